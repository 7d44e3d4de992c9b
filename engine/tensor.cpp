#include "engine/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <ostream>
#include <set>
#include <sstream>

#include "engine/allocator.h"
#include "engine/error.h"
#include "engine/thread_pool.h"

#if TOWERLAB_WITH_CUDA
#include "engine/cuda_check.h"
#endif

namespace towerlab {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return 4;
    case DType::Float64:
      return 8;
    case DType::BFloat16:
    case DType::Float16:
      return 2;
  }
  TL_THROW(InvalidArgument, "dtype_size: unknown dtype " << static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
    case DType::BFloat16:
      return "bfloat16";
    case DType::Float16:
      return "float16";
  }
  TL_THROW(InvalidArgument, "dtype_name: unknown dtype " << static_cast<int>(dtype));
}

DType dtype_from_name(std::string_view name) {
  for (DType dtype : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    if (name == dtype_name(dtype)) return dtype;
  }
  TL_THROW(InvalidArgument,
           "unknown dtype '" << name << "' (float32, float64, bfloat16 or float16)");
}

std::ostream& operator<<(std::ostream& os, bfloat16 value) {
  return os << static_cast<float>(value);
}

std::ostream& operator<<(std::ostream& os, float16 value) {
  return os << static_cast<float>(value);
}

std::int64_t numel_of(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    TL_CHECK(d >= 0, ShapeError, "shape " << to_string(shape) << " has a negative dimension");
    TL_CHECK(d == 0 || n <= std::numeric_limits<std::int64_t>::max() / d, ShapeError,
             "shape " << to_string(shape) << " has more elements than fit in 64 bits");
    n *= d;
  }
  return n;
}

std::string to_string(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  os << ']';
  return os.str();
}

namespace {

// fn.template operator()<T>() with T the C++ type of `dtype` (all four).
template <typename Fn>
void with_each_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Float32:
      return fn.template operator()<float>();
    case DType::Float64:
      return fn.template operator()<double>();
    case DType::BFloat16:
      return fn.template operator()<bfloat16>();
    case DType::Float16:
      return fn.template operator()<float16>();
  }
  TL_THROW(InvalidArgument, "unknown dtype " << static_cast<int>(dtype));
}

}  // namespace

struct Tensor::Storage {
  Allocator* allocator = nullptr;
  void* data = nullptr;
  ~Storage() { allocator->deallocate(data); }
};

Tensor Tensor::empty(const Shape& shape, const Stream& stream, DType dtype) {
  const Device device = stream.device();
  (void)dtype_size(dtype);  // an out-of-range enum value throws here, not in the allocator
  TL_CHECK(dtype != DType::Float64 || device.is_cpu(), NotSupported,
           "float64 tensors live on the CPU only (asked for " << to_string(shape) << " on "
                                                              << device.str() << ")");
  Tensor t;
  t.shape_ = shape;
  t.numel_ = numel_of(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->allocator = &device_allocator(device);
  t.storage_->data = t.storage_->allocator->allocate(t.nbytes(), stream.native_handle());
  return t;
}

Tensor Tensor::empty(const Shape& shape, Device device, DType dtype) {
  return empty(shape, default_stream(device), dtype);
}

Tensor Tensor::zeros(const Shape& shape, const Stream& stream, DType dtype) {
  Tensor t = empty(shape, stream, dtype);
  if (t.nbytes() == 0) return t;
#if TOWERLAB_WITH_CUDA
  if (t.device_.is_cuda()) {
    CudaDeviceGuard guard(t.device_.index);
    TL_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(),
                                  static_cast<cudaStream_t>(stream.native_handle())));
    return t;
  }
#endif
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::zeros(const Shape& shape, Device device, DType dtype) {
  return zeros(shape, default_stream(device), dtype);
}

template <typename T>
Tensor Tensor::from_host(std::span<const T> values, const Shape& shape, const Stream& stream) {
  const std::int64_t n = numel_of(shape);
  TL_CHECK(static_cast<std::int64_t>(values.size()) == n, ShapeError,
           "Tensor::from_host: " << values.size() << " values for shape " << to_string(shape)
                                 << " (" << n << " elements)");
  Tensor t = empty(shape, stream, dtype_of<T>());
  if (t.nbytes() == 0) return t;
  if (t.device_.is_cpu()) {
    std::memcpy(t.raw_data(), values.data(), t.nbytes());
    return t;
  }
#if TOWERLAB_WITH_CUDA
  // Stage through page-locked memory: a copy from pageable memory would be
  // staged by the driver anyway, in small synchronous pieces.
  Allocator& pinned = pinned_allocator();
  void* staging = pinned.allocate(t.nbytes());
  std::memcpy(staging, values.data(), t.nbytes());
  CudaDeviceGuard guard(t.device_.index);
  auto s = static_cast<cudaStream_t>(stream.native_handle());
  cudaError_t status =
      cudaMemcpyAsync(t.raw_data(), staging, t.nbytes(), cudaMemcpyHostToDevice, s);
  if (status == cudaSuccess) status = cudaStreamSynchronize(s);
  pinned.deallocate(staging);
  TL_CUDA_CHECK(status);
#endif
  return t;
}

