// Checks and backend dispatch for conv2d (kernels/conv2d.h).
#include "kernels/conv2d.h"

#include <string>

#include "kernels/bias.h"
#include "kernels/cast.h"
#include "kernels/checks.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cuda/conv2d.h"
#include "kernels/elementwise.h"
#include "kernels/slice_copy.h"

namespace towerlab {

namespace {

// "float32[32,1,3,3]" for a tensor, "[32,1,3,3]" for a bare shape.
std::string brief(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + t.shape_str();
}

// Works out the problem's sizes from the input and weight shapes, or throws.
// `x_desc` and `w_desc` describe the two operands in messages.
Conv2dShape make_shape(const Shape& x, const Shape& w, const Conv2dParams& p,
                       const std::string& x_desc, const std::string& w_desc) {
  TL_CHECK(x.size() == 4, ShapeError, "conv2d: input must be 4-D [N,C,H,W] but is " << x_desc);
  TL_CHECK(w.size() == 4, ShapeError, "conv2d: weight must be 4-D [K,C,R,S] but is " << w_desc);
  TL_CHECK(p.stride_h >= 1 && p.stride_w >= 1, InvalidArgument,
           "conv2d: stride must be positive, got " << p.stride_h << "x" << p.stride_w);
  TL_CHECK(p.dilation_h >= 1 && p.dilation_w >= 1, InvalidArgument,
           "conv2d: dilation must be positive, got " << p.dilation_h << "x" << p.dilation_w);
  TL_CHECK(p.pad_h >= 0 && p.pad_w >= 0, InvalidArgument,
           "conv2d: padding must not be negative, got " << p.pad_h << "x" << p.pad_w);
  TL_CHECK(p.groups >= 1, InvalidArgument, "conv2d: groups must be positive, got " << p.groups);
  // The CUDA kernels index with 32-bit integers.
  constexpr std::int64_t kLimit = std::int64_t{1} << 31;
  TL_CHECK(p.stride_h < kLimit && p.stride_w < kLimit && p.pad_h < kLimit && p.pad_w < kLimit &&
               p.dilation_h < kLimit && p.dilation_w < kLimit,
           InvalidArgument, "conv2d: stride, padding and dilation must be below 2^31");
  Conv2dShape s{x[0], x[1], x[2], x[3], w[0], w[2], w[3], 0, 0, p};
  const std::int64_t G = p.groups;
  TL_CHECK(x[1] % G == 0 && w[0] % G == 0, ShapeError,
           "conv2d: " << G << " groups do not divide the input's " << x[1]
                      << " channels and the weight's " << w[0] << " filters (input " << x_desc
                      << ", weight " << w_desc << ")");
  TL_CHECK(x[1] == w[1] * G, ShapeError,
           "conv2d: input has " << x[1] << " channels but weight expects " << w[1] * G
                                << (G > 1 ? " (" + std::to_string(w[1]) + " per group x " +
                                                std::to_string(G) + " groups)"
                                          : std::string())
                                << " (input " << x_desc << ", weight " << w_desc << ")");
  TL_CHECK(s.C >= 1 && s.R >= 1 && s.S >= 1, ShapeError,
           "conv2d: weight " << w_desc
                             << " must have at least one channel and a kernel of at least 1x1");
  const std::int64_t span_h = p.dilation_h * (s.R - 1) + 1;
  const std::int64_t span_w = p.dilation_w * (s.S - 1) + 1;
  const std::int64_t padded_h = s.H + 2 * p.pad_h, padded_w = s.W + 2 * p.pad_w;
  TL_CHECK(span_h <= padded_h && span_w <= padded_w, ShapeError,
           "conv2d: kernel " << s.R << "x" << s.S
                             << (p.dilation_h * p.dilation_w > 1
                                     ? " (dilated to " + std::to_string(span_h) + "x" +
                                           std::to_string(span_w) + ")"
                                     : std::string())
                             << " is larger than the padded input " << padded_h << "x" << padded_w
                             << " (input " << x_desc << ", padding " << p.pad_h << "x" << p.pad_w
                             << ")");
  s.P = (padded_h - span_h) / p.stride_h + 1;
  s.Q = (padded_w - span_w) / p.stride_w + 1;
  TL_CHECK(padded_h < kLimit && padded_w < kLimit, ShapeError,
           "conv2d: padded input " << padded_h << "x" << padded_w << " reaches 2^31");
  TL_CHECK(s.N * s.C * s.H * s.W < (std::int64_t{1} << 31) &&
               s.N * s.K * s.P * s.Q < (std::int64_t{1} << 31) &&
               s.K * w[1] * s.R * s.S < (std::int64_t{1} << 31),
           ShapeError,
           "conv2d: input " << x_desc << " with weight " << w_desc
                            << " has a tensor of 2^31 elements or more; split the batch");
  return s;
}

// x and weight: float32 or float64 (CPU), or the 16-bit operands check_16bit
// accepted for the tensor cores.
Conv2dShape checked_shape(const char* op, const Tensor& x, const Tensor& weight,
                          const Conv2dParams& params, const Stream& stream) {
  if (is_16bit(x.dtype())) {
    kernels::check_placed(op, stream, {{"x", &x}, {"weight", &weight}});
  } else {
    kernels::check_on_stream(op, stream, {{"x", &x}, {"weight", &weight}});
    if (stream.device().is_cuda()) kernels::check_float32(op, "x", x);
  }
  return make_shape(x.shape(), weight.shape(), params, brief(x), brief(weight));
}

// `t` (one of the op's tensors, named `name`) is on the stream, of x's dtype (or, beside
// 16-bit operands, float32 as check_16bit checked) and of `shape`.
void check_operand(const char* op, const char* name, const Tensor& t, const Shape& shape,
                   const Tensor& x, const Stream& stream) {
  if (!is_16bit(x.dtype())) {
    kernels::check_on_stream(op, stream, {{"x", &x}, {name, &t}});
  } else if (is_16bit(t.dtype())) {
    kernels::check_placed(op, stream, {{"x", &x}, {name, &t}});
  } else {
    kernels::check_on_stream(op, stream, {{name, &t}});
  }
  TL_CHECK(t.shape() == shape, ShapeError,
           op << ": " << name << " is " << brief(t) << " but should be " << to_string(shape)
              << " for input " << brief(x));
}

// The 16-bit operands of one call (kernels/conv2d.h, "Mixed precision"): every one
// of them of one 16-bit dtype (the first's), and every other tensor float32.
// Returns whether the call is a 16-bit one.
bool check_16bit(const char* op, std::initializer_list<kernels::NamedTensor> low,
                 std::initializer_list<kernels::NamedTensor> wide) {
  const DType dtype = low.begin()->second->dtype();
  bool any = false;
  for (const auto& [name, t] : low) any = any || (t->defined() && is_16bit(t->dtype()));
  if (!any) return false;
  for (const auto& [name, t] : low) {
    TL_CHECK(t->defined(), InvalidArgument, op << ": " << name << " is undefined");
    TL_CHECK(t->dtype() == dtype, NotSupported,
             op << ": " << name << " is " << brief(*t) << " but " << low.begin()->first << " is "
                << brief(*low.begin()->second)
                << "; the 16-bit operands must share one dtype (bfloat16 or float16)");
  }
  for (const auto& [name, t] : wide) {
    TL_CHECK(!t->defined() || t->dtype() == DType::Float32, NotSupported,
             op << ": " << name << " is " << brief(*t) << " but with " << dtype_name(dtype)
                << " operands the outputs, bias and gradients are float32");
  }
  return true;
}

// Whether a 16-bit call runs on the tensor cores (CUDA, one group: the implicit
// GEMM of kernels/cuda/conv2d_tc.cuh) rather than widened into float32 scratch.
bool on_tensor_cores(const Conv2dParams& params, const Stream& stream) {
  return stream.device().is_cuda() && params.groups == 1;
}

// Whether a G = 1 call whose operands are of `dtype` (16-bit ones that
// conv2d_multiplies_16bit takes as they are, the others widened already) multiplies
// in low precision: 16-bit operands (CUDA's tensor cores, the CPU's bfloat16 GEMM
// path), or float32 ones on CUDA's tensor cores under Float32Math::Tf32.
bool low_precision_call(DType dtype, Float32Math math, const Stream& stream) {
  return is_16bit(dtype) ||
         (dtype == DType::Float32 && math == Float32Math::Tf32 && stream.device().is_cuda());
}

// A 16-bit operand widened exactly into float32 scratch on the stream (undefined
// stays undefined).
Tensor widened(const Tensor& t, const Stream& stream) {
  return t.defined() ? cast(t, DType::Float32, stream) : t;
}

// Depthwise (kernels/conv2d.h, "Groups"): one group per input channel.
bool depthwise(const Conv2dShape& s) {
  return s.params.groups > 1 && s.params.groups == s.C;
}

// Channels [first, first + count) of t [N,*,H,W], copied into scratch [N,count,H,W].
Tensor channel_slice(const Tensor& t, std::int64_t first, std::int64_t count,
                     const Stream& stream) {
  Shape shape = t.shape();
  shape[1] = count;
  Tensor slice = Tensor::empty(shape, stream, t.dtype());
  slice_copy(slice, 0, t, first, count, 1, GradWrite::Assign, stream);
  return slice;
}

// Rows [g*rows, (g+1)*rows) of t (a view), or undefined when t is.
Tensor group_rows(const Tensor& t, std::int64_t g, std::int64_t rows) {
  return t.defined() ? t.slice(g * rows, (g + 1) * rows) : t;
}

// The G = 1 problem each group of s is.
Conv2dParams one_group(const Conv2dShape& s) {
  Conv2dParams params = s.params;
  params.groups = 1;
  return params;
}

// A grouped forward (not depthwise) as G convolutions on channel slices.
void grouped_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                     const Conv2dShape& s, const Stream& stream) {
  const std::int64_t G = s.params.groups, Cg = s.C / G, Kg = s.K / G;
  for (std::int64_t g = 0; g < G; ++g) {
    Tensor y_g = Tensor::empty({s.N, Kg, s.P, s.Q}, stream, y.dtype());  // [N,K/G,P,Q]
    conv2d_forward(y_g, channel_slice(x, g * Cg, Cg, stream), group_rows(weight, g, Kg),
                   group_rows(bias, g, Kg), one_group(s), stream);
    slice_copy(y, g * Kg, y_g, 0, Kg, 1, GradWrite::Assign, stream);
  }
}

// A grouped backward (not depthwise) as G backwards on channel slices: each group's
// grad_x is assigned into scratch and then copied or added into grad_x; the weight
// and bias gradients accumulate straight into their rows.
void grouped_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                      const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                      const Conv2dShape& s, const Stream& stream, GradWrite grad_x_write) {
  const std::int64_t G = s.params.groups, Cg = s.C / G, Kg = s.K / G;
  const Shape x_g_shape{s.N, Cg, s.H, s.W};
  for (std::int64_t g = 0; g < G; ++g) {
    // x is read for grad_weight only; otherwise a view of the right shape stands in.
    const Tensor x_g =
        grad_weight.defined() ? channel_slice(x, g * Cg, Cg, stream) : x.view(0, x_g_shape);
    const Tensor grad_x_g =
        grad_x.defined() ? Tensor::empty(x_g_shape, stream, grad_x.dtype()) : Tensor();
    conv2d_backward(grad_x_g, group_rows(grad_weight, g, Kg), group_rows(grad_bias, g, Kg),
                    channel_slice(grad_y, g * Kg, Kg, stream), x_g, group_rows(weight, g, Kg),
                    one_group(s), stream, GradWrite::Assign);
    if (grad_x.defined()) slice_copy(grad_x, g * Cg, grad_x_g, 0, Cg, 1, grad_x_write, stream);
  }
}

}  // namespace

