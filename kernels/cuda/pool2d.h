// CUDA backend entry points of 2-D pooling (contracts in kernels/pool2d.h), called
// by its dispatch once the arguments are checked and the shapes are consistent.
// Internal: not installed, not included by towerlab.h.
#pragma once

#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/grad_write.h"
#include "kernels/pool2d.h"

namespace towerlab::cuda {

void max_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params,
                        const Stream& stream);
void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& x,
                         const Pool2dParams& params, const Stream& stream);
void max_pool2d_forward_with_argmax(const Tensor& y, const Tensor& argmax, const Tensor& x,
                                    const Pool2dParams& params, const Stream& stream);
void max_pool2d_backward_from_argmax(const Tensor& grad_x, const Tensor& grad_y,
                                     const Tensor& argmax, const Pool2dParams& params,
                                     const Stream& stream, GradWrite write);
void avg_pool2d_forward(const Tensor& y, const Tensor& x, const Pool2dParams& params,
                        const Stream& stream);
void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_y, const Pool2dParams& params,
                         const Stream& stream);

}  // namespace towerlab::cuda
