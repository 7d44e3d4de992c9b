// conv2d forward and backward on every backend: hand-computed cases, a naive
// seven-loop reference on odd shapes (1x1 and 5x5 kernels, ragged strided
// borders, dilation, C = 1 (the CPU's direct path), prime K, shapes that are not
// multiples of the CUDA tiles), accumulation into sentinel-filled gradients, empty
// batches, rejected shapes, and float64 gradient checks on the CPU. The CPU
// backward's image groups give the same bits for any thread count. Then the CPU's
// Winograd F(2x2,3x3) path (kernels/cpu/winograd.h), forced on: against the
// reference within a tolerance scaled to each result's terms, with controls, and
// the same bits for any thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <string>

#include "gradcheck.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/conv2d_implicit.h"
#include "kernels/cpu/matmul.h"
#include "test_util.h"

namespace towerlab::testing {
namespace {

struct ConvCase {
  std::string name;
  std::int64_t N, C, H, W, K, R, S;
  Conv2dParams params;
  bool bias = true;

  Shape x_shape() const { return {N, C, H, W}; }
  Shape w_shape() const { return {K, C, R, S}; }
  Shape y_shape() const { return conv2d_output_shape(x_shape(), w_shape(), params); }
};

Conv2dParams make_params(std::int64_t stride_h, std::int64_t stride_w, std::int64_t pad_h,
                         std::int64_t pad_w, std::int64_t dilation_h = 1,
                         std::int64_t dilation_w = 1) {
  return {stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w};
}

std::vector<ConvCase> odd_cases() {
  return {
      {"1x1", 3, 4, 5, 7, 5, 1, 1, make_params(1, 1, 0, 0)},
      {"1x1_stride2_pad1", 2, 3, 6, 5, 4, 1, 1, make_params(2, 2, 1, 1), false},
      {"5x5_pad2", 1, 3, 11, 9, 7, 5, 5, make_params(1, 1, 2, 2)},
      {"5x5_no_pad_no_bias", 3, 2, 9, 8, 3, 5, 5, make_params(1, 1, 0, 0), false},
      {"3x3_stride2_ragged", 3, 3, 10, 9, 5, 3, 3, make_params(2, 2, 1, 1)},
      {"3x5_stride2x1_pad0x2", 2, 2, 9, 7, 3, 3, 5, make_params(2, 1, 0, 2)},
      {"3x3_dilation2", 2, 3, 9, 8, 5, 3, 3, make_params(1, 1, 2, 2, 2, 2)},
      {"3x3_stride3_dilation2", 1, 2, 13, 11, 3, 3, 3, make_params(3, 3, 1, 0, 2, 2)},
      {"C1_K32", 3, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
      // One channel, 3x3, unit stride: the CPU's direct path (Q >= 8), with Q not a
      // multiple of 8, K not of 4, uneven padding, and Q = 8 exactly.
      {"C1_3x3_pad1x0_K5_no_bias", 2, 1, 9, 19, 5, 3, 3, make_params(1, 1, 1, 0), false},
      {"C1_3x3_Q8", 2, 1, 6, 10, 3, 3, 3, make_params(1, 1, 0, 0)},
      // One channel on CUDA's direct kernels: strides and dilation that leave input
      // pixels no tap reaches, and more channels than one block of them (32).
      {"C1_stride2x1_dilation2x1", 2, 1, 13, 12, 6, 3, 3, make_params(2, 1, 1, 2, 2, 1)},
      {"C1_2x2_K37", 3, 1, 9, 10, 37, 2, 2, make_params(1, 1, 0, 1)},
      // Channels a multiple of 8 both ways: CUDA's channel-inner reduction order,
      // through strides and dilation.
      {"C8_K16_stride2x1_dilation2x1", 2, 8, 11, 10, 16, 3, 3, make_params(2, 1, 1, 2, 2, 1)},
      {"K_prime_13", 3, 2, 7, 7, 13, 3, 3, make_params(1, 1, 1, 1)},
      {"batch1_odd", 1, 5, 13, 15, 11, 3, 3, make_params(1, 1, 1, 1), false},
      {"tiles_ragged", 5, 19, 17, 17, 67, 3, 3, make_params(1, 1, 1, 1)},
      {"C32_K64_14x14", 2, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)},
      // CUDA's pipelined channel-inner kernel on ragged row and column tiles through a
      // stride (40 forward columns, 24 backward-data), and FashionNet's 5x5 layer.
      {"C24_K40_stride2_ragged", 3, 24, 11, 13, 40, 3, 3, make_params(2, 2, 1, 1)},
      {"C32_K64_5x5_pad2", 2, 32, 14, 14, 64, 5, 5, make_params(1, 1, 2, 2)},
      // 3x3, unit stride, K a multiple of 32: the implicit weight gradient on AVX-512
      // (no padding; 784 pixels, more than one block of the GEMM's inner dimension).
      {"3x3_pad0_K32", 2, 3, 7, 9, 32, 3, 3, make_params(1, 1, 0, 0)},
      {"3x3_28x28_K32", 1, 2, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1), false},
      {"C67_K130_stride2", 2, 67, 9, 9, 130, 3, 3, make_params(2, 2, 1, 1)},
      // Batches that the CPU backward splits into 16 weight-gradient groups of 9 or
      // 10 images, both gradients in one pass over each group.
      {"batch150_groups", 150, 3, 6, 5, 4, 3, 3, make_params(1, 1, 1, 1)},
      {"1x1_batch147_groups", 147, 4, 3, 5, 6, 1, 1, make_params(1, 1, 0, 0), false},
  };
}

// x at (n, c, h, w), zero in the padding.
double at(const std::vector<double>& x, const ConvCase& k, std::int64_t n, std::int64_t c,
          std::int64_t h, std::int64_t w) {
  if (h < 0 || h >= k.H || w < 0 || w >= k.W) return 0.0;
  return x[static_cast<std::size_t>(((n * k.C + c) * k.H + h) * k.W + w)];
}

// The naive seven-loop convolution, in double. Also gives the three gradients of
// L = sum(grad_y * y) by walking the same loops (scattering instead of gathering).
struct Reference {
  std::vector<double> y, grad_x, grad_w, grad_b;
};

Reference reference(const ConvCase& k, const std::vector<double>& x, const std::vector<double>& w,
                    const std::vector<double>& b, const std::vector<double>& grad_y) {
  const Shape ys = k.y_shape();
  const std::int64_t P = ys[2], Q = ys[3];
  const Conv2dParams& p = k.params;
  Reference ref;
  ref.y.assign(static_cast<std::size_t>(numel_of(ys)), 0.0);
  ref.grad_x.assign(x.size(), 0.0);
  ref.grad_w.assign(w.size(), 0.0);
  ref.grad_b.assign(static_cast<std::size_t>(k.K), 0.0);
  for (std::int64_t n = 0; n < k.N; ++n) {
    for (std::int64_t o = 0; o < k.K; ++o) {
      for (std::int64_t op = 0; op < P; ++op) {
        for (std::int64_t oq = 0; oq < Q; ++oq) {
          const auto yi = static_cast<std::size_t>(((n * k.K + o) * P + op) * Q + oq);
          double acc = k.bias ? b[static_cast<std::size_t>(o)] : 0.0;
          const double g = grad_y.empty() ? 0.0 : grad_y[yi];
          ref.grad_b[static_cast<std::size_t>(o)] += g;
          for (std::int64_t c = 0; c < k.C; ++c) {
            for (std::int64_t r = 0; r < k.R; ++r) {
              for (std::int64_t s = 0; s < k.S; ++s) {
                const std::int64_t h = op * p.stride_h - p.pad_h + r * p.dilation_h;
                const std::int64_t ww = oq * p.stride_w - p.pad_w + s * p.dilation_w;
                const auto wi = static_cast<std::size_t>(((o * k.C + c) * k.R + r) * k.S + s);
                acc += w[wi] * at(x, k, n, c, h, ww);
                ref.grad_w[wi] += g * at(x, k, n, c, h, ww);
                if (h >= 0 && h < k.H && ww >= 0 && ww < k.W) {
                  ref.grad_x[static_cast<std::size_t>(((n * k.C + c) * k.H + h) * k.W + ww)] +=
                      g * w[wi];
                }
              }
            }
          }
          ref.y[yi] = acc;
        }
      }
    }
  }
  return ref;
}

std::vector<double> widen(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}
std::vector<float> narrow(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}
std::vector<float> plus(std::vector<float> a, const std::vector<double>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += static_cast<float>(b[i]);
  return a;
}

class Conv2dTest : public BackendTest {};
TL_INSTANTIATE_BACKENDS(Conv2dTest);

TEST_P(Conv2dTest, HandComputedPaddedForward) {
  // x = [1 2; 3 4], weight = [1 2; 3 4], padding 1: every overlap of the two grids.
  Tensor x = make({1, 2, 3, 4}, {1, 1, 2, 2});
  Tensor w = make({1, 2, 3, 4}, {1, 1, 2, 2});
  Tensor b = make({1}, {1});
  Tensor y = Tensor::empty({1, 1, 3, 3}, stream());
  conv2d_forward(y, x, w, b, make_params(1, 1, 1, 1), stream());
  EXPECT_EQ(host(y), (std::vector<float>{5, 12, 7, 15, 31, 15, 7, 12, 5}));
}

TEST_P(Conv2dTest, HandComputedStridedForward) {
  std::vector<float> values(16);
  for (int i = 0; i < 16; ++i) values[static_cast<std::size_t>(i)] = static_cast<float>(i);
  Tensor x = make(values, {1, 1, 4, 4});
  Tensor w = make({2}, {1, 1, 1, 1});
  Tensor y = Tensor::empty({1, 1, 2, 2}, stream());
  conv2d_forward(y, x, w, Tensor(), make_params(2, 2, 0, 0), stream());
  EXPECT_EQ(host(y), (std::vector<float>{0, 4, 16, 20}));
}

TEST_P(Conv2dTest, HandComputedBackwardAccumulates) {
  // With grad_y = 1 everywhere each input pixel meets every kernel tap once and
  // each tap meets every pixel once: grad_x = sum(w), grad_w = sum(x), grad_b = 9.
  Tensor x = make({1, 2, 3, 4}, {1, 1, 2, 2});
  Tensor w = make({1, 2, 3, 4}, {1, 1, 2, 2});
  Tensor grad_y = make(std::vector<float>(9, 1.0f), {1, 1, 3, 3});
  Tensor grad_x = make({10, 10, 10, 10}, {1, 1, 2, 2});  // sentinels: must be added to
  Tensor grad_w = make({-1, -1, -1, -1}, {1, 1, 2, 2});
  Tensor grad_b = make({100}, {1});
  conv2d_backward(grad_x, grad_w, grad_b, grad_y, x, w, make_params(1, 1, 1, 1), stream());
  EXPECT_EQ(host(grad_x), (std::vector<float>{20, 20, 20, 20}));
  EXPECT_EQ(host(grad_w), (std::vector<float>{9, 9, 9, 9}));
  EXPECT_EQ(host(grad_b), (std::vector<float>{109}));
}

TEST_P(Conv2dTest, MatchesNaiveReferenceOnOddShapes) {
  unsigned seed = 100;
  for (const ConvCase& k : odd_cases()) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    const auto xv = random_values(static_cast<std::size_t>(numel_of(k.x_shape())), ++seed);
    const auto wv = random_values(static_cast<std::size_t>(numel_of(k.w_shape())), ++seed);
    const auto bv = random_values(static_cast<std::size_t>(k.K), ++seed);
    const auto gv = random_values(static_cast<std::size_t>(numel_of(ys)), ++seed);
    const Reference ref = reference(k, widen(xv), widen(wv), widen(bv), widen(gv));

    Tensor x = make(xv, k.x_shape()), w = make(wv, k.w_shape());
    Tensor b = k.bias ? make(bv, {k.K}) : Tensor();
    Tensor y = make(std::vector<float>(static_cast<std::size_t>(numel_of(ys)), 7.0f), ys);
    conv2d_forward(y, x, w, b, k.params, stream());
    EXPECT_TRUE(all_close(host(y), narrow(ref.y), 1e-4, 1e-4));

    // Sentinel-filled gradients: the backward must add to them.
    const auto sx = random_values(xv.size(), ++seed), sw = random_values(wv.size(), ++seed);
    const auto sb = random_values(bv.size(), ++seed);
    Tensor grad_x = make(sx, k.x_shape()), grad_w = make(sw, k.w_shape());
    Tensor grad_b = make(sb, {k.K});
    conv2d_backward(grad_x, grad_w, grad_b, make(gv, ys), x, w, k.params, stream());
    EXPECT_TRUE(all_close(host(grad_x), plus(sx, ref.grad_x), 1e-4, 1e-4)) << "grad_x";
    EXPECT_TRUE(all_close(host(grad_w), plus(sw, ref.grad_w), 2e-4, 1e-4)) << "grad_weight";
    EXPECT_TRUE(all_close(host(grad_b), plus(sb, ref.grad_b), 2e-4, 1e-4)) << "grad_bias";
  }
}

