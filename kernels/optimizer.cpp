// Checks and backend dispatch for the optimizer updates (kernels/optimizer.h).
#include "kernels/optimizer.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "kernels/cast.h"
#include "kernels/checks.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cuda/optimizer.h"

namespace towerlab {

namespace {

// The kernels load and store each element once through restrict pointers, so no
// two buffers may share bytes (views of one flat buffer at disjoint offsets are fine).
void check_disjoint(const char* op, std::initializer_list<kernels::NamedTensor> tensors) {
  for (auto a = tensors.begin(); a != tensors.end(); ++a) {
    for (auto b = a + 1; b != tensors.end(); ++b) {
      const auto* a_begin = static_cast<const char*>(a->second->raw_data());
      const auto* b_begin = static_cast<const char*>(b->second->raw_data());
      const bool overlap =
          a_begin < b_begin + b->second->nbytes() && b_begin < a_begin + a->second->nbytes();
      TL_CHECK(!overlap, InvalidArgument,
               op << ": " << a->first << " and " << b->first
                  << " overlap in memory; each buffer of an update needs its own memory ("
                  << a->first << " " << a->second->describe() << ")");
    }
  }
}

// A rate, decay or epsilon: finite and >= 0.
void check_non_negative(const char* op, const char* name, double value) {
  TL_CHECK(std::isfinite(value) && value >= 0, InvalidArgument,
           op << ": " << name << " must be a finite value >= 0, got " << value);
}

// A decay rate: in [0, 1), or [0, 1] where 1 is allowed (it freezes the average).
void check_unit(const char* op, const char* name, double value, bool one_allowed) {
  const bool ok = value >= 0 && (one_allowed ? value <= 1 : value < 1);
  TL_CHECK(
      ok, InvalidArgument,
      op << ": " << name << " must be in [0, 1" << (one_allowed ? "]" : ")") << ", got " << value);
}

void check_adam(const char* op, const Tensor& param, const Tensor& grad, const Tensor& m,
                const Tensor& v, std::int64_t step, const AdamParams& params,
                const Stream& stream) {
  kernels::check_same_shape(op, stream, {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}});
  check_non_negative(op, "lr", params.lr);
  check_unit(op, "beta1", params.beta1, false);
  check_unit(op, "beta2", params.beta2, false);
  check_non_negative(op, "epsilon", params.epsilon);
  check_non_negative(op, "weight_decay", params.weight_decay);
  TL_CHECK(step >= 1, InvalidArgument,
           op << ": step is the 1-based count of this update (1 on the first), got " << step);
  if (param.numel() > 0)
    check_disjoint(op, {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}});
}

// Adam's optional rounded copy (kernels/optimizer.h): 16-bit, of a float32 param's
// shape on the stream's device, apart from the other buffers.
void check_rounded(const char* op, const Tensor& param, const Tensor& grad, const Tensor& m,
                   const Tensor& v, const Tensor& rounded, const Stream& stream) {
  if (!rounded.defined()) return;
  TL_CHECK(param.dtype() == DType::Float32 && is_16bit(rounded.dtype()), InvalidArgument,
           op << ": a rounded copy is a bfloat16 or float16 copy of float32 values, got "
              << rounded.describe() << " for param " << param.describe());
  TL_CHECK(rounded.shape() == param.shape() && rounded.device() == stream.device(), ShapeError,
           op << ": rounded is " << rounded.describe() << " on " << rounded.device().str()
              << " where param is " << param.describe() << " on " << stream.device().str());
  if (param.numel() > 0) {
    check_disjoint(
        op, {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}, {"rounded", &rounded}});
  }
}

void adam_dispatch(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                   const Tensor& rounded, const AdamStep& step, const Stream& stream) {
  if (param.numel() == 0) return;
  TL_DISPATCH(stream, cpu::adam_update(param, grad, m, v, step, rounded),
              cuda::adam_update(param, grad, m, v, step, stream));
  // CUDA rounds the copy after its kernel; the CPU did within its pass.
  if (rounded.defined() && !stream.device().is_cpu()) cast(rounded, param, stream);
}

