// CPU peer_add and peer_sum: the specification for kernels/cuda/peer_add.cu. On the
// host every member's memory is the same memory, so "in place" is a plain loop.
#include <cstdint>
#include <vector>

#include "kernels/cpu/peer_add.h"

namespace towerlab::cpu {

void peer_add(const Tensor& dst, const Tensor& src) {
  float* out = dst.data<float>();       // [n]
  const float* in = src.data<float>();  // [n], possibly another member's buffer
  for (std::int64_t i = 0; i < dst.numel(); ++i) out[i] += in[i];
}

void peer_sum(const std::vector<Tensor>& buffers, const std::vector<std::int64_t>& first) {
  const auto n = std::int64_t(buffers.size());
  std::vector<float*> b;  // [n][length], every member's buffer
  for (const Tensor& t : buffers) b.push_back(t.data<float>());
  for (std::int64_t k = 0; k < n; ++k) {
    for (std::int64_t i = first[std::size_t(k)]; i < first[std::size_t(k) + 1]; ++i) {
      float sum = b[std::size_t(k)][i];  // from member k on, round the ring
      for (std::int64_t m = k + 1; m < k + n; ++m) sum += b[std::size_t(m % n)][i];
      for (float* member : b) member[i] = sum;
    }
  }
}

}  // namespace towerlab::cpu
