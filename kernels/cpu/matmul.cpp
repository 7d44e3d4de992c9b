// CPU GEMM (contracts in kernels/matmul.h): the fast float32 path that linear
// layers and conv2d (via im2col) spend most of their CPU time in.
//
// The specification is kernels/reference/matmul.h: plain loops, which this file
// runs for float64 (gradient checks) and every other path is tested against.
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
// The 16-bit inputs (gemm_mixed) go through the same driver: widened to float32
// by the generic packing loops for the float32 kernels, or packed as bfloat16
// pairs for the vdpbf16ps kernel (kernels/cpu/gemm_bf16.h), whose panels hold two
// k per 32-bit word; the driver sizes panels in words, so both layouts share it.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/error.h"
#include "engine/settings.h"
#include "engine/thread_pool.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/x86.h"
#include "kernels/reference/matmul.h"

namespace towerlab::cpu {

namespace {

// ---------------------------------------------------------------------------
// Micro-kernels: c[MR,NR] = alpha * a_panel * b_panel + beta * c (c not read
// when beta == 0), where a_panel is [kc][MR] and b_panel [kc][NR], packed.
//
// A panel's element is a Word: a float (one k; the float32 kernels, which the
// 16-bit inputs reach widened while packing) or a uint32_t holding a pair of
// bfloat16 (two k; the vdpbf16ps kernel, kernels/cpu/gemm_bf16.h), so a panel of
// kc values of k is [ceil(kc / kPerWord)][MR] words.
template <typename Word>
constexpr std::int64_t kPerWord = std::is_same_v<Word, float> ? 1 : 2;

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

// Portable: GCC/Clang vector extensions (SSE on x86-64, NEON on ARM).
typedef float Vec4 __attribute__((vector_size(16)));

constexpr int kPortableMr = 6, kPortableNr = 8;

void micro_kernel_portable(std::int64_t kc, const float* a, const float* b, float* c,
                           std::int64_t ldc, float alpha, float beta) {
  Vec4 acc[kPortableMr][2] = {};
  for (std::int64_t p = 0; p < kc; ++p, a += kPortableMr, b += kPortableNr) {
    Vec4 b0, b1;
    std::memcpy(&b0, b, sizeof b0);
    std::memcpy(&b1, b + 4, sizeof b1);
#pragma GCC unroll 6
    for (int i = 0; i < kPortableMr; ++i) {
      acc[i][0] += a[i] * b0;
      acc[i][1] += a[i] * b1;
    }
  }
  for (int i = 0; i < kPortableMr; ++i) {
    for (int j = 0; j < kPortableNr; ++j) {
      const float v = alpha * acc[i][j / 4][j % 4];
      c[i * ldc + j] = beta == 0.0f ? v : v + beta * c[i * ldc + j];
    }
  }
}

#if TL_CPU_X86

// AVX2 + FMA (Haswell, Zen): 6x16 tile = 12 ymm accumulators, 2 for the B row, 1
// for the broadcast of A: 15 of 16 registers. 12 independent FMA chains cover the
// 4-cycle FMA latency on two FMA ports.
constexpr int kAvx2Mr = 6, kAvx2Nr = 16;

// The first Rows rows and 8 * Vecs columns of the 6 x 16 tile, from panels packed
// for the full tile (a [kc][6], b [kc][16]). The full tile is <6, 2>; an edge tile
// (Winograd's M = 32 = 5 x 6 + 2 in FashionNet's input gradient, M = 64 = 10 x 6 +
// 4 in its forward) takes the smallest that covers it instead of computing padding.
// Every variant runs each output's k-loop in the same order with the same FMAs: the
// same bits.
template <int Rows, int Vecs>
__attribute__((target("avx2,fma"))) void micro_kernel_avx2(std::int64_t kc, const float* a,
                                                           const float* b, float* c,
                                                           std::int64_t ldc, float alpha,
                                                           float beta) {
  __m256 acc[Rows][Vecs];
#pragma GCC unroll 6
  for (int i = 0; i < Rows; ++i) {
    for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm256_setzero_ps();
  }
  for (int i = 0; i < Rows; ++i)
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
#pragma GCC unroll 4
  for (std::int64_t p = 0; p < kc; ++p) {
    __m256 bv[Vecs];
    for (int v = 0; v < Vecs; ++v) bv[v] = _mm256_loadu_ps(b + 8 * v);
#pragma GCC unroll 6
    for (int i = 0; i < Rows; ++i) {
      const __m256 a_i = _mm256_broadcast_ss(a + i);
      for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm256_fmadd_ps(a_i, bv[v], acc[i][v]);
    }
    a += kAvx2Mr;
    b += kAvx2Nr;
  }
  const __m256 va = _mm256_set1_ps(alpha);
  if (beta == 0.0f) {
#pragma GCC unroll 6
    for (int i = 0; i < Rows; ++i) {
      for (int v = 0; v < Vecs; ++v) {
        _mm256_storeu_ps(c + i * ldc + 8 * v, _mm256_mul_ps(va, acc[i][v]));
      }
    }
  } else {
    const __m256 vb = _mm256_set1_ps(beta);
#pragma GCC unroll 6
    for (int i = 0; i < Rows; ++i) {
      for (int v = 0; v < Vecs; ++v) {
        float* out = c + i * ldc + 8 * v;
        _mm256_storeu_ps(out,
                         _mm256_fmadd_ps(va, acc[i][v], _mm256_mul_ps(vb, _mm256_loadu_ps(out))));
      }
    }
  }
}

// The AVX2 kernel for an edge tile of rows x cols.
MicroKernel<float> avx2_edge_kernel(std::int64_t rows, std::int64_t cols) {
  if (cols <= 8) {
    if (rows <= 2) return micro_kernel_avx2<2, 1>;
    return rows <= 4 ? micro_kernel_avx2<4, 1> : micro_kernel_avx2<6, 1>;
  }
  if (rows <= 2) return micro_kernel_avx2<2, 2>;
  return rows <= 4 ? micro_kernel_avx2<4, 2> : micro_kernel_avx2<6, 2>;
}

bool avx2_edge_fits(std::int64_t rows, std::int64_t cols) {
  return (rows == 2 || rows == 4 || rows == 6) && (cols == 8 || cols == 16);
}

// Eight consecutive source values as floats: a float's loaded, a bfloat16's
// widened exactly (its pattern shifted up 16 bits, engine/half.h's widening).
__attribute__((target("avx2,fma"))) inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
__attribute__((target("avx2,fma"))) inline __m256 load8(const bfloat16* p) {
  const __m128i patterns = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(patterns), 16));
}

