// The precision policy of a training run (TrainerOptions::precision), chosen once.
// docs/precision.md tells the whole story; in short, under Bf16:
//   - the master variables and the optimizer's slots stay float32 on the master
//     device(s), and each tower's replica holds them in float32 too (the ring, the
//     update and the broadcast are unchanged);
//   - each tower rounds its replica's trainable values once per step, at the start of
//     its forward pass, into a bfloat16 working copy (VariableStore::round_working: one
//     cast kernel over the flat buffer, on the tower's stream);
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
// Fp32 is today's float32 everywhere. Tf32 is float32 on CPU towers (the CPU has no
// TF32 arithmetic; the same bits as Fp32) and NotSupported on CUDA towers until the
// TF32 tensor-core GEMM exists. Fp16 (float16 with dynamic loss scaling) is
// NotSupported for now. The Trainer's constructor throws both, naming the choice.
#pragma once

#include <string>
#include <vector>

#include "../engine/device.h"
#include "../engine/tensor.h"

namespace towerlab {

enum class Precision { Fp32, Tf32, Bf16, Fp16 };

// "fp32", "tf32", "bf16", "fp16": the sample's --precision values and the fingerprint's.
const char* precision_name(Precision precision);

// The dtype the GEMM-class ops multiply in (Tape::compute_dtype) for towers on
// `devices`: float32 or bfloat16. Throws NotSupported for what does not run yet
// (fp16 anywhere, tf32 on CUDA towers), naming the precision and what does run.
DType compute_dtype(Precision precision, const std::vector<Device>& devices);

}  // namespace towerlab
