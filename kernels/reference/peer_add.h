// The plain reference of peer_add and peer_sum (contracts in kernels/peer_add.h),
// which the CPU backend is (on the host every member's memory is the same memory)
// and the CUDA kernels are tested against. float32, as the ring's buffers are.
#pragma once

#include <cstdint>
#include <vector>

namespace towerlab::reference {

// dst[i] += src[i] (ACCUMULATES); dst [n], src [n] (may be dst itself).
void peer_add(float* dst, const float* src, std::int64_t n);

// Every buffer := the members' sum, span by span: for the members b [members][L]
// and the bounds first [members + 1] (first[0] = 0 <= ... <= first[members] = L),
// element i of span k (first[k] <= i < first[k+1]) becomes, in every buffer,
//   ((b[k][i] + b[k+1][i]) + b[k+2][i]) + ... + b[k-1][i]      (members mod n).
void peer_sum(const std::vector<float*>& b, const std::vector<std::int64_t>& first);

}  // namespace towerlab::reference
