// conv2d forward, backward-data and backward-weight (and on the CPU both gradients
// in one call) on the FashionNet layers (conv 1->32 and 32->64, 3x3, padding 1, on
// 28x28 and 14x14), ResNet-20's three stride-1 layers (16, 32 and 64 channels on
// 32x32, 16x16 and 8x8), ResNet-20 on Fashion-MNIST as one of two CPU towers trains
// it (batch 64: 16 channels at 28x28, 32 at 14x14, 64 at 7x7, the stride-2 3x3 layers
// and 1x1 projections between the stages) and 3x3 layers of 64-256 channels at
// 56x56 / 28x28, counted in FLOP/s (2*N*K*P*Q*C*R*S per pass).
//
// References, measured in the same run:
//   CUDA: cuDNN (when TOWERLAB_HAVE_CUDNN) with the fastest algorithm cudnnFind*
//         returns under CUDNN_FMA_MATH, i.e. FP32 without TF32 tensor cores (the
//         case's label names it). Target:
//         towerlab >= 80% of cuDNN on every layer here. GPU time is taken with CUDA
//         events around back-to-back calls (bench::time_calls), for both.
//         bfloat16 (cuda_bf16 beside cudnn_bf16): x, weight and grad_y in bfloat16 on
//         the tensor cores; towerlab writes y and the gradients in float32 (its
//         contract), cuDNN in bfloat16 (its BF16 convolutions' only output type),
//         with float32 accumulation and the fastest algorithm of any math type.
//   CPU:  OpenBLAS (when TOWERLAB_HAVE_CBLAS) doing the same im2col + SGEMM per image
//         for the forward: the best the im2col lowering can do with a tuned GEMM.
//         Run with OPENBLAS_NUM_THREADS=2 and OPENBLAS_CORETYPE set to the host
//         (SkylakeX on AVX-512; on AVX2-only hosts that dies with SIGILL: Haswell or Zen).
//         The end-to-end CPU target is PyTorch's speed on FashionNet, measured elsewhere.
//         Every pass also runs with im2col (the weight gradient's implicit GEMM where
//         it applies) and with Winograd forced (cpu_im2col, cpu_winograd; the forward
//         and backward-data in each tile, cpu_winograd_f2x2 and cpu_winograd_f4x4):
//         the plain "cpu" case is what the dispatch picks (bench/results/winograd.md).
//         bfloat16 operands run as cpu_bf16 (what the dispatch picks: the bfloat16 GEMM
//         path where the CPU's bfloat16 GEMM runs vdpbf16ps and the float32 paths
//         would lower), cpu_bf16_im2col (that path forced) and cpu_bf16_widen
//         (widened to float32, the float32 algorithms). On CUDA,
//         the layers where Auto takes Winograd F(4x4,3x3) also run with the implicit
//         GEMM forced (cuda_implicit).
#include <benchmark/benchmark.h>

#include "bench_util.h"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/winograd.h"
#include "towerlab.h"

#if TOWERLAB_HAVE_CBLAS
#include <cblas.h>
#endif
#if TOWERLAB_WITH_CUDA
#include <cuda_runtime.h>
#endif
#if TOWERLAB_HAVE_CUDNN
#include <cudnn.h>

#include "cudnn_check.h"
#endif

using namespace towerlab;

namespace {

struct Layer {
  const char* name;
  std::int64_t N, C, H, W, K;
  bool on_cpu;              // small enough to time on the 2-core machines
  std::int64_t R = 3;       // an R x R kernel (3 or 1), padding R / 2
  std::int64_t stride = 1;  // both ways