// The transposing packer of a panel `Width` wide (A's MR rows without transpose, or
// B's NR rows with transpose): dst [kc][Width] <- the first `valid` of Width source
// rows `ld` apart, each contiguous along k, and zeros for the rest (an edge panel's
// padding; those rows are not read). Eight k at a time, the rows in groups of eight
// transposed in registers (a last group of fewer rows padded with zero rows, its
// columns stored as `Width % 8` floats by plain 4-, 2- and 1-lane stores, x86.h's
// store_first_lanes, not the masked store vmaskmovps, which AMD runs slowly:
// bench/results/vit_attention_cpu_6446012.md). Only data moves (a bfloat16 Src widened
// exactly as it is loaded): the bits are the generic loop's. AVX2 is enough for
// the AVX-512 kernel's panels too (every AVX-512 CPU has it); the 8 x 8 transpose,
// not the vector width, is the cost.
template <int Width, typename Src = float>
__attribute__((target("avx2,fma"))) void pack_rows_avx2(const Src* src, std::int64_t ld,
                                                        std::int64_t kc, float* dst,
                                                        std::int64_t valid) {
  // Eight source rows at a time along the whole panel: eight streams for the
  // prefetcher and the TLB, where 32 rows at once (a fully connected layer's rows
  // lie 12 KiB apart) were 32 pages per block. The panel itself stays in L1.
  const std::int64_t whole = kc / 8 * 8;
  for (int g = 0; g < Width; g += 8) {
    const int rows = std::min(8, Width - g);
    const std::int64_t loaded = std::clamp<std::int64_t>(valid - g, 0, rows);
    for (std::int64_t p = 0; p < whole; p += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        r[i] = i < loaded ? load8(src + (g + i) * ld + p) : _mm256_setzero_ps();
      }
      transpose8x8(r);
      for (int q = 0; q < 8; ++q) {
        // A panel narrower than eight (AVX2's A, six rows) stores whole vectors too,
        // but the group's last: the lanes past `rows` (zeros) land on the start of
        // the next k's row, which the next store writes. One store a k, not two.
        if (rows == 8 || (Width < 8 && q < 7)) {
          _mm256_storeu_ps(dst + (p + q) * Width + g, r[q]);
        } else {
          store_first_lanes(dst + (p + q) * Width + g, r[q], rows);
        }
      }
    }
  }
  for (std::int64_t p = whole; p < kc; ++p) {
    for (int i = 0; i < Width; ++i) {
      dst[p * Width + i] = i < valid ? static_cast<float>(src[i * ld + p]) : 0.0f;
    }
  }
}

// AVX-512 (Skylake-X, Ice Lake, Sapphire Rapids, Zen 4): 12x32 tile = 24 zmm
// accumulators of 32 registers.
constexpr int kAvx512Mr = 12, kAvx512Nr = 32;

