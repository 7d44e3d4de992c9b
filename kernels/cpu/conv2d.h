// The CPU conv2d entry points, and the problem description both backends receive
// (internal: not installed, not in towerlab.h). Public contract and dispatch in
// kernels/conv2d.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/allocator.h"
#include "engine/settings.h"
#include "engine/tensor.h"
#include "kernels/conv2d.h"

namespace towerlab {

// The problem's sizes, worked out once by the checks and handed to the backends.
struct Conv2dShape {
  std::int64_t N, C, H, W;  // input
  std::int64_t K, R, S;     // weight [K,C,R,S]
  std::int64_t P, Q;        // output
  Conv2dParams params;
};

namespace cpu {
// Arguments already checked, work not empty.
void conv2d_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Conv2dShape& shape);
void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                     const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Conv2dShape& shape, GradWrite grad_x_write);

// The bfloat16 GEMM path (kernels/cpu/conv2d_bf16.cpp): whether a layer of `dtype` with
// `params` takes it (bfloat16, G = 1, the bfloat16 GEMM running vdpbf16ps, and the
// algorithm Auto or Im2col: a forced Winograd keeps the float32 algorithms on
// widened operands), and its passes on bfloat16 x,
// weight and grad_y: y float32 or bfloat16, grad_x (written as grad_x_write says)
// and grad_weight (accumulated) float32, either undefined when not needed. The
// dispatch adds grad_bias.
bool bf16_gemm_conv_chosen(DType dtype, const Conv2dParams& params);
void conv2d_forward_bf16(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Conv2dShape& s);
void conv2d_backward_bf16(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_y,
                          const Tensor& x, const Tensor& weight, const Conv2dShape& s,
                          GradWrite grad_x_write);

// Depthwise (groups == C, kernels/conv2d_depthwise.h), in kernels/cpu/conv2d_depthwise.cpp:
// the forward with its bias; the backward's grad_x (written as grad_x_write says) and
// grad_weight (accumulated), either undefined when not needed. The dispatch adds
// grad_bias with bias_add_backward.
void conv2d_depthwise_forward(const Tensor& y, const Tensor& x, const Tensor& weight,
                              const Tensor& bias, const Conv2dShape& shape);
void conv2d_depthwise_backward(const Tensor& grad_x, const Tensor& grad_weight,
                               const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                               const Conv2dShape& shape, GradWrite grad_x_write);

// How the float32 forward and backward-data compute: the process-wide setting
// Conv2dAlgorithm (engine/settings.h), named here too for the CPU code.
using towerlab::conv2d_algorithm;
using towerlab::Conv2dAlgorithm;

// Sets the algorithm while it lives and restores the previous one at the end. The
// setting is an atomic: any thread may hold one, and work started after the
// constructor returns (on any thread, CPU towers included) sees it.
class ScopedConv2dAlgorithm {
 public:
  explicit ScopedConv2dAlgorithm(Conv2dAlgorithm algorithm);
  ~ScopedConv2dAlgorithm();
  ScopedConv2dAlgorithm(const ScopedConv2dAlgorithm&) = delete;
  ScopedConv2dAlgorithm& operator=(const ScopedConv2dAlgorithm&) = delete;

 private:
  Conv2dAlgorithm previous_;
};

// An array of T from the host allocator's cache (a patch matrix, partial sums,
// Winograd tiles), given back when it goes out of scope: launch.cuh's Scratch on
// the host.
template <typename T>
class HostScratch {
 public:
  explicit HostScratch(std::int64_t count)
      : allocator_(device_allocator(Device::cpu())),
        data_(static_cast<T*>(allocator_.allocate(static_cast<std::size_t>(count) * sizeof(T)))) {}
  ~HostScratch() { allocator_.deallocate(data_); }
  HostScratch(const HostScratch&) = delete;
  HostScratch& operator=(const HostScratch&) = delete;
  T* get() const { return data_; }

 private:
  Allocator& allocator_;
  T* data_;
};
}  // namespace cpu

}  // namespace towerlab
