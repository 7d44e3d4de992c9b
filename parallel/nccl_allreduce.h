// NCCL's all-reduce, selectable in the trainer (AllReduce::Nccl) to compare the
// ring with the vendor's collective. NCCL runs one rank per physical GPU, so it
// needs two or more distinct GPUs; virtual devices (a GPU repeated) and CPU towers
// use towerlab's ring. Built when the CUDA toolkit ships libnccl; otherwise
// constructing one throws NotSupported.
#pragma once

#include <memory>
#include <vector>

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

class NcclAllReduce {
 public:
  // One member per stream, each on its own physical GPU. Throws InvalidArgument
  // naming the problem otherwise.
  explicit NcclAllReduce(std::vector<const Stream*> streams);
  ~NcclAllReduce();
  NcclAllReduce(const NcclAllReduce&) = delete;
  NcclAllReduce& operator=(const NcclAllReduce&) = delete;

  // buffers[i] (float32, one length, on streams[i]'s device) := the sum of all, on the streams.
  void allreduce(const std::vector<Tensor>& buffers);

  static bool available();  // built with NCCL

 private:
  struct Comms;
  std::vector<const Stream*> streams_;
  std::unique_ptr<Comms> comms_;
};

}  // namespace towerlab
