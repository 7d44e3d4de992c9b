// The precision policy of a training run (TrainerOptions::precision), chosen once.
// docs/precision.md tells the whole story; in short, under Bf16:
//   - the master variables and the optimizer's slots stay float32 on the master
//     device(s), and each tower's replica holds them in float32 too (the ring, the
//     update and the broadcast are unchanged);
//   - each tower rounds its replica's trainable values once per step, at the start of
//     its forward pass, into a bfloat16 working copy (VariableStore::round_working: one
//     cast kernel over the flat buffer, on the tower's stream); CPU towers of a master
//     on the host share its values and one working copy, which the update writes;
//   - the GEMM-class ops (ag::matmul, ag::linear, ag::conv2d: forward, input gradient,
//     weight gradient) multiply bfloat16 operands (the working copy, the activation
//     rounded at the op, the output gradient rounded in the backward) with float32
//     sums, and write float32 outputs and gradients: the weights' gradients reach
//     the flat gradient buffer in float32 from those sums, never rounded to bfloat16;
//   - everything else (activations between ops, biases, batch norm and its
//     statistics, pooling, softmax, losses, reductions, the numeric guard, the
//     optimizer) is float32.
// Why the policy sits on the tape: every op already reaches its tape, so one field
// reaches every layer (Context::compute_dtype) and every GEMM-class op without a new
// parameter; a float32 tape takes exactly the code paths, and so the bits, of a
// trainer without the option.
//
// Fp32 is today's float32 everywhere. Tf32 keeps every tensor float32 and lets the
// float32 GEMMs and convolutions (ag::matmul, ag::linear, ag::batched_matmul,
// ag::conv2d: forward, input and weight gradients) multiply on TF32 tensor cores
// (Tape::float32_math, Float32Math::Tf32 of kernels/matmul.h and kernels/conv2d.h):
// on CUDA towers their operands are rounded to TF32 (10 mantissa bits, to nearest
// with ties away from zero) with float32 sums (grouped convolutions stay float32);
// on CPU towers, which have no TF32 arithmetic, it is Fp32, bit for bit.
// Fp16 is Bf16's policy with float16 as the working dtype, plus dynamic loss
// scaling (LossScale below): float16 keeps 10 mantissa bits to bfloat16's 7 but
// covers only 2^-24 to 65504, so small output gradients would flush to zero without
// the scale, and a master value of magnitude 65520 or more rounds to an infinity in
// the working copy (its forward then gives a non-finite loss, which the numeric
// guard reports).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../engine/device.h"
#include "../engine/tensor.h"
#include "../kernels/matmul.h"

namespace towerlab {

enum class Precision { Fp32, Tf32, Bf16, Fp16 };

// "fp32", "tf32", "bf16", "fp16": the sample's --precision values and the fingerprint's.
const char* precision_name(Precision precision);

// The dtype the GEMM-class ops multiply in (Tape::compute_dtype): float32 (Fp32,
// Tf32), bfloat16 or float16.
DType compute_dtype(Precision precision);
// How the float32 GEMMs multiply (Tape::float32_math): Tf32 under Tf32, else Ieee.
Float32Math float32_math(Precision precision);

// Dynamic loss scaling under Fp16, with PyTorch GradScaler's rules. Each tower seeds
// its backward with its share of the batch times scale(), so the output gradients
// the float16 GEMMs multiply are scale() times larger and stay above float16's
// subnormals; the summed gradient is multiplied by 1 / scale() (exact: a power of
// two) before clipping and the update. After each training step's check of the
// summed gradient (the trainer's phase 6, the same on every tower and process):
//   - overflow (an infinity or NaN anywhere in it): the step is skipped and the
//     scale halves, and the count of clean steps restarts;
//   - a clean step counts, and the growth_interval-th in a row doubles the scale
//     (and restarts the count).
// The scale starts at 2^16 and is always a power of two. Disabled (every other
// precision), scale() is 1 and update() does nothing.
class LossScale {
 public:
  static constexpr double kInitial = 65536.0;  // 2^16, GradScaler's init_scale
  static constexpr std::int64_t kGrowthInterval = 2000;

  LossScale() = default;
  LossScale(bool enabled, std::int64_t growth_interval);
  bool enabled() const { return enabled_; }
  double scale() const { return scale_; }
  // Clean steps since the last change of the scale.
  std::int64_t clean_steps() const { return clean_steps_; }
  std::int64_t growth_interval() const { return growth_interval_; }
  void update(bool overflow);
  // A checkpoint's position (Trainer::restore_state): a positive power of two and a
  // count >= 0 (at or above the interval, under a smaller interval than the saving
  // run's, the next clean step doubles the scale); InvalidArgument otherwise.
  void restore(double scale, std::int64_t clean_steps);

 private:
  bool enabled_ = false;
  std::int64_t growth_interval_ = kGrowthInterval;
  double scale_ = 1.0;
  std::int64_t clean_steps_ = 0;
};

}  // namespace towerlab
