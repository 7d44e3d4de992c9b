// Checks and backend dispatch for peer_add (kernels/peer_add.h).
#include "kernels/peer_add.h"

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

}  // namespace towerlab
