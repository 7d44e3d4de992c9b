// Checks and backend dispatch for the fused residual add + ReLU (kernels/add_relu.h).
#include "kernels/add_relu.h"

#include "kernels/checks.h"
#include "kernels/cpu/add_relu.h"
#include "kernels/cuda/add_relu.h"

namespace towerlab {

void add_relu_forward(const Tensor& y, const Tensor& a, const Tensor& b, const Stream& stream) {
  kernels::check_same_shape_any_dtype("add_relu_forward", stream,
                                      {{"a", &a}, {"b", &b}, {"y", &y}});
  if (y.numel() == 0) return;
  TL_DISPATCH(stream, cpu::add_relu_forward(y, a, b), cuda::add_relu_forward(y, a, b, stream));
}

void add_relu_backward(const AddReluBackward& args, const Stream& stream) {
  const char* op = "add_relu_backward";
  if (is_16bit(args.y.dtype()) && args.grad_y.dtype() == DType::Float32) {
    TL_CHECK(stream.device().is_cpu(), NotSupported,
             op << ": grad_y is " << args.grad_y.describe() << " beside y " << args.y.describe()
                << ": float32 gradients beside a 16-bit y run on the CPU; on "
                << stream.device().str() << " widen y to float32 first");
    kernels::check_placed(op, stream, {{"grad_y", &args.grad_y}});
    kernels::check_placed(op, stream, {{"y", &args.y}});
    TL_CHECK(args.grad_y.shape() == args.y.shape(), ShapeError,
             op << ": grad_y is " << args.grad_y.describe() << " but y is " << args.y.describe());
  } else {
    kernels::check_same_shape_any_dtype(op, stream, {{"grad_y", &args.grad_y}, {"y", &args.y}});
  }
  if (args.grad_a.defined()) {
    kernels::check_same_shape_any_dtype(op, stream,
                                        {{"grad_y", &args.grad_y}, {"grad_a", &args.grad_a}});
  }
  if (args.grad_b.defined()) {
    kernels::check_same_shape_any_dtype(op, stream,
                                        {{"grad_y", &args.grad_y}, {"grad_b", &args.grad_b}});
  }
  if (args.grad_y.numel() == 0 || (!args.grad_a.defined() && !args.grad_b.defined())) return;
  TL_DISPATCH(stream, cpu::add_relu_backward(args), cuda::add_relu_backward(args, stream));
}

}  // namespace towerlab
