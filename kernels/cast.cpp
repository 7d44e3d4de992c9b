// Checks and backend dispatch for the cast (kernels/cast.h).
#include "kernels/cast.h"

#include "kernels/checks.h"
#include "kernels/cpu/cast.h"
#include "kernels/cuda/cast.h"

namespace towerlab {

void cast(const Tensor& dst, const Tensor& src, const Stream& stream) {
  TL_CHECK(dst.defined() && src.defined(), InvalidArgument, "cast: undefined tensor");
  TL_CHECK(dst.device() == stream.device() && src.device() == stream.device(), InvalidArgument,
           "cast: " << src.describe() << " -> " << dst.describe() << " on a stream of "
                    << stream.device().str() << " (copy_tensor() copies between devices)");
  TL_CHECK(dst.numel() == src.numel(), ShapeError,
           "cast: src " << src.describe() << " has " << src.numel() << " elements but dst "
                        << dst.describe() << " has " << dst.numel());
  if (dst.numel() == 0) return;
  TL_DISPATCH(stream, cpu::cast(dst, src), cuda::cast(dst, src, stream));
}

Tensor cast(const Tensor& src, DType dtype, const Stream& stream) {
  TL_CHECK(src.defined(), InvalidArgument, "cast: undefined tensor");
  TL_CHECK(dtype != DType::Float64 || stream.device().is_cpu(), NotSupported,
           "cast: " << src.describe() << " to float64: float64 exists on the CPU only");
  Tensor dst = Tensor::empty(src.shape(), stream, dtype);
  cast(dst, src, stream);
  return dst;
}

Tensor round_through(const Tensor& src, DType through, const Stream& stream) {
  TL_CHECK(src.defined() && src.device() == stream.device(), InvalidArgument,
           "round_through: " << (src.defined() ? src.describe() : std::string("undefined"))
                             << " on a stream of " << stream.device().str());
  TL_CHECK(src.dtype() == DType::Float32 && is_16bit(through), NotSupported,
           "round_through: " << src.describe() << " through " << dtype_name(through)
                             << "; it rounds float32 through bfloat16 or float16");
  if (!stream.device().is_cpu()) return cast(cast(src, through, stream), DType::Float32, stream);
  Tensor dst = Tensor::empty(src.shape(), stream, DType::Float32);
  if (dst.numel() > 0) cpu::round_through(dst, src, through);
  return dst;
}

}  // namespace towerlab
