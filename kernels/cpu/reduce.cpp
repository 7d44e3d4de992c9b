// CPU reductions: the sum is the plain reference (kernels/reference/reduce.h), one
// running sum in double in index order on one thread; the search for the first
// non-finite value splits over the thread pool (kernels/cpu/parallel.h) and keeps
// the smallest index any range found, the same answer for any split.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/x86.h"
#include "kernels/reference/reduce.h"

namespace towerlab::cpu {

namespace {

// Whether x[0, n) holds only finite values: v - v is +0 for a finite v and NaN for an
// infinity or a NaN. One test per value with no branch, so the compiler vectorizes
// it (std::isfinite per value with an early exit stays scalar); a block that fails
// is searched again value by value.
template <typename T>
bool all_finite(const T* x, std::int64_t n) {
  int bad = 0;
  for (std::int64_t i = 0; i < n; ++i) bad |= (x[i] - x[i] != T(0));
  return bad == 0;
}
constexpr std::int64_t kFiniteBlock = 256;

#if TL_CPU_X86
// The same test compiled for AVX2 and AVX-512, whose wider vectors the baseline
// build's SSE2 loop cannot use: the numeric guard scans a whole flat gradient every
// step, right after the ring wrote it (bench/results/trainer_fusions_zen5_*.md).
template <typename T>
__attribute__((target("avx2"))) bool all_finite_avx2(const T* x, std::int64_t n) {
  return all_finite(x, n);
}
template <typename T>
__attribute__((target("avx512f"))) bool all_finite_avx512(const T* x, std::int64_t n) {
  return all_finite(x, n);
}
#endif

// all_finite on the widest vectors the selected ISA has (kernels/cpu/x86.h's rule),
// chosen once a call, not once a block.
template <typename T>
auto block_finite() -> bool (*)(const T*, std::int64_t) {
#if TL_CPU_X86
  if (avx512_selected()) return all_finite_avx512<T>;
  if (avx2_selected()) return all_finite_avx2<T>;
#endif
  return all_finite<T>;
}

}  // namespace

void sum(const Tensor& out, const Tensor& x, double scale) {
  with_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();  // [n]
    out.data<T>()[0] = static_cast<T>(reference::sum(in, x.numel()) * scale);
  });
}

void sum_squares(const Tensor& out, const Tensor& x) {
  with_dtype(x.dtype(), [&]<typename T>() {
    out.data<T>()[0] = static_cast<T>(reference::sum_squares(x.data<T>(), x.numel()));
  });
}

std::int64_t first_nonfinite(const Tensor& x) {
  const std::int64_t n = x.numel();
  std::atomic<std::int64_t> first{n};  // n: none found
  with_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();  // [n]
    const auto finite = block_finite<T>();
    parallel_rows(n, 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t block = lo; block < hi; block += kFiniteBlock) {
        const std::int64_t end = std::min(hi, block + kFiniteBlock);
        if (finite(in + block, end - block)) continue;
        for (std::int64_t i = block; i < end; ++i) {
          if (!std::isfinite(in[i])) {  // this range's first: lower `first` to it
            std::int64_t seen = first.load();
            while (i < seen && !first.compare_exchange_weak(seen, i)) {
            }
            return;
          }
        }
      }
    });
  });
  return first.load() == n ? -1 : first.load();
}

}  // namespace towerlab::cpu
