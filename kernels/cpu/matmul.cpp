// CPU GEMM (contracts in kernels/matmul.h and kernels/cpu/matmul.h): the typed
// entry points gemm, gemm_mixed and gemm_batched, through which linear layers and
// conv2d (via im2col) spend most of their CPU time.
//
// The specification is kernels/reference/matmul.h: plain loops, which this file
// runs for float64 (gradient checks) and every other path is tested against.
//
// The float32 path is the cache-blocked driver of kernels/cpu/gemm_blocked.h with the
// micro-kernel of the ISA in use (kernels/cpu/gemm_isa.cpp chooses it,
// kernels/cpu/gemm_kernels.cpp holds them); the same driver runs the packed-operand
// products of kernels/cpu/gemm_packed.cpp.
//
// The 16-bit inputs (gemm_mixed) go through the same driver: widened to float32
// by the generic packing loops for the float32 kernels, or packed as bfloat16
// pairs for the vdpbf16ps kernel (kernels/cpu/gemm_bf16.h), whose panels hold two
// k per 32-bit word; the driver sizes panels in words, so both layouts share it.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "engine/settings.h"
#include "engine/thread_pool.h"
#include "kernels/cpu/convert16.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_blocked.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reference/matmul.h"

namespace towerlab::cpu {

using gemm_detail::bf16_dot_selected;
using gemm_detail::Blocked;
using gemm_detail::Kernels;
using gemm_detail::scale_c;
using gemm_detail::selected_isa;
using gemm_detail::with_blocked;

template <typename T>
void gemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
          T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    scale_c(m, n, beta, c, ldc);
    return;
  }
  if constexpr (std::is_same_v<T, double>) {
    // float64 serves the gradient checks: small problems, where plain loops do.
    reference::matmul(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    with_blocked(selected_isa().load(std::memory_order_relaxed),
                 [&]<int MR, int NR>(const auto& kernels) {
                   Blocked<MR, NR>::run(kernels, transpose_a, transpose_b, m, n, k, alpha, a, lda,
                                        b, ldb, beta, c, ldc);
                 });
  }
}

template <typename In, typename Out>
void gemm_mixed(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k,
                float alpha, const In* a, std::int64_t lda, const In* b, std::int64_t ldb,
                float beta, Out* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if constexpr (!std::is_same_v<Out, float>) {
    // The driver adds each K block onto C, so C is float32 until the last block: a
    // 16-bit C goes through a float32 copy (not zeroed: the GEMM's beta = 0 writes it
    // whole), widened and rounded once at the end with the vector conversions, rows
    // spread over the thread pool.
    const std::unique_ptr<float[]> acc(new float[static_cast<std::size_t>(m * n)]);  // [M,N]
    if (beta != 0.0f) {
      parallel_rows(m, n, [&](std::int64_t first, std::int64_t last) {
        for (std::int64_t i = first; i < last; ++i) widen_16bit(&acc[i * n], &c[i * ldc], n);
      });
    }
    gemm_mixed<In, float>(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, acc.get(),
                          n);
    parallel_rows(m, n, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t i = first; i < last; ++i) round_to_16bit(&c[i * ldc], &acc[i * n], n);
    });
    return;
  } else {
    if (k <= 0) {
      scale_c(m, n, beta, c, ldc);
      return;
    }
    if constexpr (std::is_same_v<In, bfloat16>) {
      if (bf16_dot_selected()) {
        const Kernels<bfloat16, std::uint32_t> kernels{bf16_kernel_for(kBf16Mr, kBf16Nr),
                                                       pack_bf16_a_along_k,
                                                       pack_bf16_b_along_k,
                                                       bf16_kernel_for,
                                                       pack_bf16_a_across_k,
                                                       pack_bf16_b_across_k};
        Blocked<kBf16Mr, kBf16Nr>::run(kernels, transpose_a, transpose_b, m, n, k, alpha, a, lda, b,
                                       ldb, beta, c, ldc);
        return;
      }
    }
    // Widened while packing, then gemm_isa()'s float32 kernel: correct everywhere,
    // no faster than float32 inputs.
    with_blocked<In>(selected_isa().load(std::memory_order_relaxed),
                     [&]<int MR, int NR>(const auto& kernels) {
                       Blocked<MR, NR>::run(kernels, transpose_a, transpose_b, m, n, k, alpha, a,
                                            lda, b, ldb, beta, c, ldc);
                     });
  }
}

