// A ProcessGroup whose "processes" are threads of the test binary: one thread per
// rank, each with its own Trainer, meeting in a shared ThreadWorld. It keeps the
// contract of parallel/process_group.h, so the multi-rank tests exercise the
// trainer's cross-process phases without MPI:
//  - allreduce_sum: the last rank to arrive sums every rank's values and every
//    rank copies that one result (the same bits everywhere). Each element is summed
//    in the order Cluster's ring gives it: chunk c of the whole buffer (its
//    ReduceFrame's) from rank c on, ranks c, c+1, ..., c-1, so that a range reduced
//    with a wrong frame gets other bits here too;
//  - reduce_scatter_sum: those sums in this rank's chunk (chunk rank+1 of the
//    frame's), quiet NaN in the rest of the values (unspecified by the contract: a
//    reader of them fails a test); allgather_chunks: each chunk from the rank that
//    holds it after a reduce-scatter;
//  - every wait has a deadline; a rank that does not arrive in time, a rank that
//    stopped with an error, or calls that disagree (kind, size, root) make the
//    waiting ranks throw CommunicationError naming the rank and `what`.
// run_ranks() starts the threads and aborts the test binary if they outlive a
// deadline, so a test cannot hang.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/error.h"
#include "parallel/process_group.h"

namespace towerlab::testing {

class ThreadWorld {
 public:
  ThreadWorld(int size, std::chrono::milliseconds deadline) : size_(size), deadline_(deadline) {}
  int size() const { return size_; }
  std::chrono::milliseconds deadline() const { return deadline_; }

  // Marks `rank` as stopped (its thread ended with an error): ranks waiting for it
  // in a call it will never make throw instead of waiting for the deadline.
  void stop(int rank, const std::string& why) {
    std::lock_guard lock(mutex_);
    stopped_[rank] = why;
    arrived_.notify_all();
  }

  // Rank `rank`'s part of its next call: `kind` and `root` must match on every rank;
  // `combine` turns the contributions (in rank order) into the result every rank
  // receives.
  std::vector<std::byte> call(
      int rank, const std::string& kind, std::vector<std::byte> mine, int root,
      std::string_view what,
      const std::function<std::vector<std::byte>(const std::vector<std::vector<std::byte>>&)>&
          combine) {
    std::unique_lock lock(mutex_);
    const std::size_t index = next_call_[rank]++;
    Call& c = calls_[index];
    if (c.contributions.empty()) {
      c.contributions.resize(std::size_t(size_));
      c.kinds.resize(std::size_t(size_));
    }
    c.kinds[std::size_t(rank)] = kind + " root " + std::to_string(root);
    c.contributions[std::size_t(rank)] = std::move(mine);
    ++c.arrived;
    if (c.arrived == size_) {
      for (int r = 1; r < size_; ++r) {
        if (c.kinds[std::size_t(r)] != c.kinds[0]) {
          c.error = "rank " + std::to_string(r) + " made " + c.kinds[std::size_t(r)] +
                    " but rank 0 made " + c.kinds[0];
        }
      }
      if (c.error.empty()) c.result = combine(c.contributions);
      c.done = true;
      arrived_.notify_all();
    }
    const auto until = std::chrono::steady_clock::now() + deadline_;
    std::string missing;
    const bool finished = arrived_.wait_until(lock, until, [&] {
      if (c.done) return true;
      for (const auto& [r, why] : stopped_) {
        if (next_call_[r] <= index) {
          missing = "rank " + std::to_string(r) + " stopped (" + why + ")";
          return true;
        }
      }
      return false;
    });
    if (!finished) {
      for (int r = 0; r < size_; ++r) {
        if (next_call_[r] <= index) {
          missing = "rank " + std::to_string(r) + " did not arrive within " +
                    std::to_string(deadline_.count()) + " ms";
          break;
        }
      }
    }
    if (!c.done || !c.error.empty()) {
      const std::string why = c.done ? c.error : missing;
      // This rank's call index was counted: it will not be made again.
      TL_THROW(CommunicationError, "rank " << rank << ": " << what << ": " << why);
    }
    std::vector<std::byte> result = c.result;
    if (++c.read == size_) calls_.erase(index);
    return result;
  }

