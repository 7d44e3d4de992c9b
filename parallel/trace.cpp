#include "parallel/trace.h"

#include <nlohmann/json.hpp>

#include "engine/atomic_file.h"

namespace towerlab {

Trace::Trace() : origin_(std::chrono::steady_clock::now()) {}

void Trace::name_row(int row, const std::string& name) {
  std::lock_guard lock(mutex_);
  rows_.emplace_back(row, name);
}

void Trace::span(int row, const std::string& name, std::chrono::steady_clock::time_point start,
                 const std::string& category) {
  const auto now = std::chrono::steady_clock::now();
  using us = std::chrono::duration<double, std::micro>;
  std::lock_guard lock(mutex_);
  spans_.push_back({row, name, category, us(start - origin_).count(), us(now - start).count()});
}

std::size_t Trace::size() const {
  std::lock_guard lock(mutex_);
  return spans_.size();
}

std::string Trace::json() const {
  std::lock_guard lock(mutex_);
  nlohmann::json events = nlohmann::json::array();
  for (const auto& [row, name] : rows_) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", 1},
                      {"tid", row},
                      {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", 1},
                      {"tid", row},
                      {"args", {{"sort_index", row}}}});
  }
  for (const Span& s : spans_) {
    events.push_back({{"ph", "X"},
                      {"name", s.name},
                      {"cat", s.category},
                      {"pid", 1},
                      {"tid", s.row},
                      {"ts", s.start_us},
                      {"dur", s.duration_us}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump(1);
}

void Trace::write(const std::string& path) const {
  const std::string text = json();
  AtomicFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

}  // namespace towerlab