AdamStep adam_constants(std::int64_t step, const AdamParams& params) {
  const auto t = static_cast<double>(step);
  AdamStep s{};
  s.beta1 = params.beta1;
  s.beta2 = params.beta2;
  s.epsilon = params.epsilon;
  s.step_size = params.lr / (1.0 - std::pow(params.beta1, t));
  s.bias_correction2_sqrt = std::sqrt(1.0 - std::pow(params.beta2, t));
  return s;
}

}  // namespace

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& velocity,
                const SgdParams& params, const Stream& stream) {
  const char* op = "sgd_update";
  kernels::check_same_shape(op, stream, {{"param", &param}, {"grad", &grad}});
  check_non_negative(op, "lr", params.lr);
  check_non_negative(op, "momentum", params.momentum);
  check_non_negative(op, "weight_decay", params.weight_decay);
  TL_CHECK(!params.nesterov || params.momentum > 0, InvalidArgument,
           op << ": nesterov needs a momentum > 0, got momentum " << params.momentum);
  const bool has_momentum = params.momentum > 0;
  if (has_momentum) {
    TL_CHECK(velocity.defined(), InvalidArgument,
             op << ": momentum " << params.momentum
                << " needs a velocity buffer of param's shape, got an undefined tensor");
    kernels::check_same_shape(op, stream, {{"param", &param}, {"velocity", &velocity}});
  }
  if (param.numel() == 0) return;
  if (has_momentum) {
    check_disjoint(op, {{"param", &param}, {"grad", &grad}, {"velocity", &velocity}});
  } else {
    check_disjoint(op, {{"param", &param}, {"grad", &grad}});
  }
  const Tensor unused;
  TL_DISPATCH(stream, cpu::sgd_update(param, grad, has_momentum ? velocity : unused, params),
              cuda::sgd_update(param, grad, has_momentum ? velocity : unused, params, stream));
}

void rmsprop_update(const Tensor& param, const Tensor& grad, const Tensor& mean_square,
                    const Tensor& moment, const Tensor& mean_grad, const RmspropParams& params,
                    const Stream& stream) {
  const char* op = "rmsprop_update";
  kernels::check_same_shape(
      op, stream,
      {{"param", &param}, {"grad", &grad}, {"mean_square", &mean_square}, {"moment", &moment}});
  check_non_negative(op, "lr", params.lr);
  check_unit(op, "decay", params.decay, true);
  check_non_negative(op, "momentum", params.momentum);
  check_non_negative(op, "epsilon", params.epsilon);
  if (params.centered) {
    TL_CHECK(mean_grad.defined(), InvalidArgument,
             op << ": centered RMSProp needs a mean_grad buffer of param's shape, got an "
                   "undefined tensor");
    kernels::check_same_shape(op, stream, {{"param", &param}, {"mean_grad", &mean_grad}});
  }
  if (param.numel() == 0) return;
  if (params.centered) {
    check_disjoint(op, {{"param", &param},
                        {"grad", &grad},
                        {"mean_square", &mean_square},
                        {"moment", &moment},
                        {"mean_grad", &mean_grad}});
  } else {
    check_disjoint(
        op,
        {{"param", &param}, {"grad", &grad}, {"mean_square", &mean_square}, {"moment", &moment}});
  }
  const Tensor unused;
  const Tensor& mg = params.centered ? mean_grad : unused;
  TL_DISPATCH(stream, cpu::rmsprop_update(param, grad, mean_square, moment, mg, params),
              cuda::rmsprop_update(param, grad, mean_square, moment, mg, params, stream));
}

void adam_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                 std::int64_t step, const AdamParams& params, const Stream& stream,
                 const Tensor& rounded) {
  check_adam("adam_update", param, grad, m, v, step, params, stream);
  check_rounded("adam_update", param, grad, m, v, rounded, stream);
  AdamStep s = adam_constants(step, params);
  s.weight_decay = params.weight_decay;
  s.decay_factor = 1.0;
  adam_dispatch(param, grad, m, v, rounded, s, stream);
}

void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                  std::int64_t step, const AdamParams& params, const Stream& stream,
                  const Tensor& rounded) {
  check_adam("adamw_update", param, grad, m, v, step, params, stream);
  check_rounded("adamw_update", param, grad, m, v, rounded, stream);
  AdamStep s = adam_constants(step, params);
  s.weight_decay = 0.0;
  s.decay_factor = 1.0 - params.lr * params.weight_decay;
  adam_dispatch(param, grad, m, v, rounded, s, stream);
}

}  // namespace towerlab