  std::int64_t pad() const { return R / 2; }
  std::int64_t P() const { return (H + 2 * pad() - R) / stride + 1; }
  std::int64_t Q() const { return (W + 2 * pad() - R) / stride + 1; }
  Conv2dParams params() const { return {stride, stride, pad(), pad(), 1, 1}; }
};

const Layer kLayers[] = {
    {"fashion1_b32", 32, 1, 28, 28, 32, true},
    {"fashion1_b64", 64, 1, 28, 28, 32, true},  // one of two CPU towers at batch 128
    {"fashion1_b128", 128, 1, 28, 28, 32, true},
    {"fashion2_b32", 32, 32, 14, 14, 64, true},
    {"fashion2_b64", 64, 32, 14, 14, 64, true},
    {"fashion2_b128", 128, 32, 14, 14, 64, true},
    {"fashion1_b512", 512, 1, 28, 28, 32, false},
    {"fashion2_b512", 512, 32, 14, 14, 64, false},
    {"resnet16_b128", 128, 16, 32, 32, 16, false},  // ResNet-20's three stages
    {"resnet32_b128", 128, 32, 16, 16, 32, false},
    {"resnet64_b128", 128, 64, 8, 8, 64, false},
    {"resnet20_16_b64", 64, 16, 28, 28, 16, true},  // Fashion-MNIST, one of two CPU towers
    {"resnet20_32_b64", 64, 32, 14, 14, 32, true},
    {"resnet20_64_b64", 64, 64, 7, 7, 64, true},
    {"resnet20_16to32_s2_b64", 64, 16, 28, 28, 32, true, 3, 2},
    {"resnet20_16to32_1x1s2_b64", 64, 16, 28, 28, 32, true, 1, 2},
    {"resnet20_32to64_s2_b64", 64, 32, 14, 14, 64, true, 3, 2},
    {"resnet20_32to64_1x1s2_b64", 64, 32, 14, 14, 64, true, 1, 2},
    {"c64_56x56_b32", 32, 64, 56, 56, 64, true},
    {"c128_28x28_b32", 32, 128, 28, 28, 128, false},
    {"c256_28x28_b64", 64, 256, 28, 28, 256, false},
    {"c64_56x56_b128", 128, 64, 56, 56, 64, false},
};

// Backward: both gradients in one call, as a training step asks for them.
enum class Pass { Forward, BackwardData, BackwardWeight, Backward };
const char* pass_name(Pass pass) {
  switch (pass) {
    case Pass::Forward:
      return "forward";
    case Pass::BackwardData:
      return "backward_data";
    case Pass::BackwardWeight:
      return "backward_weight";
    case Pass::Backward:
      return "backward";
  }
  return "?";
}

double flops(const Layer& l, Pass pass) {
  return (pass == Pass::Backward ? 2 : 1) * 2.0 * l.N * l.K * l.P() * l.Q() * l.C * l.R * l.R;
}

// x, weight and grad_y in `inputs` (drawn in float32, then rounded), y and the
// gradients in `outputs`.
struct Operands {
  Tensor x, weight, y, grad_y, grad_x, grad_weight;
  Operands(const Layer& l, const Stream& stream, DType inputs = DType::Float32,
           DType outputs = DType::Float32)
      : x(Tensor::empty({l.N, l.C, l.H, l.W}, stream)),
        weight(Tensor::empty({l.K, l.C, l.R, l.R}, stream)),
        y(Tensor::zeros({l.N, l.K, l.P(), l.Q()}, stream, outputs)),
        grad_y(Tensor::empty({l.N, l.K, l.P(), l.Q()}, stream)),
        grad_x(Tensor::zeros({l.N, l.C, l.H, l.W}, stream, outputs)),
        grad_weight(Tensor::zeros({l.K, l.C, l.R, l.R}, stream, outputs)) {
    random_uniform(x, 1, 0, -1.0f, 1.0f, stream);
    random_uniform(weight, 2, 0, -0.1f, 0.1f, stream);
    random_uniform(grad_y, 3, 0, -1.0f, 1.0f, stream);
    if (inputs != DType::Float32) {
      x = cast(x, inputs, stream);
      weight = cast(weight, inputs, stream);
      grad_y = cast(grad_y, inputs, stream);
    }
  }
};

void run_towerlab(Pass pass, const Layer& l, const Operands& o, const Stream& stream) {
  const Conv2dParams kParams = l.params();
  switch (pass) {
    case Pass::Forward:
      conv2d_forward(o.y, o.x, o.weight, Tensor(), kParams, stream);
      break;
    case Pass::BackwardData:
      conv2d_backward(o.grad_x, Tensor(), Tensor(), o.grad_y, o.x, o.weight, kParams, stream);
      break;
    case Pass::BackwardWeight:
      conv2d_backward(Tensor(), o.grad_weight, Tensor(), o.grad_y, o.x, o.weight, kParams, stream);
      break;
    case Pass::Backward:
      conv2d_backward(o.grad_x, o.grad_weight, Tensor(), o.grad_y, o.x, o.weight, kParams, stream);
      break;
  }
}

void set_counters(benchmark::State& state, const Layer& l, Pass pass) {
  state.counters["FLOP/s"] =
      benchmark::Counter(flops(l, pass), benchmark::Counter::kIsIterationInvariantRate);
}

// `inputs`: the dtype of x, weight and grad_y (y and the gradients are float32).
void BM_Towerlab(benchmark::State& state, Device device, Pass pass, Layer l, DType inputs) {
  if (device.is_cuda() && cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Stream stream(device);
  Operands o(l, stream, inputs);
  bench::time_calls(state, stream, [&] { run_towerlab(pass, l, o, stream); });
  set_counters(state, l, pass);
}

// The CUDA passes with the implicit GEMM forced, on the layers where Auto takes
// Winograd F(4x4,3x3) for a pass (kernels/cuda/conv2d_winograd.h: 32 channels one
// side and 64 the other, or more): what Winograd gains there.
void BM_CudaImplicitGemm(benchmark::State& state, Pass pass, Layer l) {
  const cpu::ScopedConv2dAlgorithm scoped(cpu::Conv2dAlgorithm::Im2col);
  BM_Towerlab(state, Device::cuda(0), pass, l, DType::Float32);
}

// The CPU passes with one algorithm forced (the plain "cpu" case takes what Auto
// picks): im2col + GEMM against Winograd (the tile Auto picks, and each tile forced
// for the forward and backward-data), side by side.
// FLOP/s counts the direct convolution's FLOPs for both, so it compares times.
// Argument: the threads (0: the pool's default). With one thread the CPU time is
// the whole work's, which a loaded machine disturbs less than the real time.
void BM_CpuAlgorithm(benchmark::State& state, Pass pass, Layer l, cpu::Conv2dAlgorithm algorithm,
                     cpu::WinogradTile tile) {
  const cpu::ScopedConv2dAlgorithm scoped(algorithm);
  const cpu::ScopedWinogradTile scoped_tile(tile);
  const int saved_threads = num_threads();
  set_num_threads(static_cast<int>(state.range(0)));
  Stream stream(Device::cpu());
  Operands o(l, stream);
  bench::time_calls(state, stream, [&] { run_towerlab(pass, l, o, stream); });
  set_counters(state, l, pass);
  set_num_threads(saved_threads);
}

// The CPU passes on bfloat16 x, weight and grad_y (y and the gradients float32),
// with the bfloat16 GEMM kernel `kernel`: Auto (where it runs vdpbf16ps, the
// bfloat16 GEMM path of kernels/cpu/conv2d.cpp where the dispatch takes it) or Widen
// (the operands widened to float32 and the float32 algorithms Auto picks), under
// `algorithm` (Im2col forces the bfloat16 GEMM path on every layer where it runs).
// Argument: the threads.
void BM_CpuBf16(benchmark::State& state, Pass pass, Layer l, Bf16GemmKernel kernel,
                cpu::Conv2dAlgorithm algorithm) {
  const cpu::ScopedConv2dAlgorithm scoped(algorithm);
  const Bf16GemmKernel saved_kernel = bf16_gemm_kernel();
  set_bf16_gemm_kernel(kernel);
  const int saved_threads = num_threads();
  set_num_threads(static_cast<int>(state.range(0)));
  Stream stream(Device::cpu());
  Operands o(l, stream, DType::BFloat16);
  bench::time_calls(state, stream, [&] { run_towerlab(pass, l, o, stream); });
  set_counters(state, l, pass);
  state.SetLabel(
      conv2d_multiplies_16bit(o.x.shape(), o.weight.shape(), DType::BFloat16, l.params(), stream)
          ? "bfloat16 GEMM path"
          : "widened to float32");
  set_num_threads(saved_threads);
  set_bf16_gemm_kernel(saved_kernel);
}

#if TOWERLAB_HAVE_CBLAS
// im2col of one image for a 3x3 kernel, padding 1, stride 1: col [C*9, H*W].
void im2col_3x3(float* col, const float* x, std::int64_t C, std::int64_t H, std::int64_t W) {
  for (std::int64_t c = 0; c < C; ++c)
    for (std::int64_t r = 0; r < 3; ++r)
      for (std::int64_t s = 0; s < 3; ++s) {
        float* row = col + ((c * 3 + r) * 3 + s) * H * W;
        for (std::int64_t p = 0; p < H; ++p)
          for (std::int64_t q = 0; q < W; ++q) {
            const std::int64_t h = p - 1 + r, w = q - 1 + s;
            row[p * W + q] = (h >= 0 && h < H && w >= 0 && w < W) ? x[(c * H + h) * W + w] : 0.0f;
          }
      }
}

void BM_OpenBlasForward(benchmark::State& state, Layer l) {
  const Stream& stream = default_stream(Device::cpu());
  Operands o(l, stream);
  std::vector<float> col(static_cast<std::size_t>(l.C * 9 * l.H * l.W));
  const int crs = static_cast<int>(l.C * 9), pq = static_cast<int>(l.H * l.W);
  for (auto _ : state) {
    for (std::int64_t n = 0; n < l.N; ++n) {
      im2col_3x3(col.data(), o.x.data<float>() + n * l.C * l.H * l.W, l.C, l.H, l.W);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(l.K), pq, crs, 1.0f,
                  o.weight.data<float>(), crs, col.data(), pq, 0.0f,
                  o.y.data<float>() + n * l.K * pq, pq);
    }
  }
  set_counters(state, l, Pass::Forward);
}
#endif

#if TOWERLAB_HAVE_CUDNN
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

// cuDNN descriptors for one layer: FP32 with FMA math only (no TF32), or BF16
// tensors with float32 accumulation and tensor-op math.
struct CudnnLayer {
  cudnnHandle_t handle = nullptr;
  cudnnTensorDescriptor_t x_desc = nullptr, y_desc = nullptr;
  cudnnFilterDescriptor_t w_desc = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;

