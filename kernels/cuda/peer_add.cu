// CUDA peer_add and peer_sum (contracts in kernels/peer_add.h): grid-stride loops,
// float32. peer_add's src may be a pointer into another GPU's memory; with peer
// access on, loads from it travel over the link (NVLink or PCIe), so the kernel
// reads src once and never writes it. peer_sum is the one-launch all-reduce of
// members that share a GPU: one row of blocks per span (blockIdx.y = k), each
// element read once from every member, summed from member k on, and written to all.
//
// peer_sum's speed on virtual devices of one GPU, beside a copy of all the members'
// bytes and beside the ring's steps: bench/results/gpu_h100.md and the README's
// ring picture. peer_add between two GPUs (peer access) has run only on the
// emulated GPUs (docs/gpu.md).
#include <algorithm>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/peer_add.h"

namespace towerlab::cuda {

namespace {

// dst and src may be the same array (each thread reads element i before it writes
// it), so neither pointer is __restrict__.
__global__ void peer_add_kernel(float* dst, const float* src, std::int64_t n) {
  for (const std::int64_t i : grid_stride(n)) {
    dst[i] += src[i];
  }
}

// The members' pointers and span bounds travel by value in the kernel's parameters
// (at most kPeerSumMembers members: 8 pointers and 9 bounds, 136 bytes).
struct PeerSumArgs {
  float* buffers[kPeerSumMembers];
  std::int64_t first[kPeerSumMembers + 1];
  int members;
};

// Span k = blockIdx.y starts its sums at member k and goes round: the ring's order
// for its chunk k, and so the ring's bits. The buffers do not overlap, and each
// element is read by the one thread that writes it.
__global__ void peer_sum_kernel(PeerSumArgs a) {
  const int k = static_cast<int>(blockIdx.y);
  const std::int64_t begin = a.first[k];
  for (const std::int64_t i : grid_stride(a.first[k + 1] - begin)) {
    const std::int64_t at = begin + i;
    float sum = a.buffers[k][at];
    for (int m = k + 1; m < k + a.members; ++m) {
      sum += a.buffers[m < a.members ? m : m - a.members][at];
    }
    for (int m = 0; m < a.members; ++m) a.buffers[m][at] = sum;
  }
}

}  // namespace

void peer_add(const Tensor& dst, const Tensor& src, const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  peer_add_kernel<<<grid_for(dst.numel(), stream), kBlockSize, 0, native(stream)>>>(
      dst.data<float>(), src.data<float>(), dst.numel());
  TL_CUDA_CHECK_LAUNCH();
}

void peer_sum(const std::vector<Tensor>& buffers, const std::vector<std::int64_t>& first,
              const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  PeerSumArgs args{};
  args.members = static_cast<int>(buffers.size());
  std::int64_t largest = 0;
  for (std::size_t m = 0; m < buffers.size(); ++m) {
    args.buffers[m] = buffers[m].data<float>();
    largest = std::max(largest, first[m + 1] - first[m]);
  }
  std::copy(first.begin(), first.end(), args.first);
  const unsigned spans = static_cast<unsigned>(buffers.size());
  const dim3 grid((grid_for(largest, stream) + spans - 1) / spans, spans);
  peer_sum_kernel<<<grid, kBlockSize, 0, native(stream)>>>(args);
  TL_CUDA_CHECK_LAUNCH();
}

}  // namespace towerlab::cuda
