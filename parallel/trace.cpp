#include "parallel/trace.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "engine/atomic_file.h"
#include "parallel/collective_checkpoint.h"

namespace towerlab {

namespace {

void write_file(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

}  // namespace

void Trace::name_row(int row, const std::string& name) {
  std::lock_guard lock(mutex_);
  for (auto& [r, n] : rows_) {
    if (r == row) {
      n = name;
      return;
    }
  }
  rows_.emplace_back(row, name);
}

void Trace::set_step(std::int64_t step) {
  std::lock_guard lock(mutex_);
  step_ = step;
}

void Trace::span(int row, const std::string& name, Clock::time_point start,
                 const std::string& category, std::vector<TraceArg> args) {
  const auto now = Clock::now();
  std::lock_guard lock(mutex_);
  if (step_ >= 0) args.emplace_back("step", step_);
  spans_.push_back({row, name, category, start, now, std::move(args)});
}

std::size_t Trace::size() const {
  std::lock_guard lock(mutex_);
  return spans_.size();
}

std::string Trace::events(int pid, std::optional<Clock::time_point> origin) const {
  std::lock_guard lock(mutex_);
  nlohmann::json events = nlohmann::json::array();
  for (const auto& [row, name] : rows_) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", pid},
                      {"tid", row},
                      {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", pid},
                      {"tid", row},
                      {"args", {{"sort_index", row}}}});
  }
  if (!origin) {
    origin = Clock::time_point{};
    if (!spans_.empty()) {
      origin = std::min_element(spans_.begin(), spans_.end(), [](const Span& a, const Span& b) {
                 return a.start < b.start;
               })->start;
    }
  }
  using us = std::chrono::duration<double, std::micro>;
  for (const Span& s : spans_) {
    nlohmann::json args = nlohmann::json::object();
    for (const auto& arg : s.args) {
      std::visit([&](const auto& v) { args[arg.first] = v; }, arg.second);
    }
    events.push_back({{"ph", "X"},
                      {"name", s.name},
                      {"cat", s.category},
                      {"pid", pid},
                      {"tid", s.row},
                      {"ts", us(s.start - *origin).count()},
                      {"dur", us(s.end - s.start).count()},
                      {"args", args}});
  }
  return events.dump();
}

std::string Trace::json() const {
  // Time 0 is the start of the earliest span.
  return nlohmann::json{{"traceEvents", nlohmann::json::parse(events(1))},
                        {"displayTimeUnit", "ms"}}
      .dump(1);
}

void Trace::write(const std::string& path) const {
  write_file(path, json());
}

void Trace::write(const std::string& path, ProcessGroup& group) const {
  // The common event: every rank leaves this collective at about the same moment,
  // so a rank's times relative to its own exit are comparable across ranks.
  group.allgather("", "trace: align the ranks' clocks");
  const Clock::time_point aligned = Clock::now();
  char host[256] = "";
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  const nlohmann::json mine{{"host", host},
                            {"events", nlohmann::json::parse(events(group.rank(), aligned))}};
  // A ProcessGroup has no gather: every rank receives every part, and rank 0 alone
  // uses them (a trace is a few steps, so the parts are small).
  const std::vector<std::string> parts = group.allgather(mine.dump(), "trace: every rank's spans");
  on_rank0(group, "trace: write " + path, [&] {
    std::vector<nlohmann::json> ranks;
    double earliest = std::numeric_limits<double>::infinity();
    for (const std::string& part : parts) {
      ranks.push_back(nlohmann::json::parse(part));
      for (const nlohmann::json& e : ranks.back()["events"]) {
        if (e["ph"] == "X") earliest = std::min(earliest, e["ts"].get<double>());
      }
    }
    if (!std::isfinite(earliest)) earliest = 0.0;
    nlohmann::json events = nlohmann::json::array();
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      const std::string name =
          "rank " + std::to_string(r) + " (" + ranks[r]["host"].get<std::string>() + ")";
      events.push_back(
          {{"ph", "M"}, {"name", "process_name"}, {"pid", r}, {"args", {{"name", name}}}});
      events.push_back(
          {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", r}, {"args", {{"sort_index", r}}}});
      for (nlohmann::json& e : ranks[r]["events"]) {
        if (e["ph"] == "X") e["ts"] = e["ts"].get<double>() - earliest;
        events.push_back(std::move(e));
      }
    }
    write_file(path, nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump(1));
    return std::string();
  });
}

TraceProfiler::TraceProfiler(Trace& trace, int row, const Stream& stream, std::int64_t samples)
    : trace_(trace), row_(row), stream_(stream), samples_(samples) {}

std::vector<TraceArg> TraceProfiler::args(const std::string& layer) const {
  return {{"layer", layer}, {"samples", samples_}};
}

int TraceProfiler::begin_scope(const std::string& layer) {
  // "conv1: Conv2d 1->32 ..." is named "conv1"; "MaxPool2d 2x2 stride 2", "MaxPool2d".
  const std::size_t colon = layer.find(':');
  std::string name = layer.substr(0, colon != std::string::npos ? colon : layer.find(' '));
  // The work queued before the layer is not the layer's.
  stream_.synchronize();
  scopes_.push_back({std::move(name), layer, Clock::now()});
  return int(scopes_.size()) - 1;
}

void TraceProfiler::end_scope(int scope) noexcept {
  const Scope& s = scopes_[std::size_t(scope)];
  try {
    stream_.synchronize();
    trace_.span(row_, s.name, s.start, "forward", args(s.layer));
  } catch (...) {
    // A failed wait or allocation loses this span only: the error of a failed
    // kernel surfaces at the tower's next operation on the stream.
  }
}

void TraceProfiler::backward_record(int scope, const std::string& op) {
  const std::string key = scope >= 0 ? std::string() : op;
  if (in_backward_ && scope == backward_scope_ && key == backward_op_) return;  // same run
  close_backward();
  in_backward_ = true;
  backward_scope_ = scope;
  backward_op_ = key;
  backward_start_ = Clock::now();
}

void TraceProfiler::backward_done() {
  close_backward();
}

void TraceProfiler::close_backward() {
  if (!in_backward_) return;
  stream_.synchronize();
  in_backward_ = false;
  if (backward_scope_ >= 0) {
    const Scope& s = scopes_[std::size_t(backward_scope_)];
    trace_.span(row_, s.name, backward_start_, "backward", args(s.layer));
  } else {
    trace_.span(row_, backward_op_, backward_start_, "backward", args(backward_op_));
  }
}

}  // namespace towerlab
