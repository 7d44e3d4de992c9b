// ReLU, forward and backward.
//   relu_forward(y, x)                 y[i] = max(x[i], 0)          (y may alias x)
//   relu_backward(grad_x, grad_y, y)   grad_x[i] += grad_y[i] * (y[i] > 0)
// The backward takes the forward's output y (y > 0 exactly where x > 0) and
// accumulates into grad_x, as every backward in towerlab does. At x == 0 the
// gradient is taken as 0. A NaN stays a NaN (as in PyTorch and TensorFlow): a
// max() that drops it would hide a broken input from the loss and from the
// trainer's numerical guard. All tensors have one shape.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"

namespace towerlab {

void relu_forward(const Tensor& y, const Tensor& x, const Stream& stream);
void relu_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y,
                   const Stream& stream);

// The activation that a fused kernel (batch norm, bias add) applies to its output
// before storing it. ReLU follows the rules above: the forward keeps a NaN, and the
// backward multiplies grad_y by (y > 0) with y the fused op's output, so the fused
// op gives the same values as the op followed by relu_forward / relu_backward.
enum class Activation { None, ReLU };

}  // namespace towerlab