template <typename In, typename Out>
void gemm_batched(bool transpose_a, bool transpose_b, std::int64_t batch, std::int64_t m,
                  std::int64_t n, std::int64_t k, float alpha, const In* a, std::int64_t a_stride,
                  const In* b, std::int64_t b_stride, float beta, Out* c, std::int64_t c_stride) {
  const std::int64_t lda = transpose_a ? m : k, ldb = transpose_b ? k : n;
  // Entry i with beta `entry_beta` and inner dimension `depth`: gemm's or
  // gemm_mixed's call, as matmul makes it.
  const auto product = [&](std::int64_t i, float entry_beta, std::int64_t depth) {
    const In* a_i = a + i * a_stride;
    const In* b_i = b + i * b_stride;
    Out* c_i = c + i * c_stride;
    if constexpr (std::is_same_v<In, float> || std::is_same_v<In, double>) {
      gemm<In>(transpose_a, transpose_b, m, n, depth, alpha, a_i, lda, b_i, ldb, entry_beta, c_i,
               n);
    } else {
      gemm_mixed<In, Out>(transpose_a, transpose_b, m, n, depth, alpha, a_i, lda, b_i, ldb,
                          entry_beta, c_i, n);
    }
  };
  if (c_stride == 0) {                    // the sum: every entry writes the one C, in order
    if (batch == 0) product(0, beta, 0);  // an empty sum: C = beta C, no operand read
    for (std::int64_t i = 0; i < batch; ++i) product(i, i == 0 ? beta : 1.0f, k);
    return;
  }
  const auto entries = [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) product(i, beta, k);
  };
  if (batch >= thread_share()) {
    // Inside a pool thread each GEMM runs inline (a nested parallel_for), on one thread.
    parallel_rows(batch, m * n * std::max<std::int64_t>(k, 1), entries);
  } else {
    entries(0, batch);
  }
}

template void gemm<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                          std::int64_t, const float*, std::int64_t, float, float*, std::int64_t);
template void gemm<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t, double,
                           const double*, std::int64_t, const double*, std::int64_t, double,
                           double*, std::int64_t);
#define TL_GEMM_MIXED(In, Out)                                                                     \
  template void gemm_mixed<In, Out>(bool, bool, std::int64_t, std::int64_t, std::int64_t, float,   \
                                    const In*, std::int64_t, const In*, std::int64_t, float, Out*, \
                                    std::int64_t)
TL_GEMM_MIXED(bfloat16, float);
TL_GEMM_MIXED(bfloat16, bfloat16);
TL_GEMM_MIXED(float16, float);
TL_GEMM_MIXED(float16, float16);
#undef TL_GEMM_MIXED
#define TL_GEMM_BATCHED(In, Out)                                                               \
  template void gemm_batched<In, Out>(bool, bool, std::int64_t, std::int64_t, std::int64_t,    \
                                      std::int64_t, float, const In*, std::int64_t, const In*, \
                                      std::int64_t, float, Out*, std::int64_t)
TL_GEMM_BATCHED(float, float);
TL_GEMM_BATCHED(double, double);
TL_GEMM_BATCHED(bfloat16, float);
TL_GEMM_BATCHED(bfloat16, bfloat16);
TL_GEMM_BATCHED(float16, float);
TL_GEMM_BATCHED(float16, float16);
#undef TL_GEMM_BATCHED

}  // namespace towerlab::cpu
