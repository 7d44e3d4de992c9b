// The precision policy's names and dtypes (parallel/precision.h).
#include "parallel/precision.h"

#include <algorithm>

#include "engine/error.h"

namespace towerlab {

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::Fp32:
      return "fp32";
    case Precision::Tf32:
      return "tf32";
    case Precision::Bf16:
      return "bf16";
    case Precision::Fp16:
      return "fp16";
  }
  return "?";
}

DType compute_dtype(Precision precision, const std::vector<Device>& devices) {
  switch (precision) {
    case Precision::Fp32:
      return DType::Float32;
    case Precision::Tf32: {
      const bool gpu =
          std::any_of(devices.begin(), devices.end(), [](Device d) { return d.is_cuda(); });
      TL_CHECK(!gpu, NotSupported,
               "Trainer: precision tf32 on CUDA towers is not supported yet (there is no TF32 "
               "tensor-core GEMM yet, and float32 is not TF32); use fp32 or bf16");
      return DType::Float32;  // the CPU has no TF32 arithmetic: float32
    }
    case Precision::Bf16:
      return DType::BFloat16;
    case Precision::Fp16:
      TL_THROW(NotSupported,
               "Trainer: precision fp16 is not supported yet (it needs dynamic loss "
               "scaling, not implemented); use bf16, which needs none");
  }
  return DType::Float32;
}

}  // namespace towerlab
