// CPU peer_add: the specification for kernels/cuda/peer_add.cu. On the host every
// member's memory is the same memory, so "in place" is a plain loop.
#include <cstdint>

#include "kernels/cpu/peer_add.h"

namespace towerlab::cpu {

void peer_add(const Tensor& dst, const Tensor& src) {
  float* out = dst.data<float>();       // [n]
  const float* in = src.data<float>();  // [n], possibly another member's buffer
  for (std::int64_t i = 0; i < dst.numel(); ++i) out[i] += in[i];
}

}  // namespace towerlab::cpu
