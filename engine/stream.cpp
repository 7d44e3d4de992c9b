#include "engine/stream.h"

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "engine/allocator.h"
#include "engine/error.h"

#if TOWERLAB_WITH_CUDA
#include "engine/cuda_check.h"
#endif

namespace towerlab {

Stream::Stream(Device device) : device_(device) {
  check_available(device);
#if TOWERLAB_WITH_CUDA
  if (device.is_cuda()) {
    CudaDeviceGuard guard(device.index);
    cudaStream_t s = nullptr;
    TL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    handle_ = s;
  }
#endif
}

Stream::~Stream() {
#if TOWERLAB_WITH_CUDA
  if (handle_ != nullptr) {
    // The caching allocator keys the blocks this stream owns by its handle, and a
    // stream created later may get the same handle: hand them over first.
    release_stream(device_, handle_);
    TL_CUDA_CHECK_PRINT(cudaStreamDestroy(static_cast<cudaStream_t>(handle_)));
  }
#endif
}

Stream::Stream(Stream&& other) noexcept
    : device_(other.device_), handle_(std::exchange(other.handle_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream old(std::move(*this));
    device_ = other.device_;
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void Stream::synchronize() const {
#if TOWERLAB_WITH_CUDA
  if (handle_ != nullptr) TL_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
#endif
}

void Stream::wait(const Event& event) const {
#if TOWERLAB_WITH_CUDA
  if (handle_ != nullptr && event.native_handle() != nullptr) {
    TL_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(handle_),
                                      static_cast<cudaEvent_t>(event.native_handle()), 0));
    return;
  }
  if (event.native_handle() != nullptr) {
    // A host stream waiting on GPU work: the host thread itself must block.
    event.synchronize();
  }
#else
  (void)event;  // host events are complete once recorded
#endif
}

Stream& default_stream(Device device) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, std::unique_ptr<Stream>> streams;
  std::lock_guard lock(mutex);
  auto key = std::make_pair(static_cast<int>(device.type), device.index);
  auto& slot = streams[key];
  if (!slot) slot = std::make_unique<Stream>(device);
  return *slot;
}

Event::Event(Device device, bool timing) : device_(device), timing_(timing) {
  check_available(device);
#if TOWERLAB_WITH_CUDA
  if (device.is_cuda()) {
    CudaDeviceGuard guard(device.index);
    cudaEvent_t e = nullptr;
    TL_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    handle_ = e;
  }
#endif
}

Event::~Event() {
#if TOWERLAB_WITH_CUDA
  if (handle_ != nullptr) TL_CUDA_CHECK_PRINT(cudaEventDestroy(static_cast<cudaEvent_t>(handle_)));
#endif
}

Event::Event(Event&& other) noexcept
    : device_(other.device_),
      timing_(other.timing_),
      handle_(std::exchange(other.handle_, nullptr)),
      recorded_(other.recorded_),
      host_time_(other.host_time_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event old(std::move(*this));
    device_ = other.device_;
    timing_ = other.timing_;
    handle_ = std::exchange(other.handle_, nullptr);
    recorded_ = other.recorded_;
    host_time_ = other.host_time_;
  }
  return *this;
}

void Event::record(const Stream& stream) {
  TL_CHECK(stream.device() == device_, InvalidArgument,
           "Event::record: event of " << device_.str() << " recorded on a stream of "
                                      << stream.device().str());
  recorded_ = true;
#if TOWERLAB_WITH_CUDA
  if (handle_ != nullptr) {
    CudaDeviceGuard guard(device_.index);
    TL_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_),
                                  static_cast<cudaStream_t>(stream.native_handle())));
    return;
  }
#endif
  host_time_ = Clock::now();
}

void Event::synchronize() const {
#if TOWERLAB_WITH_CUDA
  if (handle_ != nullptr) TL_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
#endif
}

bool Event::query() const {
#if TOWERLAB_WITH_CUDA
  if (handle_ != nullptr) {
    cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    TL_CUDA_CHECK(status);
  }
#endif
  return true;
}

float Event::elapsed_ms(const Event& start, const Event& end) {
  TL_CHECK(start.device_ == end.device_, InvalidArgument,
           "Event::elapsed_ms: events on " << start.device_.str() << " and " << end.device_.str());
  TL_CHECK(start.timing_ && end.timing_, InvalidArgument,
           "Event::elapsed_ms: both events must be created with timing = true");
  TL_CHECK(start.recorded_ && end.recorded_, InvalidArgument,
           "Event::elapsed_ms: both events must be recorded first");
#if TOWERLAB_WITH_CUDA
  if (start.handle_ != nullptr) {
    float ms = 0.0f;
    TL_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_),
                                       static_cast<cudaEvent_t>(end.handle_)));
    return ms;
  }
#endif
  return std::chrono::duration<float, std::milli>(end.host_time_ - start.host_time_).count();
}

}  // namespace towerlab
