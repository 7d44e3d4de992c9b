// Winograd convolution on the CPU (Lavin & Gray, "Fast Algorithms for Convolutional
// Neural Networks", 2015): the float32 forward and backward-data of conv2d for 3x3
// kernels, stride 1, dilation 1, padding 0 or 1, in F(2x2, 3x3) (below) or, for
// layers of 32 or more channels each side, F(4x4, 3x3) (kernels/cpu/winograd4.cpp:
// 4x4 output tiles from 6x6 input, 36 products per tile and channel pair, 2.25 an
// output pixel against 4 here); and the weight gradient in F(3x3, 2x2) (internal:
// the contract is kernels/conv2d.h's, the dispatch kernels/cpu/conv2d.cpp's).
//
// Each 2x2 block of output pixels (a tile) needs a 4x4 block of input; with
//   Bᵀ = [1  0 -1  0]    G = [1    0    0]    Aᵀ = [1  1  1  0]
//        [0  1  1  0]        [1/2  1/2  1/2]        [0  1 -1 -1]
//        [0 -1  1  0]        [1/2 -1/2  1/2]
//        [0  1  0 -1]        [0    0    1]
// the tile of y[n,k] is Aᵀ [ sum_c (G g[k,c] Gᵀ) ⊙ (Bᵀ d[n,c] Bᵀᵀ) ] A, where g is a
// 3x3 kernel and d the tile's 4x4 input. Each of the 16 elements e of the
// elementwise product sums over c independently, so a block of tiles becomes 16
// matrix products
//   M[e] = U[e] · V[e]      [K, tiles] = [K, C] · [C, tiles]
// with U = G g Gᵀ (the weight transform) and V = Bᵀ d B (the input transform): 16
// multiplications per tile and channel pair instead of im2col's 36.
//
// Backward-data is the same algorithm: grad_x is the correlation of grad_y (padded
// by 2 - pad) with the kernel turned 180 degrees, input and output channels swapped.
// The weight gradient is F(3x3, 2x2), the same input transform against G₂ dy G₂ᵀ of
// each 2x2 tile of grad_y, 16 products reducing over the tiles, [C, K] = [C, tiles] ·
// [tiles, K], then A₂ᵀ . A₂ to 3x3 (kernels/cpu/winograd_weight_grad.cpp).
//
// Numerics: the transforms add and subtract up to 16 inputs with weights of 1 and
// 1/2 before the products, so a result's rounding error is bounded by the sum of
// the magnitudes of its terms, sum |w||x| (sum |grad_y||x| for the weight gradient),
// rather than by the result: in the tests (tests/conv2d_cpu_paths_test.cpp) under 5
// units of float32 rounding of that sum, im2col's under 4; F(4x4, 3x3)'s transforms
// weigh inputs by up to 5 and 8 and kernels by down to 1/24, and its results stay
// under 64 units (tests/conv2d_winograd4_cpu_test.cpp). The tile blocks depend on
// the shape alone and each output pixel is written by one tile, so the result is the
// same bits for any thread count; the weight gradient sums a caller's group of
// images in blocks fixed by the shape too.
#pragma once

#include <cstdint>

#include "kernels/cpu/conv2d.h"

namespace towerlab::cpu {

// Whether Winograd can compute `s`: 3x3, stride 1, dilation 1, padding 0 or 1.
bool winograd_applies(const Conv2dShape& s);

// Whether conv2d's float32 passes take Winograd for `s` under the current
// Conv2dAlgorithm: the forward, backward-data and weight gradient choose alike.
bool winograd_chosen(const Conv2dShape& s);

// Which tile Winograd's forward and backward-data use (the weight gradient is
// F(3x3, 2x2) either way): Auto takes F(4x4, 3x3) where both channel counts are at
// least kMinF4x4Channels (winograd_choice.cpp says why), F(2x2, 3x3) elsewhere; the
// others force one, for tests and benchmarks. A function of the shape alone, never
// of the ISA. ScopedWinogradTile sets it while it lives (any thread sees it); the
// environment may pin it for a whole program (TOWERLAB_WINOGRAD_TILE=auto|f2x2|f4x4).
enum class WinogradTile { Auto, F2x2, F4x4 };
class ScopedWinogradTile {
 public:
  explicit ScopedWinogradTile(WinogradTile tile);
  ~ScopedWinogradTile();
  ScopedWinogradTile(const ScopedWinogradTile&) = delete;
  ScopedWinogradTile& operator=(const ScopedWinogradTile&) = delete;

 private:
  WinogradTile previous_;
};
// Whether the forward and backward-data of `s` (which Winograd computes) take
// F(4x4, 3x3).
bool f4x4_chosen(const Conv2dShape& s);

// y [N,K,P,Q] = bias + conv2d(x [N,C,H,W], weight [K,C,3,3]): ASSIGNS y. bias [K]
// may be null. Out is float, or bfloat16 or float16 for a 16-bit layer's output:
// each value rounded once, to nearest even, as the output transform stores it (the
// bits of the float32 y cast). A float16 Out needs F16C beside AVX2
// (kernels/cpu/conv2d.cpp asks).
template <typename Out>
void winograd_forward(Out* y, const float* x, const float* weight, const float* bias,
                      const Conv2dShape& s);

// grad_x [N,C,H,W] += the input gradient of conv2d for grad_y [N,K,P,Q]: ACCUMULATES,
// or with accumulate false ASSIGNS it (grad_x not read; the bits of adding onto zeros).
void winograd_backward_data(float* grad_x, const float* grad_y, const float* weight,
                            const Conv2dShape& s, bool accumulate);

// The same two passes in F(4x4, 3x3) (kernels/cpu/winograd4.cpp), which
// winograd_forward and winograd_backward_data hand the shapes f4x4_chosen takes.
template <typename Out>
void winograd4_forward(Out* y, const float* x, const float* weight, const float* bias,
                       const Conv2dShape& s);
void winograd4_backward_data(float* grad_x, const float* grad_y, const float* weight,
                             const Conv2dShape& s, bool accumulate);

// The floats of winograd_weight_grad's workspace for `s` (any number of images).
std::int64_t winograd_weight_grad_scratch(const Conv2dShape& s);

// partial [C*9, K] = the weight gradient of `images` images, x [images,C,H,W] and
// grad_y [images,K,P,Q], ASSIGNED (transposed, as conv2d.cpp's partials of a group
// of images are): partial[(c*9 + r*3 + s) * K + k] is grad_weight[k,c,r,s]'s share.
// `workspace` holds winograd_weight_grad_scratch(s) floats.
void winograd_weight_grad(float* partial, const float* x, const float* grad_y, std::int64_t images,
                          const Conv2dShape& s, float* workspace);

}  // namespace towerlab::cpu
