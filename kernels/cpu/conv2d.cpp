// CPU conv2d, tested against the plain reference kernels/reference/conv2d.h as
// kernels/cuda/conv2d.cu is (contracts and dimension letters in kernels/conv2d.h).
//
// Each image is lowered to a matrix product ("im2col", kernels/cpu/conv2d_lowering.h):
// the patch matrix
//   col[(c,r,s), (p,q)] = x[n, c, h(p,r), w(q,s)]            [C*R*S, P*Q]
// turns the convolution into
//   forward          y[n]        = weight · col                [K,P*Q] = [K,CRS]·[CRS,P*Q]
//   backward-weight  grad_weight += grad_y[n] · colᵀ           [K,CRS] = [K,P*Q]·[P*Q,CRS]
//                    (per group of images, in whichever layout suits the GEMM)
//   backward-data    grad_col     = weightᵀ · grad_y[n]         [CRS,P*Q], then col2im adds
//                    each patch element back onto the input pixel it came from.
// A 1x1 kernel with stride 1 and no padding needs no lowering: col is x[n] itself.
// The weight (forward) and its transpose (backward-data), the same A for every image,
// are packed into the GEMM's panels once a call (PackedA, gemm_packed_a: gemm's bits),
// not once an image.
// On AVX2 and AVX-512, the weight gradient of 3x3 layers with stride 1 or 2 skips col altogether
// (kernels/cpu/conv2d_implicit.h), with the same sums in the same order; on AVX2 the forward
// of those layers, where Winograd does not take it, too.
//
// Where Winograd is chosen (kernels/cpu/winograd.h: 3x3, stride 1, at least 16
// channels in and out under Auto), it takes all three passes (the forward and
// input gradient in F(2x2,3x3) or F(4x4,3x3), by shape), the weight gradient per
// group of images into the same partials.
//
// One input channel with a 3x3 kernel, unit stride and dilation (a first layer on
// gray images, FashionNet's conv1) skips the lowering where the GEMM has its AVX2
// kernel: its forward and weight gradient run the direct convolution of
// kernels/cpu/conv2d_direct.h.
//
// A 16-bit layer's forward (bfloat16 or float16 y beside float32 operands, the
// dispatch having widened x and the weight) writes y straight from the float32
// sums, each rounded once as it is stored: by Winograd's output transform, by the
// direct kernels' stores, and on the im2col path from each image's float32 block
// just after its GEMM. The backward's outputs are float32.
//
// Where the CPU's bfloat16 GEMM runs vdpbf16ps (engine/settings.h), a bfloat16
// layer's three passes take the same lowering with bfloat16 operands instead
// (bf16_gemm_conv_chosen): im2col copies bfloat16 patches, and the products of
// bfloat16 values are summed in float32 by the vdpbf16ps GEMM (gemm_mixed), at twice
// the float32 FMAs' multiply-adds; nothing is widened. Its input gradient, where the
// stride is 1, is itself a forward convolution (transposed_shape): grad_y, padded by
// dilation*(R-1) - pad, convolved with the weight flipped in (r,s) and transposed in
// (k,c), which lowers grad_y with im2col and sums over K*R*S in one product, where
// weightᵀ · grad_y summed over K alone (a reduction of 16 in ResNet-20's first stage)
// and col2im scattered nine float32 taps a pixel
// (bench/results/conv2d_bf16_transposed_zen5_*.md).
// Under Auto, a stride-1 bfloat16 layer whose shape suits them (bf16_planes_apply)
// copies no patch at all: its forward, and its input gradient as that forward on
// grad_y, read the taps straight from zero-padded planes of channel pairs, and with
// 32 filters or fewer its weight gradient multiplies grad_y laid on the padded grid
// by the planes (kernels/cpu/conv2d_planes_bf16.h).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "engine/settings.h"
#include "engine/thread_pool.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/conv2d_direct.h"
#include "kernels/cpu/conv2d_implicit.h"
#include "kernels/cpu/conv2d_lowering.h"
#include "kernels/cpu/conv2d_planes_bf16.h"
#include "kernels/cpu/convert16.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/winograd.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