Shape conv2d_output_shape(const Shape& input, const Shape& weight, const Conv2dParams& params) {
  const Conv2dShape s = make_shape(input, weight, params, to_string(input), to_string(weight));
  return {s.N, s.K, s.P, s.Q};
}

bool conv2d_multiplies_16bit(const Shape& /*input*/, const Shape& /*weight*/, DType dtype,
                             const Conv2dParams& params, const Stream& stream) {
  if (!is_16bit(dtype)) return false;
  if (stream.device().is_cuda()) return on_tensor_cores(params, stream);
  // The CPU's rule reads the dtype, the groups and the algorithm, no shape.
  return cpu::bf16_gemm_conv_chosen(dtype, params);
}

void conv2d_forward(const Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Conv2dParams& params, const Stream& stream, Float32Math math) {
  const char* op = "conv2d_forward";
  // With 16-bit operands y is float32, or their dtype: the float32 sums rounded once.
  const bool low = check_16bit(op, {{"x", &x}, {"weight", &weight}}, {{"bias", &bias}});
  const bool low_y = low && y.defined() && is_16bit(y.dtype());
  TL_CHECK(!low || !y.defined() || y.dtype() == DType::Float32 || y.dtype() == x.dtype(),
           NotSupported,
           op << ": y is " << brief(y) << " but with " << dtype_name(x.dtype())
              << " operands y is float32 or " << dtype_name(x.dtype()));
  if (low && stream.device().is_cpu() && params.groups == 1) {
    // The bfloat16 GEMM path where it runs, with y float32 or bfloat16; otherwise
    // a 16-bit y comes from the float32 algorithms on the widened operands, rounded
    // from the float32 sums as the kernel stores it (kernels/cpu/conv2d.cpp).
    const Conv2dShape s = checked_shape(op, x, weight, params, stream);
    const bool bf16_gemm = cpu::bf16_gemm_conv_chosen(x.dtype(), s.params);
    if (bf16_gemm || low_y) {
      check_operand(op, "y", y, {s.N, s.K, s.P, s.Q}, x, stream);
      if (bias.defined()) check_operand(op, "bias", bias, {s.K}, x, stream);
      if (y.numel() == 0) return;
      if (bf16_gemm) {
        cpu::conv2d_forward_bf16(y, x, weight, bias, s);
      } else {
        cpu::conv2d_forward(y, widened(x, stream), widened(weight, stream), bias, s);
      }
      return;
    }
  }
  if (low_y) {
    // Elsewhere (CUDA, grouped layers) the float32 y of the path below, cast once.
    Tensor sums = Tensor::empty(y.shape(), stream, DType::Float32);
    conv2d_forward(sums, x, weight, bias, params, stream, math);
    cast(y, sums, stream);
    return;
  }
  if (low && !on_tensor_cores(params, stream)) {
    conv2d_forward(y, widened(x, stream), widened(weight, stream), bias, params, stream);
    return;
  }
  const Conv2dShape s = checked_shape(op, x, weight, params, stream);
  check_operand(op, "y", y, {s.N, s.K, s.P, s.Q}, x, stream);
  if (bias.defined()) check_operand(op, "bias", bias, {s.K}, x, stream);
  if (y.numel() == 0) return;
  if (depthwise(s)) {
    TL_DISPATCH(stream, cpu::conv2d_depthwise_forward(y, x, weight, bias, s),
                cuda::conv2d_depthwise_forward(y, x, weight, bias, s, stream));
  } else if (s.params.groups > 1) {
    grouped_forward(y, x, weight, bias, s, stream);
  } else if (low_precision_call(x.dtype(), math, stream)) {
    TL_ON_CUDA(cuda::conv2d_tc_forward(y, x, weight, bias, s, stream));
  } else {
    TL_DISPATCH(stream, cpu::conv2d_forward(y, x, weight, bias, s),
                cuda::conv2d_forward(y, x, weight, bias, s, stream));
  }
}

