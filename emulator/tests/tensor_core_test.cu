// The tensor-core instructions of kernels/cuda/tensor_core.cuh against plain host
// loops: each mma shape and each ldmatrix form on random fragments, every lane's
// registers checked against the elements the PTX ISA's layout names, and a 64x64x64
// GEMM through cp.async, ldmatrix and mma. The same file compiles with nvcc for
// sm_90 (only the missing-wait control is the emulator's alone), so that on an H100
// the same kernels measure the hardware against the same layouts (from the
// repository's root):
//   nvcc -std=c++20 -arch=sm_90 -I. -o tensor_core_test emulator/tests/tensor_core_test.cu
//        -lgtest -lgtest_main
//   ./tensor_core_test
//
// Exact and bounded checks. With small integers as inputs every product and every
// partial sum is exact in float32, so any order of accumulation gives the same bits:
// those results must be equal everywhere. With real inputs the result depends on the
// order and precision of the accumulation: the emulator's stated model (fmaf in k
// order from C, docs/emulator.md) is checked bit for bit in the emulated build, and
// hardware is held to the bound |D - exact| <= k * 2^-22 * (|C| + sum |A B|).
//
// Controls that must fail (run as tests that expect the failure): a kernel with the
// lanes' groupID and threadID_in_group exchanged, ldmatrix row addresses given by the
// wrong lanes, and (emulated only) a GEMM that reads its tiles without waiting for
// their asynchronous copies. The emulator's reports (divergent lanes, exited lanes,
// misaligned rows) are controls in controls.cu.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "engine/half.h"
#include "kernels/cuda/tensor_core.cuh"

