// CPU peer_add and peer_sum: the plain reference (kernels/reference/peer_add.h). On
// the host every member's memory is the same memory, so "in place" is a plain loop.
#include <cstdint>
#include <vector>

#include "kernels/cpu/peer_add.h"
#include "kernels/reference/peer_add.h"

namespace towerlab::cpu {

void peer_add(const Tensor& dst, const Tensor& src) {
  // dst [n]; src [n], possibly another member's buffer
  reference::peer_add(dst.data<float>(), src.data<float>(), dst.numel());
}

void peer_sum(const std::vector<Tensor>& buffers, const std::vector<std::int64_t>& first) {
  std::vector<float*> b;  // [n][length], every member's buffer
  for (const Tensor& t : buffers) b.push_back(t.data<float>());
  reference::peer_sum(b, first);
}

}  // namespace towerlab::cpu