template <typename T>
std::vector<T> Tensor::to_host(const Stream& stream) const {
  TL_CHECK(defined(), InvalidArgument, "Tensor::to_host: the tensor is undefined");
  TL_CHECK(
      dtype_ == dtype_of<T>(), ShapeError,
      "Tensor::to_host: asked for " << dtype_name(dtype_of<T>()) << " values of " << describe());
  std::vector<T> values(static_cast<std::size_t>(numel_));
  if (values.empty()) return values;
  if (device_.is_cpu()) {
    stream.synchronize();
    std::memcpy(values.data(), raw_data(), nbytes());
    return values;
  }
#if TOWERLAB_WITH_CUDA
  TL_CHECK(stream.device() == device_, InvalidArgument,
           "Tensor::to_host: " << describe() << " read on a stream of " << stream.device().str());
  Allocator& pinned = pinned_allocator();
  void* staging = pinned.allocate(nbytes());
  CudaDeviceGuard guard(device_.index);
  auto s = static_cast<cudaStream_t>(stream.native_handle());
  cudaError_t status = cudaMemcpyAsync(staging, raw_data(), nbytes(), cudaMemcpyDeviceToHost, s);
  if (status == cudaSuccess) status = cudaStreamSynchronize(s);
  if (status == cudaSuccess) std::memcpy(values.data(), staging, nbytes());
  pinned.deallocate(staging);
  TL_CUDA_CHECK(status);
#endif
  return values;
}

template <typename T>
std::vector<T> Tensor::to_host() const {
#if TOWERLAB_WITH_CUDA
  if (defined() && device_.is_cuda()) {
    CudaDeviceGuard guard(device_.index);
    TL_CUDA_CHECK(cudaDeviceSynchronize());
  }
#endif
  return to_host<T>(default_stream(device_));
}

#define TL_INSTANTIATE_HOST_IO(T)                                                        \
  template Tensor Tensor::from_host<T>(std::span<const T>, const Shape&, const Stream&); \
  template std::vector<T> Tensor::to_host<T>(const Stream&) const;                       \
  template std::vector<T> Tensor::to_host<T>() const;
TL_INSTANTIATE_HOST_IO(float)
TL_INSTANTIATE_HOST_IO(double)
TL_INSTANTIATE_HOST_IO(bfloat16)
TL_INSTANTIATE_HOST_IO(float16)
#undef TL_INSTANTIATE_HOST_IO

Tensor Tensor::to(Device device, const Stream& stream) const {
  TL_CHECK(defined(), InvalidArgument, "Tensor::to: the tensor is undefined");
  TL_CHECK(stream.device() == device || stream.device() == device_, InvalidArgument,
           "Tensor::to: copying " << describe() << " to " << device.str() << " on a stream of "
                                  << stream.device().str() << " (use one of the two devices)");
  const Stream& alloc_stream = stream.device() == device ? stream : default_stream(device);
  Tensor out = empty(shape_, alloc_stream, dtype_);
  copy_tensor(out, *this, stream);
  return out;
}

