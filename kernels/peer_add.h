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
//   peer_sum(buffers, first)       every buffer := the members' sum, added in a rotating
//                                  order (below), in one pass
//
// dst is on the stream's device; src on a device the stream's device can read
// (peer_readable), else InvalidArgument. Both are float32 with one element count
// (shapes need not match); they may be the same tensor but must not otherwise
// overlap. Each element is the one float32 addition dst[i] + src[i]: the same bits
// as add(dst, dst, src) or as copying src over first and adding the copy, which is
// what keeps the ring's sums identical on every path. Empty tensors are a no-op.
// Runs asynchronously on `stream`; src's device must not write src meanwhile (the
// caller orders that with an event).
//
// peer_sum is the ring all-reduce of members that share one memory (virtual devices
// of one GPU, parallel/ring_allreduce.h) done in one launch: for the n buffers
// (float32, one element count L, each readable in place from the stream's device;
// at most kPeerSumMembers of them) and the n + 1 bounds first[0] = 0 <= first[1] <=
// ... <= first[n] = L, element i of span k (first[k] <= i < first[k+1]) becomes, in
// every buffer,
//     ((b[k][i] + b[k+1][i]) + b[k+2][i]) + ... + b[k-1][i]      (members mod n),
// the order in which the ring accumulates chunk k when first holds its chunks'
// bounds (parallel/ring_schedule.h): so the same bits as the ring, with each element
// read once from every member and written once to every member (2n memory passes,
// where the ring's steps take 5(n-1), and one launch where they take 2n(n-1)). The
// buffers must not overlap; the caller orders every member's writes before the call
// and its reads after it.
#pragma once

#include <cstdint>
#include <vector>

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

inline constexpr std::size_t kPeerSumMembers = 8;

bool peer_readable(Device reader, Device owner);
void peer_add(const Tensor& dst, const Tensor& src, const Stream& stream);
void peer_sum(const std::vector<Tensor>& buffers, const std::vector<std::int64_t>& first,
              const Stream& stream);

}  // namespace towerlab