#if TL_CPU_X86
// out[k*rows + i .. +7] += in[(i .. i+7)*cols + k] for one 8 x 8 block (AVX2).
__attribute__((target("avx2,fma"))) void add_transposed_block(float* out, const float* in,
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
std::int64_t image_chunks(std::int64_t images) {
  const int threads = thread_share();
  return images >= threads ? threads : 1;
}

// The weight gradient sums over images, so its grouping fixes the order of that
// sum: images are summed in kWeightGroups fixed groups (fewer for a smaller batch),
// each into its own partial, and the partials in group order. The groups depend on
// the batch alone, never on the threads, so the result is the same bits for any
// thread count or tower share.
constexpr std::int64_t kWeightGroups = 16;

// The threads to run `chunks` chunks on: the caller's share (at most one a chunk)
// when `parallel`, else one.
int chunk_workers(std::int64_t chunks, bool parallel) {
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

// The type a product of T operands sums in: float for bfloat16 (the bfloat16 GEMM
// path), T itself otherwise.
template <typename T>
using SumOf = std::conditional_t<std::is_same_v<T, bfloat16>, float, T>;

// Images the bfloat16 forward lowers side by side into one product: enough that its
// columns (images x P*Q) fill the vdpbf16ps kernel's panels, which one image of a
// 7x7 or 14x14 layer does not (bench/results/conv2d_bf16_runs_zen5_*.md); each
// output's sum is the same either way. One image where the layer needs no lowering (col is x
// itself) and on the float32 and float64 paths, which keep one product an image.
constexpr std::int64_t kBatchColumns = 512;
template <typename T>
std::int64_t images_per_gemm(const Conv2dShape& s, bool lower) {
  if (!std::is_same_v<T, bfloat16> || !lower) return 1;
  const std::int64_t pq = s.P * s.Q;
  return std::max<std::int64_t>(1, (kBatchColumns + pq - 1) / pq);
}

// col [C*R*S, count * P*Q]: the patch matrices of `count` images of x side by side.
template <typename T>
void lower_images(T* col, const T* x, std::int64_t count, const Conv2dShape& s) {
  const std::int64_t pq = s.P * s.Q, chw = s.C * s.H * s.W;
  for (std::int64_t i = 0; i < count; ++i) im2col(col + i * pq, x + i * chw, s, count * pq);
}

// y = bias + weight · col, a product for each run of images_per_gemm images
// (im2col's product; col is x itself when nothing needs lowering), T the operands'
// type (float, double for the gradient checks, or bfloat16 on the bfloat16 GEMM
// path, whose sums and bias are float32), Out y's: the sums' type, or a 16-bit
// layer's bfloat16 or float16. The sums of a run of several images, or of a 16-bit
// layer, go through a block of scratch (in cache, the GEMM just wrote it) that is
// copied or rounded into each image's y before the next run.
// With `accumulate` (a float32 Out, no bias: the bfloat16 path's input gradient
// added onto grad_x) the sums are added onto y instead.
template <typename T, typename Out>
void forward_by_gemm(Out* out, const T* in, const T* w, const SumOf<T>* b, const Conv2dShape& s,
                     bool accumulate = false) {
  using Sum = SumOf<T>;
  constexpr bool rounded = !std::is_same_v<Sum, Out>;
  const std::int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, chw = s.C * s.H * s.W;
  const bool lower = needs_lowering(s);
  const std::int64_t batch = images_per_gemm<T>(s, lower);
  // The weight, the GEMM's A for every image, packed once for them all (float32; the
  // float64 gradient checks' gemm is plain loops, with nothing to pack).
  // Where it applies, the implicit forward (kernels/cpu/conv2d_implicit.h) skips col,
  // each thread on its own images (with fewer images than threads the GEMM, which
  // spreads over them, keeps them).
  bool implicit = false;
  if constexpr (std::is_same_v<T, float>) {
    implicit = implicit_forward_applies(s) && image_chunks(s.N) == thread_share();
  }
  std::optional<PackedA> packed_w;
  HostScratch<float> panels(implicit ? implicit_forward_panels(s) : 0);
  if constexpr (std::is_same_v<T, float>) {
    if (implicit) {
      implicit_forward_pack(w, panels.get(), s);
    } else {
      packed_w.emplace(w, crs, s.K, crs);
    }
  }
  auto per_chunk = [&](std::int64_t, std::int64_t first, std::int64_t last) {
    const std::int64_t most = std::min(batch, last - first);
    const bool staged = rounded || most > 1;
    HostScratch<T> col(lower && !implicit ? crs * most * pq : 0);  // [C*R*S, images*P*Q]
    HostScratch<float> implicit_scratch(implicit ? implicit_forward_scratch(s) : 0);
    HostScratch<Sum> sums(staged ? s.K * most * pq : 0);  // [K, images*P*Q]
    for (std::int64_t n = first; n < last; n += batch) {
      const std::int64_t count = std::min(batch, last - n), cols = count * pq;
      const T* patches = in + n * chw;
      if constexpr (std::is_same_v<T, float>) {
        if (implicit) {
          if constexpr (rounded) {
            implicit_forward(patches, panels.get(), b, sums.get(), implicit_scratch.get(), s);
            round_to_16bit(out + n * s.K * pq, sums.get(), s.K * pq);
          } else {
            implicit_forward(patches, panels.get(), b, out + n * s.K * pq, implicit_scratch.get(),
                             s);
          }
          continue;
        }
      }
      if (lower) {
        lower_images(col.get(), patches, count, s);
        patches = col.get();
      }
      Sum* y_n = sums.get();  // [K, cols]
      if constexpr (!rounded) {
        if (!staged) y_n = out + n * s.K * pq;
      }
      if (b != nullptr) {
        for (std::int64_t k = 0; k < s.K; ++k) {
          std::fill(y_n + k * cols, y_n + (k + 1) * cols, b[k]);
        }
      }
      const Sum beta = b != nullptr || (accumulate && !staged) ? Sum(1) : Sum(0);
      if constexpr (std::is_same_v<T, float>) {
        gemm_packed_a(*packed_w, false, cols, patches, cols, beta, y_n, cols);
      } else if constexpr (std::is_same_v<T, bfloat16>) {
        gemm_mixed<bfloat16, float>(false, false, s.K, cols, crs, 1.0f, w, crs, patches, cols, beta,
                                    y_n, cols);
      } else {
        gemm<T>(false, false, s.K, cols, crs, T(1), w, crs, patches, cols, beta, y_n, cols);
      }
      if (!staged) continue;
      for (std::int64_t i = 0; i < count; ++i) {
        for (std::int64_t k = 0; k < s.K; ++k) {
          const Sum* from = y_n + k * cols + i * pq;  // [P*Q]
          Out* to = out + ((n + i) * s.K + k) * pq;   // [P*Q]
          if constexpr (rounded) {
            round_to_16bit(to, from, pq);
          } else if (accumulate) {
            for (std::int64_t j = 0; j < pq; ++j) to[j] += from[j];
          } else {
            std::copy(from, from + pq, to);
          }
        }
      }
    }
  };
  for_image_chunks(s.N, image_chunks(s.N), true, per_chunk);
}

// The bfloat16 forward from padded planes (kernels/cpu/conv2d_planes_bf16.h): the
// weight packed once a call, each thread on its own images.
template <typename Out>
void forward_by_planes(Out* y, const bfloat16* x, const bfloat16* w, const float* b,
                       bool accumulate, const Conv2dShape& s) {
  HostScratch<std::uint32_t> packed(bf16_planes_packed_words(s));
  bf16_planes_pack(w, packed.get(), s);
  for_image_chunks(s.N, image_chunks(s.N), true,
                   [&](std::int64_t, std::int64_t first, std::int64_t last) {
                     if constexpr (std::is_same_v<Out, float>) {
                       bf16_planes_forward(y, x, packed.get(), b, accumulate, first, last, s);
                     } else {
                       bf16_planes_forward(y, x, packed.get(), b, first, last, s);
                     }
                   });
}

// The float32 forward into y of type Out: float, or a 16-bit layer's bfloat16 or
// float16, which Winograd's output transform, the direct kernels' stores and the
// GEMM path round once from the float32 sums (the bits of the float32 y cast).
template <typename Out>
void forward_float32(Out* out, const float* in, const float* w, const float* b,
                     const Conv2dShape& s) {
#if TL_CPU_X86
  if constexpr (std::is_same_v<Out, float16>) {
    // The eight-lane stores round float16 with F16C (kernels/cpu/convert16.h):
    // without it the sums go to float32 and then through the cast's own code.
    if (avx2_selected() && !avx512_selected() && !f16c_present()) {
      HostScratch<float> sums(s.N * s.K * s.P * s.Q);  // [N,K,P,Q]
      forward_float32(sums.get(), in, w, b, s);
      round_to_16bit(out, sums.get(), s.N * s.K * s.P * s.Q);
      return;
    }
  }
#endif
  if (winograd_chosen(s)) {
    winograd_forward(out, in, w, b, s);
    return;
  }
  if (direct_single_channel(s, DType::Float32)) {
    const std::int64_t pq = s.P * s.Q, chw = s.C * s.H * s.W;
    for_image_chunks(
        s.N, image_chunks(s.N), true, [&](std::int64_t, std::int64_t first, std::int64_t last) {
          direct_forward(out + first * s.K * pq, in + first * chw, w, b, last - first, s);
        });
    return;
  }
  forward_by_gemm(out, in, w, b, s);
}

// The input gradient of a stride-1 layer as a forward convolution: grad_x [N,C,H,W]
// is grad_y [N,K,P,Q], padded by dilation*(R-1) - pad on each side, convolved with
// the weight flipped in (r,s) and transposed in (k,c) (transposed_weight), with the
// layer's dilation. The shape of that convolution, or nothing where it does not
// apply: a stride other than 1, or a padding beyond dilation*(R-1), which would
// crop grad_y.
std::optional<Conv2dShape> transposed_shape(const Conv2dShape& s) {
  const Conv2dParams& p = s.params;
  const std::int64_t pad_h = p.dilation_h * (s.R - 1) - p.pad_h;
  const std::int64_t pad_w = p.dilation_w * (s.S - 1) - p.pad_w;
  if (p.stride_h != 1 || p.stride_w != 1 || pad_h < 0 || pad_w < 0) return std::nullopt;
  Conv2dParams t = p;
  t.pad_h = pad_h;
  t.pad_w = pad_w;
  return Conv2dShape{s.N, s.K, s.P, s.Q, s.C, s.R, s.S, s.H, s.W, t};
}

// Whether that convolution pays where it runs as a lowering (im2col of grad_y and
// the GEMM): not for a layer that needs no lowering, which multiplies grad_y as it
// is, nor with more channels out than in (K > C), where lowering grad_y copies
// K*R*S bfloat16 rows a pixel against col2im's C*R*S float32 ones and the product
// has only C rows; measured slower on FashionNet's 1 -> 32 and 32 -> 64 layers,
// faster on every K <= C layer of ResNet-20
// (bench/results/conv2d_bf16_transposed_zen5_*.md). From padded planes
// (bf16_planes_apply) nothing is copied, and it pays wherever those run.
bool transposed_lowering_pays(const Conv2dShape& s) {
  return needs_lowering(s) && s.K <= s.C;
}

// w_t [C, K*R*S]: w_t[c, (k,r,s)] = w[k, (c, R-1-r, S-1-s)].
void transposed_weight(bfloat16* w_t, const bfloat16* w, const Conv2dShape& s) {
  const std::int64_t rs = s.R * s.S;
  for (std::int64_t c = 0; c < s.C; ++c) {
    for (std::int64_t k = 0; k < s.K; ++k) {
      const bfloat16* from = w + (k * s.C + c) * rs;
      bfloat16* to = w_t + (c * s.K + k) * rs;
      for (std::int64_t i = 0; i < rs; ++i) to[i] = from[rs - 1 - i];
    }
  }
}

// grad_weight [K, C*R*S] += the weight gradient from padded planes
// (kernels/cpu/conv2d_planes_bf16.h), one partial a fixed group of images, added in
// group order.
void weight_grad_by_planes(float* gw, const bfloat16* gy, const bfloat16* x, const Conv2dShape& s) {
  const std::int64_t chunks = std::min(s.N, kWeightGroups), size = s.K * s.C * s.R * s.S;
  HostScratch<float> partials(chunks * size);  // [chunks, K, C*R*S]
  for_image_chunks(s.N, chunks, chunks >= thread_share(),
                   [&](std::int64_t chunk, std::int64_t first, std::int64_t last) {
                     bf16_planes_weight_grad(partials.get() + chunk * size, x, gy, first, last, s);
                   });
  for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
    const float* partial = partials.get() + chunk * size;
    for (std::int64_t i = 0; i < size; ++i) gw[i] += partial[i];
  }
}

// The bfloat16 GEMM path's backward, float32 gradients from bfloat16 grad_y, x and
// weight: grad_x as a forward convolution of grad_y where the stride is 1
// (transposed_shape), else grad_col = weightᵀ · grad_y[n] then col2im; the weight
// gradient's partials col · grad_y[n]ᵀ in the float32 path's fixed groups of images.
// Image by image: several images' columns in one weight-gradient product (as the
// forward lowers them) gained nothing measurable, their grad_y rows then needing a
// copy side by side (bench/results/conv2d_bf16_runs_zen5_*.md).
void backward_bf16(float* gx, float* gw, const bfloat16* gy, const bfloat16* in, const bfloat16* w,
                   const Conv2dShape& s, bool assign) {
  const std::int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, chw = s.C * s.H * s.W;
  const bool lower = needs_lowering(s);
  if (gx != nullptr) {
    const std::optional<Conv2dShape> t = transposed_shape(s);
    if (t && bf16_planes_apply(*t)) {
      HostScratch<bfloat16> w_t(crs * s.K);  // [C, K*R*S]
      transposed_weight(w_t.get(), w, s);
      forward_by_planes(gx, gy, w_t.get(), nullptr, !assign, *t);
      gx = nullptr;
    } else if (t && transposed_lowering_pays(s)) {
      HostScratch<bfloat16> w_t(crs * s.K);  // [C, K*R*S]
      transposed_weight(w_t.get(), w, s);
      forward_by_gemm(gx, gy, w_t.get(), static_cast<const float*>(nullptr), *t, !assign);
      gx = nullptr;
    }
  }
  if (gw != nullptr && bf16_planes_weight_grad_applies(s)) {
    weight_grad_by_planes(gw, gy, in, s);
    gw = nullptr;
  }
  if (gx == nullptr && gw == nullptr) return;
  const std::int64_t chunks = std::min(s.N, kWeightGroups);
  HostScratch<float> partials(gw != nullptr ? chunks * crs * s.K : 0);  // [chunks, CRS, K]
  auto per_group = [&](std::int64_t chunk, std::int64_t first, std::int64_t last) {
    HostScratch<float> grad_col(gx != nullptr && lower ? crs * pq : 0);  // [C*R*S, P*Q]
    HostScratch<bfloat16> col(gw != nullptr && lower ? crs * pq : 0);    // [C*R*S, P*Q]
    float* sum = gw != nullptr ? partials.get() + chunk * crs * s.K : nullptr;
    for (std::int64_t n = first; n < last; ++n) {
      const bfloat16* gy_n = gy + n * s.K * pq;  // [K, P*Q]
      if (gx != nullptr) {
        float* gx_n = gx + n * chw;
        if (!lower) {
          gemm_mixed<bfloat16, float>(true, false, crs, pq, s.K, 1.0f, w, crs, gy_n, pq,
                                      assign ? 0.0f : 1.0f, gx_n, pq);
        } else {
          gemm_mixed<bfloat16, float>(true, false, crs, pq, s.K, 1.0f, w, crs, gy_n, pq, 0.0f,
                                      grad_col.get(), pq);
          col2im_add(gx_n, grad_col.get(), s, assign);
        }
      }
      if (sum != nullptr) {
        const bfloat16* patches = in + n * chw;
        if (lower) {
          im2col(col.get(), patches, s, pq);
          patches = col.get();
        }
        gemm_mixed<bfloat16, float>(false, true, crs, s.K, pq, 1.0f, patches, pq, gy_n, pq,
                                    n == first ? 0.0f : 1.0f, sum, s.K);
      }
    }
  };
  for_image_chunks(s.N, chunks, chunks >= thread_share(), per_group);
  if (gw != nullptr) {
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
      add_transposed(gw, partials.get() + chunk * crs * s.K, crs, s.K);  // [C*R*S, K]
    }
  }
}

}  // namespace

