// Internal (not installed): the phases of a training step, numbered once.
//
// Trainer::run (parallel/trainer.cpp) calls one private function per phase, in this
// order. The list at the top of parallel/trainer.h and the one in docs/one_step.md
// use these numbers and names, and scripts/check_docs.py (ctest docs.links) checks
// that all three agree with this table. The trainer's trace spans carry their phase
// as an arg ("phase": "7. update and broadcast").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace towerlab {

enum class Phase {
  Split = 1,
  RunTowers,
  ReduceGradients,
  AverageMovingStatistics,
  ReduceAcrossProcesses,
  Guard,
  UpdateAndBroadcast,
  GatherOutputs,
};

struct PhaseInfo {
  Phase phase;
  std::string_view name;      // as the docs write it: "update and broadcast"
  std::string_view function;  // Trainer's private function for it
};

// Number i is kPhases[i - 1].
inline constexpr PhaseInfo kPhases[] = {
    {Phase::Split, "split", "split"},
    {Phase::RunTowers, "run towers", "run_towers"},
    {Phase::ReduceGradients, "reduce gradients", "reduce_gradients"},
    {Phase::AverageMovingStatistics, "average moving statistics", "average_moving_statistics"},
    {Phase::ReduceAcrossProcesses, "reduce across processes", "reduce_across_processes"},
    {Phase::Guard, "guard", "guard"},
    {Phase::UpdateAndBroadcast, "update and broadcast", "update_and_broadcast"},
    {Phase::GatherOutputs, "gather outputs", "gather_outputs"},
};

constexpr const PhaseInfo& phase_info(Phase phase) {
  return kPhases[std::size_t(phase) - 1];
}

constexpr bool phases_in_order() {
  for (std::size_t i = 0; i < std::size(kPhases); ++i) {
    if (std::size_t(kPhases[i].phase) != i + 1) return false;
  }
  return true;
}
static_assert(phases_in_order(), "kPhases lists the phases in their order, from 1");

// "7. update and broadcast": the phase as the docs and traces name it.
inline std::string phase_label(Phase phase) {
  return std::to_string(int(phase)) + ". " + std::string(phase_info(phase).name);
}

}  // namespace towerlab