namespace {

using towerlab::bfloat16;
using towerlab::float16;
namespace tc = towerlab::cuda;

// --- the layouts, as the PTX ISA states them -------------------------------------------

struct Coord {
  int row, col;
};

// groupID and threadID_in_group of a lane. `exchanged` is the control's mistake:
// groupID taken as lane % 8 and threadID_in_group as lane / 8.
struct LaneIds {
  int g, t;
};
__host__ __device__ inline LaneIds lane_ids(int lane, bool exchanged) {
  return exchanged ? LaneIds{lane % 8, lane / 8} : LaneIds{lane >> 2, lane % 4};
}

// m16n8k16, .f16/.bf16 A element a_i: row groupID for i in {0, 1, 4, 5}, else
// groupID + 8; column threadID_in_group * 2 + (i & 1), plus 8 for i >= 4.
__host__ __device__ inline Coord a_m16n8k16(LaneIds id, int i) {
  const bool low_rows = i == 0 || i == 1 || i == 4 || i == 5;
  return {low_rows ? id.g : id.g + 8, id.t * 2 + (i & 1) + (i >= 4 ? 8 : 0)};
}
// m16n8k16 B element b_i: row threadID_in_group * 2 + (i & 1), plus 8 for i >= 2;
// column groupID.
__host__ __device__ inline Coord b_m16n8k16(LaneIds id, int i) {
  return {id.t * 2 + (i & 1) + (i >= 2 ? 8 : 0), id.g};
}
// m16n8k8 .tf32 A element a_i: row groupID for a0 and a2, groupID + 8 for a1 and a3;
// column threadID_in_group for a0 and a1, + 4 for a2 and a3.
__host__ __device__ inline Coord a_m16n8k8_tf32(LaneIds id, int i) {
  return {(i == 0 || i == 2) ? id.g : id.g + 8, (i < 2) ? id.t : id.t + 4};
}
// m16n8k8 .tf32 B: b0 at (threadID_in_group, groupID), b1 four rows below.
__host__ __device__ inline Coord b_m16n8k8_tf32(LaneIds id, int i) {
  return {i == 0 ? id.t : id.t + 4, id.g};
}
// C and D of both shapes: c0, c1 in row groupID, c2, c3 in row groupID + 8; column
// threadID_in_group * 2 + (i & 1).
__host__ __device__ inline Coord cd_m16n8(LaneIds id, int i) {
  return {i < 2 ? id.g : id.g + 8, id.t * 2 + (i & 1)};
}

// --- the kernels ---------------------------------------------------------------------------

// One warp: D (16x8) = A (16x16) * B (16x8) + C, fragments loaded and stored by the
// layouts above. a, b: 16-bit patterns, row-major; c, d: row-major.
template <bool kBf16>
__global__ void mma_m16n8k16_kernel(const std::uint16_t* a, const std::uint16_t* b, const float* c,
                                    float* d, bool exchanged) {
  const LaneIds id = lane_ids(static_cast<int>(threadIdx.x % 32), exchanged);
  std::uint32_t fa[4], fb[2];
  float fc[4], fd[4];
  for (int r = 0; r < 4; ++r) {
    const Coord lo = a_m16n8k16(id, 2 * r), hi = a_m16n8k16(id, 2 * r + 1);
    const std::uint16_t l = a[lo.row * 16 + lo.col], h = a[hi.row * 16 + hi.col];
    fa[r] = kBf16 ? tc::pack_bf16x2(bfloat16::from_bits(l), bfloat16::from_bits(h))
                  : tc::pack_f16x2(float16::from_bits(l), float16::from_bits(h));
  }
  for (int r = 0; r < 2; ++r) {
    const Coord lo = b_m16n8k16(id, 2 * r), hi = b_m16n8k16(id, 2 * r + 1);
    const std::uint16_t l = b[lo.row * 8 + lo.col], h = b[hi.row * 8 + hi.col];
    fb[r] = kBf16 ? tc::pack_bf16x2(bfloat16::from_bits(l), bfloat16::from_bits(h))
                  : tc::pack_f16x2(float16::from_bits(l), float16::from_bits(h));
  }
  for (int i = 0; i < 4; ++i) {
    const Coord e = cd_m16n8(id, i);
    fc[i] = c[e.row * 8 + e.col];
  }
  if (kBf16) {
    tc::mma_m16n8k16_bf16(fd, fa, fb, fc);
  } else {
    tc::mma_m16n8k16_f16(fd, fa, fb, fc);
  }
  for (int i = 0; i < 4; ++i) {
    const Coord e = cd_m16n8(id, i);
    d[e.row * 8 + e.col] = fd[i];
  }
}

// One warp: D (16x8) = A (16x8) * B (8x8) + C with A and B rounded to tf32 by
// to_tf32 (cvt.rna) in the kernel.
__global__ void mma_m16n8k8_tf32_kernel(const float* a, const float* b, const float* c, float* d,
                                        bool exchanged) {
  const LaneIds id = lane_ids(static_cast<int>(threadIdx.x % 32), exchanged);
  std::uint32_t fa[4], fb[2];
  float fc[4], fd[4];
  for (int i = 0; i < 4; ++i) {
    const Coord e = a_m16n8k8_tf32(id, i);
    fa[i] = tc::to_tf32(a[e.row * 8 + e.col]);
  }
  for (int i = 0; i < 2; ++i) {
    const Coord e = b_m16n8k8_tf32(id, i);
    fb[i] = tc::to_tf32(b[e.row * 8 + e.col]);
  }
  for (int i = 0; i < 4; ++i) {
    const Coord e = cd_m16n8(id, i);
    fc[i] = c[e.row * 8 + e.col];
  }
  tc::mma_m16n8k8_tf32(fd, fa, fb, fc);
  for (int i = 0; i < 4; ++i) {
    const Coord e = cd_m16n8(id, i);
    d[e.row * 8 + e.col] = fd[i];
  }
}

__global__ void to_tf32_kernel(int n, const float* x, std::uint32_t* y) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = tc::to_tf32(x[i]);
}

// Where row r of matrix j (of 4) sits in the ldmatrix kernel's shared memory: slot
// (5 (8j + r) + 3) mod 32 of 32-byte slots, so the rows are neither contiguous nor in
// order and every row address must come from its own lane.
__host__ __device__ inline int slot_of(int matrix_row) {
  return (matrix_row * 5 + 3) % 32;
}

