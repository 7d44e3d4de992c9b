// peer_add's plain reference (contracts in kernels/reference/peer_add.h).
#include "kernels/reference/peer_add.h"

namespace towerlab::reference {

void peer_add(float* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

void peer_sum(const std::vector<float*>& b, const std::vector<std::int64_t>& first) {
  const auto n = std::int64_t(b.size());
  for (std::int64_t k = 0; k < n; ++k) {
    for (std::int64_t i = first[std::size_t(k)]; i < first[std::size_t(k) + 1]; ++i) {
      float sum = b[std::size_t(k)][i];  // from member k on, round the ring
      for (std::int64_t m = k + 1; m < k + n; ++m) sum += b[std::size_t(m % n)][i];
      for (float* member : b) member[i] = sum;
    }
  }
}

}  // namespace towerlab::reference
