// CUDA 2-D pooling (contracts in kernels/pool2d.h), float32.
//
// Forwards: one thread per output. Backwards GATHER instead of scatter: one
// thread per input value visits the outputs whose windows cover it and adds their
// shares. With overlapping windows (stride < window) a scatter would need atomic
// adds in a run-dependent order; the gather needs no atomics and gives the same
// bits every run. For max pooling the gather recomputes each covering window's
// argmax (with 2x2 stride 2 there is exactly one covering window of 4 values,
// already in L1 from the neighbouring threads), or reads it where the forward
// recorded it (the from_argmax backward).
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pool2d.h"

namespace towerlab::cuda {

namespace {

struct Geometry {
  std::int64_t H, W, Ho, Wo;
  std::int64_t KH, KW, SH, SW, PH, PW;
};

Geometry geometry(const Shape& x, const Shape& y, const Pool2dParams& p) {
  return {x[2], x[3], y[2], y[3], p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w};
}

// The window of output (ho, wo) clipped to the plane: rows [h0, h1), columns [w0, w1).
struct Window {
  std::int64_t h0, h1, w0, w1;
};

__device__ Window window_of(std::int64_t ho, std::int64_t wo, const Geometry& g) {
  const std::int64_t h = ho * g.SH - g.PH, w = wo * g.SW - g.PW;
  return {max(h, std::int64_t{0}), min(h + g.KH, g.H), max(w, std::int64_t{0}), min(w + g.KW, g.W)};
}

// Plane index of the window's first maximum (a NaN wins, the first NaN): as the CPU.
__device__ std::int64_t window_argmax(const float* plane, std::int64_t W, const Window& win) {
  std::int64_t best = win.h0 * W + win.w0;
  float b = plane[best];
  for (std::int64_t h = win.h0; h < win.h1; ++h) {
    for (std::int64_t w = win.w0; w < win.w1; ++w) {
      const float v = plane[h * W + w];
      if (v > b || (isnan(v) && !isnan(b))) {
        best = h * W + w;
        b = v;
      }
    }
  }
  return best;
}

// Outputs whose windows cover input row h: [lo, hi] (empty when lo > hi).
__device__ void covering(std::int64_t h, std::int64_t K, std::int64_t S, std::int64_t P,
                         std::int64_t out_size, std::int64_t& lo, std::int64_t& hi) {
  lo = h + P < K ? 0 : (h + P - K) / S + 1;
  hi = min((h + P) / S, out_size - 1);
}

// The backward's gather for input (h, w): the sum of term(ho, wo) over the outputs
// whose windows cover the input, in row-major order of the outputs. Each grad_x
// element is then one thread's sum: no atomics, a fixed order.
template <typename Term>
__device__ float sum_over_covering(std::int64_t h, std::int64_t w, const Geometry& g, Term term) {
  std::int64_t ho0, ho1, wo0, wo1;
  covering(h, g.KH, g.SH, g.PH, g.Ho, ho0, ho1);
  covering(w, g.KW, g.SW, g.PW, g.Wo, wo0, wo1);
  float sum = 0.0f;
  for (std::int64_t ho = ho0; ho <= ho1; ++ho) {
    for (std::int64_t wo = wo0; wo <= wo1; ++wo) sum += term(ho, wo);
  }
  return sum;
}

// The max-pool backward's gather: gy (this plane's grad_y) of the covering outputs
// whose maximum took_it(ho, wo) says is the input. (Adding 0.0f for the others
// leaves the sum's bits as skipping them would: it starts at +0.0f.)
template <typename TookIt>
__device__ float gather_max_grad(std::int64_t h, std::int64_t w, const float* gy, const Geometry& g,
                                 TookIt took_it) {
  return sum_over_covering(h, w, g, [&](std::int64_t ho, std::int64_t wo) {
    return took_it(ho, wo) ? gy[ho * g.Wo + wo] : 0.0f;
  });
}

__global__ void max_pool2d_forward_kernel(std::int64_t n, float* __restrict__ y,
                                          const float* __restrict__ x, Geometry g) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t wo = i % g.Wo, ho = (i / g.Wo) % g.Ho, plane = i / (g.Wo * g.Ho);
    const float* p = x + plane * g.H * g.W;
    y[i] = p[window_argmax(p, g.W, window_of(ho, wo, g))];
  }
}

__global__ void max_pool2d_backward_kernel(std::int64_t n, float* __restrict__ grad_x,
                                           const float* __restrict__ grad_y,
                                           const float* __restrict__ x, Geometry g) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t w = i % g.W, h = (i / g.W) % g.H, plane = i / (g.W * g.H);
    const float* p = x + plane * g.H * g.W;
    const std::int64_t here = h * g.W + w;
    grad_x[i] += gather_max_grad(h, w, grad_y + plane * g.Ho * g.Wo, g,
                                 [&](std::int64_t ho, std::int64_t wo) {
                                   return window_argmax(p, g.W, window_of(ho, wo, g)) == here;
                                 });
  }
}