// One warp: out[lane][j] = register j of ldmatrix of the 4 8x8 matrices m[j][r][c]
// (16-bit patterns). `shift`: the control's mistake, each lane passing the address
// of the row `shift` further down its matrix.
template <int kMatrices, bool kTrans>
__global__ void ldmatrix_kernel(const std::uint16_t* m, std::uint32_t* out, int shift) {
  __shared__ __align__(16) std::uint16_t rows[32 * 16];
  const int lane = static_cast<int>(threadIdx.x);
  for (int e = lane; e < 32 * 8; e += 32) {
    const int matrix_row = e / 8, col = e % 8;
    rows[slot_of(matrix_row) * 16 + col] = m[e];
    rows[slot_of(matrix_row) * 16 + 8 + col] = 0xdeadu;  // the slot's unused half
  }
  __syncthreads();
  // Lanes past the loaded matrices repeat the first lanes' addresses (the ISA reads
  // only lanes 0-7 for .x1 and 0-15 for .x2 on sm_80 and later).
  const int own = lane % (8 * kMatrices);
  const int given = own / 8 * 8 + (own % 8 + shift) % 8;
  const void* row = &rows[slot_of(given) * 16];
  std::uint32_t r[kMatrices];
  if constexpr (kMatrices == 1) {
    if (kTrans) {
      tc::ldmatrix_x1_trans(r, row);
    } else {
      tc::ldmatrix_x1(r, row);
    }
  } else if constexpr (kMatrices == 2) {
    if (kTrans) {
      tc::ldmatrix_x2_trans(r, row);
    } else {
      tc::ldmatrix_x2(r, row);
    }
  } else {
    if (kTrans) {
      tc::ldmatrix_x4_trans(r, row);
    } else {
      tc::ldmatrix_x4(r, row);
    }
  }
  for (int j = 0; j < 4; ++j) out[lane * 4 + j] = j < kMatrices ? r[j] : 0u;
}

// C (64x64, f32) = A (64x64, row-major M x K) * B (64x64, row-major K x N), 16-bit
// inputs, one block of four warps, each warp a 32x32 quarter of C as 2 x 4 mma tiles.
// The tiles go to shared memory by cp.async (16 bytes a copy) and to the warps'
// registers by ldmatrix: A by .x4 (lanes 0-15 rows 0-15 at column k0, lanes 16-31 the
// same rows at k0 + 8), B by .x4.trans (two 8-column tiles of 16 k-rows at once).
// `wait_for_copies` false is the control: the tiles are read before they arrive.
constexpr int kGemm = 64;
constexpr int kStride = kGemm + 8;  // a shared row: 144 bytes, a multiple of 16

template <bool kBf16>
__global__ void gemm64_kernel(const std::uint16_t* a, const std::uint16_t* b, float* c,
                              bool wait_for_copies) {
  __shared__ __align__(16) std::uint16_t sa[kGemm * kStride];
  __shared__ __align__(16) std::uint16_t sb[kGemm * kStride];
  const int tid = static_cast<int>(threadIdx.x);
  for (int chunk = tid; chunk < kGemm * kGemm / 8; chunk += blockDim.x) {
    const int row = chunk / 8, col = chunk % 8 * 8;
    __pipeline_memcpy_async(&sa[row * kStride + col], a + row * kGemm + col, 16);
    __pipeline_memcpy_async(&sb[row * kStride + col], b + row * kGemm + col, 16);
  }
  __pipeline_commit();
  if (wait_for_copies) __pipeline_wait_prior(0);
  __syncthreads();

  const int warp = tid / 32, lane = tid % 32;
  const int wm = warp / 2 * 32, wn = warp % 2 * 32;
  float acc[2][4][4] = {};
  for (int k0 = 0; k0 < kGemm; k0 += 16) {
    std::uint32_t fa[2][4], fb[4][2];
    for (int mi = 0; mi < 2; ++mi) {
      const int row = wm + mi * 16 + lane % 16, col = k0 + lane / 16 * 8;
      tc::ldmatrix_x4(fa[mi], &sa[row * kStride + col]);
    }
    for (int ni = 0; ni < 4; ni += 2) {
      const int row = k0 + lane % 16, col = wn + ni * 8 + lane / 16 * 8;
      std::uint32_t r[4];
      tc::ldmatrix_x4_trans(r, &sb[row * kStride + col]);
      fb[ni][0] = r[0];
      fb[ni][1] = r[1];
      fb[ni + 1][0] = r[2];
      fb[ni + 1][1] = r[3];
    }
    for (int mi = 0; mi < 2; ++mi) {
      for (int ni = 0; ni < 4; ++ni) {
        if (kBf16) {
          tc::mma_m16n8k16_bf16(acc[mi][ni], fa[mi], fb[ni], acc[mi][ni]);
        } else {
          tc::mma_m16n8k16_f16(acc[mi][ni], fa[mi], fb[ni], acc[mi][ni]);
        }
      }
    }
  }
  const LaneIds id = lane_ids(lane, false);
  for (int mi = 0; mi < 2; ++mi) {
    for (int ni = 0; ni < 4; ++ni) {
      for (int i = 0; i < 4; ++i) {
        const Coord e = cd_m16n8(id, i);
        c[(wm + mi * 16 + e.row) * kGemm + wn + ni * 8 + e.col] = acc[mi][ni][i];
      }
    }
  }
}

