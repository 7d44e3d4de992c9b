// Phase 5's exchange buffer, laid out once (parallel/process_exchange.h).
#include "parallel/process_exchange.h"

#include <algorithm>

namespace towerlab {

ExchangeLayout exchange_layout(const ExchangeContents& c) {
  const bool staged = c.training && c.through_host;
  ExchangeLayout layout;
  std::int64_t at = 0;
  const auto next = [&at](std::int64_t size) {
    const ExchangeRange range{at, at + size};
    at = range.end;
    return range;
  };
  layout.gradient = next(staged ? c.gradient : 0);
  layout.statistics = next(staged ? c.statistics : 0);
  layout.losses = next(c.ranks * c.towers);
  layout.batch_sizes = next(c.ranks);
  const bool gradient_done = staged && c.buckets_sum_gradient;
  layout.summed = {gradient_done ? layout.gradient.end : 0, layout.total()};
  layout.carries = !staged         ? "losses, batch sizes"
                   : gradient_done ? "moving statistics, losses, batch sizes"
                                   : "gradients, moving statistics, losses, batch sizes";
  return layout;
}

ProcessExchange::ProcessExchange(const ExchangeContents& training,
                                 const ExchangeContents& evaluation)
    : training_(exchange_layout(training)), evaluation_(exchange_layout(evaluation)) {
  storage_ = Tensor::empty({std::max(training_.total(), evaluation_.total())}, Device::cpu());
}

}  // namespace towerlab
