// Tensor-core instructions on the emulated GPUs: what kernels/cuda/tensor_core.cuh
// calls in the emulated build where nvcc's build has inline PTX. Each function is
// one warp-collective instruction of the PTX ISA (.sync.aligned: all 32 lanes of
// the warp execute it together, from the same place) and takes the calling lane's
// registers as the instruction does.
//
//   mma_m16n8k16      mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32
//   mma_m16n8k8_tf32  mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32
//   ldmatrix_m8n8     ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16
//   cvt_rna_tf32      cvt.rna.tf32.f32
//
// The fragment layouts (which lane holds which element in which register) are the
// PTX ISA's closed forms ("Matrix Fragments for mma.m16n8k16 with floating point
// type", "... for mma.m16n8k8", "Warp-level matrix load instruction: ldmatrix").
// The arithmetic (src/tensor_core.cpp) is one stated model: every product of two
// inputs is exact, and D = C + sum over k of A[m][k] * B[k][n] is accumulated in
// float32 in increasing k, starting from C, each addition rounded to nearest even
// (one fmaf a step). The hardware's order and internal precision may differ; see
// docs/emulator.md, "Tensor cores".
//
// Checked, and reported with exit status 86 (like a misused shuffle): a warp of
// fewer than 32 threads, a lane that exited, lanes waiting elsewhere (divergent
// code) or at another instruction or call site; for ldmatrix, a row address not
// 16-byte aligned or outside the block's __shared__ memory. A row that an
// asynchronous copy has not yet delivered (cuda_pipeline.h) reads as NaN.
#pragma once

#include <cstdint>
#include <source_location>

namespace tlemu {

enum class MmaInput { bf16, f16 };

// d[4] = A * B + c[4] for the warp's 16x16 A (a[4]: four registers of two 16-bit
// elements each, the lower-numbered element in the low half) and 16x8 B (b[2]).
void mma_m16n8k16(MmaInput input, float* d, const std::uint32_t* a, const std::uint32_t* b,
                  const float* c, const std::source_location& where);
// d[4] = A * B + c[4] for the warp's 16x8 A (a[4], one tf32 each) and 8x8 B (b[2]).
// A tf32 operand's low 13 bits are not read (the value is the register's upper 19
// bits), which is what cvt_rna_tf32 leaves zero.
void mma_m16n8k8_tf32(float* d, const std::uint32_t* a, const std::uint32_t* b, const float* c,
                      const std::source_location& where);
// r[matrices] for matrices = 1, 2 or 4 8x8 matrices of 16-bit elements; lane l < 8 *
// matrices gives `row`, the address of row l % 8 of matrix l / 8 (16 bytes); the
// other lanes' addresses are not read.
void ldmatrix_m8n8(std::uint32_t* r, int matrices, bool trans, const void* row,
                   const std::source_location& where);
// x rounded to tf32 (10 mantissa bits) to nearest, ties away from zero, in the upper
// 19 bits of the result, the low 13 bits zero; infinities stay, finite values that
// round past the largest tf32 become infinities, a NaN becomes 0x7fffffff.
std::uint32_t cvt_rna_tf32(float x);

}  // namespace tlemu