// GradWrite::Assign: grad_x is written whole without being read, the bits of
// accumulating onto zeros. NaN-filled buffers show a read or an unwritten pixel
// (strides and ragged edges leave pixels that no tap reaches: they must be 0).
TEST_P(Conv2dTest, AssignedGradXIsAccumulatingOntoZeros) {
  std::vector<ConvCase> cases = odd_cases();
  cases.push_back({"3x3_pad1_flat", 3, 5, 14, 14, 6, 3, 3, make_params(1, 1, 1, 1)});
  cases.push_back({"1x1_in_place", 2, 4, 5, 7, 3, 1, 1, make_params(1, 1, 0, 0)});
  // Winograd's backward-data on the CPU (Auto: 16 channels or more), both paddings.
  cases.push_back({"winograd_pad0", 2, 16, 9, 11, 16, 3, 3, make_params(1, 1, 0, 0)});
  cases.push_back({"winograd_pad1", 2, 16, 7, 10, 17, 3, 3, make_params(1, 1, 1, 1)});
  unsigned seed = 900;
  for (const ConvCase& k : cases) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    const auto xv = random_values(static_cast<std::size_t>(numel_of(k.x_shape())), ++seed);
    const auto wv = random_values(static_cast<std::size_t>(numel_of(k.w_shape())), ++seed);
    const auto gv = random_values(static_cast<std::size_t>(numel_of(ys)), ++seed);
    Tensor x = make(xv, k.x_shape()), w = make(wv, k.w_shape()), gy = make(gv, ys);
    const auto n = static_cast<std::size_t>(numel_of(k.x_shape()));
    Tensor accumulated = make(std::vector<float>(n, 0.0f), k.x_shape());
    conv2d_backward(accumulated, Tensor(), Tensor(), gy, x, w, k.params, stream());
    Tensor assigned = make(std::vector<float>(n, std::nanf("")), k.x_shape());
    conv2d_backward(assigned, Tensor(), Tensor(), gy, x, w, k.params, stream(), GradWrite::Assign);
    const std::vector<float> want = host(accumulated), got = host(assigned);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0);
    EXPECT_NE(std::count(want.begin(), want.end(), 0.0f), std::ptrdiff_t(n)) << "trivial";
  }
}