  CudnnLayer(const Layer& l, const Stream& stream, bool bf16) {
    const cudnnDataType_t data = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    CUDNN_CHECK(cudnnCreate(&handle));
    CUDNN_CHECK(cudnnSetStream(handle, static_cast<cudaStream_t>(stream.native_handle())));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_desc));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_desc));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_desc));
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    const auto i = [](std::int64_t v) { return static_cast<int>(v); };
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_desc, CUDNN_TENSOR_NCHW, data, i(l.N), i(l.C), i(l.H),
                                           i(l.W)));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(y_desc, CUDNN_TENSOR_NCHW, data, i(l.N), i(l.K),
                                           i(l.P()), i(l.Q())));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_desc, data, CUDNN_TENSOR_NCHW, i(l.K), i(l.C), i(l.R),
                                           i(l.R)));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, i(l.pad()), i(l.pad()), i(l.stride),
                                                i(l.stride), 1, 1, CUDNN_CROSS_CORRELATION,
                                                CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionMathType(conv, bf16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
  }
  ~CudnnLayer() {
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroyFilterDescriptor(w_desc);
    cudnnDestroyTensorDescriptor(y_desc);
    cudnnDestroyTensorDescriptor(x_desc);
    cudnnDestroy(handle);
  }
  CudnnLayer(const CudnnLayer&) = delete;
  CudnnLayer& operator=(const CudnnLayer&) = delete;
};