bool bf16_gemm_conv_chosen(DType dtype, const Conv2dParams& params) {
  if (dtype != DType::BFloat16 || params.groups != 1 || !bf16_gemm_runs_vdpbf16ps()) {
    return false;
  }
  // Auto and Im2col: every layer with one group. Measured in whole training steps on
  // the Zen 5, this lowering beats the widened float32 paths on every layer of
  // FashionNet and ResNet-20, the 3x3 layers Winograd F(4x4) takes included: the
  // widening of x and the weight, the rounding of a bfloat16 y and the backward's
  // round_through of grad_y cost the widened path more than Winograd's fewer
  // multiplications gain it (bench/results/precision_cpu_zen5_*.md). A forced
  // Winograd keeps the float32 algorithms on widened operands.
  return conv2d_algorithm() != Conv2dAlgorithm::Winograd;
}

void conv2d_forward_bf16(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Conv2dShape& s) {
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  if (bf16_planes_apply(s)) {
    if (y.dtype() == DType::BFloat16) {
      forward_by_planes(y.data<bfloat16>(), x.data<bfloat16>(), weight.data<bfloat16>(), b, false,
                        s);
    } else {
      forward_by_planes(y.data<float>(), x.data<bfloat16>(), weight.data<bfloat16>(), b, false, s);
    }
    return;
  }
  if (y.dtype() == DType::BFloat16) {
    forward_by_gemm(y.data<bfloat16>(), x.data<bfloat16>(), weight.data<bfloat16>(), b, s);
  } else {
    forward_by_gemm(y.data<float>(), x.data<bfloat16>(), weight.data<bfloat16>(), b, s);
  }
}

