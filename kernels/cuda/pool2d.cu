// CUDA 2-D pooling (contracts in kernels/pool2d.h): float32, bfloat16 and float16.
//
// The general kernels are templated on the storage type T of x, y and the
// gradients (float, bfloat16, float16; argmax float32 for every T,
// pool2d_argmax_dtype): a 16-bit value is widened on load, compared and summed in
// float32, and a result rounded once as it is stored, in the reference's order
// (kernels/reference/pool2d.h), so 16-bit results are the reference's bits. For
// float the widenings and roundings are no-ops: the float32 kernels as they were.
//
// Forwards: one thread per output. Backwards GATHER instead of scatter: one
// thread per input value visits the outputs whose windows cover it and adds their
// shares. With overlapping windows (stride < window) a scatter would need atomic
// adds in a run-dependent order; the gather needs no atomics and gives the same
// bits every run. For max pooling the gather recomputes each covering window's
// argmax (with 2x2 stride 2 there is exactly one covering window of 4 values,
// already in L1 from the neighbouring threads), or reads it where the forward
// recorded it (the from_argmax backward).
//
// The 2x2 stride-2 unpadded window on even planes (FashionNet's pooling, and the
// common case) has its own float32 kernels (16-bit tensors take the general
// ones): the windows tile the plane exactly, so every input belongs to one window
// and each thread owns one output and its window: two float2 loads (rows 2r and
// 2r+1 of x viewed as [planes*H, W], coalesced across the warp), and for the
// backwards two float2 stores of grad_x, written by this thread alone (no gather,
// no atomics). 32-bit indices, one division per output instead of the general
// kernels' three 64-bit ones. Each value is the same expression in the same order
// as the general kernels, so both give the same bits. Max pooling's 2x2 backwards
// take two outputs per thread and trip and issue both outputs' loads before
// either's stores (for_output_pairs). Average pooling's backward, which reads
// nothing but the gradients, takes two neighbouring windows a thread in float4
// rows where Wo is even.
//
// Each pass is memory-bound: its speed on a GPU, beside a device copy of the same
// bytes, is in bench/results/gpu_h100.md.
#include "kernels/cuda/gpu_dtype.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pool2d.h"

#include <cstdint>
#include <limits>
#include <type_traits>

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
template <typename T>
__device__ std::int64_t window_argmax(const T* plane, std::int64_t W, const Window& win) {
  std::int64_t best = win.h0 * W + win.w0;
  float b = static_cast<float>(plane[best]);
  for (std::int64_t h = win.h0; h < win.h1; ++h) {
    for (std::int64_t w = win.w0; w < win.w1; ++w) {
      const float v = static_cast<float>(plane[h * W + w]);
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
template <typename T, typename TookIt>
__device__ float gather_max_grad(std::int64_t h, std::int64_t w, const T* gy, const Geometry& g,
                                 TookIt took_it) {
  return sum_over_covering(h, w, g, [&](std::int64_t ho, std::int64_t wo) {
    return took_it(ho, wo) ? static_cast<float>(gy[ho * g.Wo + wo]) : 0.0f;
  });
}

template <typename T>
__global__ void max_pool2d_forward_kernel(std::int64_t n, T* __restrict__ y,
                                          const T* __restrict__ x, Geometry g) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t wo = i % g.Wo, ho = (i / g.Wo) % g.Ho, plane = i / (g.Wo * g.Ho);
    const T* p = x + plane * g.H * g.W;
    y[i] = p[window_argmax(p, g.W, window_of(ho, wo, g))];
  }
}

template <typename T>
__global__ void max_pool2d_backward_kernel(std::int64_t n, T* __restrict__ grad_x,
                                           const T* __restrict__ grad_y, const T* __restrict__ x,
                                           Geometry g) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t w = i % g.W, h = (i / g.W) % g.H, plane = i / (g.W * g.H);
    const T* p = x + plane * g.H * g.W;
    const std::int64_t here = h * g.W + w;
    const float sum = gather_max_grad(h, w, grad_y + plane * g.Ho * g.Wo, g,
                                      [&](std::int64_t ho, std::int64_t wo) {
                                        return window_argmax(p, g.W, window_of(ho, wo, g)) == here;
                                      });
    grad_x[i] = T(static_cast<float>(grad_x[i]) + sum);
  }
}