// The descriptor's CUDNN_FMA_MATH is what the calls run with; cudnnFind* may label
// such results DEFAULT_MATH, never a tensor-op type, which would mean TF32.
bool fma_only(cudnnMathType_t math) {
  return math == CUDNN_FMA_MATH || math == CUDNN_DEFAULT_MATH;
}

// cuDNN's names of its algorithms, for the label of its cases.
template <std::size_t N>
const char* name_in(int algorithm, const char* const (&names)[N]) {
  return algorithm >= 0 && static_cast<std::size_t>(algorithm) < N ? names[algorithm] : "other";
}
const char* algorithm_name(cudnnConvolutionFwdAlgo_t a) {
  constexpr const char* kNames[] = {
      "implicit_gemm", "implicit_precomp_gemm", "gemm", "direct", "fft", "fft_tiling",
      "winograd",      "winograd_nonfused"};
  return name_in(a, kNames);
}
const char* algorithm_name(cudnnConvolutionBwdDataAlgo_t a) {
  constexpr const char* kNames[] = {"algo_0",     "algo_1",   "fft",
                                    "fft_tiling", "winograd", "winograd_nonfused"};
  return name_in(a, kNames);
}
const char* algorithm_name(cudnnConvolutionBwdFilterAlgo_t a) {
  constexpr const char* kNames[] = {
      "algo_0", "algo_1", "fft", "algo_3", "winograd", "winograd_nonfused", "fft_tiling"};
  return name_in(a, kNames);
}

