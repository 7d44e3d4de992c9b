// The CPU GEMM's blocked driver and what it drives (internal to the GEMM's files:
// kernels/cpu/matmul.cpp's typed entry points, kernels/cpu/gemm_packed.cpp's packed
// operands; contracts in kernels/cpu/matmul.h and kernels/matmul.h).
//
// The float32 path is the usual cache-blocked GEMM (Goto/BLIS):
//   for each [kKc x kNc] block of op(B): pack it into NR-wide column panels
//     for each [kMc x kKc] block of op(A): pack it into MR-tall row panels
//       for each NR panel of B, each MR panel of A: micro-kernel (MR x NR of C)
// Packing makes the micro-kernel's reads contiguous and the same for all four
// transpose cases, and sizes the blocks to the caches: an A block stays in L2, a B
// panel in L1, the packed B block in L3. The micro-kernel keeps its MR x NR tile
// of C in vector registers and does one broadcast-FMA per element of A. Threads
// (engine/thread_pool.h) share the packed B and take tasks from a counter: row
// blocks of A, cut into column groups of B as well when A is short.
//
// The driver (Blocked) is a template here, compiled into each entry point's file;
// it reaches the micro-kernels only through the function pointers of a Kernels
// table, each ISA's from kernels/cpu/gemm_kernels.cpp (float32) or
// kernels/cpu/gemm_bf16.h (vdpbf16ps), and the ISA in use from
// kernels/cpu/gemm_isa.cpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "engine/error.h"
#include "engine/settings.h"
#include "engine/thread_pool.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu::gemm_detail {

// ---------------------------------------------------------------------------
// Micro-kernels: c[MR,NR] = alpha * a_panel * b_panel + beta * c (c not read
// when beta == 0), where a_panel is [kc][MR] and b_panel [kc][NR], packed.
//
// A panel's element is a Word: a float (one k; the float32 kernels, which the
// 16-bit inputs reach widened while packing) or a uint32_t holding a pair of
// bfloat16 (two k; the vdpbf16ps kernel, kernels/cpu/gemm_bf16.h), so a panel of
// kc values of k is [ceil(kc / kPerWord)][MR] words.
template <typename Word>
inline constexpr std::int64_t kPerWord = std::is_same_v<Word, float> ? 1 : 2;

template <typename Word>
using MicroKernel = void (*)(std::int64_t kc, const Word* a, const Word* b, float* c,
                             std::int64_t ldc, float alpha, float beta);
// Packs a full panel from source values Src: dst [kc][width] <- src rows (width of
// them, `ld` apart), each contiguous along k (A without transpose, B with: the
// transposing case, the one worth vector code for float), or, for the pair
// layout, source rows of k holding width values each (A with transpose, B without).
template <typename Src, typename Word>
using PanelPack = void (*)(const Src* src, std::int64_t ld, std::int64_t kc, Word* dst,
                           std::int64_t valid);

// What one ISA brings for source values Src packed into Words: the micro-kernel
// and, optionally, packers for full MR-row panels of A and full NR-column panels of
// B. Float words may leave any packer nullptr (the generic loops pack, widening a
// 16-bit Src); pair words have all four.
template <typename Src, typename Word>
struct Kernels {
  MicroKernel<Word> micro_kernel;
  PanelPack<Src, Word> pack_a_rows;  // A stored [M,K]
  PanelPack<Src, Word> pack_b_rows;  // B stored [N,K]
  // The kernel for an edge tile of rows x cols (< MR x NR), writing at least that
  // much of the tile; nullptr: the full micro_kernel.
  MicroKernel<Word> (*edge_kernel)(std::int64_t rows, std::int64_t cols) = nullptr;
  PanelPack<Src, Word> pack_a_cols = nullptr;  // A stored [K,M]
  PanelPack<Src, Word> pack_b_cols = nullptr;  // B stored [K,N]
  // Whether edge_kernel(rows, cols) writes exactly rows x cols (nullptr: never), so
  // that it may write C itself.
  bool (*edge_fits)(std::int64_t rows, std::int64_t cols) = nullptr;
};

