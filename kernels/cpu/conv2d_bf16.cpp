// conv2d on the CPU with bfloat16 operands where the bfloat16 GEMM runs vdpbf16ps
// (kernels/cpu/conv2d.h: bf16_gemm_conv_chosen), tested in tests/conv2d_bf16_cpu_test.cpp
// and tests/conv2d_planes_bf16_test.cpp against the plain reference
// (kernels/reference/conv2d.h), within kernels/conv2d.h's bound for exact products
// summed in float32. The float32 path and its lowering are kernels/cpu/conv2d.cpp's.
//
// A bfloat16 layer's three passes take conv2d.cpp's lowering with bfloat16 operands
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
// by the planes (kernels/cpu/conv2d_planes_bf16.h). At a stride of 2 the forward
// and the weight gradient read them, split into phases.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "engine/settings.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/conv2d_lowering.h"
#include "kernels/cpu/conv2d_parts.h"
#include "kernels/cpu/conv2d_planes_bf16.h"
#include "kernels/cpu/matmul.h"

namespace towerlab::cpu {

namespace {

// Whether a forward (or an input gradient) runs from padded planes: where the shape
// suits them (bf16_planes_apply) and every thread has images of its own. Each image
// is one thread's there; with fewer images than threads the lowering's GEMMs spread
// over them instead (as conv2d.cpp's implicit forward leaves them).
bool planes_forward_chosen(const Conv2dShape& s) {
  return bf16_planes_apply(s) && image_chunks(s.N) == thread_share();
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
    const bool planes = t && planes_forward_chosen(*t);
    if (planes || (t && transposed_lowering_pays(s))) {
      HostScratch<bfloat16> w_t(crs * s.K);  // [C, K*R*S]
      transposed_weight(w_t.get(), w, s);
      if (planes) {
        forward_by_planes(gx, gy, w_t.get(), nullptr, !assign, *t);
      } else {
        bf16_forward_by_gemm(gx, gy, w_t.get(), nullptr, *t, !assign);
      }
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
  if (planes_forward_chosen(s)) {
    if (y.dtype() == DType::BFloat16) {
      forward_by_planes(y.data<bfloat16>(), x.data<bfloat16>(), weight.data<bfloat16>(), b, false,
                        s);
    } else {
      forward_by_planes(y.data<float>(), x.data<bfloat16>(), weight.data<bfloat16>(), b, false, s);
    }
    return;
  }
  if (y.dtype() == DType::BFloat16) {
    bf16_forward_by_gemm(y.data<bfloat16>(), x.data<bfloat16>(), weight.data<bfloat16>(), b, s);
  } else {
    bf16_forward_by_gemm(y.data<float>(), x.data<bfloat16>(), weight.data<bfloat16>(), b, s, false);
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

}  // namespace towerlab::cpu
