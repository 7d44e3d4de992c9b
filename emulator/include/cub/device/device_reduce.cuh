// CUB's device-wide reduction on the emulated GPUs: cub::DeviceReduce::Sum as
// towerlab calls it (kernels/cuda/reduce.cu), CUB's two-phase protocol included:
//
//   std::size_t bytes = 0;
//   cub::DeviceReduce::Sum(nullptr, bytes, in, out, n, stream);  // only sets `bytes`
//   ... allocate `bytes` of device memory as temp ...
//   cub::DeviceReduce::Sum(temp, bytes, in, out, n, stream);     // queues the sum
//
// The sum is one operation on `stream`, run by its worker as a kernel would be
// (src/cub.cpp): it counts as one kernel, tlemu::fault_kernel can make it fault, and
// a pointer (the input, the output, the temporary storage) that is not memory the
// stream's device may touch makes the device's sticky error cudaErrorIllegalAddress
// when it runs, as a stray access would on hardware. It writes its temporary storage
// before the result, so a temporary block reused too early is a data race.
//
// Order: a fixed pairwise tree over the items in index order (runs of 16 summed left
// to right, then halves added), in CUB's accumulator type (what the output's value
// type plus the input's value type gives: float for float). So the bits are the same
// run to run, and the error grows like a GPU tree's, not like one long running sum.
// They are not the bits CUB's own tree gives. n <= 0 writes 0, as CUB writes its
// initial value.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <type_traits>
#include <utility>
#include <vector>

namespace tlemu::detail {

// One range of memory a device-wide algorithm reads or writes.
struct DeviceSpan {
  const char* name;
  const void* p;
  std::size_t bytes;
};

// Queues `run` on `stream` as the kernel `what` would be: the stream must be a live
// stream of the current device (else cudaErrorInvalidResourceHandle, as a launch) and
// the device without a sticky error (else that error). When it runs, every span is
// checked against the memory registry first. Defined in src/cub.cpp.
cudaError_t queue_device_algorithm(const char* what, cudaStream_t stream,
                                   std::vector<DeviceSpan> spans, std::function<void()> run);

// The fixed summation order of DeviceReduce::Sum (see the top).
template <typename Accum, typename It>
Accum pairwise_sum(const It& in, std::int64_t begin, std::int64_t end) {
  if (end - begin <= 16) {
    Accum sum = static_cast<Accum>(in[begin]);
    for (std::int64_t i = begin + 1; i < end; ++i) sum = sum + static_cast<Accum>(in[i]);
    return sum;
  }
  const std::int64_t mid = begin + (end - begin) / 2;
  return pairwise_sum<Accum>(in, begin, mid) + pairwise_sum<Accum>(in, mid, end);
}

template <typename It>
struct OutputValue {
  using type = typename std::iterator_traits<It>::value_type;
};
template <typename T>
struct OutputValue<T*> {
  using type = std::remove_cv_t<T>;
};

}  // namespace tlemu::detail

namespace cub {

struct DeviceReduce {
  // The temporary storage every reduction asks for: the accumulator lives there.
  static constexpr std::size_t kTempStorageBytes = 16;

  template <typename InputIteratorT, typename OutputIteratorT, typename NumItemsT>
  static cudaError_t Sum(void* d_temp_storage, std::size_t& temp_storage_bytes, InputIteratorT d_in,
                         OutputIteratorT d_out, NumItemsT num_items, cudaStream_t stream = 0) {
    using In = typename std::iterator_traits<InputIteratorT>::value_type;
    using OutRaw = typename tlemu::detail::OutputValue<OutputIteratorT>::type;
    using Out = std::conditional_t<std::is_void_v<OutRaw>, In, OutRaw>;
    using Accum = std::decay_t<decltype(std::declval<Out>() + std::declval<In>())>;
    static_assert(sizeof(Accum) <= kTempStorageBytes && std::is_trivially_copyable_v<Accum>,
                  "the emulated cub::DeviceReduce::Sum keeps its accumulator in 16 bytes");

    if (d_temp_storage == nullptr) {
      temp_storage_bytes = kTempStorageBytes;
      return cudaSuccess;
    }
    if (temp_storage_bytes < kTempStorageBytes) return cudaErrorInvalidValue;
    const std::int64_t n = num_items > 0 ? static_cast<std::int64_t>(num_items) : 0;

    std::vector<tlemu::detail::DeviceSpan> spans;
    spans.push_back({"d_temp_storage", d_temp_storage, kTempStorageBytes});
    if constexpr (std::is_pointer_v<InputIteratorT>) {
      spans.push_back(
          {"d_in", static_cast<const void*>(d_in), static_cast<std::size_t>(n) * sizeof(In)});
    }
    if constexpr (std::is_pointer_v<OutputIteratorT>) {
      spans.push_back({"d_out", static_cast<const void*>(d_out), sizeof(Out)});
    }
    return tlemu::detail::queue_device_algorithm(
        "cub::DeviceReduce::Sum", stream, std::move(spans),
        [d_temp_storage, d_in, d_out, n]() mutable {
          const Accum sum = n > 0 ? tlemu::detail::pairwise_sum<Accum>(d_in, 0, n) : Accum{};
          std::memcpy(d_temp_storage, &sum, sizeof sum);
          Accum kept;
          std::memcpy(&kept, d_temp_storage, sizeof kept);
          *d_out = static_cast<Out>(kept);
        });
  }
};

}  // namespace cub
