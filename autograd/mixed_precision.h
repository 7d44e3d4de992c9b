// The working dtype between ops under a 16-bit precision policy (docs/precision.md),
// and the one float32 fallback for the ops that have no 16-bit kernel.
//
// On a bf16 or fp16 tape (Tape::compute_dtype) the GEMM-class ops write their output
// in the working dtype, rounded once from their float32 sums, and the element-wise
// ops with 16-bit kernels (ReLU, bias add and bias add + ReLU, the activations,
// pooling, batch norm) read and write it. Every other op reaches a 16-bit input
// through through_float32():
//
//   y = through_float32(inputs, output, op)
//     1. every 16-bit input x becomes widen(x), float32 (exact);
//     2. op runs on those, the float32 op as on an fp32 tape;
//     3. FallbackOutput::Working rounds its float32 output once to the 16-bit
//        inputs' dtype (round_to); FallbackOutput::Float32 returns it as it is (the
//        ops the policy keeps in float32: softmax, losses, reductions).
// Inputs that are float32 (a bias, batch norm's gamma and beta: the policy keeps
// parameters float32) pass through unchanged; with no 16-bit input nothing is
// recorded and the op runs as always, so fp32 and tf32 tapes keep their bits.
//
// Gradients are float32 between every two ops (Tape::grad_dtype): widen and round_to
// are straight through in the backward (dL/dx = dL/dy, added into x's float32
// gradient), and a backward that reads a saved 16-bit value widens it first
// (widened), then runs the float32 kernel.
//
// An op takes the fallback at its top, calling itself on the widened inputs:
//   if (has_16bit({x})) return through_float32({x}, FallbackOutput::Working,
//                                              [&](const std::vector<Var>& v) { return op(v[0]);
//                                              });
// Internal to autograd (not in towerlab.h).
#pragma once

#include <vector>

#include "tape.h"

namespace towerlab::ag {

enum class FallbackOutput {
  Working,  // the output rounded to the working dtype: the op's result feeds a GEMM
  Float32,  // the output left float32 (softmax, losses, reductions)
};

// Whether any defined input holds a 16-bit value.
bool has_16bit(const std::vector<Var>& inputs);

// x as float32 (exact), recorded as "widen"; x itself when it is not 16-bit.
Var widen(const Var& x);
// y rounded once to `dtype` (to nearest even), recorded as "round_to_<dtype>"; y
// itself when it already has that dtype.
Var round_to(const Var& y, DType dtype);

// A saved value as a float32 backward kernel reads it: widened into a new tensor
// on `stream` when 16-bit, else the tensor itself.
Tensor widened(const Tensor& value, const Stream& stream);

template <class Float32Op>
Var through_float32(const std::vector<Var>& inputs, FallbackOutput output,
                    const Float32Op& float32_op) {
  DType working = DType::Float32;
  std::vector<Var> wide;
  wide.reserve(inputs.size());
  for (const Var& x : inputs) {
    if (x.defined() && is_16bit(x.value().dtype())) working = x.value().dtype();
    wide.push_back(widen(x));
  }
  const Var y = float32_op(wide);
  const bool round = output == FallbackOutput::Working && working != DType::Float32;
  return round ? round_to(y, working) : y;
}

}  // namespace towerlab::ag