// --- the host side ---------------------------------------------------------------------------

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, sizeof(T) * h.size()), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, h.data(), sizeof(T) * h.size(), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

template <typename T>
std::vector<T> to_host(const T* p, std::size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(h.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

enum class Values { integers, reals };

// Inputs: small integers (exact in every accumulation order) or reals in [-1, 1].
float random_value(std::mt19937& rng, Values values) {
  if (values == Values::integers) return static_cast<float>(static_cast<int>(rng() % 9) - 4);
  return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
}

// The 16-bit pattern of v in bfloat16 or float16 (round to nearest even), and back.
std::uint16_t to_bits16(float v, bool bf16) {
  return bf16 ? bfloat16(v).bits : float16(v).bits;
}
float from_bits16(std::uint16_t bits, bool bf16) {
  return bf16 ? static_cast<float>(bfloat16::from_bits(bits))
              : static_cast<float>(float16::from_bits(bits));
}

// x rounded to 11 significant bits (tf32), to nearest with ties away from zero, as
// cvt.rna.tf32.f32 does: frexp and round, not the emulator's bit arithmetic.
float tf32_rna(float x) {
  int e = 0;
  const double m = std::frexp(static_cast<double>(x), &e);  // 0.5 <= |m| < 1
  return static_cast<float>(std::ldexp(std::round(std::ldexp(m, 11)), e - 11));
}

// D = A B + C over an M x K by K x N problem, every way the tests compare with:
// `exact` in double (the sum of the exact products), `model` the emulator's stated
// arithmetic (fmaf in increasing k from C), `magnitude` |C| + sum |A B|.
struct Reference {
  std::vector<double> exact, magnitude;
  std::vector<float> model;
};
Reference reference(int m_size, int n_size, int k_size, const std::vector<float>& a,
                    const std::vector<float>& b, const std::vector<float>& c) {
  Reference r;
  for (int m = 0; m < m_size; ++m) {
    for (int n = 0; n < n_size; ++n) {
      const float cv = c.empty() ? 0.0f : c[m * n_size + n];
      double exact = cv, magnitude = std::fabs(cv);
      float model = cv;
      for (int k = 0; k < k_size; ++k) {
        const double p = static_cast<double>(a[m * k_size + k]) * b[k * n_size + n];
        exact += p;
        magnitude += std::fabs(p);
        model = std::fmaf(a[m * k_size + k], b[k * n_size + n], model);
      }
      r.exact.push_back(exact);
      r.magnitude.push_back(magnitude);
      r.model.push_back(model);
    }
  }
  return r;
}

// How many elements of `d` the checks reject: integers must be exact everywhere;
// reals must be the emulator's model bit for bit in the emulated build, and within
// k * 2^-22 * magnitude of the exact sum on hardware. With `report`, the first few
// are test failures (a control, which expects them, counts them only).
int mismatches(const std::vector<float>& d, const Reference& r, int k_size, Values values,
               const char* what, bool report) {
  int bad = 0;
  for (std::size_t i = 0; i < d.size(); ++i) {
    bool ok;
    if (values == Values::integers) {
      ok = d[i] == r.exact[i];
    } else {
#if defined(TOWERLAB_EMULATED_CUDA)
      ok = std::memcmp(&d[i], &r.model[i], sizeof(float)) == 0;
#else
      ok = std::fabs(d[i] - r.exact[i]) <= k_size * std::ldexp(r.magnitude[i], -22);
#endif
    }
    if (!ok && ++bad <= 3 && report) {
      ADD_FAILURE() << what << ": element " << i << " is " << d[i] << ", expected " << r.exact[i]
                    << " (model " << r.model[i] << ")";
    }
  }
  return bad;
}

// Runs the m16n8k16 kernel on random A, B, C; returns the rejected elements of D.
int run_m16n8k16(bool bf16, Values values, bool exchanged, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint16_t> a_bits(16 * 16), b_bits(16 * 8);
  std::vector<float> a(16 * 16), b(16 * 8), c(16 * 8);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a_bits[i] = to_bits16(random_value(rng, values), bf16);
    a[i] = from_bits16(a_bits[i], bf16);
  }
  for (std::size_t i = 0; i < b.size(); ++i) {
    b_bits[i] = to_bits16(random_value(rng, values), bf16);
    b[i] = from_bits16(b_bits[i], bf16);
  }
  for (float& v : c) v = random_value(rng, values);
  std::uint16_t* da = to_device(a_bits);
  std::uint16_t* db = to_device(b_bits);
  float* dc = to_device(c);
  float* dd = to_device(std::vector<float>(16 * 8, NAN));
  if (bf16) {
    mma_m16n8k16_kernel<true><<<1, 32>>>(da, db, dc, dd, exchanged);
  } else {
    mma_m16n8k16_kernel<false><<<1, 32>>>(da, db, dc, dd, exchanged);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> d = to_host(dd, 16 * 8);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(dd);
  return mismatches(d, reference(16, 8, 16, a, b, c), 16, values,
                    bf16 ? "m16n8k16 bf16" : "m16n8k16 f16", !exchanged);
}

int run_m16n8k8_tf32(Values values, bool exchanged, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<float> a(16 * 8), b(8 * 8), c(16 * 8);
  for (float& v : a) v = random_value(rng, values);
  for (float& v : b) v = random_value(rng, values);
  for (float& v : c) v = random_value(rng, values);
  float* da = to_device(a);
  float* db = to_device(b);
  float* dc = to_device(c);
  float* dd = to_device(std::vector<float>(16 * 8, NAN));
  mma_m16n8k8_tf32_kernel<<<1, 32>>>(da, db, dc, dd, exchanged);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> d = to_host(dd, 16 * 8);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(dd);
  for (float& v : a) v = tf32_rna(v);  // what the kernel's to_tf32 gives the mma
  for (float& v : b) v = tf32_rna(v);
  return mismatches(d, reference(16, 8, 8, a, b, c), 8, values, "m16n8k8 tf32", !exchanged);
}

// The ldmatrix kernel on random matrices: how many (lane, register) words differ from
// the ISA's element for that lane and register; every lane's registers are checked.
template <int kMatrices, bool kTrans>
int run_ldmatrix(int shift, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint16_t> m(4 * 8 * 8);
  for (auto& v : m) v = static_cast<std::uint16_t>(rng());
  std::uint16_t* dm = to_device(m);
  std::uint32_t* dout = to_device(std::vector<std::uint32_t>(32 * 4, 0));
  ldmatrix_kernel<kMatrices, kTrans><<<1, 32>>>(dm, dout, shift);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<std::uint32_t> out = to_host(dout, 32 * 4);
  cudaFree(dm);
  cudaFree(dout);
  auto at = [&](int j, int r, int c) { return m[(j * 8 + r) * 8 + c]; };
  int bad = 0;
  for (int lane = 0; lane < 32; ++lane) {
    // Thread 0 receives the first fragment: a group of four lanes holds one row,
    // two consecutive columns each; .trans swaps rows and columns.
    const int r = lane / 4, c = lane % 4 * 2;
    for (int j = 0; j < kMatrices; ++j) {
      const std::uint32_t lo = kTrans ? at(j, c, r) : at(j, r, c);
      const std::uint32_t hi = kTrans ? at(j, c + 1, r) : at(j, r, c + 1);
      const std::uint32_t expected = lo | hi << 16;
      if (out[lane * 4 + j] != expected && ++bad <= 3 && shift == 0) {
        ADD_FAILURE() << "ldmatrix x" << kMatrices << (kTrans ? ".trans" : "") << ": lane " << lane
                      << " register " << j << " is 0x" << std::hex << out[lane * 4 + j]
                      << ", expected 0x" << expected;
      }
    }
  }
  return bad;
}

// The 64x64x64 GEMM on random reals rounded to the input type; the rejected elements.
int run_gemm(bool bf16, bool wait_for_copies, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint16_t> a_bits(kGemm * kGemm), b_bits(kGemm * kGemm);
  std::vector<float> a(kGemm * kGemm), b(kGemm * kGemm);
  for (int i = 0; i < kGemm * kGemm; ++i) {
    a_bits[i] = to_bits16(random_value(rng, Values::reals), bf16);
    a[i] = from_bits16(a_bits[i], bf16);
    b_bits[i] = to_bits16(random_value(rng, Values::reals), bf16);
    b[i] = from_bits16(b_bits[i], bf16);
  }
  std::uint16_t* da = to_device(a_bits);
  std::uint16_t* db = to_device(b_bits);
  float* dc = to_device(std::vector<float>(kGemm * kGemm, NAN));
  if (bf16) {
    gemm64_kernel<true><<<1, 128>>>(da, db, dc, wait_for_copies);
  } else {
    gemm64_kernel<false><<<1, 128>>>(da, db, dc, wait_for_copies);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> c = to_host(dc, kGemm * kGemm);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  if (!wait_for_copies) {
    int nan = 0;
    for (float v : c) nan += std::isnan(v) ? 1 : 0;
    return nan;
  }
  return mismatches(c, reference(kGemm, kGemm, kGemm, a, b, {}), kGemm, Values::reals,
                    bf16 ? "gemm64 bf16" : "gemm64 f16", true);
}

class TensorCore : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cudaSetDevice(0), cudaSuccess); }
};