// Each ISA's tile of C, MR rows by NR columns, which its micro-kernel
// (kernels/cpu/gemm_kernels.cpp) holds in registers.
// Portable: GCC/Clang vector extensions (SSE on x86-64, NEON on ARM).
inline constexpr int kPortableMr = 6, kPortableNr = 8;
// AVX2 + FMA (Haswell, Zen): 6x16 tile = 12 ymm accumulators, 2 for the B row, 1
// for the broadcast of A: 15 of 16 registers. 12 independent FMA chains cover the
// 4-cycle FMA latency on two FMA ports.
inline constexpr int kAvx2Mr = 6, kAvx2Nr = 16;
// AVX-512 (Skylake-X, Ice Lake, Sapphire Rapids, Zen 4): 12x32 tile = 24 zmm
// accumulators of 32 registers.
inline constexpr int kAvx512Mr = 12, kAvx512Nr = 32;

// Each ISA's float32 kernels for source values Src (float, or bfloat16 and float16,
// widened while packing), kernels/cpu/gemm_kernels.cpp's: the micro-kernel of its
// tile above, its edge kernels and its vector packers (nullptr where the generic
// loops pack).
template <typename Src>
Kernels<Src, float> portable_kernels();
#if TL_CPU_X86
template <typename Src>
Kernels<Src, float> avx2_kernels();
template <typename Src>
Kernels<Src, float> avx512_kernels();
#endif

// The float32 micro-kernel in use (set_gemm_isa, TOWERLAB_GEMM_ISA), and whether a
// bfloat16 product runs the vdpbf16ps kernel now: on request, or under Auto where
// engine/settings.h says it pays. Both kernels/cpu/gemm_isa.cpp's.
std::atomic<GemmIsa>& selected_isa();
bool bf16_dot_selected();

// ---------------------------------------------------------------------------
// Packing and the blocked driver.

// Block sizes in elements. kKc x NR floats of B (16 KiB at NR = 16) sit in L1
// while a kMc x kKc block of A (144 KiB) streams from L2; kNc bounds the packed B
// block (4 MiB at kKc = 256), which lives in L3.
inline constexpr std::int64_t kKc = kGemmKc;
inline constexpr std::int64_t kMc = 144;
inline constexpr std::int64_t kNc = 4096;
// Below this many multiply-adds a second thread costs more than it saves.
inline constexpr double kMinParallelWork = 48.0 * 48.0 * 48.0;

// A grow-only, 64-byte-aligned buffer for packed panels of A or B, one per thread
// and operand, kept between calls.
class PackingBuffer {
 public:
  ~PackingBuffer() { std::free(data_); }
  // Room for `count` words (float or uint32_t, both four bytes).
  template <typename Word>
  Word* get(std::int64_t count) {
    static_assert(sizeof(Word) == 4);
    if (count > size_) {
      std::free(data_);
      data_ = nullptr;
      size_ = 0;
      const std::size_t bytes = (static_cast<std::size_t>(count) * 4 + 63) / 64 * 64;
      data_ = std::aligned_alloc(64, bytes);
      TL_CHECK(data_ != nullptr, OutOfMemory, "gemm: cannot allocate " << bytes << " bytes");
      size_ = count;
    }
    return static_cast<Word*>(data_);
  }

 private:
  void* data_ = nullptr;
  std::int64_t size_ = 0;
};

inline thread_local PackingBuffer t_packed_a;
inline thread_local PackingBuffer t_packed_b;

