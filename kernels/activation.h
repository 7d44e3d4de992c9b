// Smooth and leaky activations, forward and backward: sigmoid, tanh, GELU (the
// erf form and the tanh approximation, PyTorch's approximate='none' | 'tanh'),
// SiLU and leaky ReLU. ReLU has its own family (kernels/relu.h), whose
// conventions these follow.
//   activation_forward(y, x, act)                   y[i] = f(x[i])      (y may alias x)
//   activation_backward(grad_x, grad_y, x, act)     grad_x[i] += grad_y[i] * f'(x[i])
// with, s(x) = 1 / (1 + exp(-x)) and Phi(x) = erfc(-x / sqrt 2) / 2:
//   Sigmoid    f = s(x)                        f' = s (1 - s)
//   Tanh       f = tanh(x)                     f' = 1 - tanh(x)^2
//   Gelu       f = x Phi(x)                    f' = Phi(x) + x exp(-x^2 / 2) / sqrt(2 pi)
//   GeluTanh   f = x s(2u),  u = sqrt(2/pi) (x + 0.044715 x^3)
//              (= x (1 + tanh u) / 2)          f' = s(2u) + 2 x s(2u) (1 - s(2u)) du/dx
//   SiLU       f = x s(x)                      f' = s + x s (1 - s)
//   LeakyReLU  f = x > 0 ? x : slope x         f' = x > 0 ? 1 : slope
// All tensors have one shape. The backward takes the forward's input x (sigmoid
// and tanh could use y, but one argument for every activation keeps one
// signature) and accumulates into grad_x, as every backward in towerlab does, or
// assigns it when asked (kernels/grad_write.h). grad_x may alias grad_y only
// with GradWrite::Assign (each element is read before it is written); it never
// aliases x.
//
// NaN rule, as ReLU's: a NaN input gives a NaN output and, for the smooth
// activations, a NaN gradient; leaky ReLU's backward takes the slope there
// (x > 0 fails), as PyTorch does. Infinities give the limits: s(+-inf) = 1, 0;
// tanh(+-inf) = +-1; GELU and SiLU(-inf) = 0, (+inf) = +inf; every derivative
// at +-inf is the limit (1 or 0, slope for leaky ReLU at -inf), never the NaN of
// inf * 0.
//
// Numerical stability. The sigmoid never evaluates exp of a positive argument
// (x >= 0: 1 / (1 + exp(-x)); x < 0: e / (1 + e), e = exp(x)), so no |x|
// overflows. 1 + erf(x / sqrt 2) and 1 + tanh(u) cancel to nothing in the
// negative tail (in float at x = -5, GELU would keep one digit), so GELU takes
// Phi from erfc (erfcf, std::erfc; on the CPU in float32, a fit of Phi's tail
// times exp(-x^2 / 2): kernels/cpu/float_lanes.h) and the tanh form from the
// sigmoid identity 1 + tanh u = 2 s(2u); both are accurate relative to the value
// for every x. x Phi(x), x s(x) and the derivative terms x pdf are taken as 0 where
// the other factor is 0 (the saturated tails), which is what makes the infinities
// come out as their limits. The references (kernels/reference/activation.h) are in
// double; the float32 results, CPU (float math in vector lanes on every ISA) and
// CUDA, match them within 1e-6 + 1e-5 |reference|; float64 on the CPU is the
// reference.
//
// Dtypes: float32, bfloat16 and float16 on every device, float64 on the CPU; all
// tensors of one dtype. A 16-bit input is read as its exact widening and each
// output (y, or grad_x with its old value added) is computed as above and rounded
// once to nearest even. On the CPU that is the reference's arithmetic (its float64
// loop, on blocks that vector code widens and rounds): double math, one rounding,
// its bits on every ISA. CUDA computes in float32, so a value that lies near a
// rounding boundary may round the other way: within one unit in the last place of
// the 16-bit type (at the reference's value) plus the float32 tolerance above.
//
// The leaky ReLU's slope must be finite (InvalidArgument); 0.01 by default, as in
// PyTorch.
#pragma once

#include "../engine/stream.h"
#include "../engine/tensor.h"
#include "grad_write.h"

namespace towerlab {

enum class ActivationKind { Sigmoid, Tanh, Gelu, GeluTanh, SiLU, LeakyReLU };

// Which GELU, by PyTorch's name for it: approximate='none' (erf) or 'tanh'.
enum class GeluApproximate { None, Tanh };

// An activation and its parameter (only leaky ReLU has one).
struct ActivationOp {
  ActivationKind kind = ActivationKind::Sigmoid;
  double negative_slope = 0.01;  // LeakyReLU only

  static ActivationOp sigmoid() { return {ActivationKind::Sigmoid}; }
  static ActivationOp tanh() { return {ActivationKind::Tanh}; }
  static ActivationOp gelu(GeluApproximate approximate = GeluApproximate::None) {
    return {approximate == GeluApproximate::Tanh ? ActivationKind::GeluTanh : ActivationKind::Gelu};
  }
  static ActivationOp silu() { return {ActivationKind::SiLU}; }
  static ActivationOp leaky_relu(double negative_slope = 0.01) {
    return {ActivationKind::LeakyReLU, negative_slope};
  }
};

// "sigmoid", "tanh", "gelu", "gelu_tanh", "silu", "leaky_relu": for messages and
// test names.
const char* activation_name(ActivationKind kind);

void activation_forward(const Tensor& y, const Tensor& x, const ActivationOp& act,
                        const Stream& stream);
void activation_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const ActivationOp& act, const Stream& stream,
                         GradWrite write = GradWrite::Accumulate);

}  // namespace towerlab
