// CPU residual add + ReLU: the plain reference (kernels/reference/add_relu.h) on each
// thread's range in float32 and float64, the backward in vectorizable loops of the
// same arithmetic. In bfloat16 and float16 blocks of the operands are widened to
// float32 (kernels/cpu/convert16.h), added and clamped (or masked and added) there,
// and rounded once (the forward in registers where AVX-512 runs, without the
// blocks): the reference's bits; a 16-bit y beside float32 gradients (the
// precision policy's backward) has its blocks widened for the float32 loops.
// Elementwise, so the loops split over the thread pool at any boundary
// (kernels/cpu/parallel.h); the fusion saves a pass over memory each way and the
// backward's gradient of the sum, not arithmetic.
#include "kernels/cpu/add_relu.h"

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/convert16.h"
#include "kernels/cpu/dtype_dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/x86.h"
#include "kernels/reference/add_relu.h"
#include "kernels/reference/relu.h"

namespace towerlab::cpu {
namespace {

using reference::kIs16Bit;

#if TL_CPU_X86
// The forward below where AVX-512 runs, in registers: sixteen values of a and b
// widened as they are loaded, added, clamped and rounded as they are stored, the
// same float32 operations as the blocks' without their scratch passes (y may alias a
// or b: each vector is read before it is written).
template <typename T>
__attribute__((target("avx512f"))) void add_relu_forward_avx512(T* y, const T* a, const T* b,
                                                                std::int64_t n) {
  const __m512 zero = _mm512_setzero_ps();
  // sum < 0 ? 0 : sum: a NaN fails the test and stays.
  const auto relu = [zero](__m512 sum) __attribute__((target("avx512f"))) {
    return _mm512_mask_mov_ps(sum, _mm512_cmp_ps_mask(sum, zero, _CMP_LT_OQ), zero);
  };
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) store16(y + i, relu(_mm512_add_ps(load16(a + i), load16(b + i))));
  if (i < n) {
    const __m512 sum = _mm512_add_ps(load_first16(a + i, n - i), load_first16(b + i, n - i));
    store_first16(y + i, relu(sum), n - i);
  }
}
#endif

// y = round(max(a + b, 0)) with the sum in float32, block by block (y may alias a or
// b: each block is read whole before it is written), or in registers where AVX-512
// runs.
template <typename T>
void add_relu_forward_16bit(T* y, const T* a, const T* b, std::int64_t n) {
#if TL_CPU_X86
  if (avx512_selected()) {
    add_relu_forward_avx512(y, a, b, n);
    return;
  }
#endif
  for_each_block(n, [&](std::int64_t first, std::int64_t count) {
    float lhs[kConvertBlock], rhs[kConvertBlock];
    widen_16bit(lhs, a + first, count);
    widen_16bit(rhs, b + first, count);
    for (std::int64_t i = 0; i < count; ++i) {
      const float sum = lhs[i] + rhs[i];
      lhs[i] = sum < 0.0f ? 0.0f : sum;  // a NaN fails the test and stays
    }
    round_to_16bit(y + first, lhs, count);
  });
}

// grad = round(grad + g) or round(g) (exact), g = relu_mask(grad_y, y) in float32.
template <typename T>
void add_masked_16bit(T* grad, GradWrite write, const float* g, std::int64_t count) {
  float sum[kConvertBlock];
  if (write == GradWrite::Assign) {
    round_to_16bit(grad, g, count);
    return;
  }
  widen_16bit(sum, grad, count);
  for (std::int64_t i = 0; i < count; ++i) sum[i] += g[i];
  round_to_16bit(grad, sum, count);
}

// grad_a first, then grad_b, each block: with grad_a == grad_b, b's add reads a's write.
template <typename T>
void add_relu_backward_16bit(T* grad_a, GradWrite grad_a_write, T* grad_b, GradWrite grad_b_write,
                             const T* grad_y, const T* y, std::int64_t n) {
  for_each_block(n, [&](std::int64_t first, std::int64_t count) {
    float g[kConvertBlock], out[kConvertBlock];
    widen_16bit(g, grad_y + first, count);
    widen_16bit(out, y + first, count);
    for (std::int64_t i = 0; i < count; ++i) g[i] = reference::relu_mask(g[i], out[i]);
    if (grad_a != nullptr) add_masked_16bit(grad_a + first, grad_a_write, g, count);
    if (grad_b != nullptr) add_masked_16bit(grad_b + first, grad_b_write, g, count);
  });
}

// float32 and float64: grad (=, or +=) relu_mask(grad_y, y), one loop a write mode
// with no branch in it, which the compiler vectorizes (the reference's loop tests
// both gradients' modes at every element, and stays scalar).
template <typename T>
void add_masked(T* grad, GradWrite write, const T* grad_y, const T* y, std::int64_t n) {
  if (write == GradWrite::Assign) {
    for (std::int64_t i = 0; i < n; ++i) grad[i] = reference::relu_mask(grad_y[i], y[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) grad[i] += reference::relu_mask(grad_y[i], y[i]);
  }
}

// grad_a's block first, then grad_b's: with grad_a == grad_b, each element of b's
// add reads a's write, as in the reference. y of the gradients' type, or a 16-bit y
// beside float32 gradients, whose block is widened exactly first: the bits of the
// float32 call on the widened y without its copy.
template <typename T, typename Y>
void add_relu_backward_wide(T* grad_a, GradWrite grad_a_write, T* grad_b, GradWrite grad_b_write,
                            const T* grad_y, const Y* y, std::int64_t n) {
  for_each_block(n, [&](std::int64_t first, std::int64_t count) {
    const T* out = nullptr;  // [count]: y's block
    T widened[kIs16Bit<Y> ? kConvertBlock : 1];
    if constexpr (kIs16Bit<Y>) {
      widen_16bit(widened, y + first, count);
      out = widened;
    } else {
      out = y + first;
    }
    if (grad_a != nullptr) add_masked(grad_a + first, grad_a_write, grad_y + first, out, count);
    if (grad_b != nullptr) add_masked(grad_b + first, grad_b_write, grad_y + first, out, count);
  });
}

}  // namespace

void add_relu_forward(const Tensor& y, const Tensor& a, const Tensor& b) {
  with_any_dtype(y.dtype(), [&]<typename T>() {
    T* out = y.data<T>();        // [n]
    const T* lhs = a.data<T>();  // [n]
    const T* rhs = b.data<T>();  // [n]
    parallel_rows(y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
      if constexpr (kIs16Bit<T>) {
        add_relu_forward_16bit(out + lo, lhs + lo, rhs + lo, hi - lo);
      } else {
        reference::add_relu_forward(out + lo, lhs + lo, rhs + lo, hi - lo);
      }
    });
  });
}

