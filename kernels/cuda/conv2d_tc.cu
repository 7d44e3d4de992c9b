// CUDA conv2d on the tensor cores (contracts and dimension letters in
// kernels/conv2d.h; the entry points in kernels/cuda/conv2d.h): bfloat16 or
// float16 operands with float32 sums. The float32 kernels' three problems
// (kernels/cuda/conv2d_problems.cuh) over 16-bit bits, on tc_gemm_kernel
// (kernels/cuda/conv2d_tc.cuh): every shape, stride, padding and dilation, the
// C = 1 layers included (no direct kernels, no Winograd). The weight gradient's
// reduction is split as the float32 kernel's is (split_weight_gemm).
#include <cstdint>

#include "kernels/cuda/conv2d.h"
#include "kernels/cuda/conv2d_problems.cuh"
#include "kernels/cuda/conv2d_tc.cuh"
#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda {

namespace {

using conv2d_gemm::BackwardDataProblem;
using conv2d_gemm::BackwardWeightProblem;
using conv2d_gemm::ceil_div;
using conv2d_gemm::Dims;
using conv2d_gemm::ForwardProblem;
using conv2d_gemm::make_dims;
using conv2d_gemm::split_weight_gemm;
using conv2d_gemm::tc_gemm_kernel;
using conv2d_gemm::TcTile;

using Bits = std::uint16_t;

// 128x32 (4 warps of 32x32) where the GEMM's columns are at most 32 (ResNet-20's
// 16- and 32-channel layers, FashionNet's conv1), else 64x64 (4 warps of 32x32).
// MIN_BLOCKS 4: 128 registers a thread at most, 20 or 16 KiB of shared memory a block.
using TcNarrow = TcTile<4, 1, 2, 4, 4>;
using TcSquare = TcTile<2, 2, 2, 4, 4>;

const Bits* bits(const Tensor& t) {
  return static_cast<const Bits*>(t.raw_data());
}

template <class Problem, class T>
void launch_tc(const Problem& problem, bool bf16, int splits, int k_per_split,
               cudaStream_t stream) {
  const dim3 grid(ceil_div(problem.M, T::BM), ceil_div(problem.Ncols, T::BN), splits);
  TL_CHECK(grid.y <= 65535 && grid.z <= 65535, NotSupported,
           "conv2d: " << problem.Ncols << " GEMM columns need " << grid.y
                      << " column tiles; the CUDA kernels handle at most 65535");
  const auto kernel = bf16 ? tc_gemm_kernel<Problem, T, true> : tc_gemm_kernel<Problem, T, false>;
  kernel<<<grid, T::kThreads, 0, stream>>>(problem, k_per_split);
  TL_CUDA_CHECK_LAUNCH();
}

// Forward and backward-data: rows are pixels, columns channels; one split.
template <class Problem>
void launch_tc_pixel_rows(const Problem& problem, bool bf16, cudaStream_t stream) {
  if (problem.Ncols <= TcNarrow::BN) {
    launch_tc<Problem, TcNarrow>(problem, bf16, 1, problem.Kred, stream);
  } else {
    launch_tc<Problem, TcSquare>(problem, bf16, 1, problem.Kred, stream);
  }
}

void forward_16bit(const Dims& d, float* y, const Bits* x, const Bits* weight, const float* bias,
                   bool bf16, cudaStream_t stream) {
  ForwardProblem<Bits> problem{};
  problem.d = d;
  problem.x = x;
  problem.weight = weight;
  problem.bias = bias;
  problem.y = y;
  problem.M = d.N * d.PQ, problem.Ncols = d.K, problem.Kred = d.CRS;
  launch_tc_pixel_rows(problem, bf16, stream);
}

void backward_data_16bit(const Dims& d, float* grad_x, const Bits* grad_y, const Bits* weight,
                         bool bf16, cudaStream_t stream) {
  BackwardDataProblem<Bits> problem{};
  problem.d = d;
  problem.grad_y = grad_y;
  problem.weight = weight;
  problem.grad_x = grad_x;
  problem.M = d.N * d.HW, problem.Ncols = d.C, problem.Kred = d.K * d.RS;
  launch_tc_pixel_rows(problem, bf16, stream);
}

// Rows are output channels (K), columns taps (C*R*S), the reduction every (image,
// pixel): split as the float32 kernel's is.
void backward_weight_16bit(const Dims& d, float* grad_weight, const Bits* grad_y, const Bits* x,
                           bool bf16, int sms, const Stream& stream) {
  BackwardWeightProblem<Bits> problem{};
  problem.d = d;
  problem.grad_y = grad_y;
  problem.x = x;
  problem.grad_weight = grad_weight;
  problem.partial = nullptr;
  problem.M = d.K, problem.Ncols = d.CRS, problem.Kred = d.N * d.PQ;
  using T = TcSquare;
  const std::int64_t tiles = std::int64_t{ceil_div(d.K, T::BM)} * ceil_div(d.CRS, T::BN);
  split_weight_gemm(
      problem, tiles, tc::kStepK, T::kMinBlocks, sms, stream,
      [&](const BackwardWeightProblem<Bits>& split_problem, int splits, int k_per_split) {
        launch_tc<BackwardWeightProblem<Bits>, T>(split_problem, bf16, splits, k_per_split,
                                                  native(stream));
      });
}

}  // namespace

void conv2d_tc_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const Conv2dShape& shape, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  forward_16bit(make_dims(shape), y.data<float>(), bits(x), bits(weight),
                bias.defined() ? bias.data<float>() : nullptr, x.dtype() == DType::BFloat16,
                native(stream));
}

void conv2d_tc_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_y,
                        const Tensor& x, const Tensor& weight, const Conv2dShape& shape,
                        const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  const Dims d = make_dims(shape);
  const bool bf16 = grad_y.dtype() == DType::BFloat16;
  if (grad_x.defined()) {
    backward_data_16bit(d, grad_x.data<float>(), bits(grad_y), bits(weight), bf16, native(stream));
  }
  if (grad_weight.defined()) {
    backward_weight_16bit(d, grad_weight.data<float>(), bits(grad_y), bits(x), bf16,
                          sm_count(stream.device().index), stream);
  }
}

}  // namespace towerlab::cuda