// The first Rows rows and 16 * Vecs columns of the 12 x 32 tile, from panels
// packed for the full tile (a [kc][12], b [kc][32]). The full tile is <12, 2>; an
// edge tile (FashionNet's M = 64 = 5 x 12 + 4, N = 196 = 6 x 32 + 4) takes the
// smallest that covers it instead of computing padding. Every variant runs each
// output's k-loop in the same order with the same FMAs: the same bits.
template <int Rows, int Vecs>
__attribute__((target("avx512f"))) void micro_kernel_avx512(std::int64_t kc, const float* a,
                                                            const float* b, float* c,
                                                            std::int64_t ldc, float alpha,
                                                            float beta) {
  __m512 acc[Rows][Vecs];
#pragma GCC unroll 12
  for (int i = 0; i < Rows; ++i) {
    for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm512_setzero_ps();
  }
#pragma GCC unroll 2
  for (std::int64_t p = 0; p < kc; ++p) {
    __m512 bv[Vecs];
    for (int v = 0; v < Vecs; ++v) bv[v] = _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 12
    for (int i = 0; i < Rows; ++i) {
      const __m512 a_i = _mm512_set1_ps(a[i]);
      for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm512_fmadd_ps(a_i, bv[v], acc[i][v]);
    }
    a += kAvx512Mr;
    b += kAvx512Nr;
  }
  store_tile_avx512(acc, c, ldc, alpha, beta);
}

// The AVX-512 kernel for an edge tile of rows x cols.
MicroKernel<float> avx512_edge_kernel(std::int64_t rows, std::int64_t cols) {
  if (cols <= 16) {
    if (rows <= 4) return micro_kernel_avx512<4, 1>;
    return rows <= 8 ? micro_kernel_avx512<8, 1> : micro_kernel_avx512<12, 1>;
  }
  if (rows <= 4) return micro_kernel_avx512<4, 2>;
  return rows <= 8 ? micro_kernel_avx512<8, 2> : micro_kernel_avx512<12, 2>;
}

bool avx512_edge_fits(std::int64_t rows, std::int64_t cols) {
  return (rows == 4 || rows == 8 || rows == 12) && (cols == 16 || cols == 32);
}

#endif  // TL_CPU_X86

// ---------------------------------------------------------------------------
// Packing and the blocked driver.

// Block sizes in elements. kKc x NR floats of B (16 KiB at NR = 16) sit in L1
// while a kMc x kKc block of A (144 KiB) streams from L2; kNc bounds the packed B
// block (4 MiB at kKc = 256), which lives in L3.
constexpr std::int64_t kKc = kGemmKc;
constexpr std::int64_t kMc = 144;
constexpr std::int64_t kNc = 4096;
// Below this many multiply-adds a second thread costs more than it saves.
constexpr double kMinParallelWork = 48.0 * 48.0 * 48.0;

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

thread_local PackingBuffer t_packed_a;
thread_local PackingBuffer t_packed_b;

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

// ---------------------------------------------------------------------------
// Choosing the micro-kernel.

bool cpu_has(GemmIsa isa) {
#if TL_CPU_X86
  __builtin_cpu_init();  // safe to repeat; needed if we run before libgcc's constructors
#endif
  switch (isa) {
    case GemmIsa::Auto:
    case GemmIsa::Portable:
      return true;
#if TL_CPU_X86
    case GemmIsa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case GemmIsa::Avx512:
      return __builtin_cpu_supports("avx512f");
#endif
    default:
      return false;
  }
}

GemmIsa best_isa() {
  if (cpu_has(GemmIsa::Avx512)) return GemmIsa::Avx512;
  if (cpu_has(GemmIsa::Avx2)) return GemmIsa::Avx2;
  return GemmIsa::Portable;
}

const char* isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::Auto:
      return "Auto";
    case GemmIsa::Portable:
      return "Portable";
    case GemmIsa::Avx2:
      return "Avx2";
    case GemmIsa::Avx512:
      return "Avx512";
  }
  return "?";
}

// The environment may pin the kernel (TOWERLAB_GEMM_ISA=portable|avx2|avx512),
// e.g. to rule one out on a new machine; an unknown name, or an ISA this CPU lacks,
// warns once and leaves the automatic choice (engine/settings.h).
GemmIsa initial_isa() {
  const auto wanted =
      detail::environment_choice("TOWERLAB_GEMM_ISA", {"portable", "avx2", "avx512"});
  if (!wanted) return best_isa();
  for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
    std::string lower = isa_name(isa);
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (*wanted != lower) continue;
    if (cpu_has(isa)) return isa;
    detail::warn_about_environment("TOWERLAB_GEMM_ISA", *wanted, "is not supported by this CPU");
  }
  return best_isa();
}