 private:
  struct Call {
    std::vector<std::vector<std::byte>> contributions;
    std::vector<std::string> kinds;
    std::vector<std::byte> result;
    std::string error;
    int arrived = 0;
    int read = 0;
    bool done = false;
  };

  int size_;
  std::chrono::milliseconds deadline_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<int, std::size_t> next_call_;
  std::map<std::size_t, Call> calls_;
  std::map<int, std::string> stopped_;
};

class ThreadProcessGroup final : public ProcessGroup {
 public:
  ThreadProcessGroup(ThreadWorld& world, int rank) : world_(world), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return world_.size(); }
  int local_rank() const override { return rank_; }
  std::chrono::milliseconds deadline() const override { return world_.deadline(); }

  void allreduce_sum(std::span<float> values, std::string_view what,
                     ReduceFrame frame = {}) override {
    sum(values, "allreduce_sum", what, frame);
  }
  void allreduce_sum(std::span<double> values, std::string_view what) override {
    sum(values, "allreduce_sum", what, {});
  }

  void reduce_scatter_sum(std::span<float> values, std::string_view what,
                          ReduceFrame frame = {}) override {
    const std::vector<float> sums = combine_chunks(values, "reduce_scatter_sum", what, frame, true);
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] = chunk_holder(i, values.size(), frame) == rank_
                      ? sums[i]
                      : std::numeric_limits<float>::quiet_NaN();
    }
  }
  void allgather_chunks(std::span<float> values, std::string_view what,
                        ReduceFrame frame = {}) override {
    const std::vector<float> all = combine_chunks(values, "allgather_chunks", what, frame, false);
    std::copy(all.begin(), all.end(), values.begin());
  }

  void broadcast(std::span<std::byte> bytes, int root, std::string_view what) override {
    const auto result = world_.call(
        rank_, "broadcast(" + std::to_string(bytes.size()) + " bytes)",
        {bytes.begin(), bytes.end()}, root, what,
        [root](const std::vector<std::vector<std::byte>>& all) { return all[std::size_t(root)]; });
    if (!bytes.empty()) std::memcpy(bytes.data(), result.data(), bytes.size());
  }

  std::vector<std::string> allgather(std::string_view mine, std::string_view what) override {
    std::vector<std::byte> bytes(mine.size());
    // memcpy wants valid pointers even for no bytes, and an empty view may hold null.
    if (!mine.empty()) std::memcpy(bytes.data(), mine.data(), mine.size());
    // The result: each rank's length (8 bytes) then its bytes, in rank order.
    const auto result = world_.call(rank_, "allgather", std::move(bytes), 0, what,
                                    [](const std::vector<std::vector<std::byte>>& all) {
                                      std::vector<std::byte> out;
                                      for (const auto& part : all) {
                                        const std::uint64_t n = part.size();
                                        const auto* p = reinterpret_cast<const std::byte*>(&n);
                                        out.insert(out.end(), p, p + sizeof n);
                                        out.insert(out.end(), part.begin(), part.end());
                                      }
                                      return out;
                                    });
    std::vector<std::string> strings;
    for (std::size_t at = 0; at < result.size();) {
      std::uint64_t n = 0;
      std::memcpy(&n, result.data() + at, sizeof n);
      at += sizeof n;
      strings.emplace_back(reinterpret_cast<const char*>(result.data() + at), n);
      at += n;
    }
    return strings;
  }

 private:
  // The chunk of the frame's that holds values[i] (chunk c: [total c / p, total (c+1) / p)).
  static std::size_t chunk_of(std::size_t i, std::size_t n, ReduceFrame frame, std::size_t p) {
    const std::size_t total = frame.total == 0 ? n : frame.total;
    std::size_t chunk = 0;
    while (frame.offset + i >= total * (chunk + 1) / p) ++chunk;
    return chunk;
  }
  // The rank whose chunk (after a reduce-scatter) holds values[i]: chunk c's, rank c-1.
  int chunk_holder(std::size_t i, std::size_t n, ReduceFrame frame) const {
    const auto p = std::size_t(size());
    return int((chunk_of(i, n, frame, p) + p - 1) % p);
  }

  // Every rank's values combined element by element: summed in the ring's order
  // (`add`), or taken from the element's chunk holder.
  template <typename T>
  std::vector<T> combine_chunks(std::span<T> values, const std::string& call, std::string_view what,
                                ReduceFrame frame, bool add) {
    std::vector<std::byte> bytes(values.size_bytes());
    if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), values.size_bytes());
    const std::size_t n = values.size();
    const std::string kind = call + "(" + (sizeof(T) == 4 ? "float" : "double") + " x " +
                             std::to_string(n) + " at " + std::to_string(frame.offset) + " of " +
                             std::to_string(frame.total) + ")";
    const auto result =
        world_.call(rank_, kind, std::move(bytes), 0, what,
                    [n, frame, add](const std::vector<std::vector<std::byte>>& all) {
                      const std::size_t p = all.size();
                      std::vector<T> out(n);
                      for (std::size_t i = 0; i < n; ++i) {
                        const std::size_t chunk = chunk_of(i, n, frame, p);
                        auto value = [&](std::size_t r) {
                          return reinterpret_cast<const T*>(all[(chunk + r) % p].data())[i];
                        };
                        if (!add) {
                          out[i] = value(p - 1);  // rank chunk - 1's
                          continue;
                        }
                        T s = value(0);
                        for (std::size_t r = 1; r < p; ++r) s = s + value(r);
                        out[i] = s;
                      }
                      std::vector<std::byte> out_bytes(n * sizeof(T));
                      if (n > 0) std::memcpy(out_bytes.data(), out.data(), out_bytes.size());
                      return out_bytes;
                    });
    std::vector<T> combined(n);
    if (n > 0) std::memcpy(combined.data(), result.data(), values.size_bytes());
    return combined;
  }

  template <typename T>
  void sum(std::span<T> values, const std::string& call, std::string_view what, ReduceFrame frame) {
    const std::vector<T> sums = combine_chunks(values, call, what, frame, true);
    std::copy(sums.begin(), sums.end(), values.begin());
  }

  ThreadWorld& world_;
  int rank_;
};

