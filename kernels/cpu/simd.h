// Four-lane vectors for CPU kernels whose loops the compiler does not vectorize on
// its own (a selection with an index, a reduction whose order is fixed): GCC/Clang
// vector extensions, SSE on x86-64 and NEON on ARM, with no target flags needed.
// Lane arithmetic is IEEE single precision, as the scalar code's, so a
// kernel that keeps its scalar order per lane gets the scalar code's bits.
#pragma once

#include <cstdint>
#include <cstring>

namespace towerlab::cpu {

typedef float Vec4 __attribute__((vector_size(16)));
typedef std::int32_t Mask4 __attribute__((vector_size(16)));  // per lane: all ones or zeros

inline Vec4 splat(float v) {
  return Vec4{v, v, v, v};
}

inline Vec4 load4(const float* p) {
  Vec4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store4(float* p, Vec4 v) {
  std::memcpy(p, &v, sizeof v);
}

// The first `count` (0 to 4) values at p, zeros in the other lanes; reads only
// those values.
inline Vec4 load_first(const float* p, std::int64_t count) {
  Vec4 v = splat(0.0f);
  std::memcpy(&v, p, static_cast<std::size_t>(count) * sizeof(float));
  return v;
}

// All ones in lanes 0 .. count - 1, zeros in the others.
inline Mask4 lanes_below(std::int64_t count) {
  const auto n = static_cast<std::int32_t>(count);
  return Mask4{0, 1, 2, 3} < Mask4{n, n, n, n};
}

// Whether any lane of m is set.
inline bool any_lane(Mask4 m) {
  std::uint64_t halves[2];
  std::memcpy(halves, &m, sizeof halves);
  return (halves[0] | halves[1]) != 0;
}

// m ? a : 0, lane by lane: one AND, where select() with a zero vector costs three
// operations without SSE4.1's blend.
inline Vec4 keep(Mask4 m, Vec4 a) {
  return reinterpret_cast<Vec4>(m & reinterpret_cast<Mask4>(a));
}

// m ? a : b, lane by lane.
inline Vec4 select(Mask4 m, Vec4 a, Vec4 b) {
  return reinterpret_cast<Vec4>((m & reinterpret_cast<Mask4>(a)) |
                                (~m & reinterpret_cast<Mask4>(b)));
}

}  // namespace towerlab::cpu