// --- mma ---------------------------------------------------------------------------------

TEST_F(TensorCore, MmaM16n8k16Bf16HoldsTheIsaLayoutExactlyOnIntegers) {
  for (unsigned seed = 1; seed <= 3; ++seed)
    EXPECT_EQ(run_m16n8k16(true, Values::integers, false, seed), 0);
}

TEST_F(TensorCore, MmaM16n8k16F16HoldsTheIsaLayoutExactlyOnIntegers) {
  for (unsigned seed = 1; seed <= 3; ++seed)
    EXPECT_EQ(run_m16n8k16(false, Values::integers, false, seed), 0);
}

TEST_F(TensorCore, MmaM16n8k8Tf32HoldsTheIsaLayoutExactlyOnIntegers) {
  for (unsigned seed = 1; seed <= 3; ++seed)
    EXPECT_EQ(run_m16n8k8_tf32(Values::integers, false, seed), 0);
}

TEST_F(TensorCore, MmaOnRealsFollowsTheAccumulationModel) {
  for (unsigned seed = 11; seed <= 13; ++seed) {
    EXPECT_EQ(run_m16n8k16(true, Values::reals, false, seed), 0);
    EXPECT_EQ(run_m16n8k16(false, Values::reals, false, seed), 0);
    EXPECT_EQ(run_m16n8k8_tf32(Values::reals, false, seed), 0);
  }
}

