// CPU backend entry points of 2-D pooling (contracts in kernels/pool2d.h), called
// by its dispatch once the arguments are checked and the shapes are consistent.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "kernels/grad_write.h"
#include "kernels/pool2d.h"

namespace towerlab::cpu {

void max_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params);
void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const Pool2dParams& params);
void max_pool2d_forward_with_argmax(const Tensor& y, const Tensor& argmax, const Tensor& x,
                                    const Pool2dParams& params);
void max_pool2d_backward_from_argmax(const Tensor& grad_x, const Tensor& grad_y,
                                     const Tensor& argmax, const Pool2dParams& params,
                                     GradWrite write);
// One [H,W] plane of the with_argmax / from_argmax pair, for callers that pool a
// plane at a time (the batch norm with a fused max pool, kernels/cpu/batchnorm.cpp):
// the same code as the whole-tensor ops, so the same bits. y and where are [Ho,Wo],
// grad_x [H,W], grad_y [Ho,Wo].
struct PoolPlane {
  std::int64_t H, W, Ho, Wo;
};
template <typename T>
void max_pool_plane(const T* x, T* y, T* where, const PoolPlane& z, const Pool2dParams& params);
// max_pool_plane of a float32 plane mapped value by value to
// clamp(batchnorm_affine(x, center, scale, shift)) (the clamp when relu), with the
// bits of pooling the mapped plane, computed as the windows are read: the batch
// norm's fused pool writes no activation plane. False, with nothing written, where
// this path does not apply (not 2x2 windows of stride 2, or AVX2 not the selected
// ISA's code); the caller then maps the plane and pools it.
struct PoolInputAffine {
  float center, scale, shift;
  bool relu;
};
bool max_pool_affine_plane(const float* x, float* y, float* where, const PoolPlane& z,
                           const Pool2dParams& params, const PoolInputAffine& a);
// One plane of max_pool2d_backward_from_argmax with Assign, except that a position
// of -1 in `where` gives nothing (a window whose gradient a fused ReLU stops),
// written with its zeros in one pass where the window allows.
template <typename T>
void max_pool_plane_gradient(const T* where, const T* grad_y, T* grad_x, const PoolPlane& z,
                             const Pool2dParams& params);

void avg_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params);
void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Pool2dParams& params);

}  // namespace towerlab::cpu
