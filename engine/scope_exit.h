// Internal (not installed): runs a cleanup when a scope ends, however it ends.
//
//   tape.set_profiler(&profiler);
//   ScopeExit profiler_off([&] { tape.set_profiler(nullptr); });
//
// For the undo of one call whose resource is not worth a class of its own (a
// listener taken off, a join that must happen after a throw too). The cleanup runs
// in a destructor, so it must not throw; it runs even during stack unwinding.
#pragma once

#include <utility>

namespace towerlab {

template <typename Cleanup>
class [[nodiscard]] ScopeExit {
 public:
  explicit ScopeExit(Cleanup cleanup) : cleanup_(std::move(cleanup)) {}
  ~ScopeExit() { cleanup_(); }
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;

 private:
  Cleanup cleanup_;
};

}  // namespace towerlab
