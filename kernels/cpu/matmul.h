// The CPU GEMM entry point (internal: not installed, not in towerlab.h). Public
// contract and dispatch in kernels/matmul.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/half.h"
#include "kernels/matmul.h"

namespace towerlab::cpu {

// Raw row-major pointers, arguments already checked. Serves matmul() and other
// families (conv2d via im2col). The leading dimensions are the row strides of A,
// B, C as stored (lda >= K without transpose, >= M with).
template <typename T>
void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
          T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc);

// The mixed-precision GEMM (kernels/matmul.h's 16-bit contract): In is bfloat16 or
// float16 for both A and B, the sums are float32, Out is float or In (rounded once
// at the end). bfloat16 runs the vdpbf16ps kernel where set_bf16_gemm_kernel
// (engine/settings.h) asks for it; otherwise the values are widened to float32
// while packing for gemm_isa()'s float32 kernel.
template <typename In, typename Out>
void gemm_mixed(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
                float alpha, const In* a, std::int64_t lda, const In* b, std::int64_t ldb,
                float beta, Out* c, std::int64_t ldc);

// batched_matmul's products (kernels/batched_matmul.h) on raw pointers, arguments
// already checked: for i < batch, C_i = alpha op(A_i) op(B_i) + beta C_i, where X_i
// = x + i * x_stride (a stride of 0: one matrix that every entry shares), each
// matrix stored whole (leading dimension its row's length: K or M for A, N or K for
// B, N for C). c_stride 0 is the sum over the batch: the entries add onto the one C
// in order, each after the first with beta 1 (batch 0 sets C = beta C). In and Out
// are gemm's (float, double) or gemm_mixed's (16-bit In). Each entry is gemm's or
// gemm_mixed's call on its matrices, so the bits are one matmul per entry's; the
// caller checks the arguments and dispatches the dtype once for the batch, not per
// entry, where that costs a noticeable share of a small product. The entries
// are shared among the calling thread's share of the pool when there are at least
// as many as threads (each GEMM then runs on one thread, with the bits it has on
// any number); otherwise (and for the sum) they run one after another, each on
// every thread.
template <typename In, typename Out>
void gemm_batched(bool transpose_a, bool transpose_b, std::int64_t batch, std::int64_t m,
                  std::int64_t n, std::int64_t k, float alpha, const In* a, std::int64_t a_stride,
                  const In* b, std::int64_t b_stride, float beta, Out* c, std::int64_t c_stride);

// The GEMM's block of the inner dimension: each output sums its products kGemmKc at
// a time in registers, and the blocks' sums onto C in order. A kernel that must give
// the GEMM's bits (conv2d's implicit weight gradient) blocks its sums the same way.
constexpr std::int64_t kGemmKc = 256;

// B [k,n] as the GEMM packs it for one ISA (gemm_b_panels: the one in use when
// asked; PackedA::b_panels: its own), for a producer that writes it there itself
// instead of into a matrix the GEMM would copy (Winograd's transforms, as they
// compute B): column panels `width` wide (16 on AVX2, 32 on AVX-512), [kc][width]
// each, zeros (or any finite values) past n; the rows in blocks of kGemmKc, each
// block's panels one after another.
struct GemmBPanels {
  GemmIsa isa;
  std::int64_t width, k, n;

  std::int64_t panels() const { return (n + width - 1) / width; }
  std::int64_t floats() const { return panels() * width * k; }
  // Where element (p, j) of B lies.
  std::int64_t at(std::int64_t p, std::int64_t j) const {
    const std::int64_t block = p / kGemmKc * kGemmKc, kc = std::min(kGemmKc, k - block);
    return block * panels() * width + j / width * width * kc + (p - block) * width + j % width;
  }
};
GemmBPanels gemm_b_panels(std::int64_t k, std::int64_t n);

// A [m,k] as the GEMM packs it for one ISA (gemm_a_panels: the one in use when asked;
// PackedA's layout), for a producer that writes it there itself (Winograd's weight
// gradient, its input transform V): row panels `height` high (6 on AVX2, 12 on
// AVX-512), [kc][height] each, zeros (or any finite values) past m; the columns in
// blocks of kGemmKc, each block's panels one after another.
struct GemmAPanels {
  GemmIsa isa;
  std::int64_t height, m, k;