template <typename T>
__global__ void max_pool2d_forward_with_argmax_kernel(std::int64_t n, T* __restrict__ y,
                                                      float* __restrict__ argmax,
                                                      const T* __restrict__ x, Geometry g) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t wo = i % g.Wo, ho = (i / g.Wo) % g.Ho, plane = i / (g.Wo * g.Ho);
    const T* p = x + plane * g.H * g.W;
    const std::int64_t best = window_argmax(p, g.W, window_of(ho, wo, g));
    y[i] = p[best];
    argmax[i] = static_cast<float>(best);
  }
}

// max_pool2d_backward_kernel's gather with each covering window's argmax read
// from the forward's record. Every grad_x element is written once, so kAssign
// overwrites it (zero where no output took it) without reading it. (A template
// parameter, not a run-time flag: the accumulating instance then loads grad_x
// unconditionally, alongside the other loads, instead of after a branch.)
template <bool kAssign, typename T>
__global__ void max_pool2d_backward_from_argmax_kernel(std::int64_t n, T* __restrict__ grad_x,
                                                       const T* __restrict__ grad_y,
                                                       const float* __restrict__ argmax,
                                                       Geometry g) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t w = i % g.W, h = (i / g.W) % g.H, plane = i / (g.W * g.H);
    const float* where = argmax + plane * g.Ho * g.Wo;
    const float here = static_cast<float>(h * g.W + w);
    const float sum = gather_max_grad(
        h, w, grad_y + plane * g.Ho * g.Wo, g,
        [&](std::int64_t ho, std::int64_t wo) { return where[ho * g.Wo + wo] == here; });
    grad_x[i] = T(kAssign ? sum : static_cast<float>(grad_x[i]) + sum);
  }
}

template <typename T>
__global__ void avg_pool2d_forward_kernel(std::int64_t n, T* __restrict__ y,
                                          const T* __restrict__ x, Geometry g) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t wo = i % g.Wo, ho = (i / g.Wo) % g.Ho, plane = i / (g.Wo * g.Ho);
    const T* p = x + plane * g.H * g.W;
    const Window win = window_of(ho, wo, g);
    float sum = 0.0f;
    for (std::int64_t h = win.h0; h < win.h1; ++h) {
      for (std::int64_t w = win.w0; w < win.w1; ++w) sum += static_cast<float>(p[h * g.W + w]);
    }
    y[i] = T(sum / static_cast<float>((win.h1 - win.h0) * (win.w1 - win.w0)));
  }
}

template <typename T>
__global__ void avg_pool2d_backward_kernel(std::int64_t n, T* __restrict__ grad_x,
                                           const T* __restrict__ grad_y, Geometry g) {
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t w = i % g.W, h = (i / g.W) % g.H, plane = i / (g.W * g.H);
    const T* gy = grad_y + plane * g.Ho * g.Wo;
    const float sum = sum_over_covering(h, w, g, [&](std::int64_t ho, std::int64_t wo) {
      const Window win = window_of(ho, wo, g);
      return static_cast<float>(gy[ho * g.Wo + wo]) /
             static_cast<float>((win.h1 - win.h0) * (win.w1 - win.w0));
    });
    grad_x[i] = T(static_cast<float>(grad_x[i]) + sum);
  }
}

// --- 2x2 stride 2, even planes ------------------------------------------------------

// Output i of y viewed as [rows, Wo] (rows = planes*Ho): the top-left input of its
// window in x viewed as [2*rows, W = 2*Wo], and its row within the plane.
struct Tile {
  unsigned top;   // offset of x[2r, 2wo]
  unsigned h, w;  // the window's top-left (2*ho, 2*wo) within its plane
};

__device__ __forceinline__ Tile tile_of(unsigned i, unsigned Wo, unsigned Ho) {
  const unsigned r = i / Wo, wo = i - r * Wo;
  return {2 * r * (2 * Wo) + 2 * wo, 2 * (r % Ho), 2 * wo};
}

// The window's four values in row-major order.
struct Quad {
  float2 top, bottom;
};

