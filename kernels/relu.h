// ReLU, forward and backward.
//   relu_forward(y, x)                 y[i] = max(x[i], 0)          (y may alias x)
//   relu_backward(grad_x, grad_y, y)   grad_x[i] += grad_y[i] * (y[i] > 0)
// The backward takes the forward's output y (y > 0 exactly where x > 0) and
// accumulates into grad_x, as every backward in towerlab does, or assigns it when
// asked (kernels/grad_write.h). At x == 0 the gradient is taken as 0. A NaN stays a
// NaN (as in PyTorch and TensorFlow): a max() that drops it would hide a broken
// input from the loss and from the trainer's numerical guard. All tensors have one
// shape and one dtype: float32, bfloat16 or float16 on every device, float64 on
// the CPU. A 16-bit tensor is read as its exact float32 widening and every value
// written is rounded once to nearest even (kernels/reference/math_type.h): the
// forward and an assigned gradient are exact (a value or +0), an accumulated
// 16-bit gradient is grad_x + g in float32, rounded once. Every backend gives the
// reference's bits (kernels/reference/relu.h) in every dtype.
//
// Adding an op: ReLU's files are the model. An op <op> takes these, in this order
// (the CMake globs pick up new files; there is no list to edit):
//   1. kernels/<op>.h            the contract, as above: formulas, shapes, aliasing,
//                                assigned versus accumulated outputs, the NaN rule;
//                                the public <op>_forward / <op>_backward on a stream
//   2. kernels/<op>.cpp          the checks (kernels/checks.h), then one call per
//                                backend
//   3. kernels/cpu/<op>.h        the backends' entry points, arguments already
//      kernels/cuda/<op>.h       checked (internal: not installed, not in towerlab.h)
//   4. kernels/reference/<op>.{h,cpp}  the specification: plain loops, a shape
//                                comment on each array (docs/kernels.md)
//      kernels/cpu/<op>.cpp      the reference run on each thread's range
//                                (kernels/cpu/parallel.h), or a fast path tested
//                                against it
//   5. kernels/cuda/<op>.cu      kernels in an anonymous namespace, launchers on the
//                                caller's stream (kernels/cuda/launch.cuh)
//   6. autograd/ops.{h,cpp}      ag::<op>: the forward on the tape, its backward
//                                recorded right below it
//   7. autograd/layers.h         a Layer for Sequential, where the op is one (ReLU)
//   8. tests/<op>_test.cpp       every backend, odd sizes, a sentinel for add versus
//                                assign, the error messages, a float64 gradient
//                                check (tests/gradcheck.h); the cuda:0 instances run
//                                on the emulated GPUs (emulator/) without a GPU
//   9. bench/<op>_bench.cpp      beside its reference, with bytes or FLOPs as
//                                counters (a memory-bound op against the device
//                                copy, as bench/bias_bench.cpp does)
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "grad_write.h"

namespace towerlab {

void relu_forward(const Tensor& y, const Tensor& x, const Stream& stream);
void relu_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y,
                   const Stream& stream, GradWrite write = GradWrite::Accumulate);

// The activation that a fused kernel (batch norm, bias add) applies to its output
// before storing it. ReLU follows the rules above: the forward keeps a NaN, and the
// backward multiplies grad_y by (y > 0) with y the fused op's output, so the fused
// op gives the same values as the op followed by relu_forward / relu_backward.
enum class Activation { None, ReLU };

}  // namespace towerlab