  std::int64_t panels() const { return (m + height - 1) / height; }
  std::int64_t floats() const { return panels() * height * k; }
  // Where element (i, p) of A lies.
  std::int64_t at(std::int64_t i, std::int64_t p) const {
    const std::int64_t block = p / kGemmKc * kGemmKc, kc = std::min(kGemmKc, k - block);
    return block * panels() * height + i / height * height * kc + (p - block) * height + i % height;
  }
};
GemmAPanels gemm_a_panels(std::int64_t m, std::int64_t k);

// C [m,n] = A · B + beta * C with A and B written by their producers as `a` and `b`
// lay them out (the same ISA, a.k == b.k): gemm<float>(false, false, a.m, b.n, b.k, 1,
// A, lda, B, ldb, beta, c, ldc) without packing either, the same bits.
void gemm_packed_ab(const GemmAPanels& a, const float* a_packed, const GemmBPanels& b,
                    const float* b_packed, float beta, float* c, std::int64_t ldc);

// C [m,n] = op(A) · B + beta * C for B written into `packed` as `b` lays it out:
// gemm<float>(transpose_a, false, m, b.n, b.k, 1, a, lda, B, ldb, beta, c, ldc) without
// B's packing, the same bits, on the ISA `b` was asked for.
void gemm_packed_b(bool transpose_a, std::int64_t m, const float* a, std::int64_t lda,
                   const GemmBPanels& b, const float* packed, float beta, float* c,
                   std::int64_t ldc);

// op(A) [m,k] (A stored row-major with stride lda: [m,k], or [k,m] when
// transpose_a) packed once into the GEMM's panels, for many products with the same A:
// Winograd's transformed weights against every block of tiles, and im2col's weight
// (or its transpose) against every image's patches, which gemm would pack again each
// time. Packed for the ISA in use when it is built; B's producer asks b_panels for
// the layout of B that this A multiplies (that ISA's), and gemm_packed and
// gemm_packed_a run that ISA's kernels.
class PackedA {
 public:
  PackedA(const float* a, std::int64_t lda, std::int64_t m, std::int64_t k,
          bool transpose_a = false);

  // The layout of a B [k,n] for gemm_packed with this A.
  GemmBPanels b_panels(std::int64_t n) const;

 private:
  friend void gemm_packed(const PackedA&, const GemmBPanels&, const float*, float, float*,
                          std::int64_t);
  friend void gemm_packed_a(const PackedA&, bool, std::int64_t, const float*, std::int64_t, float,
                            float*, std::int64_t);
  GemmIsa isa_;
  std::int64_t m_, k_;
  std::vector<float> panels_;
};

// C [m,n] = A · B + beta * C with both operands packed: A once (PackedA), B written
// by its producer into `packed` as a.b_panels(n) lays it out (Winograd's input
// transform, block by block): gemm<float>(false, false, m, n, k, 1, A, lda, B, ldb,
// beta, c, ldc) without packing either, the same bits.
void gemm_packed(const PackedA& a, const GemmBPanels& b, const float* packed, float beta, float* c,
                 std::int64_t ldc);

// C [m,n] = op(A) · op(B) + beta * C with A packed once (PackedA) and B [k,n] (stored
// [k,n] with stride ldb, or [n,k] when transpose_b) packed here as gemm packs it:
// gemm<float>(transpose_a, transpose_b, m, n, k, 1, A, lda, B, ldb, beta, c, ldc)
// without A's packing, the same bits, on the ISA `a` was packed for.
void gemm_packed_a(const PackedA& a, bool transpose_b, std::int64_t n, const float* b,
                   std::int64_t ldb, float beta, float* c, std::int64_t ldc);

#if defined(__x86_64__)
// dst [k][32] <- 32 rows of src, `ld` apart, each contiguous along k: the GEMM's
// packer for a full panel of its AVX-512 kernel's B (or of any 32 rows), with AVX2.
void pack_32_rows_avx2(const float* src, std::int64_t ld, std::int64_t k, float* dst);
#endif

}  // namespace towerlab::cpu
