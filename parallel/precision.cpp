// The precision policy's names and dtypes (parallel/precision.h).
#include "parallel/precision.h"

#include <cmath>

#include "engine/error.h"

namespace towerlab {

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::Fp32:
      return "fp32";
    case Precision::Tf32:
      return "tf32";
    case Precision::Bf16:
      return "bf16";
    case Precision::Fp16:
      return "fp16";
  }
  return "?";
}

DType compute_dtype(Precision precision) {
  switch (precision) {
    case Precision::Fp32:
    case Precision::Tf32:  // float32 tensors; the GEMMs' TF32 is float32_math's
      return DType::Float32;
    case Precision::Bf16:
      return DType::BFloat16;
    case Precision::Fp16:
      return DType::Float16;
  }
  return DType::Float32;
}

Float32Math float32_math(Precision precision) {
  return precision == Precision::Tf32 ? Float32Math::Tf32 : Float32Math::Ieee;
}

LossScale::LossScale(bool enabled, std::int64_t growth_interval)
    : enabled_(enabled), growth_interval_(growth_interval), scale_(enabled ? kInitial : 1.0) {
  TL_CHECK(growth_interval >= 1, InvalidArgument,
           "Trainer: loss_scale_growth_interval must be at least 1 (clean steps before the "
           "loss scale doubles; GradScaler's is 2000), got "
               << growth_interval);
}

void LossScale::update(bool overflow) {
  if (!enabled_) return;
  if (overflow) {
    scale_ /= 2;
    clean_steps_ = 0;
  } else if (++clean_steps_ >= growth_interval_) {
    scale_ *= 2;
    clean_steps_ = 0;
  }
}

void LossScale::restore(double scale, std::int64_t clean_steps) {
  int exponent = 0;
  TL_CHECK(
      std::isfinite(scale) && scale > 0 && std::frexp(scale, &exponent) == 0.5 && clean_steps >= 0,
      InvalidArgument,
      "loss scale " << scale << " after " << clean_steps
                    << " clean steps: the scale must be a positive power of two and the "
                       "count at least 0");
  scale_ = scale;
  clean_steps_ = clean_steps;
}

}  // namespace towerlab
