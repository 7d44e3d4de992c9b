// The reduction of bfloat16 contributions (parallel/ring_contributions.h): its
// reference, the ring's reduce-scatter of contributions, and the processes' exchange.
#include "parallel/ring_contributions.h"

#include <cstring>
#include <string>

#include "engine/clock.h"
#include "engine/error.h"
#include "engine/half.h"
#include "kernels/cast.h"
#include "kernels/cpu/convert16.h"
#include "kernels/elementwise.h"
#include "parallel/nccl_communicator.h"
#include "parallel/process_group.h"
#include "parallel/ring_allreduce.h"
#include "parallel/thread_team.h"
#include "parallel/trace.h"

namespace towerlab {

namespace {

// As the ring's own rule (ring_allreduce.cpp): below this many values in the
// largest chunk, host members run on the caller's thread.
constexpr std::int64_t kMinChunkValuesForThreads = 16384;

float rounded(float value) {
  return static_cast<float>(bfloat16(value));
}

}  // namespace

void contribution_sum_reference(std::span<float> sum,
                                const std::vector<std::span<const float>>& members) {
  TL_CHECK(!members.empty(), InvalidArgument, "contribution_sum_reference: no members");
  for (std::size_t m = 0; m < members.size(); ++m) {
    TL_CHECK(members[m].size() == sum.size(), ShapeError,
             "contribution_sum_reference: member " << m << " has " << members[m].size()
                                                   << " values, the sum " << sum.size());
  }
  for (std::size_t i = 0; i < sum.size(); ++i) {
    float total = rounded(members[0][i]);
    for (std::size_t m = 1; m < members.size(); ++m) total += rounded(members[m][i]);
    sum[i] = total;
  }
}

void Ring::reduce_scatter_contributions(const std::vector<Tensor>& buffers, std::int64_t begin,
                                        std::int64_t end, Trace* trace, int first_row) {
  const auto n = static_cast<std::int64_t>(streams_.size());
  if (begin == end) return;
  auto member = [&](std::int64_t i) -> const Stream& { return *streams_[std::size_t(i)]; };
  const RingSchedule schedule(n, buffers[0].numel(), begin, end);
  // Owner j's chunk (what it receives, counted as the schedule carries it: a
  // bfloat16 chunk from every other member) and its trace span.
  auto received_by = [&](std::int64_t j) {
    const RingRange r = schedule.chunk(schedule.summed_at(j));
    bytes_received_ += (n - 1) * r.size() * std::int64_t(sizeof(bfloat16));
    return r;
  };
  auto trace_sum = [&](std::int64_t j, const RingRange& r, Clock::time_point start) {
    if (trace == nullptr) return;
    member(j).synchronize();
    trace->span(first_row + int(j), "reduce-scatter (bfloat16 contributions)", start, "ring",
                {{"chunk", schedule.summed_at(j)},
                 {"members", n},
                 {"bytes", (n - 1) * r.size() * std::int64_t(sizeof(bfloat16))}});
  };

  if (all_host_) {
    // One memory: owner j rounds every member's values of its chunk as it reads
    // them and adds them in member order, one pass of blocks in L1, no bfloat16
    // copies of the buffers (rounding is a function of the value: the copies'
    // bits), the rounding and widening by the CPU kernels' vector conversions
    // (kernels/cpu/convert16.h). The owners' chunks are disjoint, and each reads a
    // block of its own values before it writes that block.
    auto sum_on_host = [&](std::int64_t j) {
      const RingRange r = received_by(j);
      const auto start = Clock::now();
      std::vector<const float*> from;  // [n] members' chunk r
      for (const Tensor& b : buffers) from.push_back(b.data<float>() + r.begin);
      float* mine = buffers[std::size_t(j)].data<float>() + r.begin;  // [r.size()]
      cpu::for_each_block(r.size(), [&](std::int64_t first, std::int64_t count) {
        bfloat16 contribution[cpu::kConvertBlock];
        float total[cpu::kConvertBlock], term[cpu::kConvertBlock];
        for (std::int64_t m = 0; m < n; ++m) {
          cpu::round_to_16bit(contribution, from[std::size_t(m)] + first, count);
          cpu::widen_16bit(m == 0 ? total : term, contribution, count);
          if (m == 0) continue;
          for (std::int64_t i = 0; i < count; ++i) total[i] += term[i];
        }
        std::memcpy(mine + first, total, std::size_t(count) * sizeof(float));
      });
      trace_sum(j, r, start);
    };
    if (team_ == nullptr || schedule.largest_chunk() < kMinChunkValuesForThreads) {
      for (std::int64_t j = 0; j < n; ++j) sum_on_host(j);
    } else {
      team_->run([&](std::size_t j) { sum_on_host(std::int64_t(j)); });
    }
    return;
  }

  // GPUs. contribution[m]: member m's range rounded once, [end - begin] bfloat16 on
  // its device; widened[j] and received[j]: owner j's widened term and, where it
  // reads another device's contribution, its copy.
  std::vector<Tensor> contribution, widened(static_cast<std::size_t>(n)),
      received(static_cast<std::size_t>(n));
  for (std::int64_t m = 0; m < n; ++m) {
    contribution.push_back(Tensor::empty({end - begin}, member(m), DType::BFloat16));
    cast(contribution.back(), buffers[std::size_t(m)].view(begin, {end - begin}), member(m));
    done_[std::size_t(m)].record(member(m));
  }
  for (std::int64_t j = 0; j < n; ++j) {
    for (std::int64_t m = 0; m < n; ++m) {
      if (m != j) member(j).wait(done_[std::size_t(m)]);
    }
  }
  // Owner j's chunk := the members' contributions, widened and added in member order.
  for (std::int64_t j = 0; j < n; ++j) {
    const RingRange r = received_by(j);
    if (r.size() == 0) continue;
    const auto start = Clock::now();
    const Stream& stream = member(j);
    const Tensor mine = buffers[std::size_t(j)].view(r.begin, {r.size()});
    for (std::int64_t m = 0; m < n; ++m) {
      Tensor theirs = contribution[std::size_t(m)].view(r.begin - begin, {r.size()});
      // The cast reads its own device's memory only: another device's bfloat16
      // chunk (or every other member's, through a receive buffer) is copied first.
      if (m != j && (!in_place_[std::size_t(j)] || theirs.device() != stream.device())) {
        Tensor& into = received[std::size_t(j)];
        if (!into.defined()) into = Tensor::empty({r.size()}, stream, DType::BFloat16);
        copy_tensor(into, theirs, stream);
        theirs = into;
      }
      if (m == 0) {
        cast(mine, theirs, stream);
        continue;
      }
      Tensor& term = widened[std::size_t(j)];
      if (!term.defined()) term = Tensor::empty({r.size()}, stream);
      cast(term, theirs, stream);
      add(mine, mine, term, stream);
    }
    trace_sum(j, r, start);
  }
  for (std::int64_t j = 0; j < n; ++j) done_[std::size_t(j)].record(member(j));
  // Every member's contribution is read by every owner: none is freed (nor its
  // buffer written by the all-gather) before all have read.
  for (std::int64_t j = 0; j < n; ++j) {
    for (std::int64_t i = 0; i < n; ++i) {
      if (i != j) member(j).wait(done_[std::size_t(i)]);
    }
  }
}

void allreduce_contributions(ProcessGroup& group, std::span<float> values, std::string_view what) {
  std::vector<bfloat16> contribution(values.size());
  cpu::round_to_16bit(contribution.data(), values.data(), std::int64_t(values.size()));
  std::string mine(values.size() * sizeof(bfloat16), '\0');
  std::memcpy(mine.data(), contribution.data(), mine.size());
  const std::vector<std::string> all = group.allgather(mine, what);
  for (std::size_t r = 0; r < all.size(); ++r) {
    TL_CHECK(all[r].size() == mine.size(), CommunicationError,
             what << ": rank " << r << " sent " << all[r].size() / sizeof(bfloat16)
                  << " bfloat16 contributions, rank " << group.rank() << " " << values.size()
                  << "; every process must pass the same length");
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    float total = 0.0f;
    for (std::size_t r = 0; r < all.size(); ++r) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, all[r].data() + i * sizeof(bfloat16), sizeof(bits));
      const float term = static_cast<float>(bfloat16::from_bits(bits));
      total = r == 0 ? term : total + term;
    }
    values[i] = total;
  }
}

void allreduce_contributions(NcclCommunicator& nccl, const Tensor& values, const Stream& stream,
                             std::string_view what) {
  const std::int64_t n = values.numel();
  const Tensor blocks = Tensor::empty({n * nccl.size()}, stream, DType::BFloat16);
  const auto block = [&](std::int64_t r) { return blocks.slice(r * n, (r + 1) * n); };
  cast(block(nccl.rank()), values, stream);
  nccl.all_gather(blocks, stream, what);
  // values := block 0 widened, then each next block widened and added (exact
  // widening; float32 sums in rank order, as the host's loop).
  cast(values, block(0), stream);
  if (nccl.size() == 1) return;
  const Tensor term = Tensor::empty({n}, stream);
  for (std::int64_t r = 1; r < nccl.size(); ++r) {
    cast(term, block(r), stream);
    add(values, values, term, stream);
  }
}

}  // namespace towerlab
