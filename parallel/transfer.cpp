#include "parallel/transfer.h"

namespace towerlab {

void transfer(const Tensor& dst, const Stream& dst_stream, const Tensor& src,
              const Stream& src_stream) {
  if (&dst_stream == &src_stream) {
    copy_tensor(dst, src, dst_stream);
    return;
  }
  const bool on_dst = dst_stream.device().is_cuda() || !src_stream.device().is_cuda();
  const Stream& copier = on_dst ? dst_stream : src_stream;
  const Stream& other = on_dst ? src_stream : dst_stream;
  Event other_ready(other.device());
  other_ready.record(other);
  copier.wait(other_ready);
  copy_tensor(dst, src, copier);
  Event copied(copier.device());
  copied.record(copier);
  other.wait(copied);
}

}  // namespace towerlab
