// Check macros for CUDA runtime and cuBLAS calls and kernel launches. Each reports
// the failing expression, the current device (a sticky error surfaces at whatever
// call comes next on that device, so the device says more than the call), the
// error's name, the file and the line, and throws towerlab::CudaError; the _PRINT
// forms log instead, for destructors.
// Include only from code built with the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include "error.h"

#define TL_CUDA_CHECK(expr)                                                                     \
  do {                                                                                          \
    cudaError_t tl_err_ = (expr);                                                               \
    if (tl_err_ != cudaSuccess) {                                                               \
      (void)cudaGetLastError(); /* clear the sticky-free error so later calls work */           \
      ::towerlab::detail::throw_cuda_error(#expr, cudaGetErrorName(tl_err_),                    \
                                           ::towerlab::detail::current_cuda_device(), __FILE__, \
                                           __LINE__);                                           \
    }                                                                                           \
  } while (0)

#define TL_CUDA_CHECK_PRINT(expr)                                                             \
  do {                                                                                        \
    cudaError_t tl_err_ = (expr);                                                             \
    if (tl_err_ != cudaSuccess) {                                                             \
      (void)cudaGetLastError();                                                               \
      ::towerlab::detail::log_cuda_error(#expr, cudaGetErrorName(tl_err_),                    \
                                         ::towerlab::detail::current_cuda_device(), __FILE__, \
                                         __LINE__);                                           \
    }                                                                                         \
  } while (0)

// After a <<<...>>> launch: catches bad configurations (too many threads, too much
// shared memory) at the launch site instead of at the next synchronize.
#define TL_CUDA_CHECK_LAUNCH() TL_CUDA_CHECK(cudaGetLastError())

#define TL_CUBLAS_CHECK(expr)                                                                   \
  do {                                                                                          \
    cublasStatus_t tl_status_ = (expr);                                                         \
    if (tl_status_ != CUBLAS_STATUS_SUCCESS) {                                                  \
      ::towerlab::detail::throw_cuda_error(#expr, cublasGetStatusName(tl_status_),              \
                                           ::towerlab::detail::current_cuda_device(), __FILE__, \
                                           __LINE__);                                           \
    }                                                                                           \
  } while (0)

namespace towerlab {

namespace detail {
// The calling thread's current CUDA device, or -1 when even that cannot be asked.
inline int current_cuda_device() noexcept {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    device = -1;
  }
  return device;
}
}  // namespace detail

// Makes `index` the current CUDA device for the scope and restores the previous
// one on exit, so that a tower thread's calls land on its own GPU.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int index) {
    TL_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != index) TL_CUDA_CHECK(cudaSetDevice(index));
  }
  ~CudaDeviceGuard() {
    int current = previous_;
    TL_CUDA_CHECK_PRINT(cudaGetDevice(&current));
    if (current != previous_) TL_CUDA_CHECK_PRINT(cudaSetDevice(previous_));
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace towerlab
