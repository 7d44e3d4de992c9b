// Tensor: a contiguous, row-major array of float32, bfloat16 or float16 (any
// device) or float64 (CPU only, for gradient checks) with a shape and a device.
// bfloat16 and float16 (engine/half.h, with their rounding rule) are storage
// types: casts and copies take them, and each op's contract says whether it does;
// an op that does not throws NotSupported naming itself and the dtype.
//
// A Tensor holds a reference to its storage: copying a Tensor makes another view
// of the same memory (as in PyTorch), clone() makes new memory. Views (reshape,
// slice along the first dimension, flat windows) share the storage, which is how
// each variable's gradient lives inside one flat gradient buffer.
//
// Memory comes from the device's caching allocator, ordered on the stream the
// tensor was created for. A tensor that is used on another stream must not be
// dropped before that stream has finished with it.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "device.h"
#include "half.h"
#include "stream.h"

namespace towerlab {

enum class DType : std::uint8_t { Float32, Float64, BFloat16, Float16 };

std::size_t dtype_size(DType dtype);  // 4, 8, 2, 2
// "float32", "float64", "bfloat16", "float16"
const char* dtype_name(DType dtype);
// The dtype dtype_name() names; InvalidArgument listing the four names otherwise.
DType dtype_from_name(std::string_view name);
// The 16-bit dtypes, which only casts, copies and the ops that say so take.
constexpr bool is_16bit(DType dtype) {
  return dtype == DType::BFloat16 || dtype == DType::Float16;
}
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::Float32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::Float64;
}
template <>
constexpr DType dtype_of<bfloat16>() {
  return DType::BFloat16;
}
template <>
constexpr DType dtype_of<float16>() {
  return DType::Float16;
}

// A 16-bit value printed as the float it holds ("0.333984", "nan", "-inf").
std::ostream& operator<<(std::ostream& os, bfloat16 value);
std::ostream& operator<<(std::ostream& os, float16 value);

using Shape = std::vector<std::int64_t>;
std::int64_t numel_of(const Shape& shape);
std::string to_string(const Shape& shape);  // "[32,1,3,3]"

class Allocator;

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor: defined() is false

  // Uninitialized memory for `shape` on the stream's device, ordered on `stream`.
  static Tensor empty(const Shape& shape, const Stream& stream, DType dtype = DType::Float32);
  static Tensor empty(const Shape& shape, Device device, DType dtype = DType::Float32);
  static Tensor zeros(const Shape& shape, const Stream& stream, DType dtype = DType::Float32);
  static Tensor zeros(const Shape& shape, Device device, DType dtype = DType::Float32);
  // A tensor on the stream's device holding `values` (values.size() must equal the shape's size).
  template <typename T>
  static Tensor from_host(std::span<const T> values, const Shape& shape, const Stream& stream);
  template <typename T>
  static Tensor from_host(const std::vector<T>& values, const Shape& shape, const Stream& stream) {
    return from_host(std::span<const T>(values), shape, stream);
  }

  // The values, copied to the host. Waits for `stream` (any stream of this device,
  // or the host stream for a CPU tensor): work on other streams that wrote the
  // tensor must be ordered before it by the caller.
  template <typename T>
  std::vector<T> to_host(const Stream& stream) const;
  // The values, copied to the host after all work submitted so far to this
  // tensor's device, on every stream, has finished (a device-wide wait on a GPU;
  // on the CPU, work is done when the call that submitted it returns). Correct
  // whichever stream wrote the tensor: for tests, samples and tools. Code on a hot
  // path passes the stream it ordered the work on instead.
  template <typename T>
  std::vector<T> to_host() const;
  // A copy of this tensor on another device (or the same one), ordered on `stream`,
  // which belongs to the source or the destination device.
  Tensor to(Device device, const Stream& stream) const;
  Tensor clone(const Stream& stream) const { return to(device_, stream); }
  // A copy with the elements converted to `dtype` (rounded to nearest even, NaN
  // and infinities kept: engine/half.h), on this tensor's device, ordered on
  // `stream`, a stream of that device. The same dtype gives a clone. A CPU tensor
  // converts between all four dtypes; a GPU tensor converts with cast()
  // (kernels/cast.h), and to float64 after to(Device::cpu(), stream).
  Tensor to(DType dtype, const Stream& stream) const;

  // Views sharing this tensor's storage.
  Tensor reshape(const Shape& shape) const;                    // one dimension may be -1
  Tensor slice(std::int64_t begin, std::int64_t end) const;    // rows [begin, end) of dim 0
  Tensor view(std::int64_t offset, const Shape& shape) const;  // a flat window at `offset` elements

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim() const { return static_cast<std::int64_t>(shape_.size()); }
  std::int64_t size(std::int64_t axis) const;  // negative axes count from the end
  std::int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  std::string shape_str() const { return to_string(shape_); }
  // "float32[32,1,3,3] on cuda:0"
  std::string describe() const;
  // describe() and the first `limit` values (all of them when there are no more),
  // copied to the host after all work on the device (as to_host()):
  // "bfloat16[2,2] on cpu {1, 0.333984, nan, -inf}".
  std::string str(std::int64_t limit = 16) const;

  void* raw_data() const;
  template <typename T>
  T* data() const;  // throws ShapeError if T does not match dtype()

  bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }

 private:
  struct Storage;
  std::shared_ptr<Storage> storage_;
  std::int64_t offset_ = 0;  // in elements
  Shape shape_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::Float32;
  Device device_;
};

// Copies src into dst (same size and dtype; any two devices), ordered on
// `stream`, which belongs to one of the two devices. Host to device and device to
// host go through page-locked staging memory; between two GPUs the copy is
// peer-to-peer when the hardware allows it, and staged through the host when not.
// On the host, src and dst may overlap (the copy is as if through a buffer), and a
// copy of 256 KiB or more splits over the calling thread's share of the pool.
void copy_tensor(const Tensor& dst, const Tensor& src, const Stream& stream);

// Turns on peer access from device `from` to device `to` once; false when the
// hardware cannot (then copies between them are staged through the host).
bool enable_peer_access(int from, int to);

}  // namespace towerlab
