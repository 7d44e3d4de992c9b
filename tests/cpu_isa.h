// A test body run once per instruction set the CPU's vector code can take, for the
// tests that hold each ISA's results to the reference. Kept apart from test_util.h,
// which every test includes, so that only the tests that use it depend on it.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace towerlab::testing {

// Calls fn(where) once per ISA this CPU has, with the ISA pinned (the CPU's vector
// code follows the GEMM's choice: kernels/cpu/x86.h), `where` naming it; on a GPU
// once, `where` naming the device.
template <typename Fn>
void for_each_cpu_isa(const Device& device, Fn&& fn) {
  if (!device.is_cpu()) return fn(device.str());
  const RestoreGemmIsa restore;
  int runs = 0;
  for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
    if (!gemm_isa_supported(isa)) continue;
    set_gemm_isa(isa);
    ++runs;
    fn("ISA " + std::to_string(int(isa)));
  }
  EXPECT_GE(runs, 1);
}

}  // namespace towerlab::testing