__device__ __forceinline__ Quad load_quad(const float* x, unsigned top, unsigned W) {
  return {*reinterpret_cast<const float2*>(x + top), *reinterpret_cast<const float2*>(x + top + W)};
}

__device__ __forceinline__ void store_quad(float* x, unsigned top, unsigned W, const Quad& q) {
  *reinterpret_cast<float2*>(x + top) = q.top;
  *reinterpret_cast<float2*>(x + top + W) = q.bottom;
}

// Which of the four (0..3, row-major) is the window's first maximum, a NaN winning
// (the first NaN): window_argmax's scan.
__device__ __forceinline__ int quad_argmax(const Quad& q) {
  const float v[4] = {q.top.x, q.top.y, q.bottom.x, q.bottom.y};
  int best = 0;
#pragma unroll
  for (int k = 1; k < 4; ++k) {
    if (v[k] > v[best] || (isnan(v[k]) && !isnan(v[best]))) best = k;
  }
  return best;
}

__device__ __forceinline__ float quad_value(const Quad& q, int k) {
  return k == 0 ? q.top.x : k == 1 ? q.top.y : k == 2 ? q.bottom.x : q.bottom.y;
}

// g at position k of the four, zero elsewhere (each as 0.0f + term, the gather's sum
// over one covering window, so the bits match the general kernels).
__device__ __forceinline__ Quad quad_one_hot(int k, float g) {
  const auto at = [&](int j) { return 0.0f + (j == k ? g : 0.0f); };
  return {make_float2(at(0), at(1)), make_float2(at(2), at(3))};
}

__device__ __forceinline__ Quad quad_add(const Quad& a, const Quad& b) {
  return {make_float2(a.top.x + b.top.x, a.top.y + b.top.y),
          make_float2(a.bottom.x + b.bottom.x, a.bottom.y + b.bottom.y)};
}

// The grid-stride loop over n < 2^31 outputs in 32-bit indices.
#define TL_FOR_EACH_OUTPUT(i, n) \
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += gridDim.x * blockDim.x)

// The max-pool backwards' loop over n outputs: store(o, load(o)) for each, two outputs per
// thread and trip, i and i + half (half = ceil(n / 2), the count the grid is sized
// for; both coalesced across the warp), with both loads issued before either
// store. The windows of two outputs never overlap, so the order of the stores does
// not matter. Why: Nsight Compute on a GPU (planes twice the L2) found the warps
// of the one-output loop waiting on memory nearly every cycle, far from DRAM's
// bandwidth. With this loop, and the argmax backward's assign made a template
// parameter in the same change, the max-pool step through the argmax came up to the
// copy's speed. Which of the two did it was not measured apart; on average pooling's
// backward alone the pairs changed nothing, where 16-byte accesses did (the wide
// kernel below; docs/kernels.md, "Measured choices").
// Where n is odd the last thread's partner would be output n: it loads output
// n - 1 instead (in bounds, its twin's) and stores nothing for it.
template <typename Load, typename Store>
__device__ __forceinline__ void for_output_pairs(unsigned half, unsigned n, Load load,
                                                 Store store) {
  TL_FOR_EACH_OUTPUT(i, half) {
    const unsigned j = min(i + half, n - 1);
    const auto a = load(i);
    const auto b = load(j);
    store(i, a);
    if (i + half < n) store(j, b);
  }
}

__global__ void max_pool_2x2_forward_kernel(std::int64_t n, float* __restrict__ y,
                                            float* __restrict__ argmax, const float* __restrict__ x,
                                            unsigned Ho, unsigned Wo) {
  TL_FOR_EACH_OUTPUT(i, static_cast<unsigned>(n)) {
    const Tile t = tile_of(i, Wo, Ho);
    const Quad q = load_quad(x, t.top, 2 * Wo);
    const int k = quad_argmax(q);
    y[i] = quad_value(q, k);
    if (argmax != nullptr) {
      argmax[i] = static_cast<float>((t.h + k / 2) * (2 * Wo) + t.w + k % 2);
    }
  }
}