TEST_P(Conv2dTest, WritesThroughUnalignedViews) {
  // Outputs that start one float into their storage: the CUDA kernels must fall
  // back from 16-byte vector stores.
  const ConvCase k{"", 2, 3, 8, 8, 5, 3, 3, make_params(1, 1, 1, 1)};
  const Shape ys = k.y_shape();
  const auto xv = random_values(static_cast<std::size_t>(numel_of(k.x_shape())), 31);
  const auto wv = random_values(static_cast<std::size_t>(numel_of(k.w_shape())), 32);
  const auto bv = random_values(5, 33);
  const auto gv = random_values(static_cast<std::size_t>(numel_of(ys)), 34);
  const Reference ref = reference(k, widen(xv), widen(wv), widen(bv), widen(gv));
  Tensor x = make(xv, k.x_shape()), w = make(wv, k.w_shape()), b = make(bv, {5});
  Tensor y_storage = Tensor::zeros({numel_of(ys) + 1}, stream());
  Tensor y = y_storage.view(1, ys);
  conv2d_forward(y, x, w, b, k.params, stream());
  EXPECT_TRUE(all_close(host(y), narrow(ref.y), 1e-4, 1e-4));
  Tensor gx_storage = Tensor::zeros({numel_of(k.x_shape()) + 1}, stream());
  Tensor grad_x = gx_storage.view(1, k.x_shape());
  conv2d_backward(grad_x, Tensor(), Tensor(), make(gv, ys), x, w, k.params, stream());
  EXPECT_TRUE(all_close(host(grad_x), narrow(ref.grad_x), 1e-4, 1e-4));
}

// Shapes big enough for the CUDA kernels' largest tiles and split reductions on a
// full GPU (pixel rows in the tens of thousands), checked against the CPU backend.
TEST_P(Conv2dTest, CudaMatchesCpuOnLargeLayers) {
  if (device().is_cpu()) GTEST_SKIP() << "compares the CUDA kernels with the CPU backend";
  const Stream& cpu = default_stream(Device::cpu());
  const std::vector<ConvCase> cases = {
      {"C40_K96_64x64", 9, 40, 64, 64, 96, 3, 3, make_params(1, 1, 1, 1)},
      {"C5_K64_110x110", 3, 5, 110, 110, 64, 3, 3, make_params(1, 1, 1, 1)},
      {"fashion2_b128", 128, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)},
      {"fashion1_b128", 128, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
      {"fashion1_b512", 512, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
      {"fashion1_b37", 37, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
  };
  unsigned seed = 500;
  for (const ConvCase& k : cases) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    const auto xv = random_values(static_cast<std::size_t>(numel_of(k.x_shape())), ++seed);
    const auto wv = random_values(static_cast<std::size_t>(numel_of(k.w_shape())), ++seed);
    const auto bv = random_values(static_cast<std::size_t>(k.K), ++seed);
    const auto gv = random_values(static_cast<std::size_t>(numel_of(ys)), ++seed);
    auto run = [&](const Stream& on) {
      auto put = [&](const std::vector<float>& v, const Shape& shape) {
        return Tensor::from_host<float>(v, shape, on);
      };
      Tensor x = put(xv, k.x_shape()), w = put(wv, k.w_shape()), b = put(bv, {k.K});
      Tensor y = Tensor::empty(ys, on), grad_y = put(gv, ys);
      Tensor grad_x = Tensor::zeros(k.x_shape(), on), grad_w = Tensor::zeros(k.w_shape(), on);
      Tensor grad_b = Tensor::zeros({k.K}, on);
      conv2d_forward(y, x, w, b, k.params, on);
      conv2d_backward(grad_x, grad_w, grad_b, grad_y, x, w, k.params, on);
      return std::vector<std::vector<float>>{y.to_host<float>(on), grad_x.to_host<float>(on),
                                             grad_w.to_host<float>(on), grad_b.to_host<float>(on)};
    };
    const auto expected = run(cpu);
    const auto actual = run(stream());
    EXPECT_TRUE(all_close(actual[0], expected[0], 1e-4, 1e-4)) << "y";
    EXPECT_TRUE(all_close(actual[1], expected[1], 1e-4, 1e-4)) << "grad_x";
    // Sums over up to 10^5 terms: float rounding differs between the two orders.
    EXPECT_TRUE(all_close(actual[2], expected[2], 2e-3, 1e-4)) << "grad_weight";
    EXPECT_TRUE(all_close(actual[3], expected[3], 2e-3, 1e-4)) << "grad_bias";
  }
}

// Backward-weight on FashionNet's layers, whose few output tiles make the CUDA
// kernel split the reduction over (image, pixel) ranges (79 splits for fashion2
// at 132 SMs: the two-stage reduction): run twice into the same sentinel, the
// accumulated grad_weight must have the same bits (a fixed reduction order).
TEST_P(Conv2dTest, CudaBackwardWeightRepeatsTheBits) {
  if (device().is_cpu()) GTEST_SKIP() << "CUDA-only: the split backward-weight";
  for (const ConvCase& k :
       {ConvCase{"fashion1_b128", 128, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1), false},
        ConvCase{"fashion2_b128", 128, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1), false}}) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    Tensor x =
        make(random_values(static_cast<std::size_t>(numel_of(k.x_shape())), 71), k.x_shape());
    Tensor grad_y = make(random_values(static_cast<std::size_t>(numel_of(ys)), 72), ys);
    Tensor w = Tensor::zeros(k.w_shape(), stream());
    const auto sentinel = random_values(static_cast<std::size_t>(numel_of(k.w_shape())), 73);
    auto run = [&] {
      Tensor grad_w = make(sentinel, k.w_shape());
      conv2d_backward(Tensor(), grad_w, Tensor(), grad_y, x, w, k.params, stream());
      return host(grad_w);
    };
    const auto first = run();
    EXPECT_NE(first, sentinel);
    EXPECT_EQ(run(), first);
  }
}

TEST_P(Conv2dTest, ComputesOnlyRequestedGradients) {
  const ConvCase k{"", 2, 3, 6, 6, 4, 3, 3, make_params(1, 1, 1, 1)};
  const auto xv = random_values(static_cast<std::size_t>(numel_of(k.x_shape())), 1);
  const auto wv = random_values(static_cast<std::size_t>(numel_of(k.w_shape())), 2);
  const auto gv = random_values(static_cast<std::size_t>(numel_of(k.y_shape())), 3);
  const Reference ref = reference(k, widen(xv), widen(wv), std::vector<double>(4, 0.0), widen(gv));
  Tensor x = make(xv, k.x_shape()), w = make(wv, k.w_shape()), grad_y = make(gv, k.y_shape());

  Tensor grad_w = Tensor::zeros(k.w_shape(), stream());
  conv2d_backward(Tensor(), grad_w, Tensor(), grad_y, x, w, k.params, stream());
  EXPECT_TRUE(all_close(host(grad_w), narrow(ref.grad_w), 1e-4, 1e-4));

  Tensor grad_x = Tensor::zeros(k.x_shape(), stream());
  conv2d_backward(grad_x, Tensor(), Tensor(), grad_y, x, w, k.params, stream());
  EXPECT_TRUE(all_close(host(grad_x), narrow(ref.grad_x), 1e-4, 1e-4));

  Tensor grad_b = Tensor::zeros({4}, stream());
  conv2d_backward(Tensor(), Tensor(), grad_b, grad_y, x, w, k.params, stream());
  EXPECT_TRUE(all_close(host(grad_b), narrow(ref.grad_b), 1e-4, 1e-4));
}

