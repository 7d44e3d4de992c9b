// Softmax and log-softmax over the last dimension, forward and backward, with an
// optional causal mask for attention scores.
//
// Dimensions: x is [..., D] of any rank >= 1, taken as R rows of D values (R = the
// product of the other dimensions, 1 for a vector). y, grad_y and grad_x have x's
// shape. With SoftmaxMask::Causal, x is [..., T, T] (rank >= 2, the last two
// dimensions equal, D = T): row r is query i = r mod T of its [T, T] matrix, and
// its keys j > i are masked. Without a mask every j is kept. For row r with kept
// set K = {j : j <= i} (causal) or every j, and m = max_{j in K} x[r,j]:
//   softmax_forward        y[r,j] = exp(x[r,j] - m) / sum_{k in K} exp(x[r,k] - m)
//   log_softmax_forward    y[r,j] = (x[r,j] - m) - log(sum_{k in K} exp(x[r,k] - m))
//   softmax_backward       grad_x[r,j] += y[r,j] (grad_y[r,j] - sum_{k in K} grad_y[r,k] y[r,k])
//   log_softmax_backward   grad_x[r,j] += grad_y[r,j] - exp(y[r,j]) sum_{k in K} grad_y[r,k]
// for j in K. A masked element (j > i) is excluded: softmax's y is exactly 0 and
// log-softmax's exactly -inf there, x there is never read (it may be anything,
// NaN included), and its gradient is exactly 0 (grad_y there is not read either,
// so the -inf of log-softmax's output takes no part).
//
// The backwards take the forward's output y, as PyTorch's do (_softmax_backward_data),
// and accumulate into grad_x, as every backward in towerlab does, or assign it
// when asked (kernels/grad_write.h: every element, masked ones included, is
// written). y may alias x in the forwards (each row is read whole before it is
// written); grad_x may alias grad_y only with GradWrite::Assign; grad_x never
// aliases y.
//
// Numerical stability: the row maximum of the kept values is subtracted before
// exp, so no exponent is positive and logits of +-1e4 (or any finite size) give
// their exact limits, never inf / inf; log-softmax is x - m - log(sum), never
// log(softmax), so a probability that underflows keeps its finite logarithm.
//
// NaN rule, PyTorch's: a NaN among a row's kept values makes that whole row NaN,
// forward and backward (it reaches every output through the sum). A row whose kept
// values are all -inf gives NaN (exp(-inf - -inf)), as in PyTorch; so does a row
// with a +inf (inf - inf). A row with -inf and finite values gives exactly 0
// (softmax) and -inf (log-softmax) at the -inf entries, and their gradients are 0
// (softmax) and grad_y (log-softmax, exp(-inf) = 0).
//
// Tolerance: the reference (kernels/reference/softmax.h) is in double; the CPU
// runs it in float64, and the float32 results, CPU (float math in vector lanes on
// every ISA: kernels/cpu/softmax.cpp) and CUDA, are held to
// 1e-6 + 1e-5 |reference| in the tests.
//
// Errors: bfloat16 / float16 get check_dtype_supported's NotSupported naming the
// op and the dtype; shapes that differ, a scalar (rank 0), and a causal mask on a
// tensor whose last two dimensions differ give ShapeError naming the op and the
// shapes.
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "grad_write.h"

namespace towerlab {

// Which keys each query sees: all of them, or (Causal) keys j <= query i.
enum class SoftmaxMask { None, Causal };

// Which of the two the backends compute (the entry points below name it).
enum class SoftmaxKind { Softmax, LogSoftmax };

void softmax_forward(const Tensor& y, const Tensor& x, SoftmaxMask mask, const Stream& stream);
void softmax_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, SoftmaxMask mask,
                      const Stream& stream, GradWrite write = GradWrite::Accumulate);

void log_softmax_forward(const Tensor& y, const Tensor& x, SoftmaxMask mask, const Stream& stream);
void log_softmax_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y,
                          SoftmaxMask mask, const Stream& stream,
                          GradWrite write = GradWrite::Accumulate);

}  // namespace towerlab