__global__ void max_pool2d_forward_with_argmax_kernel(std::int64_t n, float* __restrict__ y,
                                                      float* __restrict__ argmax,
                                                      const float* __restrict__ x, Geometry g) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t wo = i % g.Wo, ho = (i / g.Wo) % g.Ho, plane = i / (g.Wo * g.Ho);
    const float* p = x + plane * g.H * g.W;
    const std::int64_t best = window_argmax(p, g.W, window_of(ho, wo, g));
    y[i] = p[best];
    argmax[i] = static_cast<float>(best);
  }
}

// max_pool2d_backward_kernel's gather with each covering window's argmax read
// from the forward's record. Every grad_x element is written once, so `assign`
// overwrites it (zero where no output took it) without reading it.
__global__ void max_pool2d_backward_from_argmax_kernel(std::int64_t n, float* __restrict__ grad_x,
                                                       const float* __restrict__ grad_y,
                                                       const float* __restrict__ argmax, Geometry g,
                                                       bool assign) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t w = i % g.W, h = (i / g.W) % g.H, plane = i / (g.W * g.H);
    const float* where = argmax + plane * g.Ho * g.Wo;
    const float here = static_cast<float>(h * g.W + w);
    const float sum = gather_max_grad(
        h, w, grad_y + plane * g.Ho * g.Wo, g,
        [&](std::int64_t ho, std::int64_t wo) { return where[ho * g.Wo + wo] == here; });
    grad_x[i] = assign ? sum : grad_x[i] + sum;
  }
}

__global__ void avg_pool2d_forward_kernel(std::int64_t n, float* __restrict__ y,
                                          const float* __restrict__ x, Geometry g) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t wo = i % g.Wo, ho = (i / g.Wo) % g.Ho, plane = i / (g.Wo * g.Ho);
    const float* p = x + plane * g.H * g.W;
    const Window win = window_of(ho, wo, g);
    float sum = 0.0f;
    for (std::int64_t h = win.h0; h < win.h1; ++h) {
      for (std::int64_t w = win.w0; w < win.w1; ++w) sum += p[h * g.W + w];
    }
    y[i] = sum / static_cast<float>((win.h1 - win.h0) * (win.w1 - win.w0));
  }
}

__global__ void avg_pool2d_backward_kernel(std::int64_t n, float* __restrict__ grad_x,
                                           const float* __restrict__ grad_y, Geometry g) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t w = i % g.W, h = (i / g.W) % g.H, plane = i / (g.W * g.H);
    const float* gy = grad_y + plane * g.Ho * g.Wo;
    grad_x[i] += sum_over_covering(h, w, g, [&](std::int64_t ho, std::int64_t wo) {
      const Window win = window_of(ho, wo, g);
      return gy[ho * g.Wo + wo] / static_cast<float>((win.h1 - win.h0) * (win.w1 - win.w0));
    });
  }
}

}  // namespace

void max_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params,
                        const Stream& stream) {
  launch_grid_stride(max_pool2d_forward_kernel, y.numel(), stream, y.data<float>(), x.data<float>(),
                     geometry(x.shape(), y.shape(), params));
}

void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const Pool2dParams& params, const Stream& stream) {
  launch_grid_stride(max_pool2d_backward_kernel, x.numel(), stream, grad_x.data<float>(),
                     grad_y.data<float>(), x.data<float>(),
                     geometry(x.shape(), grad_y.shape(), params));
}

void max_pool2d_forward_with_argmax(const Tensor& y, const Tensor& argmax, const Tensor& x,
                                    const Pool2dParams& params, const Stream& stream) {
  launch_grid_stride(max_pool2d_forward_with_argmax_kernel, y.numel(), stream, y.data<float>(),
                     argmax.data<float>(), x.data<float>(), geometry(x.shape(), y.shape(), params));
}

void max_pool2d_backward_from_argmax(const Tensor& grad_x, const Tensor& grad_y,
                                     const Tensor& argmax, const Pool2dParams& params,
                                     const Stream& stream, GradWrite write) {
  launch_grid_stride(max_pool2d_backward_from_argmax_kernel, grad_x.numel(), stream,
                     grad_x.data<float>(), grad_y.data<float>(), argmax.data<float>(),
                     geometry(grad_x.shape(), grad_y.shape(), params), write == GradWrite::Assign);
}

void avg_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params,
                        const Stream& stream) {
  launch_grid_stride(avg_pool2d_forward_kernel, y.numel(), stream, y.data<float>(), x.data<float>(),
                     geometry(x.shape(), y.shape(), params));
}

void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Pool2dParams& params,
                         const Stream& stream) {
  launch_grid_stride(avg_pool2d_backward_kernel, grad_x.numel(), stream, grad_x.data<float>(),
                     grad_y.data<float>(), geometry(grad_x.shape(), grad_y.shape(), params));
}

}  // namespace towerlab::cuda
