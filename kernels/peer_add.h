// Adding a tensor that lives in another device's memory without copying it first:
// the ring all-reduce's receiver reads its sender's chunk in place and adds it into
// its own (3 memory passes per element: two reads and a write, where a copy into a
// receive buffer and an add take 5).
//
//   peer_readable(reader, owner)   true when kernels on `reader` can read memory of
//                                  `owner` in place: both the host, one GPU, or two
//                                  GPUs with peer access (turned on by the call, once;
//                                  engine/tensor.h). The host never reads a GPU's
//                                  memory in place, nor a GPU the host's.
//   peer_add(dst, src)             dst[i] += src[i]   (accumulates into dst)
//
// dst is on the stream's device; src on a device the stream's device can read
// (peer_readable), else InvalidArgument. Both are float32 with one element count
// (shapes need not match); they may be the same tensor but must not otherwise
// overlap. Each element is the one float32 addition dst[i] + src[i]: the same bits
// as add(dst, dst, src) or as copying src over first and adding the copy, which is
// what keeps the ring's sums identical on every path. Empty tensors are a no-op.
// Runs asynchronously on `stream`; src's device must not write src meanwhile (the
// caller orders that with an event).
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

bool peer_readable(Device reader, Device owner);
void peer_add(const Tensor& dst, const Tensor& src, const Stream& stream);

}  // namespace towerlab