Tensor Tensor::to(DType dtype, const Stream& stream) const {
  TL_CHECK(defined(), InvalidArgument, "Tensor::to: the tensor is undefined");
  TL_CHECK(stream.device() == device_, InvalidArgument,
           "Tensor::to(" << dtype_name(dtype) << "): " << describe() << " on a stream of "
                         << stream.device().str() << " (use a stream of its device)");
  if (dtype == dtype_) return clone(stream);
  TL_CHECK(device_.is_cpu() || dtype != DType::Float64, NotSupported,
           "Tensor::to(" << dtype_name(dtype) << "): " << describe()
                         << ": float64 exists on the CPU only; convert after to(Device::cpu())");
  TL_CHECK(device_.is_cpu(), NotSupported,
           "Tensor::to(" << dtype_name(dtype) << "): " << describe()
                         << ": a GPU tensor converts with cast() (kernels/cast.h)");
  // Host memory: the work that wrote this tensor finished when its call returned.
  // The conversions are engine/half.h's, as in cast() (kernels/cast.h).
  Tensor out = empty(shape_, stream, dtype);
  with_each_dtype(dtype_, [&]<typename From>() {
    with_each_dtype(dtype, [&]<typename To>() {
      const From* in = data<From>();  // [n]
      To* o = out.data<To>();         // [n]
      for (std::int64_t i = 0; i < numel_; ++i) o[i] = cast_value<To>(in[i]);
    });
  });
  return out;
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape resolved = shape;
  int inferred = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      TL_CHECK(inferred < 0, ShapeError,
               "reshape " << shape_str() << " to " << to_string(shape) << ": more than one -1");
      inferred = static_cast<int>(i);
    } else {
      TL_CHECK(resolved[i] >= 0, ShapeError,
               "reshape " << shape_str() << " to " << to_string(shape) << ": negative dimension");
      known *= resolved[i];
    }
  }
  if (inferred >= 0) {
    TL_CHECK(known != 0 && numel_ % known == 0, ShapeError,
             "reshape " << shape_str() << " to " << to_string(shape)
                        << ": cannot infer the -1 dimension");
    resolved[static_cast<std::size_t>(inferred)] = numel_ / known;
  }
  TL_CHECK(numel_of(resolved) == numel_, ShapeError,
           "reshape " << shape_str() << " (" << numel_ << " elements) to " << to_string(shape)
                      << " (" << numel_of(resolved) << " elements)");
  Tensor t = *this;
  t.shape_ = std::move(resolved);
  return t;
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  TL_CHECK(dim() >= 1, ShapeError, "slice of a scalar tensor " << shape_str());
  TL_CHECK(0 <= begin && begin <= end && end <= shape_[0], ShapeError,
           "slice [" << begin << ", " << end << ") out of range for " << shape_str());
  Tensor t = *this;
  const std::int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  t.offset_ += begin * row;
  t.shape_[0] = end - begin;
  t.numel_ = numel_of(t.shape_);
  return t;
}

Tensor Tensor::view(std::int64_t offset, const Shape& shape) const {
  const std::int64_t n = numel_of(shape);
  TL_CHECK(offset >= 0 && offset + n <= numel_, ShapeError,
           "view of " << n << " elements at offset " << offset << " does not fit in " << shape_str()
                      << " (" << numel_ << " elements)");
  Tensor t = *this;
  t.offset_ += offset;
  t.shape_ = shape;
  t.numel_ = n;
  return t;
}

std::int64_t Tensor::size(std::int64_t axis) const {
  const std::int64_t a = axis < 0 ? axis + dim() : axis;
  TL_CHECK(0 <= a && a < dim(), ShapeError, "axis " << axis << " out of range for " << shape_str());
  return shape_[static_cast<std::size_t>(a)];
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_str() + " on " + device_.str();
}

void* Tensor::raw_data() const {
  if (storage_ == nullptr || storage_->data == nullptr) return nullptr;
  return static_cast<char*>(storage_->data) +
         offset_ * static_cast<std::int64_t>(dtype_size(dtype_));
}

template <typename T>
T* Tensor::data() const {
  TL_CHECK(dtype_ == dtype_of<T>(), ShapeError,
           "data<" << dtype_name(dtype_of<T>()) << ">() of " << describe());
  return static_cast<T*>(raw_data());
}
template float* Tensor::data<float>() const;
template double* Tensor::data<double>() const;
template bfloat16* Tensor::data<bfloat16>() const;
template float16* Tensor::data<float16>() const;

std::string Tensor::str(std::int64_t limit) const {
  std::ostringstream os;
  os << describe();
  if (!defined()) return os.str();
  os << " {";
  const Tensor head = view(0, {std::min(numel_, std::max<std::int64_t>(limit, 0))});
  with_each_dtype(dtype_, [&]<typename T>() {
    const std::vector<T> values = head.to_host<T>();
    for (std::size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i];
  });
  if (head.numel() < numel_) os << ", ... (" << numel_ << " values)";
  os << '}';
  return os.str();
}

bool enable_peer_access(int from, int to) {
#if TOWERLAB_WITH_CUDA
  if (from == to) return true;
  static std::mutex mutex;
  static std::set<std::pair<int, int>> enabled, impossible;
  std::lock_guard lock(mutex);
  if (enabled.contains({from, to})) return true;
  if (impossible.contains({from, to})) return false;
  int can = 0;
  TL_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, from, to));
  if (!can) {
    impossible.insert({from, to});
    return false;
  }
  CudaDeviceGuard guard(from);
  cudaError_t status = cudaDeviceEnablePeerAccess(to, 0);
  if (status == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
  } else {
    TL_CUDA_CHECK(status);
  }
  enabled.insert({from, to});
  return true;
#else
  (void)from;
  (void)to;
  return false;
