// CUDA conv2d on the tensor cores (contracts and dimension letters in
// kernels/conv2d.h; the entry points in kernels/cuda/conv2d.h): bfloat16 or
// float16 operands, or float32 ones rounded to TF32, with float32 sums. The float32
// kernels' three problems (kernels/cuda/conv2d_problems.cuh) over the operands'
// Stored values, on tc_gemm_kernel (kernels/cuda/conv2d_tc.cuh) instantiated for
// each operand type: every shape, stride, padding and dilation, the C = 1 layers
// included (no direct kernels, no Winograd). The weight gradient's reduction is
// split as the float32 kernel's is (split_weight_gemm).
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

// 128x32 (4 warps of 32x32) where the GEMM's columns are at most 32 (ResNet-20's
// 16- and 32-channel layers, FashionNet's conv1), else 64x64 (4 warps of 32x32).
// MIN_BLOCKS 4: 128 registers a thread at most, 20 or 16 KiB of shared memory a block.
using TcNarrow = TcTile<4, 1, 2, 4, 4>;
using TcSquare = TcTile<2, 2, 2, 4, 4>;

// The Stored values of an operand tensor, for the operand type kInput.
template <TcInput kInput>
const typename tc::TcValues<kInput>::Stored* stored(const Tensor& t) {
  return static_cast<const typename tc::TcValues<kInput>::Stored*>(t.raw_data());
}

template <TcInput kInput, class T, class Problem>
void launch_tc(const Problem& problem, int splits, int k_per_split, cudaStream_t stream) {
  const dim3 grid(ceil_div(problem.M, T::BM), ceil_div(problem.Ncols, T::BN), splits);
  TL_CHECK(grid.y <= 65535 && grid.z <= 65535, NotSupported,
           "conv2d: " << problem.Ncols << " GEMM columns need " << grid.y
                      << " column tiles; the CUDA kernels handle at most 65535");
  tc_gemm_kernel<Problem, T, kInput><<<grid, T::kThreads, 0, stream>>>(problem, k_per_split);
  TL_CUDA_CHECK_LAUNCH();
}

// Forward and backward-data: rows are pixels, columns channels; one split.
template <TcInput kInput, class Problem>
void launch_tc_pixel_rows(const Problem& problem, cudaStream_t stream) {
  if (problem.Ncols <= TcNarrow::BN) {
    launch_tc<kInput, TcNarrow>(problem, 1, problem.Kred, stream);
  } else {
    launch_tc<kInput, TcSquare>(problem, 1, problem.Kred, stream);
  }
}

template <TcInput kInput>
void forward(const Dims& d, float* y, const Tensor& x, const Tensor& weight, const float* bias,
             cudaStream_t stream) {
  ForwardProblem<typename tc::TcValues<kInput>::Stored> problem{};
  problem.d = d;
  problem.x = stored<kInput>(x);
  problem.weight = stored<kInput>(weight);
  problem.bias = bias;
  problem.y = y;
  problem.M = d.N * d.PQ, problem.Ncols = d.K, problem.Kred = d.CRS;
  launch_tc_pixel_rows<kInput>(problem, stream);
}

template <TcInput kInput>
void backward_data(const Dims& d, float* grad_x, const Tensor& grad_y, const Tensor& weight,
                   cudaStream_t stream) {
  BackwardDataProblem<typename tc::TcValues<kInput>::Stored> problem{};
  problem.d = d;
  problem.grad_y = stored<kInput>(grad_y);
  problem.weight = stored<kInput>(weight);
  problem.grad_x = grad_x;
  problem.M = d.N * d.HW, problem.Ncols = d.C, problem.Kred = d.K * d.RS;
  launch_tc_pixel_rows<kInput>(problem, stream);
}

// Rows are output channels (K), columns taps (C*R*S), the reduction every (image,
// pixel): split as the float32 kernel's is, in whole steps.
template <TcInput kInput>
void backward_weight(const Dims& d, float* grad_weight, const Tensor& grad_y, const Tensor& x,
                     int sms, const Stream& stream) {
  using Problem = BackwardWeightProblem<typename tc::TcValues<kInput>::Stored>;
  Problem problem{};
  problem.d = d;
  problem.grad_y = stored<kInput>(grad_y);
  problem.x = stored<kInput>(x);
  problem.grad_weight = grad_weight;
  problem.partial = nullptr;
  problem.M = d.K, problem.Ncols = d.CRS, problem.Kred = d.N * d.PQ;
  using T = TcSquare;
  const std::int64_t tiles = std::int64_t{ceil_div(d.K, T::BM)} * ceil_div(d.CRS, T::BN);
  split_weight_gemm(problem, tiles, tc::TcValues<kInput>::kStepK, T::kMinBlocks, sms, stream,
                    [&](const Problem& split_problem, int splits, int k_per_split) {
                      launch_tc<kInput, T>(split_problem, splits, k_per_split, native(stream));
                    });
}

// run.template operator()<kInput>() for the operands' dtype: bfloat16, float16, or
// float32 multiplied in TF32.
template <class Run>
void for_operands(DType dtype, Run run) {
  switch (dtype) {
    case DType::BFloat16:
      run.template operator()<TcInput::BFloat16>();
      break;
    case DType::Float16:
      run.template operator()<TcInput::Float16>();
      break;
    default:
      TL_CHECK(dtype == DType::Float32, NotSupported,
               "conv2d: the tensor cores take bfloat16, float16 or float32 operands, not "
                   << dtype_name(dtype));
      run.template operator()<TcInput::Tf32>();
  }
}

}  // namespace

void conv2d_tc_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const Conv2dShape& shape, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  for_operands(x.dtype(), [&]<TcInput kInput>() {
    forward<kInput>(make_dims(shape), y.data<float>(), x, weight,
                    bias.defined() ? bias.data<float>() : nullptr, native(stream));
  });
}

void conv2d_tc_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_y,
                        const Tensor& x, const Tensor& weight, const Conv2dShape& shape,
                        const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  const Dims d = make_dims(shape);
  for_operands(grad_y.dtype(), [&]<TcInput kInput>() {
    if (grad_x.defined())
      backward_data<kInput>(d, grad_x.data<float>(), grad_y, weight, native(stream));
    if (grad_weight.defined()) {
      backward_weight<kInput>(d, grad_weight.data<float>(), grad_y, x,
                              sm_count(stream.device().index), stream);
    }
  });
}

}  // namespace towerlab::cuda
