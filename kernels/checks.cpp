#include "kernels/checks.h"

namespace towerlab::kernels {

namespace {

// Defined, on the stream's device, of one dtype; with computed_only, not 16-bit.
void check_tensors(const char* op, const Stream& stream, std::initializer_list<NamedTensor> tensors,
                   bool computed_only) {
  const NamedTensor* first = nullptr;
  for (const NamedTensor& t : tensors) {
    TL_CHECK(t.second->defined(), InvalidArgument, op << ": " << t.first << " is undefined");
    TL_CHECK(t.second->device() == stream.device(), InvalidArgument,
             op << ": " << t.first << " is " << t.second->describe() << " but the stream is on "
                << stream.device().str());
    if (computed_only) check_dtype_supported(op, t.first, *t.second);
    if (first == nullptr) {
      first = &t;
    } else {
      TL_CHECK(t.second->dtype() == first->second->dtype(), ShapeError,
               op << ": " << t.first << " is " << t.second->describe() << " but " << first->first
                  << " is " << first->second->describe());
    }
  }
}

}  // namespace

void check_on_stream(const char* op, const Stream& stream,
                     std::initializer_list<NamedTensor> tensors) {
  check_tensors(op, stream, tensors, true);
}

void check_placed(const char* op, const Stream& stream,
                  std::initializer_list<NamedTensor> tensors) {
  check_tensors(op, stream, tensors, false);
}

bool overlap(const Tensor& x, const Tensor& y) {
  if (x.numel() == 0 || y.numel() == 0) return false;
  const auto* x0 = static_cast<const char*>(x.raw_data());
  const auto* y0 = static_cast<const char*>(y.raw_data());
  return x0 < y0 + y.nbytes() && y0 < x0 + x.nbytes();
}

namespace {

void check_shapes_equal(const char* op, std::initializer_list<NamedTensor> tensors) {
  const NamedTensor& first = *tensors.begin();
  for (const NamedTensor& t : tensors) {
    TL_CHECK(t.second->shape() == first.second->shape(), ShapeError,
             op << ": " << t.first << " is " << t.second->describe() << " but " << first.first
                << " is " << first.second->describe());
  }
}

}  // namespace

void check_same_shape(const char* op, const Stream& stream,
                      std::initializer_list<NamedTensor> tensors) {
  check_on_stream(op, stream, tensors);
  check_shapes_equal(op, tensors);
}

void check_same_shape_any_dtype(const char* op, const Stream& stream,
                                std::initializer_list<NamedTensor> tensors) {
  check_placed(op, stream, tensors);
  check_shapes_equal(op, tensors);
}

void check_dtype_supported(const char* op, const char* name, const Tensor& t) {
  TL_CHECK(!is_16bit(t.dtype()), NotSupported,
           op << ": " << dtype_name(t.dtype()) << " is not supported ("
              << (t.device().is_cpu() ? "float32, float64 on cpu" : "float32 on cuda") << "; "
              << name << " is " << t.describe() << "; cast() converts)");
}

void check_one_element(const char* op, const char* name, const Tensor& t) {
  TL_CHECK(t.numel() == 1, ShapeError,
           op << ": " << name << " must have one element, got " << t.describe());
}

void check_float32(const char* op, const char* name, const Tensor& t) {
  TL_CHECK(t.dtype() == DType::Float32, NotSupported,
           op << ": " << name << " is " << t.describe() << "; this op has float32 kernels only");
}

}  // namespace towerlab::kernels
