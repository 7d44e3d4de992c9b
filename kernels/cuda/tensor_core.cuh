// The tensor-core instructions the CUDA kernels use, each one warp-collective PTX
// instruction (sm_80 and later; towerlab builds for sm_90):
//
//   mma_m16n8k16_bf16   D(16x8, f32) = A(16x16, bf16) * B(16x8, bf16) + C(16x8, f32)
//   mma_m16n8k16_f16    the same with float16 A and B
//   mma_m16n8k8_tf32    D(16x8, f32) = A(16x8, tf32) * B(8x8, tf32) + C(16x8, f32)
//   ldmatrix_x1/x2/x4   1, 2 or 4 8x8 matrices of 16-bit elements from shared memory,
//   ldmatrix_x*_trans   and the same transposed
//   pack_bf16x2, pack_f16x2, to_tf32   building the operand registers
//   mma_m16n8<TcInput>  the mma of an operand type, for kernels templated on it
//
// With nvcc each is inline PTX; in the emulated build (TOWERLAB_EMULATED_CUDA, from the
// emulator's cuda_runtime.h) each calls the emulator's model of the instruction
// (emulator/include/tlemu/tensor_core.h), so a kernel is the same text in both.
//
// Every lane of the warp must call these together (.sync.aligned): the warp's 32
// lanes, none exited, none in divergent code, from the same line. The emulator
// reports a warp that does not (exit status 86).
//
// Fragments: which lane holds which element, with g = lane / 4 and t = lane % 4 (the
// PTX ISA's groupID and threadID_in_group; docs/emulator.md, "Tensor cores"):
//   m16n8k16 A, a[4]: a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..),
//                     a[3] = (g+8, 2t+8..); the lower column in the low 16 bits
//   m16n8k16 B, b[2]: b[0] = rows 2t, 2t+1 of column g; b[1] = rows 2t+8, 2t+9
//   m16n8k8 tf32 A, a[4]: (g, t), (g+8, t), (g, t+4), (g+8, t+4)
//   m16n8k8 tf32 B, b[2]: (t, g), (t+4, g)
//   C and D, c[4]/d[4]: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
//   ldmatrix: lane 8j + r passes the address of row r of matrix j (16 bytes, 16-byte
//     aligned, in __shared__ memory; for .x1 and .x2 only lanes 0-7 and 0-15 are
//     read); r[j] of lane l holds row l/4, columns 2(l%4) and 2(l%4)+1 of matrix j,
//     or with _trans rows 2(l%4) and 2(l%4)+1 of column l/4. So ldmatrix_x4 of a
//     16x16 row-major tile (lanes 0-15 pointing at rows 0-15, column 0; lanes 16-31
//     at rows 0-15, column 8) gives the mma's A fragment, and ldmatrix_x2_trans of a
//     16x8 row-major [k][n] tile (lanes 0-15 at rows 0-15) its B fragment.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/half.h"

#if defined(TOWERLAB_EMULATED_CUDA)
#include <source_location>

#include "tlemu/tensor_core.h"
// The emulator reports a misuse at the kernel's line, not this header's: every
// instruction takes its caller's location as a defaulted last parameter.
#define TL_TC_WHERE , std::source_location where = std::source_location::current()
#define TL_TC_PASS_WHERE , where  // a wrapper hands its caller's location on
#else
#define TL_TC_WHERE
#define TL_TC_PASS_WHERE
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "kernels/cuda/tensor_core.cuh: mma.sync m16n8k16 and m16n8k8.tf32 need sm_80 or later"
#endif
#endif

namespace towerlab::cuda {

// Two 16-bit values in one register, `lo` in bits 0-15: the operand of an mma
// whose lower-numbered element is `lo`.
__device__ __forceinline__ std::uint32_t pack_bf16x2(bfloat16 lo, bfloat16 hi) {
  return static_cast<std::uint32_t>(lo.bits) | static_cast<std::uint32_t>(hi.bits) << 16;
}
__device__ __forceinline__ std::uint32_t pack_f16x2(float16 lo, float16 hi) {
  return static_cast<std::uint32_t>(lo.bits) | static_cast<std::uint32_t>(hi.bits) << 16;
}

// x rounded to tf32 (cvt.rna.tf32.f32: to nearest, ties away from zero), in the upper
// 19 bits, the low 13 bits zero: an operand of mma_m16n8k8_tf32.
__device__ __forceinline__ std::uint32_t to_tf32(float x) {
#if defined(TOWERLAB_EMULATED_CUDA)
  return tlemu::cvt_rna_tf32(x);
#else
  std::uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
#endif
}

__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                                  const std::uint32_t (&b)[2],
                                                  const float (&c)[4] TL_TC_WHERE) {
#if defined(TOWERLAB_EMULATED_CUDA)
  tlemu::mma_m16n8k16(tlemu::MmaInput::bf16, d, a, b, c, where);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#endif
}

