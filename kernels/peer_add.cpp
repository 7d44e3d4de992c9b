// Checks and backend dispatch for peer_add (kernels/peer_add.h).
#include "kernels/peer_add.h"

#include <string>

#include "kernels/checks.h"
#include "kernels/cpu/peer_add.h"
#include "kernels/cuda/peer_add.h"

namespace towerlab {

bool peer_readable(Device reader, Device owner) {
  if (reader.is_cpu() || owner.is_cpu()) return reader.is_cpu() && owner.is_cpu();
  return enable_peer_access(reader.index, owner.index);
}

void peer_add(const Tensor& dst, const Tensor& src, const Stream& stream) {
  kernels::check_on_stream("peer_add", stream, {{"dst", &dst}});
  TL_CHECK(src.defined(), InvalidArgument, "peer_add: src is undefined");
  kernels::check_float32("peer_add", "dst", dst);
  kernels::check_float32("peer_add", "src", src);
  TL_CHECK(dst.numel() == src.numel(), ShapeError,
           "peer_add: src " << src.describe() << " has " << src.numel() << " elements but dst "
                            << dst.describe() << " has " << dst.numel());
  TL_CHECK(peer_readable(stream.device(), src.device()), InvalidArgument,
           "peer_add: " << stream.device().str() << " cannot read src " << src.describe()
                        << " in place (no peer access); copy it to " << stream.device().str()
                        << " with copy_tensor and add the copy");
  if (dst.numel() == 0) return;
  TL_DISPATCH(stream, cpu::peer_add(dst, src), cuda::peer_add(dst, src, stream));
}

void peer_sum(const std::vector<Tensor>& buffers, const std::vector<std::int64_t>& first,
              const Stream& stream) {
  const std::size_t n = buffers.size();
  TL_CHECK(n >= 1 && n <= kPeerSumMembers, InvalidArgument,
           "peer_sum: " << n << " buffers; it sums 1 to " << kPeerSumMembers);
  TL_CHECK(first.size() == n + 1, InvalidArgument,
           "peer_sum: " << first.size() << " span bounds for " << n << " buffers (needs " << n + 1
                        << ")");
  for (std::size_t m = 0; m < n; ++m) {
    const std::string name = "buffers[" + std::to_string(m) + "]";
    TL_CHECK(buffers[m].defined(), InvalidArgument, "peer_sum: " << name << " is undefined");
    kernels::check_float32("peer_sum", name.c_str(), buffers[m]);
    TL_CHECK(buffers[m].numel() == buffers[0].numel(), ShapeError,
             "peer_sum: " << name << " " << buffers[m].describe() << " has " << buffers[m].numel()
                          << " elements but buffers[0] " << buffers[0].describe() << " has "
                          << buffers[0].numel());
    TL_CHECK(peer_readable(stream.device(), buffers[m].device()), InvalidArgument,
             "peer_sum: " << stream.device().str() << " cannot read " << name << " "
                          << buffers[m].describe() << " in place (no peer access)");
  }
  const std::int64_t length = buffers[0].numel();
  for (std::size_t k = 0; k <= n; ++k) {
    const std::int64_t low = k == 0 ? 0 : first[k - 1];
    TL_CHECK(first[k] >= low && first[k] <= length && (k > 0 || first[0] == 0) &&
                 (k < n || first[n] == length),
             InvalidArgument,
             "peer_sum: span bound first[" << k << "] = " << first[k]
                                           << "; the bounds must rise from 0 to " << length
                                           << ", the buffers' element count");
  }
  if (length == 0) return;
  TL_DISPATCH(stream, cpu::peer_sum(buffers, first), cuda::peer_sum(buffers, first, stream));
}

}  // namespace towerlab
