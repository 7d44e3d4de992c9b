// A recorder of what the towers do in training steps, written as Chrome trace
// JSON (open it in https://ui.perfetto.dev or chrome://tracing, or render it with
// scripts/trace_png.py): one row per tower with its forward and backward, each
// layer's forward and backward inside them, and each ring step; one row for the
// master's update; with a process group, one row ("processes") for the all-reduce
// between processes, named by what it carries, with its bytes. A learner sees the
// towers work side by side, where a step's time goes layer by layer, and the ring
// pass chunks.
//
// Every span carries args: the global step it belongs to (set_step), and what the
// recorder knows of it: the samples in the tower for tower and layer spans, the
// chunk index and the bytes a ring step moves into its member. Times start at 0 at
// the first span recorded.
//
// Across processes (parallel/process_group.h) each process records its own
// trace, and write(path, group) gathers them into one file on rank 0: each rank is
// a process of the trace ("rank 1 (host)"), its towers, master and cross-process
// all-reduce are its rows. Each process's steady clock has its own origin, so the
// ranks' times are aligned at a common event: the moment they leave one collective
// together (their exits differ by about one message's latency, microseconds on one
// host). The times then start at 0 at the earliest span of any rank.
//
// Spans are wall-clock times on the host. For CUDA towers the trainer waits for
// the tower's stream at the end of each span while a trace is being recorded, so
// the spans show when the GPU work really ran (at some cost in speed: tracing is a
// teaching and debugging tool, off by default, and costs nothing when off).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "../autograd/tape.h"
#include "../engine/clock.h"
#include "process_group.h"

namespace towerlab {

// One arg of a span: {"samples", 64}, {"layer", "conv1: Conv2d 1->32 ..."}.
using TraceArg = std::pair<std::string, std::variant<std::int64_t, std::string>>;

class Trace {
 public:
  using Clock = towerlab::Clock;  // engine/clock.h

  // Names a row ("tower 0 (cuda:0)", "master (cpu)"); naming it again renames it.
  void name_row(int row, const std::string& name);
  // The global step of the spans recorded from now on (each gets a "step" arg);
  // -1 (the start): none.
  void set_step(std::int64_t step);
  // A span on `row` from `start` to now.
  void span(int row, const std::string& name, Clock::time_point start,
            const std::string& category = "step", std::vector<TraceArg> args = {});
  // Writes the Chrome trace JSON (atomically). Throws IoError.
  void write(const std::string& path) const;
  // Collective: every process of `group` calls it with its own trace, and rank 0
  // writes one trace of every rank's rows to `path` (the other ranks' `path` is not
  // used). Every rank returns, or throws rank 0's error, alike.
  void write(const std::string& path, ProcessGroup& group) const;
  std::string json() const;
  std::size_t size() const;

 private:
  struct Span {
    int row;
    std::string name, category;
    Clock::time_point start, end;
    std::vector<TraceArg> args;
  };
  // This trace's Chrome trace events as a JSON array: rows and spans in process
  // `pid`, times in microseconds from `origin` (negative before it), or from the
  // earliest span without one.
  std::string events(int pid, std::optional<Clock::time_point> origin = std::nullopt) const;

  mutable std::mutex mutex_;
  std::int64_t step_ = -1;
  std::vector<Span> spans_;
  std::vector<std::pair<int, std::string>> rows_;
};

// Records the layers of one tower's tape on a row of a trace: each layer's forward
// (category "forward", named by the layer: "conv1", "ReLU"), and in the backward
// pass each run of records made by one layer (category "backward"; a record made
// outside every layer, such as the loss, gets a span named by its op). Waits for
// the tape's stream at the end of each span, so GPU spans show when the work ran.
// Give it to the tape with Tape::set_profiler for the steps to trace.
class TraceProfiler : public TapeProfiler {
 public:
  TraceProfiler(Trace& trace, int row, const Stream& stream, std::int64_t samples);

  int begin_scope(const std::string& name) override;
  void end_scope(int scope) noexcept override;
  void backward_record(int scope, const std::string& op) override;
  void backward_done() override;

 private:
  struct Scope {
    std::string name, layer;
    Trace::Clock::time_point start;
  };
  void close_backward();
  std::vector<TraceArg> args(const std::string& layer) const;

  Trace& trace_;
  int row_;
  const Stream& stream_;
  std::int64_t samples_;
  std::vector<Scope> scopes_;
  // The backward run being timed: its scope (and op, outside every scope).
  bool in_backward_ = false;
  int backward_scope_ = -1;
  std::string backward_op_;
  Trace::Clock::time_point backward_start_;
};

}  // namespace towerlab