__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const std::uint32_t (&a)[4],
                                                 const std::uint32_t (&b)[2],
                                                 const float (&c)[4] TL_TC_WHERE) {
#if defined(TOWERLAB_EMULATED_CUDA)
  tlemu::mma_m16n8k16(tlemu::MmaInput::f16, d, a, b, c, where);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#endif
}

__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const std::uint32_t (&a)[4],
                                                 const std::uint32_t (&b)[2],
                                                 const float (&c)[4] TL_TC_WHERE) {
#if defined(TOWERLAB_EMULATED_CUDA)
  tlemu::mma_m16n8k8_tf32(d, a, b, c, where);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#endif
}

// What a tensor-core kernel multiplies: bfloat16 or float16 operands on
// m16n8k16, or float32 ones rounded to tf32 (to_tf32) on m16n8k8.
enum class TcInput { BFloat16, Float16, Tf32 };

// d = a b + c by kInput's mma (the fragments above: m16n8k16 or m16n8k8).
template <TcInput kInput>
__device__ __forceinline__ void mma_m16n8(float (&d)[4], const std::uint32_t (&a)[4],
                                          const std::uint32_t (&b)[2],
                                          const float (&c)[4] TL_TC_WHERE) {
  if constexpr (kInput == TcInput::BFloat16) {
    mma_m16n8k16_bf16(d, a, b, c TL_TC_PASS_WHERE);
  } else if constexpr (kInput == TcInput::Float16) {
    mma_m16n8k16_f16(d, a, b, c TL_TC_PASS_WHERE);
  } else {
    mma_m16n8k8_tf32(d, a, b, c TL_TC_PASS_WHERE);
  }
}

#if !defined(TOWERLAB_EMULATED_CUDA)
namespace tensor_core_detail {
// The address of `p` in the shared state space, which ldmatrix's [p] operand takes.
__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
}  // namespace tensor_core_detail
#endif

// `row`: this lane's row address (see the fragments above). The "memory" clobber
// keeps the compiler from moving shared-memory stores across the load it cannot see.
__device__ __forceinline__ void ldmatrix_x1(std::uint32_t (&r)[1], const void* row TL_TC_WHERE) {
#if defined(TOWERLAB_EMULATED_CUDA)
  tlemu::ldmatrix_m8n8(r, 1, false, row, where);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(tensor_core_detail::shared_address(row))
               : "memory");
#endif
}

__device__ __forceinline__ void ldmatrix_x2(std::uint32_t (&r)[2], const void* row TL_TC_WHERE) {
#if defined(TOWERLAB_EMULATED_CUDA)
  tlemu::ldmatrix_m8n8(r, 2, false, row, where);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(tensor_core_detail::shared_address(row))
               : "memory");
#endif
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* row TL_TC_WHERE) {
#if defined(TOWERLAB_EMULATED_CUDA)
  tlemu::ldmatrix_m8n8(r, 4, false, row, where);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(tensor_core_detail::shared_address(row))
               : "memory");
#endif
}

__device__ __forceinline__ void ldmatrix_x1_trans(std::uint32_t (&r)[1],
                                                  const void* row TL_TC_WHERE) {
#if defined(TOWERLAB_EMULATED_CUDA)
  tlemu::ldmatrix_m8n8(r, 1, true, row, where);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(tensor_core_detail::shared_address(row))
               : "memory");
#endif
}

__device__ __forceinline__ void ldmatrix_x2_trans(std::uint32_t (&r)[2],
                                                  const void* row TL_TC_WHERE) {
#if defined(TOWERLAB_EMULATED_CUDA)
  tlemu::ldmatrix_m8n8(r, 2, true, row, where);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(tensor_core_detail::shared_address(row))
               : "memory");
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4],
                                                  const void* row TL_TC_WHERE) {
#if defined(TOWERLAB_EMULATED_CUDA)
  tlemu::ldmatrix_m8n8(r, 4, true, row, where);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(tensor_core_detail::shared_address(row))
               : "memory");
#endif
}

}  // namespace towerlab::cuda

#undef TL_TC_WHERE
#undef TL_TC_PASS_WHERE
