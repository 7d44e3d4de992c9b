// CUDNN_CHECK(expr): the benches' one way to call cuDNN, their reference. A call
// that fails throws CudaError naming the expression and cuDNN's message, as
// TL_CHECK does for towerlab's own calls. Include it after <cudnn.h>.
#pragma once

#include <cudnn.h>

#include "engine/error.h"

#define CUDNN_CHECK(expr)                                                        \
  do {                                                                           \
    cudnnStatus_t status_ = (expr);                                              \
    if (status_ != CUDNN_STATUS_SUCCESS)                                         \
      TL_THROW(CudaError, #expr << " failed: " << cudnnGetErrorString(status_)); \
  } while (0)
