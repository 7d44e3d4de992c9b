// The pieces of the CPU's conv2d that kernels/cpu/conv2d.cpp (float32, float64, the
// widened 16-bit layers) and kernels/cpu/conv2d_bf16.cpp (the bfloat16 path on
// vdpbf16ps) share (internal): how a pass spreads images over the threads, the fixed
// groups of the weight gradient's sum, adding a transposed partial, and the lowering's
// forward on bfloat16 operands.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "engine/half.h"
#include "engine/thread_pool.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

#if TL_CPU_X86
// out[k*rows + i .. +7] += in[(i .. i+7)*cols + k] for one 8 x 8 block (AVX2).
__attribute__((target("avx2,fma"))) inline void add_transposed_block(float* out, const float* in,
                                                                     std::int64_t rows,
                                                                     std::int64_t cols) {
  __m256 r[8];
  for (int a = 0; a < 8; ++a) r[a] = _mm256_loadu_ps(in + a * cols);
  transpose8x8(r);
  for (int b = 0; b < 8; ++b) {
    _mm256_storeu_ps(out + b * rows, _mm256_add_ps(_mm256_loadu_ps(out + b * rows), r[b]));
  }
}
#endif

// out [cols, rows] += inᵀ, in [rows, cols]: a weight gradient's partial in the
// layout [C*R*S, K] added to grad_weight [K, C*R*S], element by element (the same
// adds in any blocking), eight by eight through a register transpose where the
// GEMM has AVX2: the strided loop was the whole cost of the partials' reduction.
template <typename T>
void add_transposed(T* out, const T* in, std::int64_t rows, std::int64_t cols) {
  std::int64_t i0 = 0, k0 = 0;
#if TL_CPU_X86
  if constexpr (std::is_same_v<T, float>) {
    if (avx2_selected()) {
      for (; i0 + 8 <= rows; i0 += 8) {
        for (k0 = 0; k0 + 8 <= cols; k0 += 8) {
          add_transposed_block(out + k0 * rows + i0, in + i0 * cols + k0, rows, cols);
        }
        for (std::int64_t k = k0; k < cols; ++k) {  // the last columns
          for (std::int64_t i = i0; i < i0 + 8; ++i) out[k * rows + i] += in[i * cols + k];
        }
      }
    }
  }
#endif
  for (std::int64_t k = 0; k < cols; ++k) {  // the last rows (all of them without AVX2)
    for (std::int64_t i = i0; i < rows; ++i) out[k * rows + i] += in[i * cols + k];
  }
}

// How many contiguous chunks of images to spread over the caller's threads. With
// at least as many images as threads, each thread lowers and multiplies its own
// images (its GEMMs then run inline on that thread: small per-image products
// parallelize badly); with fewer, one chunk walks the images and each GEMM spreads
// over the threads itself. Only loops whose images write disjoint outputs use it:
// their results do not depend on the chunks.
inline std::int64_t image_chunks(std::int64_t images) {
  const int threads = thread_share();
  return images >= threads ? threads : 1;
}

// The weight gradient sums over images, so its grouping fixes the order of that
// sum: images are summed in kWeightGroups fixed groups (fewer for a smaller batch),
// each into its own partial, and the partials in group order. The groups depend on
// the batch alone, never on the threads, so the result is the same bits for any
// thread count or tower share.
inline constexpr std::int64_t kWeightGroups = 16;

// The threads to run `chunks` chunks on: the caller's share (at most one a chunk)
// when `parallel`, else one.
inline int chunk_workers(std::int64_t chunks, bool parallel) {
  return parallel ? static_cast<int>(std::min<std::int64_t>(chunks, thread_share())) : 1;
}

// Runs body(worker, chunk, first_image, end_image) for each of `chunks` even chunks
// of the images, split into `workers` runs of chunks that may run at once: worker w
// runs its run of chunks on one thread, so the caller can allocate a workspace for
// each worker before the loop (the count it passes here, not a thread count read
// again, which may have grown meanwhile when towers lend each other cores).
template <typename Body>
void for_worker_chunks(std::int64_t images, std::int64_t chunks, int workers, const Body& body) {
  auto run = [&](std::int64_t first_worker, std::int64_t end_worker) {
    for (std::int64_t w = first_worker; w < end_worker; ++w) {
      for (std::int64_t chunk = w * chunks / workers; chunk < (w + 1) * chunks / workers; ++chunk) {
        body(static_cast<int>(w), chunk, chunk * images / chunks, (chunk + 1) * images / chunks);
      }
    }
  };
  if (workers == 1) {
    run(0, 1);
  } else {
    parallel_for(0, workers, run);
  }
}

// Runs body(chunk, first_image, end_image) for each of `chunks` even chunks of the
// images, in parallel when `parallel`.
template <typename Body>
void for_image_chunks(std::int64_t images, std::int64_t chunks, bool parallel, const Body& body) {
  for_worker_chunks(images, chunks, chunk_workers(chunks, parallel),
                    [&](int, std::int64_t chunk, std::int64_t first, std::int64_t last) {
                      body(chunk, first, last);
                    });
}

// The lowering's forward on bfloat16 operands (conv2d.cpp's forward_by_gemm: im2col
// of bfloat16 patches, the vdpbf16ps GEMM, several images a product where the output
// is small): y = bias (may be null) + the convolution, float32 sums or a bfloat16 y
// rounded once from them; with `accumulate` (float32 y, bias null) added onto y.
void bf16_forward_by_gemm(float* y, const bfloat16* x, const bfloat16* w, const float* bias,
                          const Conv2dShape& s, bool accumulate);
void bf16_forward_by_gemm(bfloat16* y, const bfloat16* x, const bfloat16* w, const float* bias,
                          const Conv2dShape& s);

}  // namespace towerlab::cpu