void add_relu_backward(const AddReluBackward& args) {
  with_any_dtype(args.grad_y.dtype(), [&]<typename T>() {
    T* ga = args.grad_a.defined() ? args.grad_a.data<T>() : nullptr;  // [n] or none
    T* gb = args.grad_b.defined() ? args.grad_b.data<T>() : nullptr;  // [n] or none
    const T* gy = args.grad_y.data<T>();                              // [n]
    // y is of T, or 16-bit beside float32 gradients (kernels/add_relu.h).
    with_any_dtype(args.y.dtype(), [&]<typename Y>() {
      if constexpr (std::is_same_v<Y, T> || (kIs16Bit<Y> && std::is_same_v<T, float>)) {
        const Y* out = args.y.data<Y>();  // [n]
        parallel_rows(args.grad_y.numel(), 1, [&](std::int64_t lo, std::int64_t hi) {
          T* a = ga ? ga + lo : nullptr;
          T* b = gb ? gb + lo : nullptr;
          if constexpr (kIs16Bit<T>) {
            add_relu_backward_16bit(a, args.grad_a_write, b, args.grad_b_write, gy + lo, out + lo,
                                    hi - lo);
          } else {
            add_relu_backward_wide(a, args.grad_a_write, b, args.grad_b_write, gy + lo, out + lo,
                                   hi - lo);
          }
        });
      }
    });
  });
}

}  // namespace towerlab::cpu
