// Tensor-core instructions on the emulated GPUs (tlemu/tensor_core.h): mma.sync and
// ldmatrix as warp-collective meetings (warp_collective, src/warp.cpp), whose
// `combine` step sees every lane's registers at once.
//
// The layouts below are the PTX ISA's closed forms, with
//   g = lane >> 2 (groupID), t = lane % 4 (threadID_in_group):
//   m16n8k16, 16-bit A (a0..a7, two to a register, a0 in the low half of the first):
//     row g + 8 * ((i >> 1) & 1), column 2t + (i & 1) + 8 * (i >> 2)
//   m16n8k16, 16-bit B (b0..b3): row 2t + (i & 1) + 8 * (i >> 1), column g
//   m16n8k8, tf32 A (a0..a3, one to a register): row g + 8 * (i & 1), column t + 4 * (i >> 1)
//   m16n8k8, tf32 B (b0, b1): row t + 4i, column g
//   C and D of both (c0..c3, float32): row g + 8 * (i >> 1), column 2t + (i & 1)
//   ldmatrix m8n8 .b16: lane 8j + r gives the address of row r of matrix j; register j
//     of lane l holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix j (low,
//     high half); with .trans, rows and columns exchange.
#include "tlemu/tensor_core.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "internal.h"

namespace tlemu {
namespace {

using detail::WarpWords;

// The 16-bit half `h` (0: low, 1: high) of a register.
std::uint16_t half_of(std::uint32_t word, int h) {
  return static_cast<std::uint16_t>(h == 0 ? word & 0xffffu : word >> 16);
}

float bf16_value(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

float f16_value(std::uint16_t bits) {
  const float sign = (bits & 0x8000u) != 0 ? -1.0f : 1.0f;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0x1f) return mantissa == 0 ? sign * INFINITY : NAN;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);  // subnormal
  return sign * std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
}

float tf32_value(std::uint32_t bits) {
  return std::bit_cast<float>(bits & 0xffffe000u);
}

// D = C + A * B, one fmaf per k in increasing k: each product exact (the inputs have
// at most 11 significant bits), each sum rounded once to float32, nearest even.
template <int kM, int kN, int kK>
void multiply_accumulate(const float (&a)[kM][kK], const float (&b)[kK][kN], float (&d)[kM][kN]) {
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < kN; ++n) {
      float acc = d[m][n];
      for (int k = 0; k < kK; ++k) acc = std::fmaf(a[m][k], b[k][n], acc);
      d[m][n] = acc;
    }
  }
}

// One lane's words in the exchange: A's registers, B's, C's.
constexpr int kWordA = 0, kWordB = 4, kWordC = 6;

// C/D element i of lane l (the same for both shapes).
int cd_row(int lane, int i) {
  return (lane >> 2) + 8 * (i >> 1);
}
int cd_col(int lane, int i) {
  return 2 * (lane % 4) + (i & 1);
}

void read_c(const WarpWords& in, float (&d)[16][8]) {
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 4; ++i)
      d[cd_row(l, i)][cd_col(l, i)] = std::bit_cast<float>(in.lane[l][kWordC + i]);
  }
}

void write_d(const float (&d)[16][8], WarpWords& out) {
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 4; ++i)
      out.lane[l][i] = std::bit_cast<std::uint32_t>(d[cd_row(l, i)][cd_col(l, i)]);
  }
}

template <MmaInput kInput>
void mma_m16n8k16_combine(const WarpWords& in, WarpWords& out) {
  float a[16][16], b[16][8], d[16][8];
  auto value = [](std::uint16_t bits) {
    return kInput == MmaInput::bf16 ? bf16_value(bits) : f16_value(bits);
  };
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l % 4;
    for (int i = 0; i < 8; ++i) {
      const std::uint16_t bits = half_of(in.lane[l][kWordA + i / 2], i & 1);
      a[g + 8 * ((i >> 1) & 1)][2 * t + (i & 1) + 8 * (i >> 2)] = value(bits);
    }
    for (int i = 0; i < 4; ++i) {
      const std::uint16_t bits = half_of(in.lane[l][kWordB + i / 2], i & 1);
      b[2 * t + (i & 1) + 8 * (i >> 1)][g] = value(bits);
    }
  }
  read_c(in, d);
  multiply_accumulate(a, b, d);
  write_d(d, out);
}

void mma_m16n8k8_tf32_combine(const WarpWords& in, WarpWords& out) {
  float a[16][8], b[8][8], d[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l % 4;
    for (int i = 0; i < 4; ++i) a[g + 8 * (i & 1)][t + 4 * (i >> 1)] = tf32_value(in.lane[l][i]);
    for (int i = 0; i < 2; ++i) b[t + 4 * i][g] = tf32_value(in.lane[l][kWordB + i]);
  }
  read_c(in, d);
  multiply_accumulate(a, b, d);
  write_d(d, out);
}