// The fastest successful algorithm among cudnnFind*'s results (sorted by time): of
// FMA math in FP32, of any math in BF16.
template <typename Perf>
Perf pick(const Perf* results, int count, bool bf16, const char* what) {
  for (int i = 0; i < count; ++i) {
    if (results[i].status == CUDNN_STATUS_SUCCESS && (bf16 || fma_only(results[i].mathType)))
      return results[i];
  }
  TL_THROW(CudaError,
           "cuDNN found no " << (bf16 ? "BF16" : "FP32 FMA") << " algorithm for " << what);
}

void BM_Cudnn(benchmark::State& state, Pass pass, Layer l, bool bf16) {
  if (cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Stream stream(Device::cuda(0));
  const DType dtype = bf16 ? DType::BFloat16 : DType::Float32;
  Operands o(l, stream, dtype, dtype);
  CudnnLayer c(l, stream, bf16);
  constexpr int kMax = 16;
  int found = 0;
  std::size_t workspace_bytes = 0;
  const float one = 1.0f, zero = 0.0f;
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t data_algo{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo{};
  switch (pass) {
    case Pass::Forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[kMax];
      CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(c.handle, c.x_desc, c.w_desc, c.conv,
                                                       c.y_desc, kMax, &found, perf));
      const auto best = pick(perf, found, bf16, "forward");
      fwd_algo = best.algo, workspace_bytes = best.memory;
      state.SetLabel(algorithm_name(best.algo));
      break;
    }
    case Pass::BackwardData: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
      CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(c.handle, c.w_desc, c.y_desc, c.conv,
                                                            c.x_desc, kMax, &found, perf));
      const auto best = pick(perf, found, bf16, "backward data");
      data_algo = best.algo, workspace_bytes = best.memory;
      state.SetLabel(algorithm_name(best.algo));
      break;
    }
    case Pass::BackwardWeight: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
      CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(c.handle, c.x_desc, c.y_desc, c.conv,
                                                              c.w_desc, kMax, &found, perf));
      const auto best = pick(perf, found, bf16, "backward filter");
      filter_algo = best.algo, workspace_bytes = best.memory;
      state.SetLabel(algorithm_name(best.algo));
      break;
    }
    case Pass::Backward:  // registered on the CPU only
      break;
  }
  Tensor workspace = Tensor::empty({static_cast<std::int64_t>(workspace_bytes / 4 + 1)}, stream);
  // Alpha and beta are float for both FP32 and BF16 data.
  void* ws = workspace.raw_data();
  // Backward passes accumulate (beta = 1), as towerlab's do.
  bench::time_calls(state, stream, [&] {
    switch (pass) {
      case Pass::Forward:
        CUDNN_CHECK(cudnnConvolutionForward(c.handle, &one, c.x_desc, o.x.raw_data(), c.w_desc,
                                            o.weight.raw_data(), c.conv, fwd_algo, ws,
                                            workspace_bytes, &zero, c.y_desc, o.y.raw_data()));
        break;
      case Pass::BackwardData:
        CUDNN_CHECK(cudnnConvolutionBackwardData(
            c.handle, &one, c.w_desc, o.weight.raw_data(), c.y_desc, o.grad_y.raw_data(), c.conv,
            data_algo, ws, workspace_bytes, &one, c.x_desc, o.grad_x.raw_data()));
        break;
      case Pass::BackwardWeight:
        CUDNN_CHECK(cudnnConvolutionBackwardFilter(
            c.handle, &one, c.x_desc, o.x.raw_data(), c.y_desc, o.grad_y.raw_data(), c.conv,
            filter_algo, ws, workspace_bytes, &one, c.w_desc, o.grad_weight.raw_data()));
        break;
      case Pass::Backward:
        break;
    }
  });
  set_counters(state, l, pass);
}
#pragma GCC diagnostic pop
#endif