void conv2d_backward_bf16(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_y,
                          const Tensor& x, const Tensor& weight, const Conv2dShape& s,
                          GradWrite grad_x_write) {
  backward_bf16(grad_x.defined() ? grad_x.data<float>() : nullptr,
                grad_weight.defined() ? grad_weight.data<float>() : nullptr,
                grad_y.data<bfloat16>(), x.data<bfloat16>(), weight.data<bfloat16>(), s,
                grad_x.defined() && grad_x_write == GradWrite::Assign);
}

void conv2d_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Conv2dShape& s) {
  if (x.dtype() == DType::Float64) {
    forward_by_gemm(y.data<double>(), x.data<double>(), weight.data<double>(),
                    bias.defined() ? bias.data<double>() : nullptr, s);
    return;
  }
  const float* in = x.data<float>();                               // [N,C,H,W]
  const float* w = weight.data<float>();                           // [K, C*R*S]
  const float* b = bias.defined() ? bias.data<float>() : nullptr;  // [K]
  switch (y.dtype()) {                                             // [N,K,P,Q]
    case DType::BFloat16:
      forward_float32(y.data<bfloat16>(), in, w, b, s);
      return;
    case DType::Float16:
      forward_float32(y.data<float16>(), in, w, b, s);
      return;
    default:
      forward_float32(y.data<float>(), in, w, b, s);
  }
}