__global__ void max_pool_2x2_backward_kernel(std::int64_t half, float* __restrict__ grad_x,
                                             const float* __restrict__ grad_y,
                                             const float* __restrict__ x, unsigned n, unsigned Ho,
                                             unsigned Wo) {
  const unsigned W = 2 * Wo;
  struct Loaded {
    unsigned top;
    Quad x, acc;
    float g;
  };
  for_output_pairs(
      static_cast<unsigned>(half), n,
      [&](unsigned i) {
        const unsigned top = tile_of(i, Wo, Ho).top;
        return Loaded{top, load_quad(x, top, W), load_quad(grad_x, top, W), grad_y[i]};
      },
      [&](unsigned, const Loaded& l) {
        store_quad(grad_x, l.top, W, quad_add(l.acc, quad_one_hot(quad_argmax(l.x), l.g)));
      });
}

// The recorded argmax (a plane index) as a position 0..3 in the window at (h, w);
// one that is not in the window (no valid record) takes none. kAssign as in
// max_pool2d_backward_from_argmax_kernel.
template <bool kAssign>
__global__ void max_pool_2x2_backward_from_argmax_kernel(std::int64_t half,
                                                         float* __restrict__ grad_x,
                                                         const float* __restrict__ grad_y,
                                                         const float* __restrict__ argmax,
                                                         unsigned n, unsigned Ho, unsigned Wo) {
  const unsigned W = 2 * Wo;
  struct Loaded {
    Tile t;
    float where, g;
    Quad acc;
  };
  for_output_pairs(
      static_cast<unsigned>(half), n,
      [&](unsigned i) {
        const Tile t = tile_of(i, Wo, Ho);
        return Loaded{t, argmax[i], grad_y[i], kAssign ? Quad{} : load_quad(grad_x, t.top, W)};
      },
      [&](unsigned, const Loaded& l) {
        int k = -1;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (l.where == static_cast<float>((l.t.h + j / 2) * W + l.t.w + j % 2)) k = j;
        }
        const Quad g = quad_one_hot(k, l.g);
        store_quad(grad_x, l.t.top, W, kAssign ? g : quad_add(l.acc, g));
      });
}

__global__ void avg_pool_2x2_forward_kernel(std::int64_t n, float* __restrict__ y,
                                            const float* __restrict__ x, unsigned Ho, unsigned Wo) {
  TL_FOR_EACH_OUTPUT(i, static_cast<unsigned>(n)) {
    const Quad q = load_quad(x, tile_of(i, Wo, Ho).top, 2 * Wo);
    float sum = 0.0f;
    sum += q.top.x;
    sum += q.top.y;
    sum += q.bottom.x;
    sum += q.bottom.y;
    y[i] = sum / 4.0f;
  }
}

// One window a thread: odd Wo, or grad_x not 16-byte aligned (the wide kernel below
// otherwise). Two outputs a thread (for_output_pairs) did not speed it up.
__global__ void avg_pool_2x2_backward_kernel(std::int64_t n, float* __restrict__ grad_x,
                                             const float* __restrict__ grad_y, unsigned Ho,
                                             unsigned Wo) {
  TL_FOR_EACH_OUTPUT(i, static_cast<unsigned>(n)) {
    const unsigned top = tile_of(i, Wo, Ho).top;
    const float g = 0.0f + grad_y[i] / 4.0f;
    const Quad acc = load_quad(grad_x, top, 2 * Wo);
    store_quad(grad_x, top, 2 * Wo,
               {make_float2(acc.top.x + g, acc.top.y + g),
                make_float2(acc.bottom.x + g, acc.bottom.y + g)});
  }
}