template <int MR, int NR>
struct Blocked {
  // dst [kc][MR] <- op(A)[i0 : i0+rows, p0 : p0+kc], zero rows past `rows`; a
  // 16-bit Src is widened exactly, a float copied.
  template <typename Src, typename Word>
  static void pack_a(const Kernels<Src, Word>& isa, bool transpose_a, const Src* a,
                     std::int64_t lda, std::int64_t i0, std::int64_t rows, std::int64_t p0,
                     std::int64_t kc, Word* dst) {
    constexpr bool kFloat = std::is_same_v<Src, float>;
    if constexpr (!std::is_same_v<Word, float>) {  // pairs: the ISA packs every case
      if (transpose_a) {
        isa.pack_a_cols(a + p0 * lda + i0, lda, kc, dst, rows);
      } else {
        isa.pack_a_rows(a + i0 * lda + p0, lda, kc, dst, rows);
      }
    } else if (!transpose_a && isa.pack_a_rows != nullptr) {
      isa.pack_a_rows(a + i0 * lda + p0, lda, kc, dst, rows);
    } else if (kFloat && transpose_a) {  // A stored [K,M]: `rows` floats per k, zeros after
      // The count a compile-time constant, for an edge panel too (Winograd's weight
      // gradient with 16 channels: 16 = 6 + 6 + 4 rows): a few moves a k, where the
      // element-by-element loop tested each element.
      if constexpr (kFloat) {
        [&]<std::size_t... R>(std::index_sequence<R...>) {
          (void)((rows == std::int64_t(R) + 1 &&
                  (pack_transposed_floats<R + 1>(a + p0 * lda + i0, lda, kc, dst), true)) ||
                 ...);
        }
        (std::make_index_sequence<MR>());
      }
    } else if (transpose_a) {
      for (std::int64_t p = 0; p < kc; ++p) {
        const Src* src = a + (p0 + p) * lda + i0;
        for (int i = 0; i < MR; ++i) dst[p * MR + i] = i < rows ? static_cast<float>(src[i]) : 0.0f;
      }
    } else {  // A stored [M,K]: MR rows, each contiguous along k
      for (int i = 0; i < MR; ++i) {
        if (i < rows) {
          const Src* src = a + (i0 + i) * lda + p0;
          for (std::int64_t p = 0; p < kc; ++p) dst[p * MR + i] = static_cast<float>(src[p]);
        } else {
          for (std::int64_t p = 0; p < kc; ++p) dst[p * MR + i] = 0.0f;
        }
      }
    }
  }

  // dst [kc][MR] <- the first Rows floats of kc rows `ld` apart, zeros after: a
  // panel of a float A stored [K,M].
  template <std::size_t Rows>
  static void pack_transposed_floats(const float* src, std::int64_t ld, std::int64_t kc,
                                     float* dst) {
    for (std::int64_t p = 0; p < kc; ++p, src += ld, dst += MR) {
      std::memcpy(dst, src, Rows * sizeof(float));
      if constexpr (Rows < MR) std::memset(dst + Rows, 0, (MR - Rows) * sizeof(float));
    }
  }

  // Consecutive panels of Width floats from a float matrix stored along them (A
  // stored [K,M] for A's panels, B stored [K,N] for B's): panel q of dst, `stride`
  // floats after panel q - 1, [kc][Width] <- src[p0 : p0+kc, x0 + q Width : ..] of
  // the `count` values from x0 on, zeros past them. Row by row across eight panels
  // at a time: each row's piece of them is read once, in order, where packing panel
  // by panel read Width floats of every row for each panel, a new cache line each
  // time when the rows are short (a ViT's 64 features, with K its 3136 tokens).
  // Eight panels bound the streams written at once. Only data moves: the bits are
  // pack_a's and pack_b's.
  template <int Width>
  static void pack_across(const float* src, std::int64_t ld, std::int64_t x0, std::int64_t count,
                          std::int64_t p0, std::int64_t kc, float* dst, std::int64_t stride) {
    constexpr std::int64_t kGroup = 8;
    const std::int64_t panels = (count + Width - 1) / Width;
    for (std::int64_t g = 0; g < panels; g += kGroup) {
      const std::int64_t g_end = std::min(panels, g + kGroup);
      for (std::int64_t p = 0; p < kc; ++p) {
        const float* row = src + (p0 + p) * ld + x0;
        for (std::int64_t q = g; q < g_end; ++q) {
          float* out = dst + q * stride + p * Width;
          const std::int64_t valid = count - q * Width;
          if (valid >= Width) {
            std::memcpy(out, row + q * Width, Width * sizeof(float));
          } else {
            for (std::int64_t i = 0; i < Width; ++i) out[i] = i < valid ? row[q * Width + i] : 0.0f;
          }
        }
      }
    }
  }

