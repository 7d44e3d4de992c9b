#include "autograd/mixed_precision.h"

#include "kernels/cast.h"

namespace towerlab::ag {

namespace {

// A dtype conversion on the tape; its backward passes the float32 gradient through,
// handing x the gradient tensor itself where x has none yet (Tape::pass_grad), as a
// reshape does, instead of a copy of it.
Var converted(const Var& x, DType dtype, std::string name) {
  Tape& tape = x.tape();
  return tape.record(cast(x.value(), dtype, tape.stream()), std::move(name), {x},
                     [x](const Var& out) { out.tape().pass_grad(x, out.grad()); });
}

}  // namespace

bool has_16bit(const std::vector<Var>& inputs) {
  for (const Var& x : inputs) {
    if (x.defined() && is_16bit(x.value().dtype())) return true;
  }
  return false;
}

Var widen(const Var& x) {
  if (!x.defined() || !is_16bit(x.value().dtype())) return x;
  return converted(x, DType::Float32, "widen");
}

Var round_to(const Var& y, DType dtype) {
  if (y.value().dtype() == dtype) return y;
  return converted(y, dtype, std::string("round_to_") + dtype_name(dtype));
}

Tensor widened(const Tensor& value, const Stream& stream) {
  return is_16bit(value.dtype()) ? cast(value, DType::Float32, stream) : value;
}

}  // namespace towerlab::ag
