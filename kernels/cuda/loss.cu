// CUDA losses (contracts in kernels/loss.h), float32.
//
// Every loss is a sum of terms reduced in the two fixed stages of
// kernels/cuda/sum_terms.cuh (the same bits every run, nothing back to the host);
// cross-entropy's first stage is its own row kernel.
//
// Cross-entropy gives each row to one warp: the row's maximum, then the sum of
// exp(x - max) (the second read of a row hits L1, the warp has just read it), then
// the outputs. For K = 10 two thirds of the lanes idle, but [128,10] is a few
// microseconds of launch either way; [4096,1000] keeps every lane busy.
//
// Rows of at most kRowChunks * 128 classes with K % 4 == 0 and 16-byte aligned
// buffers (e.g. [4096,1000]) take the cached kernels instead: each lane loads its
// float4s of the row (float4 j = lane + 32 t) into registers with all loads issued
// at once, and the maximum, the sum of exponentials and the outputs all come from
// those registers: the row is read from memory once, in 128-bit loads, and written
// (probs, grad) in 128-bit stores. The cached forward is bound by the warp's
// instructions once its row has arrived (see cross_entropy_forward_cached_kernel),
// so it takes the maximum alone unless predictions are asked for, and e^(x - max)
// by ex2.approx (exp_shifted).
//
// Each pass is memory-bound: its speed on a GPU, beside a device copy of the same
// bytes, is in bench/results/gpu_h100.md (the step from probabilities moves a third
// more bytes than the one that recomputes the softmax, which the autograd op runs
// on a GPU).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "engine/allocator.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/loss.h"
#include "kernels/cuda/sum_terms.cuh"

namespace towerlab::cuda {

namespace {

using losses::finish_sum_kernel;
using losses::kMaxPartials;
using losses::sum_terms;

__device__ bool is_class_id(float label, std::int64_t num_classes) {
  return label >= 0.0f && label < static_cast<float>(num_classes) && floorf(label) == label;
}

struct SquaredError {
  const float* pred;
  const float* target;
  __device__ float operator()(std::int64_t i) const {
    const float diff = pred[i] - target[i];
    return diff * diff;
  }
};

struct Square {
  const float* w;
  __device__ float operator()(std::int64_t i) const { return w[i] * w[i]; }
};

// The row statistics every lane of the warp ends with: max and argmax (the first
// index on ties), then sum_k exp(x[k] - max).
struct RowStats {
  float max;
  std::int64_t argmax;
  float sum_exp;
};

// A row's cross-entropy from its label, its logit x_label = x[label], its statistics
// and, with label smoothing eps, mean_shifted = mean_k (x[k] - max) (0 when eps is 0):
// log(sum exp(x - max)) - (1 - eps) (x_label - max) - eps mean_shifted (kernels/loss.h;
// at eps = 0 the bits of log(sum exp(x - max)) - (x_label - max)); NaN for a label that
// is not a class id (x_label then unused), which the trainer's guard then reports.
__device__ __forceinline__ float row_loss(float label, float x_label, float max, float sum_exp,
                                          std::int64_t num_classes, float eps, float mean_shifted) {
  return is_class_id(label, num_classes)
             ? logf(sum_exp) - (1.0f - eps) * (x_label - max) - eps * mean_shifted
             : NAN;
}

// Class k's share of the smoothed target of a row labelled `target` (exactly 1 and 0
// at eps = 0).
__device__ __forceinline__ float smoothed_target(std::int64_t k, std::int64_t target,
                                                 std::int64_t num_classes, float eps) {
  return (k == target ? 1.0f - eps : 0.0f) + eps / static_cast<float>(num_classes);
}

// x[label] of a row, or 0 for a label that is not a class id (never an index then).
__device__ __forceinline__ float label_logit(const float* row, float label,
                                             std::int64_t num_classes) {
  return is_class_id(label, num_classes) ? row[static_cast<std::int64_t>(label)] : 0.0f;
}

// Every lane's (max, argmax) becomes the warp's: the largest value, and of equal
// ones the first class, whatever order the lanes saw them in.
__device__ __forceinline__ void warp_max_argmax(float& max, std::int64_t& argmax) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float other_max = __shfl_xor_sync(kFullMask, max, offset);
    const auto other_arg = static_cast<std::int64_t>(
        __shfl_xor_sync(kFullMask, static_cast<long long>(argmax), offset));
    if (other_max > max || (other_max == max && other_arg < argmax)) {
      max = other_max;
      argmax = other_arg;
    }
  }
}