void conv2d_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                     const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Conv2dParams& params, const Stream& stream, GradWrite grad_x_write,
                     Float32Math math) {
  const char* op = "conv2d_backward";
  const bool low =
      check_16bit(op, {{"grad_y", &grad_y}, {"x", &x}, {"weight", &weight}},
                  {{"grad_x", &grad_x}, {"grad_weight", &grad_weight}, {"grad_bias", &grad_bias}});
  if (low && !conv2d_multiplies_16bit(x.shape(), weight.shape(), x.dtype(), params, stream)) {
    // Widened to float32; x is read for grad_weight only, weight for grad_x only.
    conv2d_backward(
        grad_x, grad_weight, grad_bias, widened(grad_y, stream),
        grad_weight.defined() ? widened(x, stream) : Tensor::empty(x.shape(), stream),
        grad_x.defined() ? widened(weight, stream) : Tensor::empty(weight.shape(), stream), params,
        stream, grad_x_write);
    return;
  }
  const Conv2dShape s = checked_shape(op, x, weight, params, stream);
  check_operand(op, "grad_y", grad_y, {s.N, s.K, s.P, s.Q}, x, stream);
  if (grad_x.defined()) check_operand(op, "grad_x", grad_x, x.shape(), x, stream);
  if (grad_weight.defined())
    check_operand(op, "grad_weight", grad_weight, weight.shape(), x, stream);
  if (grad_bias.defined()) check_operand(op, "grad_bias", grad_bias, {s.K}, x, stream);
  const bool assign = grad_x.defined() && grad_x_write == GradWrite::Assign;
  // Nothing flows back from an empty output: every gradient gets += 0 (an assigned
  // grad_x, 0).
  if (grad_y.numel() == 0) {
    if (assign) fill(grad_x, 0.0, stream);
    return;
  }
  if (!grad_x.defined() && !grad_weight.defined() && !grad_bias.defined()) return;
  if (depthwise(s)) {
    if (grad_x.defined() || grad_weight.defined()) {
      TL_DISPATCH(
          stream,
          cpu::conv2d_depthwise_backward(grad_x, grad_weight, grad_y, x, weight, s, grad_x_write),
          cuda::conv2d_depthwise_backward(grad_x, grad_weight, grad_y, x, weight, s, grad_x_write,
                                          stream));
    }
    if (grad_bias.defined()) bias_add_backward(grad_bias, grad_y, stream);
    return;
  }
  if (s.params.groups > 1) {
    grouped_backward(grad_x, grad_weight, grad_bias, grad_y, x, weight, s, stream, grad_x_write);
    return;
  }
  // The CUDA kernels accumulate: an assigned grad_x is zeroed first on its stream.
  if (assign && stream.device().is_cuda()) fill(grad_x, 0.0, stream);
  if (low_precision_call(grad_y.dtype(), math, stream)) {
    // The tensor cores (CUDA) or the bfloat16 GEMM path (CPU) take the two GEMM
    // passes; the bias's gradient sums grad_y (widened to float32, as on the
    // widening path).
    if (grad_bias.defined())
      bias_add_backward(grad_bias, low ? widened(grad_y, stream) : grad_y, stream);
    TL_DISPATCH(stream,
                cpu::conv2d_backward_bf16(grad_x, grad_weight, grad_y, x, weight, s, grad_x_write),
                cuda::conv2d_tc_backward(grad_x, grad_weight, grad_y, x, weight, s, stream));
    return;
  }
  TL_DISPATCH(
      stream,
      cpu::conv2d_backward(grad_x, grad_weight, grad_bias, grad_y, x, weight, s, grad_x_write),
      cuda::conv2d_backward(grad_x, grad_weight, grad_bias, grad_y, x, weight, s, stream));
}

}  // namespace towerlab