  // dst [kc][NR] <- op(B)[p0 : p0+kc, j0 : j0+cols], zero columns past `cols`.
  template <typename Src, typename Word>
  static void pack_b(const Kernels<Src, Word>& isa, bool transpose_b, const Src* b,
                     std::int64_t ldb, std::int64_t j0, std::int64_t cols, std::int64_t p0,
                     std::int64_t kc, Word* dst) {
    constexpr bool kFloat = std::is_same_v<Src, float>;
    if constexpr (!std::is_same_v<Word, float>) {
      if (transpose_b) {
        isa.pack_b_rows(b + j0 * ldb + p0, ldb, kc, dst, cols);
      } else {
        isa.pack_b_cols(b + p0 * ldb + j0, ldb, kc, dst, cols);
      }
    } else if (transpose_b && isa.pack_b_rows != nullptr) {
      isa.pack_b_rows(b + j0 * ldb + p0, ldb, kc, dst, cols);
    } else if (transpose_b) {  // B stored [N,K]: NR rows, each contiguous along k
      for (int j = 0; j < NR; ++j) {
        if (j < cols) {
          const Src* src = b + (j0 + j) * ldb + p0;
          for (std::int64_t p = 0; p < kc; ++p) dst[p * NR + j] = static_cast<float>(src[p]);
        } else {
          for (std::int64_t p = 0; p < kc; ++p) dst[p * NR + j] = 0.0f;
        }
      }
    } else if (kFloat && cols == NR) {  // B stored [K,N]: NR contiguous floats per k
      for (std::int64_t p = 0; p < kc; ++p) {
        std::memcpy(dst + p * NR, b + (p0 + p) * ldb + j0, NR * sizeof(float));
      }
    } else {
      for (std::int64_t p = 0; p < kc; ++p) {
        const Src* src = b + (p0 + p) * ldb + j0;
        for (int j = 0; j < NR; ++j) dst[p * NR + j] = j < cols ? static_cast<float>(src[j]) : 0.0f;
      }
    }
  }

  // op(A) packed whole for every K block: [K blocks][M panels][kc][MR] (PackedA).
  static void pack_all_a(const Kernels<float, float>& isa, bool transpose_a, const float* a,
                         std::int64_t lda, std::int64_t m, std::int64_t k, float* dst) {
    const std::int64_t m_panels = (m + MR - 1) / MR;
    for (std::int64_t pc = 0; pc < k; pc += kKc) {
      const std::int64_t kc = std::min(kKc, k - pc);
      for (std::int64_t q = 0; q < m_panels; ++q) {
        pack_a(isa, transpose_a, a, lda, q * MR, std::min<std::int64_t>(MR, m - q * MR), pc, kc,
               dst + pc * m_panels * MR + q * MR * kc);
      }
    }
  }

