// Helpers for the per-channel CPU kernels (batch norm, bias add) on x viewed as
// [N,C,S]: each (n, c) row of S values is contiguous.
#pragma once

#include <cstdint>
#include <utility>

namespace towerlab::cpu {

// sum_{s < S} term(s) in double, with four independent running sums: a single
// running sum is bound by the latency of one double add per value (about 4
// cycles), and the compiler may not reorder floating-point adds by itself.
template <typename F>
double sum_over(std::int64_t S, F&& term) {
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  std::int64_t s = 0;
  for (; s + 4 <= S; s += 4) {
    for (int k = 0; k < 4; ++k) acc[k] += term(s + k);
  }
  for (; s < S; ++s) acc[0] += term(s);
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// Two sums at once, each as sum_over adds it (the same bits): term(s) returns the
// pair of terms, so a loop that needs two sums of one row reads the row once.
template <typename F>
std::pair<double, double> sum_pair_over(std::int64_t S, F&& term) {
  double a[4] = {0.0, 0.0, 0.0, 0.0}, b[4] = {0.0, 0.0, 0.0, 0.0};
  std::int64_t s = 0;
  for (; s + 4 <= S; s += 4) {
    for (int k = 0; k < 4; ++k) {
      const auto [ta, tb] = term(s + k);
      a[k] += ta;
      b[k] += tb;
    }
  }
  for (; s < S; ++s) {
    const auto [ta, tb] = term(s);
    a[0] += ta;
    b[0] += tb;
  }
  return {(a[0] + a[1]) + (a[2] + a[3]), (b[0] + b[1]) + (b[2] + b[3])};
}

}  // namespace towerlab::cpu
