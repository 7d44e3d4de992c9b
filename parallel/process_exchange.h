// Internal (not installed): the host buffer that phase 5 of a training step
// (reduce across processes, parallel/trainer.h) sums over the processes, described
// as data, once, when the trainer is built.
//
// One float per element, in this order:
//
//   [ gradient | moving statistics | losses | batch sizes ]
//     G          S                   R x T    R
//
//   gradient, moving statistics: tower 0's flat gradient and flat state (after
//       phases 3 and 4 every tower holds the same), on a training step whose values
//       travel through the host. Empty in an evaluation, and when NCCL carries them
//       on tower 0's device buffers after this call (parallel/nccl_communicator.h).
//   losses: every tower's loss of every rank, [rank * T + tower] (0: no samples).
//   batch sizes: per rank, the batch it saw; each rank fills in its own entry and
//       zeros, so the sum holds every rank's and the trainer checks that they agree.
//
// The step's one allreduce_sum sums `summed`: the whole buffer, or everything after
// the gradient when the bucket reducer's calls (parallel/buckets.h) summed the
// gradient during the backward. Those calls stage each bucket at its own place in
// this same buffer and frame it by the whole buffer (ReduceFrame), so every element
// is summed in the same order either way: the same bits.
#pragma once

#include <cstdint>
#include <string>

#include "../engine/tensor.h"

namespace towerlab {

// Elements [begin, end) of the exchange buffer.
struct ExchangeRange {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
  bool empty() const { return end == begin; }
  Tensor of(const Tensor& buffer) const { return buffer.slice(begin, end); }
};

// What decides the layout of one kind of call (a training step or an evaluation).
struct ExchangeContents {
  bool training = false;
  bool through_host = true;           // gradient and statistics staged on the host (no NCCL)
  bool buckets_sum_gradient = false;  // the bucket reducer's calls sum the gradient
  std::int64_t gradient = 0;          // trainable elements (the flat gradient)
  std::int64_t statistics = 0;        // state elements (the moving statistics)
  std::int64_t ranks = 1;
  std::int64_t towers = 1;  // per rank
};

struct ExchangeLayout {
  ExchangeRange gradient, statistics, losses, batch_sizes;
  ExchangeRange summed;  // what the step's allreduce_sum sums
  std::string carries;   // what `summed` holds, for the call's name and the trace
  std::int64_t total() const { return batch_sizes.end; }
  // The gradient's range when this call carries it; empty when it does not (not
  // staged, or summed by the buckets' calls).
  ExchangeRange gradient_summed() const { return summed.begin == 0 ? gradient : ExchangeRange{}; }
};

ExchangeLayout exchange_layout(const ExchangeContents& contents);

// Phase 5's layouts and its host buffer, kept between steps.
class ProcessExchange {
 public:
  // `training` and `evaluation` describe the two kinds of call.
  ProcessExchange(const ExchangeContents& training, const ExchangeContents& evaluation);

  const ExchangeLayout& layout(bool training) const { return training ? training_ : evaluation_; }
  // The buffer of `layout(training).total()` floats, on the host: a view of one
  // allocation large enough for either kind.
  Tensor buffer(bool training) const { return storage_.slice(0, layout(training).total()); }

 private:
  ExchangeLayout training_, evaluation_;
  Tensor storage_;
};

}  // namespace towerlab
