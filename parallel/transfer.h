// Internal (not installed): one copy between two streams, ordered on both, as the
// trainer's master and its towers make them (parallel/trainer.cpp,
// parallel/sharded_master.cpp).
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"

namespace towerlab {

// Copies src (ready on src_stream) into dst (used on dst_stream), ordering both
// streams around the copy; the copy runs on a GPU stream when either side is a GPU.
void transfer(const Tensor& dst, const Stream& dst_stream, const Tensor& src,
              const Stream& src_stream);

}  // namespace towerlab