std::atomic<GemmIsa>& selected_isa() {
  static std::atomic<GemmIsa> isa{initial_isa()};
  return isa;
}

std::atomic<Bf16GemmKernel> g_bf16_kernel{Bf16GemmKernel::Auto};

// Whether a bfloat16 product runs the vdpbf16ps kernel now: only on request (set
// only where the CPU has it). Auto widens, for the reason engine/settings.h gives.
bool bf16_dot_selected() {
  return g_bf16_kernel.load(std::memory_order_relaxed) == Bf16GemmKernel::Avx512Bf16;
}

// C = beta * C, for K == 0 (no products to add).
template <typename T>
void scale_c(std::int64_t m, std::int64_t n, T beta, T* c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j)
      c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
  }
}

}  // namespace

}  // namespace towerlab::cpu

namespace towerlab {

bool gemm_isa_supported(GemmIsa isa) {
  return cpu::cpu_has(isa);
}

void set_gemm_isa(GemmIsa isa) {
  TL_CHECK(cpu::cpu_has(isa), NotSupported,
           "set_gemm_isa: this CPU does not support the " << cpu::isa_name(isa) << " GEMM kernel");
  cpu::selected_isa().store(isa == GemmIsa::Auto ? cpu::best_isa() : isa);
}

GemmIsa gemm_isa() {
  return cpu::selected_isa().load();
}

bool bf16_gemm_kernel_supported(Bf16GemmKernel kernel) {
  return kernel != Bf16GemmKernel::Avx512Bf16 || cpu::cpu_has_avx512_bf16();
}

void set_bf16_gemm_kernel(Bf16GemmKernel kernel) {
  TL_CHECK(bf16_gemm_kernel_supported(kernel), NotSupported,
           "set_bf16_gemm_kernel: this CPU does not report avx512_bf16 (vdpbf16ps); Widen and "
           "Auto run everywhere");
  cpu::g_bf16_kernel.store(kernel);
}

Bf16GemmKernel bf16_gemm_kernel() {
  return cpu::g_bf16_kernel.load();
}

}  // namespace towerlab

namespace towerlab::cpu {

namespace {

#if TL_CPU_X86
// The vector packer of a panel `Width` wide from Src values: floats (moved without
// being looked at) and bfloat16 (widened as loaded); nullptr for float16, which the
// generic loops widen.
template <typename Src, int Width>
constexpr PanelPack<Src, float> rows_packer() {
  if constexpr (std::is_same_v<Src, float> || std::is_same_v<Src, bfloat16>) {
    return pack_rows_avx2<Width, Src>;
  } else {
    return nullptr;
  }
}
#endif

// fn.template operator()<MR, NR>(kernels) with the blocked float32 GEMM of `isa`,
// for source values Src: float, or a 16-bit type widened while packing.
template <typename Src = float, typename Fn>
void with_blocked(GemmIsa isa, const Fn& fn) {
  switch (isa) {
#if TL_CPU_X86
    case GemmIsa::Avx512:
      fn.template operator()<kAvx512Mr, kAvx512Nr>(Kernels<Src, float>{
          micro_kernel_avx512<kAvx512Mr, 2>, rows_packer<Src, kAvx512Mr>(),
          rows_packer<Src, kAvx512Nr>(), avx512_edge_kernel, nullptr, nullptr, avx512_edge_fits});
      return;
    case GemmIsa::Avx2:
      fn.template operator()<kAvx2Mr, kAvx2Nr>(Kernels<Src, float>{
          micro_kernel_avx2<kAvx2Mr, 2>, rows_packer<Src, kAvx2Mr>(), rows_packer<Src, kAvx2Nr>(),
          avx2_edge_kernel, nullptr, nullptr, avx2_edge_fits});
      return;
#endif
    default:
      fn.template operator()<kPortableMr, kPortableNr>(
          Kernels<Src, float>{micro_kernel_portable, nullptr, nullptr});
  }
}

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
    // 16-bit C goes through a float32 copy, rounded once at the end.
    std::vector<float> acc(static_cast<std::size_t>(m * n));  // [M,N]
    if (beta != 0.0f) {
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) acc[i * n + j] = static_cast<float>(c[i * ldc + j]);
      }
    }
    gemm_mixed<In, float>(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta,
                          acc.data(), n);
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = Out(acc[i * n + j]);
    }
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

#if TL_CPU_X86
void pack_32_rows_avx2(const float* src, std::int64_t ld, std::int64_t k, float* dst) {
  pack_rows_avx2<32>(src, ld, k, dst, 32);
}
#endif

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