// cvt.rna.tf32.f32: ties away from zero, overflow to infinity, NaN stays NaN.
TEST_F(TensorCore, ToTf32RoundsToNearestWithTiesAwayFromZero) {
  const std::vector<float> x = {
      1.0f,
      std::bit_cast<float>(0x3f801000u),  // 1 + 2^-11: a tie, away from zero
      std::bit_cast<float>(0xbf801000u),  // its negative
      std::bit_cast<float>(0x3f800fffu),  // just below the tie: down
      std::bit_cast<float>(0x3f803000u),  // 1 + 3 * 2^-11: a tie above an odd value: up
      std::bit_cast<float>(0x7f7fffffu),  // the largest float: past the largest tf32
      INFINITY,
      -INFINITY,
      NAN,
      0.1f,
      -3.14159265f,
  };
  float* dx = to_device(x);
  std::uint32_t* dy = to_device(std::vector<std::uint32_t>(x.size(), 0));
  to_tf32_kernel<<<1, 32>>>(static_cast<int>(x.size()), dx, dy);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<std::uint32_t> y = to_host(dy, x.size());
  cudaFree(dx);
  cudaFree(dy);
  const std::vector<std::uint32_t> expected = {0x3f800000u, 0x3f802000u, 0xbf802000u, 0x3f800000u,
                                               0x3f804000u, 0x7f800000u, 0x7f800000u, 0xff800000u};
  for (std::size_t i = 0; i < expected.size(); ++i)
    EXPECT_EQ(y[i], expected[i]) << "input " << i << " (0x" << std::hex
                                 << std::bit_cast<std::uint32_t>(x[i]) << ")";
  EXPECT_TRUE(std::isnan(std::bit_cast<float>(y[8])));
  for (std::size_t i = 9; i < x.size(); ++i) {
    EXPECT_EQ(y[i] & 0x1fffu, 0u);
    EXPECT_EQ(std::bit_cast<float>(y[i]), tf32_rna(x[i])) << "input " << x[i];
  }
}

