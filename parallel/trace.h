// A recorder of what the towers do in a training step, written as Chrome trace
// JSON (open it in https://ui.perfetto.dev or chrome://tracing): one row per tower
// with its forward, backward and each ring step, and one row for the master's
// update. A learner sees the towers work side by side and the ring pass chunks.
//
// Spans are wall-clock times on the host. For CUDA towers the trainer waits for
// the tower's stream at the end of each span while a trace is being recorded, so
// the spans show when the GPU work really ran (at some cost in speed: tracing is a
// teaching and debugging tool, off by default).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace towerlab {

class Trace {
 public:
  Trace();
  // Names a row ("tower 0 (cuda:0)", "master (cpu)").
  void name_row(int row, const std::string& name);
  // A span on `row` from `start` to now.
  void span(int row, const std::string& name, std::chrono::steady_clock::time_point start,
            const std::string& category = "step");
  // Writes the Chrome trace JSON (atomically). Throws IoError.
  void write(const std::string& path) const;
  std::string json() const;
  std::size_t size() const;

 private:
  struct Span {
    int row;
    std::string name, category;
    double start_us, duration_us;
  };
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<Span> spans_;
  std::vector<std::pair<int, std::string>> rows_;
};

}  // namespace towerlab
