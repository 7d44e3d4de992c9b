// towerlab's one clock: trace spans, deadlines, spin limits and the host times of
// events all read it, so that any two of its times may be subtracted. Steady, not
// the wall clock: an adjustment of the system time cannot make a span negative or
// a deadline pass early.
#pragma once

#include <chrono>

namespace towerlab {

using Clock = std::chrono::steady_clock;

}  // namespace towerlab