TEST_P(Conv2dTest, EmptyBatchIsANoOp) {
  Tensor x = Tensor::zeros({0, 3, 5, 5}, stream());
  Tensor w = make(random_values(4 * 3 * 9, 5), {4, 3, 3, 3});
  Tensor y = Tensor::zeros({0, 4, 5, 5}, stream());
  conv2d_forward(y, x, w, Tensor(), make_params(1, 1, 1, 1), stream());
  Tensor grad_w = make(std::vector<float>(4 * 3 * 9, 3.0f), {4, 3, 3, 3});
  Tensor grad_b = make({1, 2, 3, 4}, {4});
  Tensor grad_x = Tensor::zeros({0, 3, 5, 5}, stream());
  conv2d_backward(grad_x, grad_w, grad_b, y, x, w, make_params(1, 1, 1, 1), stream());
  EXPECT_EQ(host(grad_w), std::vector<float>(4 * 3 * 9, 3.0f));
  EXPECT_EQ(host(grad_b), (std::vector<float>{1, 2, 3, 4}));
}

TEST_P(Conv2dTest, RejectsBadShapesWithClearMessages) {
  Tensor x = Tensor::zeros({2, 3, 8, 8}, stream());
  Tensor w = Tensor::zeros({32, 1, 3, 3}, stream());
  Tensor y = Tensor::zeros({2, 32, 8, 8}, stream());
  EXPECT_THROW_WITH(conv2d_forward(y, x, w, Tensor(), make_params(1, 1, 1, 1), stream()),
                    ShapeError,
                    "conv2d: input has 3 channels but weight expects 1 (input float32[2,3,8,8], "
                    "weight float32[32,1,3,3])");

  Tensor small = Tensor::zeros({1, 1, 4, 4}, stream());
  Tensor w5 = Tensor::zeros({1, 1, 5, 5}, stream());
  EXPECT_THROW_WITH(conv2d_forward(y, small, w5, Tensor(), {}, stream()), ShapeError,
                    "conv2d: kernel 5x5 is larger than the padded input 4x4");
  Tensor w3 = Tensor::zeros({1, 1, 3, 3}, stream());
  EXPECT_THROW_WITH(conv2d_forward(y, small, w3, Tensor(), make_params(1, 1, 0, 0, 2, 2), stream()),
                    ShapeError,
                    "conv2d: kernel 3x3 (dilated to 5x5) is larger than the padded input 4x4");
  EXPECT_THROW_WITH(conv2d_forward(y, small, w3, Tensor(), make_params(0, 1, 1, 1), stream()),
                    InvalidArgument, "conv2d: stride must be positive, got 0x1");
  EXPECT_THROW_WITH(conv2d_forward(y, small, w3, Tensor(), make_params(1, 1, -1, 0), stream()),
                    InvalidArgument, "conv2d: padding must not be negative");

  Tensor y_wrong = Tensor::zeros({1, 1, 3, 3}, stream());
  EXPECT_THROW_WITH(conv2d_forward(y_wrong, small, w3, Tensor(), {}, stream()), ShapeError,
                    "conv2d_forward: y is float32[1,1,3,3] but should be [1,1,2,2]");
  Tensor y_ok = Tensor::zeros({1, 1, 2, 2}, stream());
  Tensor bias_wrong = Tensor::zeros({2}, stream());
  EXPECT_THROW_WITH(conv2d_forward(y_ok, small, w3, bias_wrong, {}, stream()), ShapeError,
                    "conv2d_forward: bias is float32[2] but should be [1]");
  Tensor flat = Tensor::zeros({16}, stream());
  EXPECT_THROW_WITH(conv2d_forward(y_ok, flat, w3, Tensor(), {}, stream()), ShapeError,
                    "conv2d: input must be 4-D [N,C,H,W] but is float32[16]");

  Tensor grad_w_wrong = Tensor::zeros({1, 1, 2, 2}, stream());
  EXPECT_THROW_WITH(
      conv2d_backward(Tensor(), grad_w_wrong, Tensor(), y_ok, small, w3, {}, stream()), ShapeError,
      "conv2d_backward: grad_weight is float32[1,1,2,2] but should be [1,1,3,3]");
  EXPECT_THROW_WITH(conv2d_backward(Tensor(), Tensor(), Tensor(), y_wrong, small, w3, {}, stream()),
                    ShapeError,
                    "conv2d_backward: grad_y is float32[1,1,3,3] but should be [1,1,2,2]");
}

TEST(Conv2dShape, OutputShapeFollowsTheFormula) {
  EXPECT_EQ(conv2d_output_shape({128, 1, 28, 28}, {32, 1, 3, 3}, make_params(1, 1, 1, 1)),
            (Shape{128, 32, 28, 28}));
  EXPECT_EQ(conv2d_output_shape({2, 3, 10, 9}, {5, 3, 3, 3}, make_params(2, 2, 1, 1)),
            (Shape{2, 5, 5, 5}));
  EXPECT_EQ(conv2d_output_shape({1, 1, 9, 8}, {1, 1, 3, 3}, make_params(1, 1, 2, 2, 2, 2)),
            (Shape{1, 1, 9, 8}));
  EXPECT_THROW_WITH(conv2d_output_shape({1, 3, 8, 8}, {4, 2, 3, 3}, {}), ShapeError,
                    "conv2d: input has 3 channels but weight expects 2 (input [1,3,8,8], weight "
                    "[4,2,3,3])");
}

// float64 exists on the CPU only (for gradient checks): a CUDA float64 tensor cannot
// be made, so no CUDA kernel ever sees one. (This test once built such tensors and
// expected conv2d to refuse them; it had never run until the emulated GPUs ran it.)
TEST(Conv2dShape, CudaHasNoFloat64Tensors) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Stream stream(Device::cuda(0));
  EXPECT_THROW_WITH(Tensor::zeros({1, 1, 4, 4}, stream, DType::Float64), NotSupported,
                    "float64 tensors live on the CPU only (asked for [1,1,4,4] on cuda:0)");
}

// Central differences of L = sum(g * conv2d(x, w, b)) against the backward, in float64.
void expect_gradients_match(const ConvCase& k) {
  SCOPED_TRACE(k.name);
  const Stream& cpu = default_stream(Device::cpu());
  const Shape ys = k.y_shape();
  Tensor x = random_double_tensor(k.x_shape(), 21);
  Tensor w = random_double_tensor(k.w_shape(), 22);
  Tensor b = random_double_tensor({k.K}, 23);
  Tensor g = random_double_tensor(ys, 24);
  auto loss = [&](const std::vector<Tensor>& in) {
    Tensor y = Tensor::empty(ys, cpu, DType::Float64);
    conv2d_forward(y, in[0], in[1], in[2], k.params, cpu);
    return weighted_sum(g, y);
  };
  Tensor grad_x = Tensor::zeros(k.x_shape(), cpu, DType::Float64);
  Tensor grad_w = Tensor::zeros(k.w_shape(), cpu, DType::Float64);
  Tensor grad_b = Tensor::zeros({k.K}, cpu, DType::Float64);
  conv2d_backward(grad_x, grad_w, grad_b, g, x, w, k.params, cpu);
  EXPECT_TRUE(check_gradient(loss, {x, w, b}, {grad_x, grad_w, grad_b}));
}

TEST(Conv2dGradient, MatchesCentralDifferences) {
  expect_gradients_match({"3x3_pad1", 2, 3, 5, 6, 4, 3, 3, make_params(1, 1, 1, 1)});
  expect_gradients_match({"3x3_stride2_ragged", 2, 2, 8, 7, 3, 3, 3, make_params(2, 2, 1, 1)});
  expect_gradients_match({"1x1", 2, 3, 4, 5, 2, 1, 1, make_params(1, 1, 0, 0)});
  expect_gradients_match({"5x5_pad2", 1, 2, 6, 7, 3, 5, 5, make_params(1, 1, 2, 2)});
  expect_gradients_match(
      {"3x2_dilation2_stride2x1", 2, 2, 9, 8, 3, 3, 2, make_params(2, 1, 1, 0, 2, 2)});
}

