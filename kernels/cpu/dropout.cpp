// CPU dropout: the reference's masks (kernels/dropout.h), drawn four elements at a
// time. dropout_unit, the specification, runs Philox's ten rounds for every element
// and keeps one of the four words; here each draw serves the four elements that
// share it (word e % 4 of draw e / 4), and the keep test is done on the integers:
// to_unit_float(w) = (w >> 8) 2^-24 exactly, so (double)u >= p exactly when
// (w >> 8) >= ceil(p 2^24), p 2^24 being exact in double. Same masks and values as
// the reference, bit for bit (tests/dropout_test.cpp), with a quarter of the draws
// and no float conversion per element. An element's mask depends on its global
// index alone, so the threads' split changes nothing.
#include "kernels/cpu/dropout.h"

#include <cmath>

#include "engine/philox.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/dropout.h"

namespace towerlab::cpu {

namespace {

// Calls apply(i, kept) for i in [0, n), element i being global element first + i.
template <typename Apply>
void for_each_mask(double p, std::uint64_t seed, std::uint64_t subsequence, std::uint64_t first,
                   std::int64_t n, Apply apply) {
  const auto threshold = static_cast<std::uint32_t>(std::ceil(std::ldexp(p, 24)));
  std::int64_t i = 0;
  while (i < n) {
    const std::uint64_t e = first + static_cast<std::uint64_t>(i);
    const philox::Uint4 r = philox::draw(seed, subsequence, e / 4);
    const std::uint32_t words[4] = {r.x, r.y, r.z, r.w};
    for (std::uint64_t w = e % 4; w < 4 && i < n; ++w, ++i) apply(i, (words[w] >> 8) >= threshold);
  }
}

}  // namespace

void dropout_forward(const Tensor& y, const Tensor& x, double p, std::uint64_t seed,
                     std::uint64_t subsequence, std::uint64_t first_element) {
  with_dtype(x.dtype(), [&]<typename T>() {
    T* out = y.data<T>();       // [n]
    const T* in = x.data<T>();  // [n]
    const T scale = reference::dropout_scale<T>(p);
    parallel_rows(x.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      for_each_mask(
          p, seed, subsequence, first_element + static_cast<std::uint64_t>(lo), hi - lo,
          [&](std::int64_t i, bool kept) { out[lo + i] = in[lo + i] * (kept ? scale : T(0)); });
    });
  });
}

void dropout_backward(const Tensor& grad_x, const Tensor& grad_y, double p, std::uint64_t seed,
                      std::uint64_t subsequence, std::uint64_t first_element, GradWrite write) {
  with_dtype(grad_y.dtype(), [&]<typename T>() {
    T* gx = grad_x.data<T>();        // [n]
    const T* gy = grad_y.data<T>();  // [n]
    const T scale = reference::dropout_scale<T>(p);
    parallel_rows(grad_y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      for_each_mask(p, seed, subsequence, first_element + static_cast<std::uint64_t>(lo), hi - lo,
                    [&](std::int64_t i, bool kept) {
                      const T g = gy[lo + i] * (kept ? scale : T(0));
                      gx[lo + i] = write == GradWrite::Assign ? g : gx[lo + i] + g;
                    });
    });
  });
}

}  // namespace towerlab::cpu
