// Argument checks shared by the op families' launchers. Each throws ShapeError
// (or InvalidArgument) with the op's name and the offending tensors described,
// e.g. "add: b is float32[4,3] on cpu but out is float32[3,4] on cpu".
#pragma once

#include <initializer_list>
#include <utility>

#include "../engine/error.h"
#include "../engine/stream.h"
#include "../engine/tensor.h"

// TL_ON_CUDA(call): the call in a build with the CUDA backend, a NotSupported
// error without it (where no CUDA tensor can exist to get this far anyway).
#if TOWERLAB_WITH_CUDA
#define TL_ON_CUDA(call) call
#else
#define TL_ON_CUDA(call) TL_THROW(NotSupported, "no CUDA backend in this build")
#endif

// TL_DISPATCH(stream, cpu_call, cuda_call): the backend dispatch of an op's
// launcher, once its arguments are checked: cpu_call when `stream` is the host's,
// cuda_call (through TL_ON_CUDA) otherwise. A macro rather than a function taking
// two callables, because cuda_call names functions that a build without CUDA does
// not have.
#define TL_DISPATCH(stream, cpu_call, cuda_call) \
  do {                                           \
    if ((stream).device().is_cpu()) {            \
      cpu_call;                                  \
    } else {                                     \
      TL_ON_CUDA(cuda_call);                     \
    }                                            \
  } while (false)

namespace towerlab::kernels {

using NamedTensor = std::pair<const char*, const Tensor*>;

// Every tensor is defined, on the stream's device, of one dtype, and of a dtype
// the ops compute in (check_dtype_supported).
void check_on_stream(const char* op, const Stream& stream,
                     std::initializer_list<NamedTensor> tensors);
// As check_on_stream, for the ops that move values without computing in them
// (permute, slice copy): any dtype the device holds, bfloat16 and float16 included.
void check_placed(const char* op, const Stream& stream, std::initializer_list<NamedTensor> tensors);
// Whether two tensors' memory overlaps (views of one storage may, or may not).
bool overlap(const Tensor& x, const Tensor& y);
// As check_on_stream, and every tensor has the shape of the first.
void check_same_shape(const char* op, const Stream& stream,
                      std::initializer_list<NamedTensor> tensors);
// As check_same_shape, for the ops that also take bfloat16 and float16 (widened
// to float32, computed on, rounded once: kernels/reference/math_type.h).
void check_same_shape_any_dtype(const char* op, const Stream& stream,
                                std::initializer_list<NamedTensor> tensors);
// The tensor is not bfloat16 or float16, which only casts and copies take today:
// NotSupported naming the op, the dtype and what the op takes, e.g.
// "relu_forward: bfloat16 is not supported (float32, float64 on cpu; x is
// bfloat16[4] on cpu; cast() converts)". check_on_stream calls it for every
// tensor, so each op that checks its arguments there rejects them early.
void check_dtype_supported(const char* op, const char* name, const Tensor& t);
// The tensor has one element (a loss, or the dL/dloss a loss's backward reads):
// ShapeError "mse_forward: loss must have one element, got float32[2]".
void check_one_element(const char* op, const char* name, const Tensor& t);

// The tensor is float32 (for ops that have no float64 kernel).
void check_float32(const char* op, const char* name, const Tensor& t);

}  // namespace towerlab::kernels