__device__ RowStats row_stats(const float* row, std::int64_t num_classes, int lane) {
  float max = -INFINITY;
  std::int64_t argmax = INT64_MAX;
  if (lane < num_classes) {
    max = row[lane];
    argmax = lane;
  }
  for (std::int64_t k = lane + kWarpSize; k < num_classes; k += kWarpSize) {
    if (row[k] > max) {
      max = row[k];
      argmax = k;
    }
  }
  warp_max_argmax(max, argmax);
  float sum_exp = 0.0f;
  for (std::int64_t k = lane; k < num_classes; k += kWarpSize) sum_exp += expf(row[k] - max);
  return {max, argmax, warp_sum(sum_exp)};
}

// --- cached rows ------------------------------------------------------------------

constexpr int kRowChunks = 8;  // float4s of a row per lane: rows of up to 1024 classes

__device__ __forceinline__ float component(const float4& v, int c) {
  return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

// The lane's float4s j = lane + 32 t (t < kRowChunks) of a row of k4 float4s.
struct CachedRow {
  float4 v[kRowChunks];
};

__device__ __forceinline__ CachedRow load_row(const float* row, int k4, int lane) {
  CachedRow r;
#pragma unroll
  for (int t = 0; t < kRowChunks; ++t) {
    const int j = lane + kWarpSize * t;
    r.v[t] = j < k4 ? reinterpret_cast<const float4*>(row)[j] : make_float4(0, 0, 0, 0);
  }
  return r;
}

// row_stats on a cached row: the lane's first value, then any greater one (the
// first index on ties, a lane's NaN first value staying its maximum as in
// row_stats), combined across the warp as there.
__device__ RowStats cached_row_stats(const CachedRow& r, int k4, int lane) {
  float max = -INFINITY;
  std::int64_t argmax = INT64_MAX;
#pragma unroll
  for (int t = 0; t < kRowChunks; ++t) {
    const int j = lane + kWarpSize * t;
    if (j < k4) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float e = component(r.v[t], c);
        if ((t == 0 && c == 0) || e > max) {
          max = e;
          argmax = 4 * j + c;
        }
      }
    }
  }
  warp_max_argmax(max, argmax);
  float sum_exp = 0.0f;
#pragma unroll
  for (int t = 0; t < kRowChunks; ++t) {
    if (lane + kWarpSize * t < k4) {
#pragma unroll
      for (int c = 0; c < 4; ++c) sum_exp += expf(component(r.v[t], c) - max);
    }
  }
  return {max, argmax, warp_sum(sum_exp)};
}

// e^d for d = x - max <= 0 in the cached forward: ex2.approx of d * log2(e)
// (__expf), two instructions where expf takes about eight. Its relative error,
// about 2 ulp + |d| * 2^-24, is far inside the tests' 1e-5 on the loss and the
// probabilities; for d below about -87 it flushes to 0, which adds nothing next
// to the row maximum's term of 1.
__device__ __forceinline__ float exp_shifted(float d) {
  return __expf(d);
}

// The row maximum alone (no argmax, when predictions are not asked for): one
// fmaxf a value. The maximum is the same value whatever order the values are
// compared in; a NaN in the row makes the row's sum, loss and probabilities NaN
// either way.
__device__ __forceinline__ float cached_row_max(const CachedRow& r, int k4, int lane) {
  float max = -INFINITY;
#pragma unroll
  for (int t = 0; t < kRowChunks; ++t) {
    if (lane + kWarpSize * t < k4) {
      max = fmaxf(max, fmaxf(fmaxf(r.v[t].x, r.v[t].y), fmaxf(r.v[t].z, r.v[t].w)));
    }
  }
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    max = fmaxf(max, __shfl_xor_sync(kFullMask, max, offset));
  }
  return max;
}

// The warp's sum of exp_shifted(x - max) over a cached row, in every lane.
__device__ __forceinline__ float cached_sum_exp(const CachedRow& r, int k4, int lane, float max) {
  float sum = 0.0f;
#pragma unroll
  for (int t = 0; t < kRowChunks; ++t) {
    if (lane + kWarpSize * t < k4) {
#pragma unroll
      for (int c = 0; c < 4; ++c) sum += exp_shifted(component(r.v[t], c) - max);
    }
  }
  return warp_sum(sum);
}

