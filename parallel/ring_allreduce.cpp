#include "parallel/ring_allreduce.h"

#include <algorithm>
#include <barrier>
#include <functional>
#include <string>

#include "engine/clock.h"
#include "engine/error.h"
#include "kernels/elementwise.h"
#include "kernels/peer_add.h"
#include "parallel/thread_team.h"
#include "parallel/trace.h"

namespace towerlab {

namespace {

// Host members take their steps on threads of their own only when the largest chunk
// has at least this many values (64 KiB of float32); smaller rings run all on the
// caller's thread: waking the team costs about what one core needs to add such a
// chunk (the thread pool's rule, kernels/cpu/parallel.h), and the moving
// statistics' ring (a few hundred values) would spend most of its time waking them.
constexpr std::int64_t kMinChunkValuesForThreads = 16384;

// mine += theirs, ordered on `stream` (mine's device): in place, or through
// `received` (on mine's device, at least as long as theirs) when the devices do
// not allow that. One float32 addition per element either way.
void accumulate(const Tensor& mine, const Tensor& theirs, bool in_place, const Tensor& received,
                const Stream& stream) {
  if (in_place) {
    peer_add(mine, theirs, stream);
  } else {
    Tensor copy = received.view(0, {theirs.numel()});
    copy_tensor(copy, theirs, stream);
    peer_add(mine, copy, stream);
  }
}

}  // namespace

Ring::Ring(std::vector<const Stream*> streams, RingReads reads, RingOnOneGpu one_gpu,
           DType contributions)
    : streams_(std::move(streams)), contributions_(contributions) {
  TL_CHECK(!streams_.empty(), InvalidArgument, "Ring: no members");
  TL_CHECK(contributions == DType::Float32 || contributions == DType::BFloat16, NotSupported,
           "Ring: contributions in " << dtype_name(contributions)
                                     << "; the ring reduces float32, or bfloat16 contributions");
  const std::size_t n = streams_.size();
  for (std::size_t i = 0; i < n; ++i) {
    const Device device = streams_[i]->device();
    const Device sender = streams_[(i + n - 1) % n]->device();
    done_.emplace_back(device);
    all_host_ = all_host_ && device.is_cpu();
    // peer_readable turns peer access on here, once, rather than in the first step.
    in_place_.push_back(reads == RingReads::InPlace && peer_readable(device, sender));
  }
  if (all_host_ && n > 1) team_ = std::make_unique<ThreadTeam>(n);
  const Device first = streams_[0]->device();
  one_launch_ = one_gpu == RingOnOneGpu::OneLaunch && reads == RingReads::InPlace &&
                first.is_cuda() && n > 1 && n <= kPeerSumMembers &&
                std::all_of(streams_.begin(), streams_.end(),
                            [&](const Stream* s) { return s->device() == first; });
}

Ring::~Ring() = default;

void Ring::allreduce(const std::vector<Tensor>& buffers, Trace* trace, int first_row) {
  TL_CHECK(!buffers.empty(), InvalidArgument,
           "ring all-reduce: 0 buffers for " << streams_.size() << " members");
  allreduce_range(buffers, 0, buffers[0].numel(), trace, first_row);
}

void Ring::allreduce_range(const std::vector<Tensor>& buffers, std::int64_t begin, std::int64_t end,
                           Trace* trace, int first_row) {
  run(buffers, begin, end, {RingPhase::ReduceScatter, RingPhase::AllGather}, trace, first_row);
}

void Ring::reduce_scatter_range(const std::vector<Tensor>& buffers, std::int64_t begin,
                                std::int64_t end, Trace* trace, int first_row) {
  run(buffers, begin, end, {RingPhase::ReduceScatter}, trace, first_row);
}

void Ring::all_gather(const std::vector<Tensor>& buffers, Trace* trace, int first_row) {
  TL_CHECK(!buffers.empty(), InvalidArgument,
           "ring all-gather: 0 buffers for " << streams_.size() << " members");
  run(buffers, 0, buffers[0].numel(), {RingPhase::AllGather}, trace, first_row);
}

void Ring::all_gather_range(const std::vector<Tensor>& buffers, std::int64_t begin,
                            std::int64_t end, Trace* trace, int first_row) {
  run(buffers, begin, end, {RingPhase::AllGather}, trace, first_row);
}

void Ring::reduce(const std::vector<Tensor>& buffers, Trace* trace, int first_row) {
  TL_CHECK(!buffers.empty(), InvalidArgument,
           "ring reduce: 0 buffers for " << streams_.size() << " members");
  const bool into_first = all_host_ && contributions_ == DType::Float32 &&
                          std::all_of(in_place_.begin(), in_place_.end(), std::identity{});
  if (!into_first) {
    allreduce(buffers, trace, first_row);
    return;
  }
  run(buffers, 0, buffers[0].numel(), {RingPhase::ReduceScatter}, trace, first_row, true);
}

void Ring::run(const std::vector<Tensor>& buffers, std::int64_t begin, std::int64_t end,
               std::vector<RingPhase> phases, Trace* trace, int first_row, bool into_first) {
  bool scatters = std::ranges::find(phases, RingPhase::ReduceScatter) != phases.end();
  const auto n = static_cast<std::int64_t>(streams_.size());
  TL_CHECK(static_cast<std::int64_t>(buffers.size()) == n, InvalidArgument,
           "ring all-reduce: " << buffers.size() << " buffers for " << n << " members");
  const std::int64_t length = buffers[0].numel();
  TL_CHECK(0 <= begin && begin <= end && end <= length, InvalidArgument,
           "ring all-reduce: range [" << begin << ", " << end << ") of buffers of " << length
                                      << " elements");
  for (std::int64_t i = 0; i < n; ++i) {
    const Tensor& b = buffers[std::size_t(i)];
    TL_CHECK(b.numel() == length && b.dtype() == DType::Float32 &&
                 b.device() == streams_[std::size_t(i)]->device(),
             ShapeError,
             "ring all-reduce: member " << i << " has " << b.describe() << ", expected float32["
                                        << length << "] on "
                                        << streams_[std::size_t(i)]->device().str());
  }
  // Contributions are rounded even where nothing moves (one member): the same
  // contract for every member count.
  if (contributions_ == DType::BFloat16 && scatters) {
    reduce_scatter_contributions(buffers, begin, end, trace, first_row);
    std::erase(phases, RingPhase::ReduceScatter);
    scatters = false;
  }
  if (n == 1 || begin == end || phases.empty()) return;

  auto member = [&](std::int64_t i) -> const Stream& {
    return *streams_[std::size_t((i + n) % n)];
  };
  const RingSchedule schedule(n, length, begin, end);
  // Chunk k of member j's buffer (the whole buffer's chunk, within the range).
  auto chunk_of = [&](std::int64_t j, std::int64_t k) {
    const RingRange r = schedule.chunk(k);
    return buffers[std::size_t((j + n) % n)].view(r.begin, {r.size()});
  };
  // A receive buffer (the largest chunk) for each member that cannot read in place.
  std::vector<Tensor> received(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    if (!in_place_[std::size_t(j)])
      received[std::size_t(j)] = Tensor::empty({schedule.largest_chunk()}, member(j));
  }

  // Member j's step: it reads the chunk it receives from its predecessor (the
  // sender) in place and adds it into, or copies it over, its own.
  auto step = [&](std::int64_t j, const RingStep& at) {
    const bool gather = at.phase == RingPhase::AllGather;
    Tensor theirs = chunk_of(j - 1, at.receive);
    Tensor mine = chunk_of(j, at.receive);
    if (mine.numel() == 0) return;
    const auto start = Clock::now();
    // reduce(): the last step's complete sum lands in member 0's chunk (member 1's
    // is the chunk it reads: add's out may alias an input).
    const bool lands_in_first =
        into_first && j != 0 && !gather && at.index == schedule.steps_per_phase() - 1;
    if (gather) {
      copy_tensor(mine, theirs, member(j));
    } else if (lands_in_first) {
      add(chunk_of(0, at.receive), theirs, mine, member(j));
    } else {
      accumulate(mine, theirs, in_place_[std::size_t(j)], received[std::size_t(j)], member(j));
    }
    bytes_received_ += mine.numel() * std::int64_t(sizeof(float));
    if (trace != nullptr) {
      member(j).synchronize();
      trace->span(first_row + int(j),
                  (gather       ? "all-gather "
                   : into_first ? "reduce "
                                : "reduce-scatter ") +
                      std::to_string(at.index),
                  start, "ring",
                  {{"ring step", at.index},
                   {"chunk", at.receive},
                   {"bytes", mine.numel() * std::int64_t(sizeof(float))}});
    }
  };

  if (all_host_) {
    if (schedule.largest_chunk() < kMinChunkValuesForThreads) {
      // Small chunks: every member's steps on this thread, step by step, in member
      // order within a step (no member writes what another reads in the same step).
      for (RingPhase phase : phases) {
        for (std::int64_t s = 0; s < schedule.steps_per_phase(); ++s) {
          for (std::int64_t j = 0; j < n; ++j) step(j, schedule.step(j, phase, s));
        }
      }
      return;
    }
    // Each member on its own thread; a barrier between steps gives both orders
    // (read after write, write after read) that the events give on streams.
    std::barrier step_done(n);
    team_->run([&](std::size_t index) {
      const auto j = std::int64_t(index);
      try {
        for (const RingStep& at : schedule.steps(j)) {
          if (std::ranges::find(phases, at.phase) == phases.end()) continue;
          step(j, at);
          step_done.arrive_and_wait();
        }
      } catch (...) {
        step_done.arrive_and_drop();  // the others finish their steps; run() rethrows
        throw;
      }
    });
    return;
  }

  // Every member's buffer is ready on its own stream (its backward ran there).
  for (std::int64_t i = 0; i < n; ++i) done_[std::size_t(i)].record(member(i));
  // The one launch sums every chunk everywhere: an all-reduce, and a reduce-scatter
  // whose other chunks hold the full sums too (an all-gather alone takes the steps).
  if (one_launch_ && scatters) {
    // Member 0 sums every chunk once every buffer is ready; the others wait for it.
    std::vector<Tensor> range;
    std::vector<std::int64_t> first{0};
    for (std::int64_t j = 0; j < n; ++j) {
      range.push_back(buffers[std::size_t(j)].view(begin, {end - begin}));
      first.push_back(schedule.chunk(j).end - begin);
      if (j > 0) member(0).wait(done_[std::size_t(j)]);
    }
    const auto start = Clock::now();
    peer_sum(range, first, member(0));
    // What the steps of these phases would have moved (see bytes_received()).
    bytes_received_ +=
        std::int64_t(phases.size()) * (n - 1) * (end - begin) * std::int64_t(sizeof(float));
    done_[0].record(member(0));
    for (std::int64_t j = 1; j < n; ++j) member(j).wait(done_[0]);
    if (trace != nullptr) {
      member(0).synchronize();
      trace->span(first_row, "all-reduce (one launch)", start, "ring",
                  {{"members", n}, {"bytes", (end - begin) * std::int64_t(sizeof(float))}});
    }
    return;
  }
  for (RingPhase phase : phases) {
    const bool gather = phase == RingPhase::AllGather;
    for (std::int64_t s = 0; s < schedule.steps_per_phase(); ++s) {
      // Member j reads from its predecessor what that member's previous step wrote.
      // All waits are issued before any of this step's records, so each captures the
      // previous step and the members of one step run concurrently.
      for (std::int64_t j = 0; j < n; ++j) {
        member(j).wait(done_[std::size_t((j - 1 + n) % n)]);
        // Before the first overwrite of the all-gather, the successor must have
        // finished reading this member's chunks in the reduce-scatter.
        if (gather && s == 0) member(j).wait(done_[std::size_t((j + 1) % n)]);
      }
      for (std::int64_t j = 0; j < n; ++j) step(j, schedule.step(j, phase, s));
      for (std::int64_t j = 0; j < n; ++j) done_[std::size_t(j)].record(member(j));
    }
  }
  // Everyone may use (and overwrite) its buffer once every member is done reading.
  for (std::int64_t j = 0; j < n; ++j) {
    for (std::int64_t i = 0; i < n; ++i) {
      if (i != j) member(j).wait(done_[std::size_t(i)]);
    }
  }
}

void reduce_and_broadcast(const std::vector<const Stream*>& streams,
                          const std::vector<Tensor>& buffers, std::size_t root) {
  const std::size_t n = streams.size();
  TL_CHECK(n > 0 && buffers.size() == n && root < n, InvalidArgument,
           "reduce_and_broadcast: " << buffers.size() << " buffers for " << n << " streams, root "
                                    << root);
  for (std::size_t i = 0; i < n; ++i) {
    TL_CHECK(buffers[i].shape() == buffers[root].shape() && buffers[i].dtype() == DType::Float32 &&
                 buffers[i].device() == streams[i]->device(),
             ShapeError,
             "reduce_and_broadcast: member " << i << " has " << buffers[i].describe()
                                             << ", expected float32" << buffers[root].shape_str()
                                             << " on " << streams[i]->device().str());
  }
  if (n == 1) return;
  const Stream& root_stream = *streams[root];
  std::vector<Event> done;
  for (std::size_t i = 0; i < n; ++i) {
    done.emplace_back(streams[i]->device());
    done[i].record(*streams[i]);
  }
  Tensor sum = Tensor::zeros(buffers[root].shape(), root_stream);
  Tensor received = Tensor::empty(buffers[root].shape(), root_stream);
  for (std::size_t i = 0; i < n; ++i) {
    root_stream.wait(done[i]);
    if (i == root) {
      add(sum, sum, buffers[i], root_stream);
    } else {
      copy_tensor(received, buffers[i], root_stream);
      add(sum, sum, received, root_stream);
    }
  }
  copy_tensor(buffers[root], sum, root_stream);
  done[root].record(root_stream);
  for (std::size_t i = 0; i < n; ++i) {
    if (i == root) continue;
    streams[i]->wait(done[root]);
    copy_tensor(buffers[i], buffers[root], *streams[i]);
  }
  for (std::size_t i = 0; i < n; ++i) done[i].record(*streams[i]);
  for (std::size_t i = 0; i < n; ++i) root_stream.wait(done[i]);
}

}  // namespace towerlab
