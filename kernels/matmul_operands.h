// matmul's operand checks (kernels/matmul.h's accepted dtypes, and every tensor
// defined and on the stream's device), shared with batched_matmul, which checks a
// whole batch once instead of once per entry. Internal: not installed.
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab::kernels {

// float32 or float64 a, b and c of one dtype (float64 on the CPU only), or 16-bit
// a and b of one dtype with a float32 c or one of theirs; NotSupported or
// InvalidArgument starting "matmul: " otherwise. Shapes are the caller's to check.
void check_matmul_operands(const Stream& stream, const Tensor& c, const Tensor& a, const Tensor& b);

}  // namespace towerlab::kernels
