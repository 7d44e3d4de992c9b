// The CPU GEMM on operands packed ahead of it (contracts in kernels/cpu/matmul.h):
// PackedA, an A packed once for many products (im2col's weight, Winograd's
// transformed weights); the layouts in which a producer writes A or B straight into
// the GEMM's panels (GemmAPanels, GemmBPanels: Winograd's transforms); and the
// products that read them (gemm_packed, gemm_packed_a, gemm_packed_b,
// gemm_packed_ab). Each runs the blocked driver (kernels/cpu/gemm_blocked.h) of the
// ISA its panels were laid out for, skipping only the packing of what is packed
// already: gemm<float>'s bits.
#include <cstddef>
#include <cstdint>

#include "engine/error.h"
#include "engine/settings.h"
#include "kernels/cpu/gemm_blocked.h"
#include "kernels/cpu/matmul.h"

namespace towerlab::cpu {

using gemm_detail::Blocked;
using gemm_detail::scale_c;
using gemm_detail::selected_isa;
using gemm_detail::with_blocked;

namespace {

// The layout of B for `isa`'s kernels.
GemmBPanels b_panels_for(GemmIsa isa, std::int64_t k, std::int64_t n) {
  GemmBPanels panels{isa, 0, k, n};
  with_blocked(isa, [&]<int MR, int NR>(const auto&) { panels.width = NR; });
  return panels;
}

}  // namespace

PackedA::PackedA(const float* a, std::int64_t lda, std::int64_t m, std::int64_t k, bool transpose_a)
    : isa_(selected_isa().load(std::memory_order_relaxed)), m_(m), k_(k) {
  with_blocked(isa_, [&]<int MR, int NR>(const auto& kernels) {
    panels_.resize(static_cast<std::size_t>((m + MR - 1) / MR * MR * k));
    Blocked<MR, NR>::pack_all_a(kernels, transpose_a, a, lda, m, k, panels_.data());
  });
}

GemmBPanels PackedA::b_panels(std::int64_t n) const {
  return b_panels_for(isa_, k_, n);
}

GemmAPanels gemm_a_panels(std::int64_t m, std::int64_t k) {
  GemmAPanels panels{selected_isa().load(std::memory_order_relaxed), 0, m, k};
  with_blocked(panels.isa, [&]<int MR, int NR>(const auto&) { panels.height = MR; });
  return panels;
}

void gemm_packed_ab(const GemmAPanels& a, const float* a_packed, const GemmBPanels& b,
                    const float* b_packed, float beta, float* c, std::int64_t ldc) {
  TL_CHECK(a.isa == b.isa && a.k == b.k, InvalidArgument,
           "gemm_packed_ab: A's panels with K = " << a.k << ", B's with K = " << b.k
                                                  << (a.isa == b.isa ? "" : ", for another ISA"));
  if (a.m <= 0 || b.n <= 0) return;
  if (b.k <= 0) {
    scale_c(a.m, b.n, beta, c, ldc);
    return;
  }
  with_blocked(b.isa, [&]<int MR, int NR>(const auto& kernels) {
    Blocked<MR, NR>::run(kernels, false, false, a.m, b.n, b.k, 1.0f, nullptr, 0, nullptr, 0, beta,
                         c, ldc, a_packed, b_packed);
  });
}

GemmBPanels gemm_b_panels(std::int64_t k, std::int64_t n) {
  return b_panels_for(selected_isa().load(std::memory_order_relaxed), k, n);
}

void gemm_packed(const PackedA& a, const GemmBPanels& b, const float* packed, float beta, float* c,
                 std::int64_t ldc) {
  TL_CHECK(a.isa_ == b.isa && a.k_ == b.k, InvalidArgument,
           "gemm_packed: A packed with K = " << a.k_ << ", B's panels with K = " << b.k
                                             << (a.isa_ == b.isa ? "" : ", for another ISA"));
  if (a.m_ <= 0 || b.n <= 0) return;
  if (b.k <= 0) {
    scale_c(a.m_, b.n, beta, c, ldc);
    return;
  }
  with_blocked(b.isa, [&]<int MR, int NR>(const auto& kernels) {
    Blocked<MR, NR>::run(kernels, false, false, a.m_, b.n, b.k, 1.0f, nullptr, 0, nullptr, 0, beta,
                         c, ldc, a.panels_.data(), packed);
  });
}

void gemm_packed_a(const PackedA& a, bool transpose_b, std::int64_t n, const float* b,
                   std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (a.m_ <= 0 || n <= 0) return;
  if (a.k_ <= 0) {
    scale_c(a.m_, n, beta, c, ldc);
    return;
  }
  with_blocked(a.isa_, [&]<int MR, int NR>(const auto& kernels) {
    Blocked<MR, NR>::run(kernels, false, transpose_b, a.m_, n, a.k_, 1.0f, nullptr, 0, b, ldb, beta,
                         c, ldc, a.panels_.data());
  });
}

void gemm_packed_b(bool transpose_a, std::int64_t m, const float* a, std::int64_t lda,
                   const GemmBPanels& b, const float* packed, float beta, float* c,
                   std::int64_t ldc) {
  if (m <= 0 || b.n <= 0) return;
  if (b.k <= 0) {
    scale_c(m, b.n, beta, c, ldc);
    return;
  }
  with_blocked(b.isa, [&]<int MR, int NR>(const auto& kernels) {
    Blocked<MR, NR>::run(kernels, transpose_a, false, m, b.n, b.k, 1.0f, a, lda, nullptr, 0, beta,
                         c, ldc, nullptr, packed);
  });
}

}  // namespace towerlab::cpu