// Average pooling's backward where Wo is even and grad_x 16-byte aligned: two
// neighbouring windows a thread (outputs 2p and 2p + 1, one row of grad_x's
// float4 above the other), the same values as avg_pool_2x2_backward_kernel. On a
// GPU this beat the float2 kernel, with one or two outputs a thread: 16-byte
// accesses, not more of them in flight, were what that lacked
// (bench/experiments/decided/avgpool_backward.cu; bench/results/gpu_h100_avgpool_experiment/).
__global__ void avg_pool_2x2_backward_wide_kernel(std::int64_t pairs, float* __restrict__ grad_x,
                                                  const float* __restrict__ grad_y, unsigned Ho,
                                                  unsigned Wo) {
  const unsigned W = 2 * Wo;
  TL_FOR_EACH_OUTPUT(p, static_cast<unsigned>(pairs)) {
    const unsigned top = tile_of(2 * p, Wo, Ho).top;
    const float4 upper = *reinterpret_cast<const float4*>(grad_x + top);
    const float4 lower = *reinterpret_cast<const float4*>(grad_x + top + W);
    const float2 gy = *reinterpret_cast<const float2*>(grad_y + 2 * p);
    const float g0 = 0.0f + gy.x / 4.0f, g1 = 0.0f + gy.y / 4.0f;
    *reinterpret_cast<float4*>(grad_x + top) =
        make_float4(upper.x + g0, upper.y + g0, upper.z + g1, upper.w + g1);
    *reinterpret_cast<float4*>(grad_x + top + W) =
        make_float4(lower.x + g0, lower.y + g0, lower.z + g1, lower.w + g1);
  }
}

#undef TL_FOR_EACH_OUTPUT

bool aligned(const void* p, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// Whether the 2x2 kernels apply: a 2x2 stride-2 unpadded window tiling even planes
// exactly, every buffer 8-byte aligned (float2), x small enough for 32-bit indices.
bool two_by_two(const Geometry& g, std::int64_t x_numel,
                std::initializer_list<const void*> buffers) {
  if (g.KH != 2 || g.KW != 2 || g.SH != 2 || g.SW != 2 || g.PH != 0 || g.PW != 0) return false;
  if (g.H != 2 * g.Ho || g.W != 2 * g.Wo) return false;
  if (x_numel >= std::int64_t{std::numeric_limits<int>::max()}) return false;
  for (const void* p : buffers) {
    if (!aligned(p, 8)) return false;
  }
  return true;
}

// The grid size of a 2x2 backward over n outputs: two per thread (for_output_pairs).
std::int64_t pairs(std::int64_t n) {
  return (n + 1) / 2;
}

}  // namespace

// Each launcher: the float32 2x2 kernels where they apply (two_by_two), else the
// general kernel for the tensors' storage type (with_gpu_dtype).
void max_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params,
                        const Stream& stream) {
  const Geometry g = geometry(x.shape(), y.shape(), params);
  with_gpu_dtype("max_pool2d_forward", x, [&]<typename T>() {
    if constexpr (std::is_same_v<T, float>) {
      if (two_by_two(g, x.numel(), {y.data<float>(), x.data<float>()})) {
        launch_grid_stride(max_pool_2x2_forward_kernel, y.numel(), stream, y.data<float>(), nullptr,
                           x.data<float>(), static_cast<unsigned>(g.Ho),
                           static_cast<unsigned>(g.Wo));
        return;
      }
    }
    launch_grid_stride(max_pool2d_forward_kernel<T>, y.numel(), stream, y.data<T>(), x.data<T>(),
                       g);
  });
}

void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const Pool2dParams& params, const Stream& stream) {
  const Geometry g = geometry(x.shape(), grad_y.shape(), params);
  with_gpu_dtype("max_pool2d_backward", x, [&]<typename T>() {
    if constexpr (std::is_same_v<T, float>) {
      if (two_by_two(g, x.numel(), {grad_x.data<float>(), grad_y.data<float>(), x.data<float>()})) {
        launch_grid_stride(max_pool_2x2_backward_kernel, pairs(grad_y.numel()), stream,
                           grad_x.data<float>(), grad_y.data<float>(), x.data<float>(),
                           static_cast<unsigned>(grad_y.numel()), static_cast<unsigned>(g.Ho),
                           static_cast<unsigned>(g.Wo));
        return;
      }
    }
    launch_grid_stride(max_pool2d_backward_kernel<T>, x.numel(), stream, grad_x.data<T>(),
                       grad_y.data<T>(), x.data<T>(), g);
  });
}

