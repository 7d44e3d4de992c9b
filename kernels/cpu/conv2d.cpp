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
// Where the CPU's bfloat16 GEMM runs vdpbf16ps, a bfloat16 layer multiplies its
// bfloat16 operands as they are, without widening: kernels/cpu/conv2d_bf16.cpp, on
// this file's lowering (kernels/cpu/conv2d_parts.h) or from padded planes.
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
#include "kernels/cpu/conv2d_parts.h"
#include "kernels/cpu/convert16.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/winograd.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

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

}  // namespace

void bf16_forward_by_gemm(float* y, const bfloat16* x, const bfloat16* w, const float* bias,
                          const Conv2dShape& s, bool accumulate) {
  forward_by_gemm(y, x, w, bias, s, accumulate);
}

void bf16_forward_by_gemm(bfloat16* y, const bfloat16* x, const bfloat16* w, const float* bias,
                          const Conv2dShape& s) {
  forward_by_gemm(y, x, w, bias, s);
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