void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                     const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Conv2dShape& s, GradWrite grad_x_write) {
  // An assigned grad_x is never read: each image's is written whole by Winograd's
  // output transform, by the GEMM (beta 0) or by col2im onto zeros, as accumulating
  // onto a zeroed grad_x would.
  const bool assign = grad_x.defined() && grad_x_write == GradWrite::Assign;
  // Winograd takes the input gradient where chosen, and the weight gradient below.
  const bool winograd = grad_y.dtype() == DType::Float32 && winograd_chosen(s);
  if (winograd && grad_x.defined()) {
    winograd_backward_data(grad_x.data<float>(), grad_y.data<float>(), weight.data<float>(), s,
                           !assign);
  }
  with_dtype(grad_y.dtype(), [&]<typename T>() {
    const T* gy = grad_y.data<T>();  // [N,K,P,Q]
    const T* in = x.data<T>();       // [N,C,H,W]
    const T* w = weight.data<T>();   // [K, C*R*S]
    const std::int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, chw = s.C * s.H * s.W;

    if (grad_bias.defined()) {
      T* gb = grad_bias.data<T>();  // [K]
      for (std::int64_t k = 0; k < s.K; ++k) {
        double total = 0;  // float32 sums of 10^5 terms would lose digits
        for (std::int64_t n = 0; n < s.N; ++n) {
          const T* plane = gy + (n * s.K + k) * pq;  // [P*Q]
          for (std::int64_t i = 0; i < pq; ++i) total += plane[i];
        }
        gb[k] += static_cast<T>(total);
      }
    }
    // The weight gradient sums over images, so its groups (kWeightGroups, each
    // summing into its own partial, added to grad_weight in group order) fix the
    // order of that sum. Each image's input gradient is its own product,
    // whatever the groups, so the same groups serve it. With fewer groups than
    // threads, the groups run one after another and each GEMM spreads over the
    // threads instead. Every path writes the partial transposed, [C*R*S, K]: with few
    // taps (C*R*S = 9 in a first layer) the GEMM runs far better with them as rows
    // than as a 9-wide column panel, and add_transposed adds it to grad_weight
    // through register transposes.
    const std::int64_t chunks = std::min(s.N, kWeightGroups);
    const bool direct = grad_weight.defined() && direct_single_channel(s, grad_y.dtype());
    const bool weight_by_winograd = grad_weight.defined() && !direct && winograd;
    const bool weight_by_gemm = grad_weight.defined() && !direct && !winograd;
    const bool data_by_gemm = grad_x.defined() && !winograd;
    // The weight gradient of 3x3 layers of stride 1 or 2 where Winograd is not chosen, on
    // AVX2 and AVX-512: the implicit GEMM (kernels/cpu/conv2d_implicit.h), the
    // GEMM's bits without im2col.
    const bool implicit =
        weight_by_gemm && std::is_same_v<T, float> && implicit_weight_grad_applies(s);
    HostScratch<T> partials(grad_weight.defined() ? chunks * crs * s.K : 0);  // [chunks, CRS, K]
    if constexpr (std::is_same_v<T, float>) {
      if (direct) {
        for_image_chunks(s.N, chunks, chunks >= thread_share(),
                         [&](std::int64_t chunk, std::int64_t first, std::int64_t last) {
                           direct_weight_grad(partials.get() + chunk * crs * s.K, in + first * chw,
                                              gy + first * s.K * pq, last - first, s);
                         });
      }
      if (weight_by_winograd) {
        // Each thread's workspace comes from here, the caller, before the loop: the
        // same allocations every step whichever threads run the groups, which the
        // caching allocator then serves from its blocks (allocated by the threads
        // themselves, two at once or one after the other as they happened to run,
        // a steady step could need a new segment).
        const int workers = chunk_workers(chunks, chunks >= thread_share());
        const std::int64_t each = winograd_weight_grad_scratch(s);
        HostScratch<float> workspaces(workers * each);
        for_worker_chunks(
            s.N, chunks, workers,
            [&](int worker, std::int64_t chunk, std::int64_t first, std::int64_t last) {
              winograd_weight_grad(partials.get() + chunk * crs * s.K, in + first * chw,
                                   gy + first * s.K * pq, last - first, s,
                                   workspaces.get() + worker * each);
            });
      }
    }
    if (weight_by_gemm || data_by_gemm) {
      // Both gradients in one pass over each group's images, col reused.
      const bool lower = needs_lowering(s);
      // grad_col = weightᵀ · grad_y[n]: weightᵀ [C*R*S, K], the GEMM's A for every
      // image, packed once for them all (float32, as in the forward).
      std::optional<PackedA> packed_wt;
      if constexpr (std::is_same_v<T, float>) {
        if (data_by_gemm) packed_wt.emplace(w, crs, crs, s.K, true);
      }
      auto data_gemm = [&](const T* gy_n, T beta, T* out) {  // out [C*R*S, P*Q]
        if constexpr (std::is_same_v<T, float>) {
          gemm_packed_a(*packed_wt, false, pq, gy_n, pq, beta, out, pq);
        } else {
          gemm<T>(true, false, crs, pq, s.K, T(1), w, crs, gy_n, pq, beta, out, pq);
        }
      };
      auto per_group = [&](std::int64_t chunk, std::int64_t first, std::int64_t last) {
        // [C*R*S, P*Q], patches or their gradient
        HostScratch<T> col(lower && (data_by_gemm || !implicit) ? crs * pq : 0);
        HostScratch<float> implicit_scratch(implicit ? implicit_weight_grad_scratch(s) : 0);
        T* sum = weight_by_gemm ? partials.get() + chunk * crs * s.K : nullptr;
        for (std::int64_t n = first; n < last; ++n) {
          const T* gy_n = gy + n * s.K * pq;  // [K, P*Q]
          // The input gradient first: its GEMM reads grad_y[n] row by row, which
          // the prefetcher follows, and leaves it in L2 for the weight gradient's
          // packer, which reads it K rows at a time.
          if (data_by_gemm) {
            T* gx_n = grad_x.data<T>() + n * chw;
            if (!lower) {  // grad_x[n] is the patch matrix's gradient itself: accumulate in place
              data_gemm(gy_n, assign ? T(0) : T(1), gx_n);
            } else {
              data_gemm(gy_n, T(0), col.get());
              col2im_add(gx_n, col.get(), s, assign);
            }
          }
          if (weight_by_gemm) {
            const T* patches = in + n * chw;
            if constexpr (std::is_same_v<T, float>) {
              if (implicit) {
                implicit_weight_grad(patches, gy_n, sum, n == first, implicit_scratch.get(), s);
                continue;
              }
            }
            if (lower) {
              im2col(col.get(), patches, s, pq);
              patches = col.get();
            }
            gemm<T>(false, true, crs, s.K, pq, T(1), patches, pq, gy_n, pq,
                    n == first ? T(0) : T(1), sum, s.K);
          }
        }
      };
      for_image_chunks(s.N, chunks, chunks >= thread_share(), per_group);
    }
    if (grad_weight.defined()) {
      T* gw = grad_weight.data<T>();  // [K, C*R*S]
      for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
        add_transposed(gw, partials.get() + chunk * crs * s.K, crs, s.K);  // [C*R*S, K]
      }
    }
  });
}

}  // namespace towerlab::cpu