// --- ldmatrix ------------------------------------------------------------------------------

TEST_F(TensorCore, LdmatrixGivesEachLaneTheIsaFragmentOfEveryMatrix) {
  EXPECT_EQ((run_ldmatrix<1, false>(0, 21)), 0);
  EXPECT_EQ((run_ldmatrix<2, false>(0, 22)), 0);
  EXPECT_EQ((run_ldmatrix<4, false>(0, 23)), 0);
}

TEST_F(TensorCore, LdmatrixTransGivesEachLaneTheTransposedFragment) {
  EXPECT_EQ((run_ldmatrix<1, true>(0, 24)), 0);
  EXPECT_EQ((run_ldmatrix<2, true>(0, 25)), 0);
  EXPECT_EQ((run_ldmatrix<4, true>(0, 26)), 0);
}

// --- a whole tile ----------------------------------------------------------------------------

TEST_F(TensorCore, Gemm64ThroughCpAsyncLdmatrixAndMmaMatchesTheHostLoop) {
  EXPECT_EQ(run_gemm(true, true, 31), 0);
  EXPECT_EQ(run_gemm(false, true, 32), 0);
}

// --- controls: each comparison above must be able to fail --------------------------------

// groupID and threadID_in_group exchanged when loading and storing the fragments:
// the tensor core multiplies other elements than the kernel meant, and the check says so.
TEST_F(TensorCore, ControlAWrongFragmentMappingIsDetected) {
  EXPECT_GT(run_m16n8k16(true, Values::integers, true, 41), 0);
  EXPECT_GT(run_m16n8k16(false, Values::integers, true, 42), 0);
  EXPECT_GT(run_m16n8k8_tf32(Values::integers, true, 43), 0);
}

// Every lane passing the address of the next row of its matrix: the registers hold
// the wrong rows, and the check says so.
TEST_F(TensorCore, ControlBLdmatrixRowAddressesFromTheWrongLanesAreDetected) {
  EXPECT_GT((run_ldmatrix<1, false>(1, 51)), 0);
  EXPECT_GT((run_ldmatrix<4, false>(1, 52)), 0);
  EXPECT_GT((run_ldmatrix<2, true>(3, 53)), 0);
}

#if defined(TOWERLAB_EMULATED_CUDA)
// No __pipeline_wait_prior before the tiles are read: the emulator leaves an
// asynchronous copy's destination NaN until its wait, so ldmatrix reads NaN and every
// element of C is NaN. (On hardware the same mistake reads whatever has arrived: a
// race, not a reproducible test.)
TEST_F(TensorCore, ControlCLdmatrixBeforeTheAsyncCopiesWaitReadsNaN) {
  EXPECT_EQ(run_gemm(true, false, 61), kGemm * kGemm);
}
#endif

}  // namespace