// Runs body(rank, group) on one thread per rank and returns each rank's error
// message ("" when it returned normally). A rank that throws is marked stopped so
// the others do not wait for it. If the ranks are not all done after `limit`, the
// test binary aborts with a message: a hang fails the test instead of stalling CI.
inline std::vector<std::string> run_ranks(
    int ranks, const std::function<void(int rank, ProcessGroup& group)>& body,
    std::chrono::milliseconds collective_deadline = std::chrono::seconds(30),
    std::chrono::milliseconds limit = std::chrono::seconds(120)) {
  ThreadWorld world(ranks, collective_deadline);
  std::vector<std::string> errors(static_cast<std::size_t>(ranks));
  std::mutex mutex;
  std::condition_variable finished;
  int running = ranks;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      ThreadProcessGroup group(world, r);
      try {
        body(r, group);
      } catch (const std::exception& e) {
        errors[std::size_t(r)] = e.what();
        world.stop(r, e.what());
      }
      std::lock_guard lock(mutex);
      if (--running == 0) finished.notify_all();
    });
  }
  {
    std::unique_lock lock(mutex);
    if (!finished.wait_for(lock, limit, [&] { return running == 0; })) {
      std::fprintf(stderr, "run_ranks: %d of %d rank thread(s) still running after %lld ms\n",
                   running, ranks, static_cast<long long>(limit.count()));
      std::abort();
    }
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace towerlab::testing