void max_pool2d_forward_with_argmax(const Tensor& y, const Tensor& argmax, const Tensor& x,
                                    const Pool2dParams& params, const Stream& stream) {
  const Geometry g = geometry(x.shape(), y.shape(), params);
  with_gpu_dtype("max_pool2d_forward_with_argmax", x, [&]<typename T>() {
    if constexpr (std::is_same_v<T, float>) {
      if (two_by_two(g, x.numel(), {y.data<float>(), x.data<float>()})) {
        launch_grid_stride(max_pool_2x2_forward_kernel, y.numel(), stream, y.data<float>(),
                           argmax.data<float>(), x.data<float>(), static_cast<unsigned>(g.Ho),
                           static_cast<unsigned>(g.Wo));
        return;
      }
    }
    launch_grid_stride(max_pool2d_forward_with_argmax_kernel<T>, y.numel(), stream, y.data<T>(),
                       argmax.data<float>(), x.data<T>(), g);
  });
}

void max_pool2d_backward_from_argmax(const Tensor& grad_x, const Tensor& grad_y,
                                     const Tensor& argmax, const Pool2dParams& params,
                                     const Stream& stream, GradWrite write) {
  const Geometry g = geometry(grad_x.shape(), grad_y.shape(), params);
  const bool assign = write == GradWrite::Assign;
  with_gpu_dtype("max_pool2d_backward_from_argmax", grad_x, [&]<typename T>() {
    if constexpr (std::is_same_v<T, float>) {
      if (two_by_two(g, grad_x.numel(), {grad_x.data<float>()})) {
        launch_grid_stride(assign ? max_pool_2x2_backward_from_argmax_kernel<true>
                                  : max_pool_2x2_backward_from_argmax_kernel<false>,
                           pairs(grad_y.numel()), stream, grad_x.data<float>(),
                           grad_y.data<float>(), argmax.data<float>(),
                           static_cast<unsigned>(grad_y.numel()), static_cast<unsigned>(g.Ho),
                           static_cast<unsigned>(g.Wo));
        return;
      }
    }
    launch_grid_stride(assign ? max_pool2d_backward_from_argmax_kernel<true, T>
                              : max_pool2d_backward_from_argmax_kernel<false, T>,
                       grad_x.numel(), stream, grad_x.data<T>(), grad_y.data<T>(),
                       argmax.data<float>(), g);
  });
}

void avg_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params,
                        const Stream& stream) {
  const Geometry g = geometry(x.shape(), y.shape(), params);
  with_gpu_dtype("avg_pool2d_forward", x, [&]<typename T>() {
    if constexpr (std::is_same_v<T, float>) {
      if (two_by_two(g, x.numel(), {x.data<float>()})) {
        launch_grid_stride(avg_pool_2x2_forward_kernel, y.numel(), stream, y.data<float>(),
                           x.data<float>(), static_cast<unsigned>(g.Ho),
                           static_cast<unsigned>(g.Wo));
        return;
      }
    }
    launch_grid_stride(avg_pool2d_forward_kernel<T>, y.numel(), stream, y.data<T>(), x.data<T>(),
                       g);
  });
}

void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Pool2dParams& params,
                         const Stream& stream) {
  const Geometry g = geometry(grad_x.shape(), grad_y.shape(), params);
  with_gpu_dtype("avg_pool2d_backward", grad_x, [&]<typename T>() {
    if constexpr (std::is_same_v<T, float>) {
      if (two_by_two(g, grad_x.numel(), {grad_x.data<float>()})) {
        if (g.Wo % 2 == 0 && aligned(grad_x.data<float>(), 16) &&
            aligned(grad_y.data<float>(), 8)) {
          launch_grid_stride(avg_pool_2x2_backward_wide_kernel, grad_y.numel() / 2, stream,
                             grad_x.data<float>(), grad_y.data<float>(),
                             static_cast<unsigned>(g.Ho), static_cast<unsigned>(g.Wo));
          return;
        }
        launch_grid_stride(avg_pool_2x2_backward_kernel, grad_y.numel(), stream,
                           grad_x.data<float>(), grad_y.data<float>(), static_cast<unsigned>(g.Ho),
                           static_cast<unsigned>(g.Wo));
        return;
      }
    }
    launch_grid_stride(avg_pool2d_backward_kernel<T>, grad_x.numel(), stream, grad_x.data<T>(),
                       grad_y.data<T>(), g);
  });
}

}  // namespace towerlab::cuda