// in.lane[8j + r][0..3]: row r of matrix j as its lane read it (16 bytes, four words
// of two elements each).
template <int kMatrices, bool kTrans>
void ldmatrix_combine(const WarpWords& in, WarpWords& out) {
  auto element = [&](int matrix, int row, int col) {
    return half_of(in.lane[8 * matrix + row][col / 2], col & 1);
  };
  for (int l = 0; l < 32; ++l) {
    const int r = l / 4, c = 2 * (l % 4);
    for (int j = 0; j < kMatrices; ++j) {
      const std::uint16_t lo = kTrans ? element(j, c, r) : element(j, r, c);
      const std::uint16_t hi = kTrans ? element(j, c + 1, r) : element(j, r, c + 1);
      out.lane[l][j] = lo | static_cast<std::uint32_t>(hi) << 16;
    }
  }
}

template <bool kTrans>
detail::Combine ldmatrix_combine_for(int matrices) {
  return matrices == 1   ? &ldmatrix_combine<1, kTrans>
         : matrices == 2 ? &ldmatrix_combine<2, kTrans>
                         : &ldmatrix_combine<4, kTrans>;
}

}  // namespace

void mma_m16n8k16(MmaInput input, float* d, const std::uint32_t* a, const std::uint32_t* b,
                  const float* c, const std::source_location& where) {
  std::uint32_t in[detail::kCollectiveWords] = {}, out[detail::kCollectiveWords];
  std::memcpy(in + kWordA, a, 4 * sizeof(std::uint32_t));
  std::memcpy(in + kWordB, b, 2 * sizeof(std::uint32_t));
  std::memcpy(in + kWordC, c, 4 * sizeof(float));
  if (input == MmaInput::bf16) {
    detail::warp_collective(&mma_m16n8k16_combine<MmaInput::bf16>, in, out,
                            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", where);
  } else {
    detail::warp_collective(&mma_m16n8k16_combine<MmaInput::f16>, in, out,
                            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", where);
  }
  std::memcpy(d, out, 4 * sizeof(float));
}

void mma_m16n8k8_tf32(float* d, const std::uint32_t* a, const std::uint32_t* b, const float* c,
                      const std::source_location& where) {
  std::uint32_t in[detail::kCollectiveWords] = {}, out[detail::kCollectiveWords];
  std::memcpy(in + kWordA, a, 4 * sizeof(std::uint32_t));
  std::memcpy(in + kWordB, b, 2 * sizeof(std::uint32_t));
  std::memcpy(in + kWordC, c, 4 * sizeof(float));
  detail::warp_collective(&mma_m16n8k8_tf32_combine, in, out,
                          "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", where);
  std::memcpy(d, out, 4 * sizeof(float));
}

void ldmatrix_m8n8(std::uint32_t* r, int matrices, bool trans, const void* row,
                   const std::source_location& where) {
  static const char* const kNames[2][3] = {
      {"ldmatrix.sync.aligned.m8n8.x1.shared.b16", "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
       "ldmatrix.sync.aligned.m8n8.x4.shared.b16"},
      {"ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16",
       "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
       "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"}};
  const int form = matrices == 1 ? 0 : matrices == 2 ? 1 : 2;
  const char* what = kNames[trans ? 1 : 0][form];
  if (matrices != 1 && matrices != 2 && matrices != 4)
    detail::warp_instruction_bug(what, where, "ldmatrix loads 1, 2 or 4 matrices");
  const unsigned lane = detail::lane_id();
  std::uint32_t in[detail::kCollectiveWords] = {}, out[detail::kCollectiveWords];
  // The lanes that give a row address read that row now, before the warp meets: on
  // hardware the warp reads every row before any lane runs on, so a lane that
  // writes shared memory right after the instruction cannot change what another
  // lane receives.
  if (lane < 8u * static_cast<unsigned>(matrices)) {
    char problem[200];
    if (reinterpret_cast<std::uintptr_t>(row) % 16 != 0) {
      std::snprintf(problem, sizeof problem,
                    "the row address %p (row %u of matrix %u) is not 16-byte aligned", row,
                    lane % 8, lane / 8);
      detail::warp_instruction_bug(what, where, problem);
    }
    if (!detail::in_block_shared(row, 16)) {
      std::snprintf(problem, sizeof problem,
                    "the row address %p (row %u of matrix %u) is not in this block's __shared__ "
                    "memory (16 bytes from it)",
                    row, lane % 8, lane / 8);
      detail::warp_instruction_bug(what, where, problem);
    }
    std::memcpy(in, row, 16);
  }
  detail::warp_collective(
      trans ? ldmatrix_combine_for<true>(matrices) : ldmatrix_combine_for<false>(matrices), in, out,
      what, where);
  std::memcpy(r, out, static_cast<std::size_t>(matrices) * sizeof(std::uint32_t));
}

std::uint32_t cvt_rna_tf32(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fffffffu;
  // Adding half a unit of the 13 dropped bits to the magnitude rounds ties away from
  // zero; a carry into the exponent is the next binade (or the infinity) it should be.
  return (bits + 0x1000u) & 0xffffe000u;
}

}  // namespace tlemu
