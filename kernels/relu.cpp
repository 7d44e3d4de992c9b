// Checks and backend dispatch for ReLU (kernels/relu.h).
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/relu.h"

#include "kernels/checks.h"
#include "kernels/cpu/relu.h"
#include "kernels/cuda/relu.h"

namespace towerlab {

void relu_forward(const Tensor& y, const Tensor& x, const Stream& stream) {
  kernels::check_same_shape_any_dtype("relu_forward", stream, {{"y", &y}, {"x", &x}});
  if (y.numel() == 0) return;
  TL_DISPATCH(stream, cpu::relu_forward(y, x), cuda::relu_forward(y, x, stream));
}

void relu_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y,
                   const Stream& stream, GradWrite write) {
  kernels::check_same_shape_any_dtype("relu_backward", stream,
                                      {{"grad_x", &grad_x}, {"grad_y", &grad_y}, {"y", &y}});
  if (grad_x.numel() == 0) return;
  TL_DISPATCH(stream, cpu::relu_backward(grad_x, grad_y, y, write),
              cuda::relu_backward(grad_x, grad_y, y, stream, write));
}

}  // namespace towerlab