#endif
}

namespace {

// A copy on the host. From kParallelCopyBytes on it splits over the calling
// thread's share of the pool (engine/thread_pool.h): the trainer's master copies
// the whole model's gradient in and its values out to every replica each step,
// and on one core of a 2-core machine those copies were a visible part of the
// step's serial time (docs/kernels.md, "Measured choices").
// Inside a tower's pass the share is one thread and the copy stays whole. Ranges
// that overlap keep memmove's one pass, which copies them as if through a buffer.
constexpr std::size_t kParallelCopyBytes = std::size_t(256) << 10;

void host_copy(void* dst, const void* src, std::size_t bytes) {
  auto* to = static_cast<unsigned char*>(dst);
  const auto* from = static_cast<const unsigned char*>(src);
  const bool overlap = to < from + bytes && from < to + bytes;
  if (bytes < kParallelCopyBytes || overlap) {
    std::memmove(dst, src, bytes);
    return;
  }
  parallel_for(0, std::int64_t(bytes), [&](std::int64_t first, std::int64_t last) {
    std::memcpy(to + first, from + first, std::size_t(last - first));
  });
}

}  // namespace

void copy_tensor(const Tensor& dst, const Tensor& src, const Stream& stream) {
  TL_CHECK(dst.defined() && src.defined(), InvalidArgument, "copy_tensor: undefined tensor");
  TL_CHECK(dst.numel() == src.numel() && dst.dtype() == src.dtype(), ShapeError,
           "copy_tensor: cannot copy " << src.describe() << " into " << dst.describe());
  TL_CHECK(stream.device() == dst.device() || stream.device() == src.device(), InvalidArgument,
           "copy_tensor: " << src.describe() << " -> " << dst.describe() << " on a stream of "
                           << stream.device().str());
  const std::size_t bytes = src.nbytes();
  if (bytes == 0 || dst.raw_data() == src.raw_data()) return;
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    host_copy(dst.raw_data(), src.raw_data(), bytes);
    return;
  }
#if TOWERLAB_WITH_CUDA
  auto s = static_cast<cudaStream_t>(stream.native_handle());
  TL_CHECK(s != nullptr, InvalidArgument,
           "copy_tensor: " << src.describe() << " -> " << dst.describe()
                           << " needs a stream of the GPU, not the host stream");
  CudaDeviceGuard guard(stream.device().index);
  if (dst.device().is_cuda() && src.device().is_cuda()) {
    if (dst.device() == src.device()) {
      TL_CUDA_CHECK(
          cudaMemcpyAsync(dst.raw_data(), src.raw_data(), bytes, cudaMemcpyDeviceToDevice, s));
    } else if (enable_peer_access(dst.device().index, src.device().index)) {
      TL_CUDA_CHECK(cudaMemcpyPeerAsync(dst.raw_data(), dst.device().index, src.raw_data(),
                                        src.device().index, bytes, s));
    } else {
      // No peer path: through page-locked host memory, waiting for each half.
      Allocator& pinned = pinned_allocator();
      void* staging = pinned.allocate(bytes);
      cudaError_t status = cudaMemcpyAsync(staging, src.raw_data(), bytes, cudaMemcpyDefault, s);
      if (status == cudaSuccess) status = cudaStreamSynchronize(s);
      if (status == cudaSuccess)
        status = cudaMemcpyAsync(dst.raw_data(), staging, bytes, cudaMemcpyDefault, s);
      if (status == cudaSuccess) status = cudaStreamSynchronize(s);
      pinned.deallocate(staging);
      TL_CUDA_CHECK(status);
    }
    return;
  }
  // Host <-> device: staged through page-locked memory; waits, because the host
  // side may be freed or reused as soon as this call returns.
  Allocator& pinned = pinned_allocator();
  void* staging = pinned.allocate(bytes);
  cudaError_t status = cudaSuccess;
  if (src.device().is_cpu()) {
    std::memcpy(staging, src.raw_data(), bytes);
    status = cudaMemcpyAsync(dst.raw_data(), staging, bytes, cudaMemcpyHostToDevice, s);
    if (status == cudaSuccess) status = cudaStreamSynchronize(s);
  } else {
    status = cudaMemcpyAsync(staging, src.raw_data(), bytes, cudaMemcpyDeviceToHost, s);
    if (status == cudaSuccess) status = cudaStreamSynchronize(s);
    if (status == cudaSuccess) std::memcpy(dst.raw_data(), staging, bytes);
  }
  pinned.deallocate(staging);
  TL_CUDA_CHECK(status);
#else
  TL_THROW(NotSupported, "copy_tensor: no CUDA backend in this build");
#endif
}

}  // namespace towerlab