const bool registered = [] {
  for (const Layer& l : kLayers) {
    for (Pass pass : {Pass::Forward, Pass::BackwardData, Pass::BackwardWeight, Pass::Backward}) {
      const std::string base = std::string("conv2d_") + pass_name(pass) + "/" + l.name + "/";
      if (l.on_cpu) {
        // Real time: the work runs on the pool's threads too, not only the caller's.
        benchmark::RegisterBenchmark((base + "cpu").c_str(), BM_Towerlab, Device::cpu(), pass, l,
                                     DType::Float32)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
        const bool winograd_applies = l.R == 3 && l.stride == 1;
        struct Forced {
          const char* name;
          cpu::Conv2dAlgorithm algorithm;
          cpu::WinogradTile tile;
        };
        for (const Forced& f :
             {Forced{"cpu_im2col", cpu::Conv2dAlgorithm::Im2col, cpu::WinogradTile::Auto},
              Forced{"cpu_winograd", cpu::Conv2dAlgorithm::Winograd, cpu::WinogradTile::Auto},
              Forced{"cpu_winograd_f2x2", cpu::Conv2dAlgorithm::Winograd, cpu::WinogradTile::F2x2},
              Forced{"cpu_winograd_f4x4", cpu::Conv2dAlgorithm::Winograd,
                     cpu::WinogradTile::F4x4}}) {
          if (f.algorithm == cpu::Conv2dAlgorithm::Winograd && !winograd_applies) continue;
          benchmark::RegisterBenchmark((base + f.name).c_str(), BM_CpuAlgorithm, pass, l,
                                       f.algorithm, f.tile)
              ->ArgName("threads")
              ->Arg(1)
              ->Arg(0)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
        struct Bf16Case {
          const char* name;
          Bf16GemmKernel kernel;
          cpu::Conv2dAlgorithm algorithm;
        };
        for (const Bf16Case& c :
             {Bf16Case{"cpu_bf16", Bf16GemmKernel::Auto, cpu::Conv2dAlgorithm::Auto},
              Bf16Case{"cpu_bf16_im2col", Bf16GemmKernel::Auto, cpu::Conv2dAlgorithm::Im2col},
              Bf16Case{"cpu_bf16_widen", Bf16GemmKernel::Widen, cpu::Conv2dAlgorithm::Auto}}) {
          benchmark::RegisterBenchmark((base + c.name).c_str(), BM_CpuBf16, pass, l, c.kernel,
                                       c.algorithm)
              ->ArgName("threads")
              ->Arg(1)
              ->Arg(0)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
#if TOWERLAB_HAVE_CBLAS
        if (pass == Pass::Forward && winograd_applies) {  // im2col_3x3's shapes
          benchmark::RegisterBenchmark((base + "cpu_openblas_im2col").c_str(), BM_OpenBlasForward,
                                       l)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
#endif
      }
      if (pass == Pass::Backward) continue;  // the CPU's combined call; CUDA has its passes
      benchmark::RegisterBenchmark((base + "cuda").c_str(), BM_Towerlab, Device::cuda(0), pass, l,
                                   DType::Float32)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark((base + "cuda_bf16").c_str(), BM_Towerlab, Device::cuda(0), pass,
                                   l, DType::BFloat16)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
      if (std::min(l.C, l.K) >= 32 && std::max(l.C, l.K) >= 64) {
        benchmark::RegisterBenchmark((base + "cuda_implicit").c_str(), BM_CudaImplicitGemm, pass, l)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
#if TOWERLAB_HAVE_CUDNN
      for (const bool bf16 : {false, true}) {
        benchmark::RegisterBenchmark((base + (bf16 ? "cudnn_bf16" : "cudnn")).c_str(), BM_Cudnn,
                                     pass, l, bf16)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
#endif
    }
  }
  return true;
}();

}  // namespace
