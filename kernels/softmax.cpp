// Checks and backend dispatch for softmax and log-softmax (kernels/softmax.h).
// The files an op takes, in order: the top of kernels/relu.h.
#include "kernels/softmax.h"

#include "kernels/checks.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/softmax.h"

namespace towerlab {

namespace {

// x has a last dimension to normalize over, and under the causal mask is [..., T, T].
void check_rows(const char* op, const char* name, const Tensor& x, SoftmaxMask mask) {
  TL_CHECK(x.dim() >= 1, ShapeError,
           op << ": " << name << " is " << x.describe()
              << "; it needs a last dimension to normalize over");
  if (mask == SoftmaxMask::Causal) {
    const Shape& s = x.shape();
    TL_CHECK(x.dim() >= 2 && s[s.size() - 1] == s[s.size() - 2], ShapeError,
             op << ": the causal mask takes " << name << " as [..., T, T] (queries by keys), but "
                << name << " is " << x.describe());
  }
}

void forward(const char* op, const Tensor& y, const Tensor& x, SoftmaxKind kind, SoftmaxMask mask,
             const Stream& stream) {
  kernels::check_same_shape(op, stream, {{"y", &y}, {"x", &x}});
  check_rows(op, "x", x, mask);
  if (x.numel() == 0) return;
  TL_DISPATCH(stream, cpu::softmax_forward(y, x, kind, mask),
              cuda::softmax_forward(y, x, kind, mask, stream));
}

void backward(const char* op, const Tensor& grad_x, const Tensor& grad_y, const Tensor& y,
              SoftmaxKind kind, SoftmaxMask mask, const Stream& stream, GradWrite write) {
  kernels::check_same_shape(op, stream, {{"grad_x", &grad_x}, {"grad_y", &grad_y}, {"y", &y}});
  check_rows(op, "y", y, mask);
  if (y.numel() == 0) return;
  TL_DISPATCH(stream, cpu::softmax_backward(grad_x, grad_y, y, kind, mask, write),
              cuda::softmax_backward(grad_x, grad_y, y, kind, mask, stream, write));
}

}  // namespace

void softmax_forward(const Tensor& y, const Tensor& x, SoftmaxMask mask, const Stream& stream) {
  forward("softmax_forward", y, x, SoftmaxKind::Softmax, mask, stream);
}

void softmax_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, SoftmaxMask mask,
                      const Stream& stream, GradWrite write) {
  backward("softmax_backward", grad_x, grad_y, y, SoftmaxKind::Softmax, mask, stream, write);
}

void log_softmax_forward(const Tensor& y, const Tensor& x, SoftmaxMask mask, const Stream& stream) {
  forward("log_softmax_forward", y, x, SoftmaxKind::LogSoftmax, mask, stream);
}

void log_softmax_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y,
                          SoftmaxMask mask, const Stream& stream, GradWrite write) {
  backward("log_softmax_backward", grad_x, grad_y, y, SoftmaxKind::LogSoftmax, mask, stream, write);
}

}  // namespace towerlab