// cross_entropy_forward_kernel on cached rows; k4 = num_classes / 4; kArgmax when
// predictions is not null.
//
// Its one wave of 4096 warps at [4096,1000] (one row each, 64 registers: 32 warps
// a SM) is bound by instruction issue once the rows arrive, not by memory: each
// warp's work after its loads is what the kernel takes. So that work is cut to
// about five instructions a value: fmaxf for the maximum (the argmax's compares
// and 64-bit selects only when predictions are asked for), then a subtract, the
// ex2 pair and an add. Lane 0 loads the row's label and its logit together with
// the row, so that their latency hides under the row's rather than following
// the reduction.
template <bool kArgmax>
__global__ void __launch_bounds__(kBlockSize, 4)
    cross_entropy_forward_cached_kernel(float* partials, float* probs, float* predictions,
                                        const float* logits, const float* labels, std::int64_t rows,
                                        int k4, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const std::int64_t warps_per_block = blockDim.x / kWarpSize;
  const std::int64_t num_classes = 4 * std::int64_t{k4};
  float loss_sum = 0.0f;  // lane 0's rows
  for (std::int64_t n = blockIdx.x * warps_per_block + threadIdx.x / kWarpSize; n < rows;
       n += gridDim.x * warps_per_block) {
    const float* row = logits + n * num_classes;  // [K]
    const CachedRow r = load_row(row, k4, lane);
    float label = 0.0f, x_label = 0.0f;
    if (lane == 0) {
      label = labels[n];
      x_label = label_logit(row, label, num_classes);
    }
    float max;
    std::int64_t argmax = 0;
    if constexpr (kArgmax) {
      const RowStats s = cached_row_stats(r, k4, lane);
      max = s.max;
      argmax = s.argmax;
    } else {
      max = cached_row_max(r, k4, lane);
    }
    const float sum_exp = cached_sum_exp(r, k4, lane, max);
    float mean_shifted = 0.0f;
    if (eps != 0.0f) {  // the same for every warp: all lanes reach the warp sum
      float shifted = 0.0f;
#pragma unroll
      for (int t = 0; t < kRowChunks; ++t) {
        if (lane + kWarpSize * t < k4) {
#pragma unroll
          for (int c = 0; c < 4; ++c) shifted += component(r.v[t], c) - max;
        }
      }
      mean_shifted = warp_sum(shifted) / static_cast<float>(num_classes);
    }
    if (lane == 0) {
      loss_sum += row_loss(label, x_label, max, sum_exp, num_classes, eps, mean_shifted);
      if constexpr (kArgmax) predictions[n] = static_cast<float>(argmax);
    }
    if (probs != nullptr) {
      const float inv_sum = 1.0f / sum_exp;
#pragma unroll
      for (int t = 0; t < kRowChunks; ++t) {
        const int j = lane + kWarpSize * t;
        if (j < k4) {
          const float4 v = r.v[t];
          reinterpret_cast<float4*>(probs + n * num_classes)[j] =
              make_float4(exp_shifted(v.x - max) * inv_sum, exp_shifted(v.y - max) * inv_sum,
                          exp_shifted(v.z - max) * inv_sum, exp_shifted(v.w - max) * inv_sum);
        }
      }
    }
  }
  loss_sum = block_sum<kBlockSize>(loss_sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = loss_sum;
}

// cross_entropy_backward_kernel on cached rows; k4 = num_classes / 4.
__global__ void __launch_bounds__(kBlockSize, 4)
    cross_entropy_backward_cached_kernel(float* grad_logits, const float* grad_loss,
                                         const float* logits, const float* labels,
                                         std::int64_t rows, int k4, float scale, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const std::int64_t warps_per_block = blockDim.x / kWarpSize;
  const std::int64_t num_classes = 4 * std::int64_t{k4};
  const float factor = scale * *grad_loss;
  for (std::int64_t n = blockIdx.x * warps_per_block + threadIdx.x / kWarpSize; n < rows;
       n += gridDim.x * warps_per_block) {
    const CachedRow r = load_row(logits + n * num_classes, k4, lane);
    float4* grad = reinterpret_cast<float4*>(grad_logits + n * num_classes);  // [K/4]
    const RowStats s = cached_row_stats(r, k4, lane);
    const float label = labels[n];
    const bool valid = is_class_id(label, num_classes);
    const std::int64_t target = valid ? static_cast<std::int64_t>(label) : -1;
#pragma unroll
    for (int t = 0; t < kRowChunks; ++t) {
      const int j = lane + kWarpSize * t;
      if (j < k4) {
        float4 g = grad[j];
        const auto term = [&](float v, int c) {
          const float p = expf(v - s.max) / s.sum_exp;
          return valid ? factor * (p - smoothed_target(4 * j + c, target, num_classes, eps)) : NAN;
        };
        g.x += term(r.v[t].x, 0);
        g.y += term(r.v[t].y, 1);
        g.z += term(r.v[t].z, 2);
        g.w += term(r.v[t].w, 3);
        grad[j] = g;
      }
    }
  }
}

// Whether rows of num_classes can be taken in float4s: K % 4 == 0 and the
// buffers null or 16-byte aligned.
bool float4_rows(std::int64_t num_classes, std::initializer_list<const void*> buffers) {
  if (num_classes % 4 != 0) return false;
  for (const void* p : buffers) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// Whether rows of num_classes take the cached kernels (float4 rows that fit).
bool cached_rows(std::int64_t num_classes, std::initializer_list<const void*> buffers) {
  return float4_rows(num_classes, buffers) && num_classes <= 4 * kWarpSize * kRowChunks;
}

// One warp per row, kBlockSize threads. partials[block] = sum of the block's row losses (NaN for a
// row whose label is not a class id; that label is never used as an index).
__global__ void cross_entropy_forward_kernel(float* partials, float* probs, float* predictions,
                                             const float* logits, const float* labels,
                                             std::int64_t rows, std::int64_t num_classes,
                                             float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const std::int64_t warps_per_block = blockDim.x / kWarpSize;
  float loss_sum = 0.0f;  // lane 0's rows
  for (std::int64_t n = blockIdx.x * warps_per_block + threadIdx.x / kWarpSize; n < rows;
       n += gridDim.x * warps_per_block) {
    const float* row = logits + n * num_classes;  // [K]
    const RowStats s = row_stats(row, num_classes, lane);
    float mean_shifted = 0.0f;
    if (eps != 0.0f) {  // the same for every warp: all lanes reach the warp sum
      float shifted = 0.0f;
      for (std::int64_t k = lane; k < num_classes; k += kWarpSize) shifted += row[k] - s.max;
      mean_shifted = warp_sum(shifted) / static_cast<float>(num_classes);
    }
    if (lane == 0) {
      const float label = labels[n];
      loss_sum += row_loss(label, label_logit(row, label, num_classes), s.max, s.sum_exp,
                           num_classes, eps, mean_shifted);
      if (predictions != nullptr) predictions[n] = static_cast<float>(s.argmax);
    }
    if (probs != nullptr) {
      for (std::int64_t k = lane; k < num_classes; k += kWarpSize) {
        probs[n * num_classes + k] = expf(row[k] - s.max) / s.sum_exp;
      }
    }
  }
  loss_sum = block_sum<kBlockSize>(loss_sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = loss_sum;
}

// One warp per row: grad[n,k] += grad_loss[0] * scale * (softmax[k] - target[k]), the
// target smoothed by eps (smoothed_target).
__global__ void cross_entropy_backward_kernel(float* grad_logits, const float* grad_loss,
                                              const float* logits, const float* labels,
                                              std::int64_t rows, std::int64_t num_classes,
                                              float scale, float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const std::int64_t warps_per_block = blockDim.x / kWarpSize;
  const float factor = scale * *grad_loss;
  for (std::int64_t n = blockIdx.x * warps_per_block + threadIdx.x / kWarpSize; n < rows;
       n += gridDim.x * warps_per_block) {
    const float* row = logits + n * num_classes;  // [K]
    float* grad = grad_logits + n * num_classes;  // [K]
    const RowStats s = row_stats(row, num_classes, lane);
    const float label = labels[n];
    const bool valid = is_class_id(label, num_classes);
    const std::int64_t target = valid ? static_cast<std::int64_t>(label) : -1;
    for (std::int64_t k = lane; k < num_classes; k += kWarpSize) {
      const float p = expf(row[k] - s.max) / s.sum_exp;
      grad[k] += valid ? factor * (p - smoothed_target(k, target, num_classes, eps)) : NAN;
    }
  }
}

// As cross_entropy_backward_kernel with p read from the forward's probs: elementwise.
__global__ void cross_entropy_backward_from_probs_kernel(std::int64_t n, float* grad_logits,
                                                         const float* grad_loss, const float* probs,
                                                         const float* labels,
                                                         std::int64_t num_classes, float scale,
                                                         float eps) {
  const float factor = scale * *grad_loss;
  for (const std::int64_t i : grid_stride(n)) {
    const std::int64_t row = i / num_classes, k = i - row * num_classes;
    const float label = labels[row];
    const bool valid = is_class_id(label, num_classes);
    const std::int64_t target = valid ? static_cast<std::int64_t>(label) : -1;
    grad_logits[i] +=
        valid ? factor * (probs[i] - smoothed_target(k, target, num_classes, eps)) : NAN;
  }
}

// cross_entropy_backward_from_probs_kernel in float4 units, for num_classes % 4
// == 0, 16-byte aligned buffers and fewer than 2^32 units: a float4 lies within
// one row, whose index is one 32-bit division per four values. The general
// kernel's 64-bit division per value is a software routine of dozens of
// instructions, enough to make that elementwise pass instruction-bound.
__global__ void cross_entropy_backward_from_probs4_kernel(std::int64_t n4, float4* grad_logits,
                                                          const float* grad_loss,
                                                          const float4* probs, const float* labels,
                                                          unsigned k4, float scale, float eps) {
  const float factor = scale * *grad_loss;
  const std::int64_t num_classes = 4 * std::int64_t{k4};
  for (const std::int64_t i : grid_stride(n4)) {
    const unsigned row = static_cast<unsigned>(i) / k4;
    const std::int64_t k = 4 * std::int64_t{static_cast<unsigned>(i) - row * k4};
    const float label = labels[row];
    const bool valid = is_class_id(label, num_classes);
    const std::int64_t target = valid ? static_cast<std::int64_t>(label) : -1;
    const float4 p = probs[i];
    const auto term = [&](float pc, int c) {
      return valid ? factor * (pc - smoothed_target(k + c, target, num_classes, eps)) : NAN;
    };
    float4 g = grad_logits[i];
    g.x += term(p.x, 0);
    g.y += term(p.y, 1);
    g.z += term(p.z, 2);
    g.w += term(p.w, 3);
    grad_logits[i] = g;
  }
}

__global__ void mse_backward_kernel(std::int64_t n, float* grad_pred, float* grad_target,
                                    const float* grad_loss, const float* pred, const float* target,
                                    float scale) {
  const float factor = 2.0f * scale * *grad_loss;
  for (const std::int64_t i : grid_stride(n)) {
    const float g = factor * (pred[i] - target[i]);
    if (grad_pred != nullptr) grad_pred[i] += g;
    if (grad_target != nullptr) grad_target[i] -= g;
  }
}

__global__ void l2_loss_backward_kernel(std::int64_t n, float* grad_w, const float* grad_loss,
                                        const float* w, float scale) {
  const float factor = scale * *grad_loss;
  for (const std::int64_t i : grid_stride(n)) {
    grad_w[i] += factor * w[i];
  }
}

// Blocks for one warp per row, at most kMaxPartials (extra rows loop).
unsigned grid_for_rows(std::int64_t rows) {
  const std::int64_t warps_per_block = kBlockSize / kWarpSize;
  return static_cast<unsigned>(
      std::clamp<std::int64_t>((rows + warps_per_block - 1) / warps_per_block, 1, kMaxPartials));
}

}  // namespace

void squared_error_sum(const Tensor& loss, const Tensor& pred, const Tensor& target, float scale,
                       const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  sum_terms(loss.data<float>(), pred.numel(),
            SquaredError{pred.data<float>(), target.data<float>()}, scale, stream);
}

void mse_backward(const Tensor& grad_pred, const Tensor& grad_target, const Tensor& grad_loss,
                  const Tensor& pred, const Tensor& target, float scale, const Stream& stream) {
  launch_grid_stride(mse_backward_kernel, pred.numel(), stream,
                     grad_pred.defined() ? grad_pred.data<float>() : nullptr,
                     grad_target.defined() ? grad_target.data<float>() : nullptr,
                     grad_loss.data<float>(), pred.data<float>(), target.data<float>(), scale);
}

void softmax_cross_entropy_forward(const Tensor& loss, const Tensor& probs,
                                   const Tensor& predictions, const Tensor& logits,
                                   const Tensor& labels, float scale, float label_smoothing,
                                   const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  cudaStream_t s = native(stream);
  const std::int64_t rows = logits.size(0), num_classes = logits.size(1);
  if (rows == 0) {
    TL_CUDA_CHECK(cudaMemsetAsync(loss.data<float>(), 0, sizeof(float), s));
    return;
  }
  const unsigned blocks = grid_for_rows(rows);
  Scratch partials(stream, blocks * sizeof(float));
  float* probs_ptr = probs.defined() ? probs.data<float>() : nullptr;
  float* predictions_ptr = predictions.defined() ? predictions.data<float>() : nullptr;
  if (cached_rows(num_classes, {probs_ptr, logits.data<float>()})) {
    const auto kernel = predictions_ptr != nullptr ? cross_entropy_forward_cached_kernel<true>
                                                   : cross_entropy_forward_cached_kernel<false>;
    kernel<<<blocks, kBlockSize, 0, s>>>(partials.as<float>(), probs_ptr, predictions_ptr,
                                         logits.data<float>(), labels.data<float>(), rows,
                                         static_cast<int>(num_classes / 4), label_smoothing);
  } else {
    cross_entropy_forward_kernel<<<blocks, kBlockSize, 0, s>>>(
        partials.as<float>(), probs_ptr, predictions_ptr, logits.data<float>(),
        labels.data<float>(), rows, num_classes, label_smoothing);
  }
  TL_CUDA_CHECK_LAUNCH();
  finish_sum_kernel<<<1, kMaxPartials, 0, s>>>(loss.data<float>(), partials.as<float>(), blocks,
                                               scale);
  TL_CUDA_CHECK_LAUNCH();
}

void softmax_cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                                    const Tensor& logits, const Tensor& labels, float scale,
                                    float label_smoothing, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  const std::int64_t rows = logits.size(0), num_classes = logits.size(1);
  if (rows == 0) return;
  if (cached_rows(num_classes, {grad_logits.data<float>(), logits.data<float>()})) {
    cross_entropy_backward_cached_kernel<<<grid_for_rows(rows), kBlockSize, 0, native(stream)>>>(
        grad_logits.data<float>(), grad_loss.data<float>(), logits.data<float>(),
        labels.data<float>(), rows, static_cast<int>(num_classes / 4), scale, label_smoothing);
  } else {
    cross_entropy_backward_kernel<<<grid_for_rows(rows), kBlockSize, 0, native(stream)>>>(
        grad_logits.data<float>(), grad_loss.data<float>(), logits.data<float>(),
        labels.data<float>(), rows, num_classes, scale, label_smoothing);
  }
  TL_CUDA_CHECK_LAUNCH();
}

void softmax_cross_entropy_backward_from_probs(const Tensor& grad_logits, const Tensor& grad_loss,
                                               const Tensor& probs, const Tensor& labels,
                                               float scale, float label_smoothing,
                                               const Stream& stream) {
  const std::int64_t num_classes = probs.size(1);
  if (float4_rows(num_classes, {grad_logits.data<float>(), probs.data<float>()}) &&
      probs.numel() / 4 <= std::int64_t{UINT32_MAX}) {
    launch_grid_stride(cross_entropy_backward_from_probs4_kernel, probs.numel() / 4, stream,
                       reinterpret_cast<float4*>(grad_logits.data<float>()),
                       grad_loss.data<float>(),
                       reinterpret_cast<const float4*>(probs.data<float>()), labels.data<float>(),
                       static_cast<unsigned>(num_classes / 4), scale, label_smoothing);
    return;
  }
  launch_grid_stride(cross_entropy_backward_from_probs_kernel, probs.numel(), stream,
                     grad_logits.data<float>(), grad_loss.data<float>(), probs.data<float>(),
                     labels.data<float>(), num_classes, scale, label_smoothing);
}

// A functor rather than a lambda: nvcc needs --extended-lambda for device lambdas.
struct InvalidLabel {
  const float* labels;
  std::int64_t num_classes;
  __device__ bool operator()(std::int64_t i) const { return !is_class_id(labels[i], num_classes); }
};

std::int64_t first_invalid_label(const Tensor& labels, std::int64_t num_classes,
                                 const Stream& stream) {
  return first_index_where(labels.numel(), InvalidLabel{labels.data<float>(), num_classes}, stream);
}

void square_sum(const Tensor& loss, const Tensor& w, float scale, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  sum_terms(loss.data<float>(), w.numel(), Square{w.data<float>()}, scale, stream);
}

void l2_loss_backward(const Tensor& grad_w, const Tensor& grad_loss, const Tensor& w, float scale,
                      const Stream& stream) {
  launch_grid_stride(l2_loss_backward_kernel, w.numel(), stream, grad_w.data<float>(),
                     grad_loss.data<float>(), w.data<float>(), scale);
}

}  // namespace towerlab::cuda