// --- the CPU's direct path on every ISA -----------------------------------------
//
// One input channel, 3x3, unit stride runs a direct convolution (no im2col,
// kernels/cpu/conv2d_direct.h): eight pixels a vector with AVX2, sixteen with
// AVX-512. Each output is the same chain of nine fused multiply-adds either way, and
// the weight gradient's sixteen lane sums are the AVX-512 vector's lanes or two AVX2
// vectors' halves, so the two give the same bits. The shapes cover P*Q a multiple of
// sixteen (Q = 16, 28), a last group of 11, 14 and 1 pixels (in AVX2's terms: a
// half partly full, or empty), P*Q = 8 (the forward's AVX2 code on both), an odd
// K (a filter without a partner), and groups of several images (N = 35).
std::vector<ConvCase> direct_cases() {
  return {
      {"Q16", 2, 1, 18, 18, 5, 3, 3, make_params(1, 1, 0, 0)},
      {"Q19_pad1x0", 2, 1, 9, 21, 4, 3, 3, make_params(1, 1, 1, 0), false},
      {"Q28_K32", 3, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
      {"Q70", 1, 1, 5, 70, 3, 3, 3, make_params(1, 1, 1, 1)},
      {"PQ33", 2, 1, 5, 13, 6, 3, 3, make_params(1, 1, 0, 0)},
      {"PQ8", 2, 1, 3, 10, 3, 3, 3, make_params(1, 1, 0, 0)},
      {"N35_groups", 35, 1, 12, 12, 7, 3, 3, make_params(1, 1, 1, 1)},
  };
}

// y, then grad_weight added to a sentinel, of one direct case on the CPU.
std::vector<float> direct_outputs(const ConvCase& k, const std::vector<float>& xv, unsigned seed) {
  const auto wv = random_values(std::size_t(numel_of(k.w_shape())), seed);
  const auto bv = random_values(std::size_t(k.K), seed + 1);
  const auto gv = random_values(std::size_t(numel_of(k.y_shape())), seed + 2);
  const auto sentinel = random_values(wv.size(), seed + 3);
  auto put = [](const std::vector<float>& v, const Shape& shape) {
    return Tensor::from_host<float>(v, shape, cpu());
  };
  const Tensor x = put(xv, k.x_shape()), w = put(wv, k.w_shape());
  Tensor y = Tensor::empty(k.y_shape(), cpu());
  conv2d_forward(y, x, w, k.bias ? put(bv, {k.K}) : Tensor(), k.params, cpu());
  Tensor grad_w = put(sentinel, k.w_shape());
  conv2d_backward(Tensor(), grad_w, Tensor(), put(gv, k.y_shape()), x, w, k.params, cpu());
  std::vector<float> all = y.to_host<float>(cpu());
  const std::vector<float> gw = grad_w.to_host<float>(cpu());
  all.insert(all.end(), gw.begin(), gw.end());
  return all;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Conv2dDirect, Avx512GivesTheAvx2Bits) {
  if (!gemm_isa_supported(GemmIsa::Avx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  const RestoreGemmIsa restore;
  for (const ConvCase& k : direct_cases()) {
    SCOPED_TRACE(k.name);
    const auto xv = random_values(std::size_t(numel_of(k.x_shape())), 1201);
    auto run = [&](GemmIsa isa, const std::vector<float>& x) {
      set_gemm_isa(isa);
      return direct_outputs(k, x, 1202);
    };
    const std::vector<float> avx2 = run(GemmIsa::Avx2, xv);
    EXPECT_TRUE(same_bits(run(GemmIsa::Avx512, xv), avx2));
    // Control: the last input value 0.1% off changes bits of y and of grad_weight,
    // and the comparison sees both.
    std::vector<float> nudged = xv;
    nudged.back() *= 1.001f;
    const std::vector<float> off = run(GemmIsa::Avx512, nudged);
    const auto y_size = std::ptrdiff_t(numel_of(k.y_shape()));
    EXPECT_FALSE(
        same_bits({off.begin(), off.begin() + y_size}, {avx2.begin(), avx2.begin() + y_size}))
        << "the control's y";
    EXPECT_FALSE(same_bits({off.begin() + y_size, off.end()}, {avx2.begin() + y_size, avx2.end()}))
        << "the control's grad_weight";
  }
}

// The direct path's images are split over threads in fixed groups: 1, 2 and 3
// threads and a tower's share of the pool give the same bits, on the ISA this CPU
// runs.
TEST(Conv2dDirect, SameBitsForAnyThreadCount) {
  const int saved = num_threads();
  for (const ConvCase& k : direct_cases()) {
    SCOPED_TRACE(k.name);
    const auto xv = random_values(std::size_t(numel_of(k.x_shape())), 1301);
    set_num_threads(1);
    const std::vector<float> one = direct_outputs(k, xv, 1302);
    set_num_threads(2);
    EXPECT_TRUE(same_bits(direct_outputs(k, xv, 1302), one)) << "2 threads";
    set_num_threads(3);
    EXPECT_TRUE(same_bits(direct_outputs(k, xv, 1302), one)) << "3 threads";
    const ThreadShare share(0, 2);
    EXPECT_TRUE(same_bits(direct_outputs(k, xv, 1302), one)) << "a tower's share of 2 of 3";
  }
  set_num_threads(saved);
}

// --- col2im's vector path ---------------------------------------------------------
//
// With unit strides and Q == W, col2im sums each input pixel's taps eight pixels at
// a time (AVX2, whenever the GEMM runs AVX2 or AVX-512) instead of tap by tap over
// the plane; each pixel must still add its taps in the same order. With one output
// channel every element of the patch gradient is a single product, the same bits on
// every GEMM, so the input gradients of the portable build (the tap-by-tap loop)
// and of the vector path must agree bit for bit, added onto a random grad_x (the
// accumulation is part of the order).
TEST(Conv2dCol2im, VectorPathGivesTheTapByTapBits) {
  if (!gemm_isa_supported(GemmIsa::Avx2)) GTEST_SKIP() << "this CPU has no AVX2";
  const RestoreGemmIsa restore;
  for (const ConvCase& k :
       {ConvCase{"14x14", 3, 5, 14, 14, 1, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"5x7", 2, 3, 5, 7, 1, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"1x1_plane", 2, 2, 1, 1, 1, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"9x22", 1, 2, 9, 22, 1, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"3x5_kernel", 2, 2, 6, 11, 1, 3, 5, make_params(1, 1, 1, 2)},
        ConvCase{"dilation2", 2, 2, 9, 8, 1, 3, 3, make_params(1, 1, 2, 2, 2, 2)}}) {
    SCOPED_TRACE(k.name);
    const auto gyv = random_values(std::size_t(numel_of(k.y_shape())), 1301);
    const auto wv = random_values(std::size_t(numel_of(k.w_shape())), 1302);
    const auto gxv = random_values(std::size_t(numel_of(k.x_shape())), 1303);
    auto grad_x = [&](GemmIsa isa, const std::vector<float>& gy) {
      set_gemm_isa(isa);
      Tensor gx = Tensor::from_host<float>(gxv, k.x_shape(), cpu());
      conv2d_backward(gx, Tensor(), Tensor(), Tensor::from_host<float>(gy, k.y_shape(), cpu()),
                      Tensor::zeros(k.x_shape(), cpu()),
                      Tensor::from_host<float>(wv, k.w_shape(), cpu()), k.params, cpu());
      return gx.to_host<float>(cpu());
    };
    const std::vector<float> tap_by_tap = grad_x(GemmIsa::Portable, gyv);
    const std::vector<float> vector = grad_x(GemmIsa::Avx2, gyv);
    ASSERT_EQ(vector.size(), tap_by_tap.size());
    EXPECT_EQ(std::memcmp(vector.data(), tap_by_tap.data(), vector.size() * sizeof(float)), 0);
    // Control: the last gradient value 0.1% off changes the bits the comparison sees.
    std::vector<float> nudged = gyv;
    nudged.back() *= 1.001f;
    const std::vector<float> off = grad_x(GemmIsa::Avx2, nudged);
    EXPECT_NE(std::memcmp(off.data(), tap_by_tap.data(), off.size() * sizeof(float)), 0)
        << "control";
  }
}

// --- the implicit weight gradient --------------------------------------------------
//
// On AVX2 and AVX-512, the weight gradient of a 3x3 stride-1 convolution with K a
// multiple of 32 broadcasts the patches from the padded image instead of im2col +
// GEMM; each ISA's kernel must give the bits of im2col (here by plain loops) and that
// ISA's GEMM: padded and not, one block of the GEMM's inner dimension and several
// (784 pixels), a 1x1 output, assigned (an image group's first image) and added onto
// a random partial. Then the whole weight gradient: the AVX2 and AVX-512 paths agree.

// col [C*9, P*Q] of one image x [C,H,W]: the patches, zeros in the padding.
std::vector<float> patch_matrix(const std::vector<float>& x, const Conv2dShape& s) {
  std::vector<float> col(std::size_t(s.C * 9 * s.P * s.Q));
  for (std::int64_t c = 0; c < s.C; ++c) {
    for (std::int64_t r = 0; r < 3; ++r) {
      for (std::int64_t t = 0; t < 3; ++t) {
        for (std::int64_t h = 0; h < s.P; ++h) {
          for (std::int64_t w = 0; w < s.Q; ++w) {
            const std::int64_t ih = h + r - s.params.pad_h, iw = w + t - s.params.pad_w;
            const bool inside = ih >= 0 && ih < s.H && iw >= 0 && iw < s.W;
            col[std::size_t(((c * 9 + r * 3 + t) * s.P + h) * s.Q + w)] =
                inside ? x[std::size_t((c * s.H + ih) * s.W + iw)] : 0.0f;
          }
        }
      }
    }
  }
  return col;
}

TEST(Conv2dImplicitWeightGrad, GivesTheGemmBits) {
  const RestoreGemmIsa restore;
  int isas_run = 0;
  for (GemmIsa isa : {GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) continue;
    set_gemm_isa(isa);
    ++isas_run;
    for (const ConvCase& k :
         {ConvCase{"14x14_K64", 1, 5, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)},
          ConvCase{"28x28_K32", 1, 2, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
          ConvCase{"pad0_5x9_K96", 1, 3, 5, 9, 96, 3, 3, make_params(1, 1, 0, 0)},
          ConvCase{"pad1x0_K32", 1, 2, 6, 11, 32, 3, 3, make_params(1, 1, 1, 0)},
          ConvCase{"1x1_output", 1, 3, 3, 3, 32, 3, 3, make_params(1, 1, 0, 0)}}) {
      SCOPED_TRACE(k.name + (isa == GemmIsa::Avx2 ? " on AVX2" : " on AVX-512"));
      const Shape ys = k.y_shape();
      const Conv2dShape s{1, k.C, k.H, k.W, k.K, 3, 3, ys[2], ys[3], k.params};
      ASSERT_TRUE(cpu::implicit_weight_grad_applies(s));
      const std::int64_t crs = s.C * 9, pq = s.P * s.Q;
      const auto x = random_values(std::size_t(numel_of(k.x_shape())), 1501);
      const auto gy = random_values(std::size_t(s.K * pq), 1503);
      const auto start = random_values(std::size_t(crs * s.K), 1504);
      const std::vector<float> col = patch_matrix(x, s);
      std::vector<float> scratch(std::size_t(cpu::implicit_weight_grad_scratch(s)));
      for (bool first : {true, false}) {
        SCOPED_TRACE(first ? "assigned" : "added");
        std::vector<float> gemm = start, implicit = start;  // [C*9, K]
        cpu::gemm<float>(false, true, crs, s.K, pq, 1.0f, col.data(), pq, gy.data(), pq,
                         first ? 0.0f : 1.0f, gemm.data(), s.K);
        cpu::implicit_weight_grad(x.data(), gy.data(), implicit.data(), first, scratch.data(), s);
        EXPECT_EQ(std::memcmp(implicit.data(), gemm.data(), gemm.size() * sizeof(float)), 0);
        // Control: the last gradient value 0.1% off changes the bits the comparison sees.
        std::vector<float> nudged = gy, off = start;
        nudged.back() *= 1.001f;
        cpu::implicit_weight_grad(x.data(), nudged.data(), off.data(), first, scratch.data(), s);
        EXPECT_NE(std::memcmp(off.data(), gemm.data(), gemm.size() * sizeof(float)), 0)
            << "control";
      }
    }
  }
  if (isas_run == 0) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512";
}

TEST(Conv2dImplicitWeightGrad, Avx512GivesTheAvx2Bits) {
  if (!gemm_isa_supported(GemmIsa::Avx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  const RestoreGemmIsa restore;
  const ConvCase k{"C32_K64_14x14", 3, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)};
  const auto xv = random_values(std::size_t(numel_of(k.x_shape())), 1511);
  const auto wv = random_values(std::size_t(numel_of(k.w_shape())), 1512);
  const auto gyv = random_values(std::size_t(numel_of(k.y_shape())), 1513);
  auto grad_weight = [&](GemmIsa isa) {
    set_gemm_isa(isa);
    Tensor gw = Tensor::zeros(k.w_shape(), cpu());
    conv2d_backward(Tensor(), gw, Tensor(), Tensor::from_host<float>(gyv, k.y_shape(), cpu()),
                    Tensor::from_host<float>(xv, k.x_shape(), cpu()),
                    Tensor::from_host<float>(wv, k.w_shape(), cpu()), k.params, cpu());
    return gw.to_host<float>(cpu());
  };
  const std::vector<float> avx2 = grad_weight(GemmIsa::Avx2);
  const std::vector<float> avx512 = grad_weight(GemmIsa::Avx512);
  EXPECT_EQ(std::memcmp(avx2.data(), avx512.data(), avx2.size() * sizeof(float)), 0);
}

// --- the CPU backward's image groups -------------------------------------------
//
// The CPU backward sums the weight gradient over fixed groups of images whatever
// the thread count, and each image's input gradient does not depend on its group:
// 1, 2 and 3 threads, a tower's share of the pool, and a second run give the same
// bits, for batches that leave uneven groups.
TEST(Conv2dBackwardGroups, SameBitsForAnyThreadCount) {
  for (const ConvCase& k :
       {ConvCase{"3x3_batch150", 150, 8, 9, 9, 12, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"3x3_K32_batch37", 37, 3, 7, 7, 32, 3, 3, make_params(1, 1, 1, 1)},
        ConvCase{"1x1_batch37", 37, 16, 6, 6, 20, 1, 1, make_params(1, 1, 0, 0)}}) {
    SCOPED_TRACE(k.name);
    const Shape ys = k.y_shape();
    const auto xv = random_values(std::size_t(numel_of(k.x_shape())), 1101);
    const auto wv = random_values(std::size_t(numel_of(k.w_shape())), 1102);
    const auto gv = random_values(std::size_t(numel_of(ys)), 1103);
    const auto sx = random_values(xv.size(), 1104), sw = random_values(wv.size(), 1105);
    // grad_x then grad_weight, both added to sentinels.
    auto run = [&](const std::vector<float>& grad_y) {
      const cpu::ScopedConv2dAlgorithm im2col(cpu::Conv2dAlgorithm::Im2col);
      auto put = [](const std::vector<float>& v, const Shape& shape) {
        return Tensor::from_host<float>(v, shape, cpu());
      };
      Tensor grad_x = put(sx, k.x_shape()), grad_w = put(sw, k.w_shape());
      conv2d_backward(grad_x, grad_w, Tensor(), put(grad_y, ys), put(xv, k.x_shape()),
                      put(wv, k.w_shape()), k.params, cpu());
      std::vector<float> all = grad_x.to_host<float>(cpu());
      const std::vector<float> gw = grad_w.to_host<float>(cpu());
      all.insert(all.end(), gw.begin(), gw.end());
      return all;
    };
    const int saved = num_threads();
    set_num_threads(1);
    const std::vector<float> one = run(gv);
    auto same_bits = [&](const std::vector<float>& many) {
      return many.size() == one.size() &&
             std::memcmp(many.data(), one.data(), one.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same_bits(run(gv))) << "one thread, run again";
    // Control: one grad_y value of the last image 0.1% off changes bits of both
    // gradients, and the comparison sees it.
    std::vector<float> nudged = gv;
    nudged.back() *= 1.001f;
    const std::vector<float> off = run(nudged);
    EXPECT_FALSE(same_bits(off)) << "the control";
    EXPECT_NE(std::vector<float>(off.begin(), off.begin() + std::ptrdiff_t(sx.size())),
              std::vector<float>(one.begin(), one.begin() + std::ptrdiff_t(sx.size())))
        << "the control's grad_x";
    EXPECT_NE(std::vector<float>(off.begin() + std::ptrdiff_t(sx.size()), off.end()),
              std::vector<float>(one.begin() + std::ptrdiff_t(sx.size()), one.end()))
        << "the control's grad_weight";
    set_num_threads(2);
    EXPECT_TRUE(same_bits(run(gv))) << "2 threads";
    set_num_threads(3);
    EXPECT_TRUE(same_bits(run(gv))) << "3 threads";
    {
      const ThreadShare share(0, 2);
      EXPECT_TRUE(same_bits(run(gv))) << "a tower's share of 2 of 3 threads";
    }
    set_num_threads(saved);
  }
}

// --- Winograd F(2x2, 3x3) on the CPU -------------------------------------------
//
// Winograd rounds differently from im2col: its transforms add and subtract inputs
// before the products (Bᵀ d B sums up to 4 of them, G g Gᵀ up to 9, Aᵀ m A up to 9
// products), so its error is bounded not by the result but by the sum of the
// magnitudes of the result's terms, sum |w||x| (+ |b|, + |sentinel|), times a few
// unit roundoffs u = 2^-24 (F(2,3) is the Winograd tile with the smallest
// transforms: about 2x to 4x the direct convolution's error). The cases below stay
// under 5 u (im2col: under 4 u); the tolerance is 32 u. One input 1% off in one
// tile (a tile that read a wrong pixel, a transform coefficient off) moves a result
// by more than that (the controls below), so the check would catch a wrong tile.
constexpr double kWinogradTolerance = 32.0 / (1 << 24);

std::vector<ConvCase> winograd_cases() {
  return {
      {"even_pad1", 2, 16, 14, 14, 32, 3, 3, make_params(1, 1, 1, 1)},
      {"odd_pad1", 3, 5, 13, 11, 7, 3, 3, make_params(1, 1, 1, 1)},
      {"odd_pad0_no_bias", 1, 3, 9, 12, 4, 3, 3, make_params(1, 1, 0, 0), false},
      {"even_pad0", 2, 20, 10, 8, 17, 3, 3, make_params(1, 1, 0, 0)},
      {"pad1x0", 1, 4, 7, 6, 5, 3, 3, make_params(1, 1, 1, 0)},
      {"one_partial_tile", 1, 2, 3, 3, 3, 3, 3, make_params(1, 1, 0, 0)},
      {"one_row_pad1", 3, 3, 1, 2, 2, 3, 3, make_params(1, 1, 1, 1)},
      {"fashion2_two_blocks", 2, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)},
      {"C67_K130_two_blocks", 2, 67, 9, 9, 130, 3, 3, make_params(1, 1, 1, 1)},
  };
}

std::vector<double> magnitudes(const std::vector<float>& v) {
  std::vector<double> m(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) m[i] = std::fabs(double(v[i]));
  return m;
}

// The largest |actual - expected| / scale.
double worst_error(const std::vector<float>& actual, const std::vector<double>& expected,
                   const std::vector<double>& scale) {
  EXPECT_EQ(actual.size(), expected.size());
  double worst = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    worst = std::max(worst, std::fabs(double(actual[i]) - expected[i]) / scale[i]);
  }
  return worst;
}

// y from the forward and grad_x from the backward-data (added to `sentinel`) on the
// CPU, under `algorithm`.
struct ConvOutputs {
  std::vector<float> y, grad_x;
};
ConvOutputs run_cpu(const ConvCase& k, const std::vector<float>& xv, const std::vector<float>& wv,
                    const std::vector<float>& bv, const std::vector<float>& gv,
                    const std::vector<float>& sentinel, cpu::Conv2dAlgorithm algorithm) {
  const cpu::ScopedConv2dAlgorithm scoped(algorithm);
  auto put = [](const std::vector<float>& v, const Shape& shape) {
    return Tensor::from_host<float>(v, shape, cpu());
  };
  const Shape ys = k.y_shape();
  Tensor y = put(std::vector<float>(std::size_t(numel_of(ys)), 7.0f), ys);
  conv2d_forward(y, put(xv, k.x_shape()), put(wv, k.w_shape()), k.bias ? put(bv, {k.K}) : Tensor(),
                 k.params, cpu());
  Tensor grad_x = put(sentinel, k.x_shape());
  conv2d_backward(grad_x, Tensor(), Tensor(), put(gv, ys), put(xv, k.x_shape()),
                  put(wv, k.w_shape()), k.params, cpu());
  return {y.to_host<float>(cpu()), grad_x.to_host<float>(cpu())};
}

// The reference values of one case and the magnitude sums that scale its tolerance.
struct WinogradCase {
  ConvCase k;
  std::vector<float> xv, wv, bv, gv, sentinel;
  std::vector<double> y, grad_x, y_scale, grad_x_scale;

  WinogradCase(const ConvCase& c, unsigned seed) : k(c) {
    xv = random_values(std::size_t(numel_of(k.x_shape())), seed);
    wv = random_values(std::size_t(numel_of(k.w_shape())), seed + 1);
    bv = random_values(std::size_t(k.K), seed + 2);
    gv = random_values(std::size_t(numel_of(k.y_shape())), seed + 3);
    sentinel = random_values(xv.size(), seed + 4);
    const Reference ref = reference(k, widen(xv), widen(wv), widen(bv), widen(gv));
    const Reference abs =
        reference(k, magnitudes(xv), magnitudes(wv), magnitudes(bv), magnitudes(gv));
    y = ref.y;
    y_scale = abs.y;
    for (std::size_t i = 0; i < xv.size(); ++i) {
      grad_x.push_back(double(sentinel[i]) + ref.grad_x[i]);
      grad_x_scale.push_back(std::fabs(double(sentinel[i])) + abs.grad_x[i]);
    }
  }
  ConvOutputs run(cpu::Conv2dAlgorithm algorithm) const {
    return run_cpu(k, xv, wv, bv, gv, sentinel, algorithm);
  }
};

TEST(Conv2dWinograd, MatchesReferenceWithinTheTermMagnitudes) {
  unsigned seed = 900;
  for (const ConvCase& k : winograd_cases()) {
    SCOPED_TRACE(k.name);
    const WinogradCase c(k, seed += 10);
    const ConvOutputs winograd = c.run(cpu::Conv2dAlgorithm::Winograd);
    const double y_error = worst_error(winograd.y, c.y, c.y_scale);
    const double gx_error = worst_error(winograd.grad_x, c.grad_x, c.grad_x_scale);
    EXPECT_LE(y_error, kWinogradTolerance) << "y";
    EXPECT_LE(gx_error, kWinogradTolerance) << "grad_x";
    // The Winograd path really ran: its bits differ from im2col's somewhere.
    const ConvOutputs im2col = c.run(cpu::Conv2dAlgorithm::Im2col);
    if (k.C * k.K >= 64) {
      EXPECT_NE(winograd.y, im2col.y);
      EXPECT_NE(winograd.grad_x, im2col.grad_x);
    }
    // The errors go into the test's XML record (--gtest_output=xml), not the log.
    std::ostringstream errors;
    errors << std::scientific << std::setprecision(2) << "y " << y_error << ", grad_x " << gx_error
           << " (im2col: " << worst_error(im2col.y, c.y, c.y_scale) << ", "
           << worst_error(im2col.grad_x, c.grad_x, c.grad_x_scale) << ")";
    RecordProperty("worst_error_" + k.name, errors.str());
  }
}

// Controls: one input value 1% off in one tile fails the same check.
TEST(Conv2dWinograd, ToleranceCatchesOneWrongTile) {
  const WinogradCase c({"fashion2", 2, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 990);
  WinogradCase wrong_x = c, wrong_g = c;
  const std::size_t pixel = (1 * 32 + 7) * 14 * 14 + 5 * 14 + 9;  // n 1, c 7, (5, 9)
  wrong_x.xv[pixel] *= 1.01f;
  wrong_g.gv[pixel] *= 1.01f;  // grad_y [2,64,14,14]: n 0, k 39, (5, 9)
  const ConvOutputs right = c.run(cpu::Conv2dAlgorithm::Winograd);
  EXPECT_LE(worst_error(right.y, c.y, c.y_scale), kWinogradTolerance);
  EXPECT_LE(worst_error(right.grad_x, c.grad_x, c.grad_x_scale), kWinogradTolerance);
  EXPECT_GT(worst_error(wrong_x.run(cpu::Conv2dAlgorithm::Winograd).y, c.y, c.y_scale),
            kWinogradTolerance);
  EXPECT_GT(
      worst_error(wrong_g.run(cpu::Conv2dAlgorithm::Winograd).grad_x, c.grad_x, c.grad_x_scale),
      kWinogradTolerance);
}

// The tile blocks depend on the shape alone: 1, 2 and 3 threads, a tower's share of
// the pool, and a second run give the same bits.
// The transforms have AVX-512 code (sixteen tiles a vector across tile rows, the
// last group masked) and AVX2 code (eight tiles of one tile row a vector, a row's
// last pixels stored 4, 2 and 1 at a time); both must give the same bits, forward
// (bias + the tile) and backward-data (added into grad_x), with an odd P and Q (a
// last tile row and column cut in half) and rows of more than sixteen pixels.
TEST(Conv2dWinograd, Avx512GivesTheAvx2Bits) {
  if (!gemm_isa_supported(GemmIsa::Avx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  const RestoreGemmIsa restore;
  for (const WinogradCase& c :
       {WinogradCase({"fashion2_b3", 3, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 997),
        WinogradCase({"odd_wide", 2, 16, 9, 37, 17, 3, 3, make_params(1, 1, 0, 1)}, 998),
        // Padding 0 across: backward-data's correlation pads 2 columns, masked off
        // from the AVX-512 input transform's loads.
        WinogradCase({"pad_w0", 2, 24, 10, 19, 20, 3, 3, make_params(1, 1, 1, 0)}, 999)}) {
    auto run = [&](GemmIsa isa) {
      set_gemm_isa(isa);
      const ConvOutputs out = c.run(cpu::Conv2dAlgorithm::Winograd);
      std::vector<float> all = out.y;
      all.insert(all.end(), out.grad_x.begin(), out.grad_x.end());
      return all;
    };
    const std::vector<float> avx2 = run(GemmIsa::Avx2), avx512 = run(GemmIsa::Avx512);
    ASSERT_EQ(avx512.size(), avx2.size());
    EXPECT_EQ(std::memcmp(avx512.data(), avx2.data(), avx2.size() * sizeof(float)), 0);
  }
}

TEST(Conv2dWinograd, SameBitsForAnyThreadCount) {
  const WinogradCase c({"fashion2_b5", 5, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 995);
  const int saved = num_threads();
  auto run = [&] {
    const ConvOutputs out = c.run(cpu::Conv2dAlgorithm::Winograd);
    std::vector<float> all = out.y;
    all.insert(all.end(), out.grad_x.begin(), out.grad_x.end());
    return all;
  };
  set_num_threads(1);
  const std::vector<float> one = run();
  auto expect_as_one = [&](const std::vector<float>& many, const char* how) {
    ASSERT_EQ(many.size(), one.size());
    EXPECT_EQ(std::memcmp(many.data(), one.data(), one.size() * sizeof(float)), 0)
        << "results with " << how << " differ from one thread";
  };
  expect_as_one(run(), "one thread, run again");
  set_num_threads(2);
  expect_as_one(run(), "2 threads");
  set_num_threads(3);
  expect_as_one(run(), "3 threads");
  {
    const ThreadShare share(0, 2);
    expect_as_one(run(), "a tower's share of 2 of 3 threads");
  }
  set_num_threads(saved);
}

// Auto takes Winograd for the forward of FashionNet's second layer and im2col for
// its backward-data, for its first layer (C = 1) and for shapes Winograd cannot do;
// a forced Winograd lowers those shapes too.
TEST(Conv2dWinograd, AutoPicksByShape) {
  const WinogradCase conv2({"fashion2", 1, 32, 14, 14, 64, 3, 3, make_params(1, 1, 1, 1)}, 1001);
  const ConvOutputs automatic = conv2.run(cpu::Conv2dAlgorithm::Auto);
  const ConvOutputs winograd = conv2.run(cpu::Conv2dAlgorithm::Winograd);
  const ConvOutputs im2col = conv2.run(cpu::Conv2dAlgorithm::Im2col);
  EXPECT_EQ(automatic.y, winograd.y);
  EXPECT_NE(automatic.y, im2col.y);
  EXPECT_EQ(automatic.grad_x, winograd.grad_x);
  EXPECT_NE(automatic.grad_x, im2col.grad_x);
  for (const ConvCase& k : {ConvCase{"fashion1", 2, 1, 28, 28, 32, 3, 3, make_params(1, 1, 1, 1)},
                            ConvCase{"stride2", 1, 32, 9, 9, 32, 3, 3, make_params(2, 2, 1, 1)},
                            ConvCase{"pad2", 1, 32, 9, 9, 32, 3, 3, make_params(1, 1, 2, 2)}}) {
    SCOPED_TRACE(k.name);
    const WinogradCase c(k, 1002);
    const ConvOutputs im2col = c.run(cpu::Conv2dAlgorithm::Im2col);
    EXPECT_EQ(c.run(cpu::Conv2dAlgorithm::Auto).y, im2col.y);
    if (k.C > 1) EXPECT_EQ(c.run(cpu::Conv2dAlgorithm::Winograd).y, im2col.y);
  }
}

}  // namespace
}  // namespace towerlab::testing