  // With `prepacked` (pack_all_a's layout) A's panels are read from there, not packed.
  template <typename Src, typename Word>
  // (Src and Word come from `isa`: a, b and the packed panels may be nullptr.)
  static void run(const Kernels<Src, Word>& isa, bool transpose_a, bool transpose_b, std::int64_t m,
                  std::int64_t n, std::int64_t k, float alpha, const std::type_identity_t<Src>* a,
                  std::int64_t lda, const std::type_identity_t<Src>* b, std::int64_t ldb,
                  float beta, float* c, std::int64_t ldc,
                  const std::type_identity_t<Word>* prepacked = nullptr,
                  const std::type_identity_t<Word>* prepacked_b = nullptr) {
    const std::int64_t m_panels = (m + MR - 1) / MR;
    const std::int64_t mc_panels = std::max<std::int64_t>(1, kMc / MR);
    const int threads = static_cast<double>(m) * n * k >= kMinParallelWork ? thread_share() : 1;
    // With `prepacked_b` (GemmBPanels' layout) B's panels are read from there.
    Word* packing = prepacked_b != nullptr
                        ? nullptr
                        : t_packed_b.get<Word>(kKc * ((std::min(n, kNc) + NR - 1) / NR) * NR);
    const std::int64_t all_n_panels = (n + NR - 1) / NR;

    for (std::int64_t jc = 0; jc < n; jc += kNc) {
      const std::int64_t nc = std::min(kNc, n - jc);
      const std::int64_t n_panels = (nc + NR - 1) / NR;
      for (std::int64_t pc = 0; pc < k; pc += kKc) {
        const std::int64_t kc = std::min(kKc, k - pc);
        const std::int64_t kw = (kc + kPerWord<Word> - 1) / kPerWord<Word>;  // a panel's rows
        const float beta_block = pc == 0 ? beta : 1.0f;  // later K blocks add to C
        const Word* packed_b =
            prepacked_b != nullptr ? prepacked_b + pc * all_n_panels * NR + jc * kw : packing;

        auto pack_b_panels = [&](std::int64_t q0, std::int64_t q1) {
          if constexpr (std::is_same_v<Src, float> && std::is_same_v<Word, float>) {
            if (!transpose_b && q1 > q0) {  // B stored [K,N]: its rows read once each
              pack_across<NR>(b, ldb, jc + q0 * NR, std::min((q1 - q0) * NR, nc - q0 * NR), pc, kc,
                              packing + q0 * NR * kw, NR * kw);
              return;
            }
          }
          for (std::int64_t q = q0; q < q1; ++q) {
            pack_b(isa, transpose_b, b, ldb, jc + q * NR, std::min<std::int64_t>(NR, nc - q * NR),
                   pc, kc, packing + q * NR * kw);
          }
        };

        // C rows [mp0*MR, mp1*MR) x columns of B panels [np0, np1) of this block.
        auto compute = [&](std::int64_t mp0, std::int64_t mp1, std::int64_t np0, std::int64_t np1) {
          Word* scratch =
              prepacked != nullptr ? nullptr : t_packed_a.get<Word>(mc_panels * MR * kw);
          alignas(64) float tile[MR * NR];
          for (std::int64_t mb = mp0; mb < mp1; mb += mc_panels) {
            const std::int64_t mb1 = std::min(mb + mc_panels, mp1);
            const Word* packed_a = scratch;
            if (prepacked != nullptr) {
              packed_a = prepacked + pc * m_panels * MR + mb * MR * kw;
            } else {
              bool packed = false;
              if constexpr (std::is_same_v<Src, float> && std::is_same_v<Word, float>) {
                if (transpose_a) {  // A stored [K,M]: its rows read once each
                  pack_across<MR>(a, lda, mb * MR, std::min((mb1 - mb) * MR, m - mb * MR), pc, kc,
                                  scratch, MR * kw);
                  packed = true;
                }
              }
              for (std::int64_t q = mb; q < mb1 && !packed; ++q) {
                pack_a(isa, transpose_a, a, lda, q * MR, std::min<std::int64_t>(MR, m - q * MR), pc,
                       kc, scratch + (q - mb) * MR * kw);
              }
            }
            for (std::int64_t jp = np0; jp < np1; ++jp) {
              const Word* b_panel = packed_b + jp * NR * kw;
              const std::int64_t j = jc + jp * NR;
              const std::int64_t cols = std::min<std::int64_t>(NR, jc + nc - j);
              for (std::int64_t q = mb; q < mb1; ++q) {
                const Word* a_panel = packed_a + (q - mb) * MR * kw;
                const std::int64_t i = q * MR;
                const std::int64_t rows = std::min<std::int64_t>(MR, m - i);
                float* c_tile = c + i * ldc + j;
                if (rows == MR && cols == NR) {
                  isa.micro_kernel(kc, a_panel, b_panel, c_tile, ldc, alpha, beta_block);
                  continue;
                }
                const MicroKernel<Word> edge =
                    isa.edge_kernel != nullptr ? isa.edge_kernel(rows, cols) : isa.micro_kernel;
                // An edge that its kernel covers exactly (M = 16 = 6 + 6 + 4 on AVX2:
                // Winograd's GEMMs with 16 channels) is written in place, as a full
                // tile is: the same bits as below where alpha is 1 (alpha * acc
                // exact) or beta 0.
                if (isa.edge_fits != nullptr && isa.edge_fits(rows, cols) &&
                    (alpha == 1.0f || beta_block == 0.0f)) {
                  edge(kc, a_panel, b_panel, c_tile, ldc, alpha, beta_block);
                  continue;
                }
                // A ragged edge: compute the tile aside, then write the valid part.
                edge(kc, a_panel, b_panel, tile, NR, alpha, 0.0f);
                // Row by row, beta tested once: per element, the test was most of
                // the time of Winograd's GEMMs' 4-row edge (M = 64 = 5 x 12 + 4).
                for (std::int64_t r = 0; r < rows; ++r) {
                  float* out = c_tile + r * ldc;
                  const float* in = tile + r * NR;
                  if (beta_block == 0.0f) {
                    std::copy(in, in + cols, out);
                  } else {
                    for (std::int64_t s = 0; s < cols; ++s) out[s] = in[s] + beta_block * out[s];
                  }
                }
              }
            }
          }
        };

        if (threads == 1) {
          if (prepacked_b == nullptr) pack_b_panels(0, n_panels);
          compute(0, m_panels, 0, n_panels);
          continue;
        }
        // Tasks are handed out from a shared counter rather than split evenly up
        // front: when the machine is shared (other towers, other processes) a
        // thread that was descheduled does fewer tasks instead of holding
        // everyone at the join. At least eight tasks per thread, so that the last
        // one is a small share: row blocks of A (at most kMc rows), and column
        // groups of B as well when A has too few rows for that.
        const std::int64_t per_thread =
            std::max<std::int64_t>(8, (m_panels + threads * mc_panels - 1) / (threads * mc_panels));
        const std::int64_t wanted = per_thread * threads;
        const std::int64_t rows_per_task =
            std::max<std::int64_t>(1, (m_panels + wanted - 1) / wanted);
        const std::int64_t m_tasks = (m_panels + rows_per_task - 1) / rows_per_task;
        const std::int64_t n_split = std::clamp<std::int64_t>(wanted / m_tasks, 1, n_panels);
        const std::int64_t cols_per_task = (n_panels + n_split - 1) / n_split;
        const std::int64_t n_groups = (n_panels + cols_per_task - 1) / cols_per_task;
        const std::int64_t tasks = m_tasks * n_groups;
        const std::int64_t b_tasks = std::min(n_panels, wanted);
        std::atomic<std::int64_t> next_b{0}, next_task{0};
        if (prepacked_b == nullptr) {
          parallel_for(0, threads, [&](std::int64_t, std::int64_t) {
            for (std::int64_t t; (t = next_b.fetch_add(1)) < b_tasks;) {
              pack_b_panels(n_panels * t / b_tasks, n_panels * (t + 1) / b_tasks);
            }
          });
        }
        parallel_for(0, threads, [&](std::int64_t, std::int64_t) {
          for (std::int64_t t; (t = next_task.fetch_add(1)) < tasks;) {
            const std::int64_t mp = (t / n_groups) * rows_per_task;
            const std::int64_t np = (t % n_groups) * cols_per_task;
            compute(mp, std::min(mp + rows_per_task, m_panels), np,
                    std::min(np + cols_per_task, n_panels));
          }
        });
      }
    }
  }
};

// fn.template operator()<MR, NR>(kernels) with the blocked float32 GEMM of `isa`,
// for source values Src: float, or a 16-bit type widened while packing.
template <typename Src = float, typename Fn>
void with_blocked(GemmIsa isa, const Fn& fn) {
  switch (isa) {
#if TL_CPU_X86
    case GemmIsa::Avx512:
      fn.template operator()<kAvx512Mr, kAvx512Nr>(avx512_kernels<Src>());
      return;
    case GemmIsa::Avx2:
      fn.template operator()<kAvx2Mr, kAvx2Nr>(avx2_kernels<Src>());
      return;
#endif
    default:
      fn.template operator()<kPortableMr, kPortableNr>(portable_kernels<Src>());
  }
}

// C = beta * C, for K == 0 (no products to add).
template <typename T>
void scale_c(std::int64_t m, std::int64_t n, T beta, T* c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j)
      c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
  }
}

}  // namespace towerlab::cpu::gemm_detail
