// Streams and events: the ordering primitives of a tower.
//
// On CUDA a Stream is a cudaStream_t (non-blocking with respect to the legacy
// default stream) and an Event a cudaEvent_t. On the CPU a stream is the calling
// thread itself: work submitted to it has finished when the call returns, so a
// host event is complete as soon as it is recorded. That is why a tower on the CPU
// runs on its own thread: the thread is its stream.
#pragma once

#include "clock.h"
#include "device.h"

namespace towerlab {

class Event;

class Stream {
 public:
  // A new stream on `device`. Throws DeviceError if the device is not present.
  explicit Stream(Device device);
  // On CUDA, waits for the stream's work first: the caching allocator hands the
  // blocks this stream owns to no stream before its handle can be reused.
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device device() const { return device_; }
  // Blocks the calling thread until all work submitted so far has finished.
  void synchronize() const;
  // Work submitted to this stream after the call waits for `event` (no host block on CUDA).
  void wait(const Event& event) const;
  // The cudaStream_t on CUDA; nullptr on the CPU.
  void* native_handle() const { return handle_; }

 private:
  Device device_;
  void* handle_ = nullptr;
};

// The library's stream for `device`, created on first use and shared by every
// caller that does not bring its own. Towers always bring their own.
Stream& default_stream(Device device);

class Event {
 public:
  // `timing` enables elapsed_ms() (CUDA events without timing are cheaper).
  explicit Event(Device device, bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  Device device() const { return device_; }
  // Captures the work submitted to `stream` so far. The stream must be on this event's device.
  void record(const Stream& stream);
  // Blocks until the captured work has finished (returns at once if never recorded).
  void synchronize() const;
  // True when the captured work has finished.
  bool query() const;
  void* native_handle() const { return handle_; }

  // Milliseconds between two recorded timing events of one device.
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  Device device_;
  bool timing_ = false;
  void* handle_ = nullptr;
  bool recorded_ = false;
  Clock::time_point host_time_{};
};

}  // namespace towerlab
