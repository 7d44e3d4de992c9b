// Streams and events of the emulated GPUs.
//
// Each stream is a worker thread with a queue: operations run one after another, in
// the order they were queued, and only there. Nothing else orders two streams:
//   - an event is a fence: cudaEventRecord queues "mark the event reached", and
//     cudaStreamWaitEvent queues "wait until it is" on the other stream;
//   - the legacy default stream (0) of a device waits for the work queued before it
//     on the device's blocking streams, and they wait for the work queued before on
//     it, as CUDA documents; streams made with cudaStreamNonBlocking skip both;
//   - the host waits with cudaStreamSynchronize, cudaEventSynchronize (or a query
//     that says done), cudaDeviceSynchronize, and the calls CUDA makes synchronous
//     (cudaMemcpy, cudaFree, a copy to pageable host memory).
// The locks of the queues and events are taken in Hidden scopes, and each ordering
// CUDA gives is told to ThreadSanitizer as a release and an acquire of a token: an
// operation is ordered after the host's calls before it was queued (and nothing the
// host did later), a waiter after the operation or record it waited for. The lists
// of streams and events are looked up in Hidden scopes too: the lookups order nothing.
//
// One liberty: cudaStreamDestroy returns once the stream's queued work has run (on
// hardware it returns at once and the work finishes later).
#include <algorithm>
#include <map>

#include "internal.h"

namespace tlemu::detail {
namespace {

using Clock = std::chrono::steady_clock;

struct Stream;
using StreamPtr = std::shared_ptr<Stream>;

struct Queued {
  Operation op;
  // What orders the operation after the host's calls before it was queued (and after
  // nothing the host does later): released at the call, acquired before it runs.
  std::unique_ptr<char> token = std::make_unique<char>();
  bool bookkeeping = false;  // runs even after a fault (events must still be reached)
  std::vector<std::pair<StreamPtr, std::uint64_t>> after;  // the legacy stream's implicit waits
};

struct Stream {
  int device = 0;
  bool blocking = true;  // orders itself against the legacy default stream
  bool legacy = false;
  std::mutex m;
  std::condition_variable work, done;
  std::deque<Queued> queue;
  std::uint64_t enqueued = 0, completed = 0;
  bool stop = false;
  char done_token = 0;  // released by each finished operation, acquired by its waiters
  std::thread worker;

  // The queue's lock is taken in Hidden scopes: the host waiting on it must not be
  // ordered before the operations that run after its wait began, nor they after it.
  // The tokens carry the orderings CUDA gives.
  void run() {
    for (;;) {
      Queued q;
      {
        Hidden hidden;
        std::unique_lock lock(m);
        work.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        q = std::move(queue.front());
        queue.pop_front();
      }
      tsan_acquire(q.token.get());
      for (auto& [stream, ticket] : q.after) stream->wait_for(ticket);
      if (q.bookkeeping || sticky(device) == cudaSuccess) q.op.run();
      tsan_release(&done_token);
      Hidden hidden;
      std::lock_guard lock(m);
      ++completed;
      done.notify_all();
    }
  }

  // Blocks until the first `ticket` operations have run.
  void wait_for(std::uint64_t ticket) {
    {
      Hidden hidden;
      std::unique_lock lock(m);
      done.wait(lock, [&] { return completed >= ticket; });
    }
    tsan_acquire(&done_token);
  }

  // How many operations were queued so far; read without ordering anything.
  std::uint64_t queued_so_far() {
    Hidden hidden;
    std::lock_guard lock(m);
    return enqueued;
  }
};

struct EventState {
  std::mutex m;
  std::condition_variable cv;
  std::uint64_t recorded = 0, reached = 0;  // records asked for, records run
  Clock::time_point at;
  bool timing = true;
  int device = -1;
  char token = 0;  // released when a record is reached, acquired by whoever waited for it

  std::uint64_t recorded_so_far() {
    Hidden hidden;
    std::lock_guard lock(m);
    return recorded;
  }
};

struct Handles {
  std::mutex m;
  std::map<CUstream_st*, StreamPtr> streams;
  std::map<CUevent_st*, std::shared_ptr<EventState>> events;
  StreamPtr legacy[kMaxDevices];
};

// Never destroyed: worker threads and late cudaFree calls from other static
// destructors may still use it while the process exits.
Handles& handles() {
  static Handles* h = new Handles;
  return *h;
}

StreamPtr start_stream(int device, bool blocking, bool legacy) {
  auto s = std::make_shared<Stream>();
  s->device = device;
  s->blocking = blocking;
  s->legacy = legacy;
  s->worker = std::thread([raw = s.get()] { raw->run(); });
  return s;
}

bool is_default(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
}

// The stream a handle names (the current device's legacy stream for 0), or null.
StreamPtr resolve(cudaStream_t stream) {
  Hidden hidden;
  Handles& h = handles();
  std::lock_guard lock(h.m);
  if (is_default(stream)) {
    const int device = current_device();
    if (!valid_device(device)) return nullptr;
    if (!h.legacy[device]) h.legacy[device] = start_stream(device, true, true);
    return h.legacy[device];
  }
  auto it = h.streams.find(stream);
  return it == h.streams.end() ? nullptr : it->second;
}

std::shared_ptr<EventState> find_event(cudaEvent_t event) {
  Hidden hidden;
  Handles& h = handles();
  std::lock_guard lock(h.m);
  auto it = h.events.find(event);
  return it == h.events.end() ? nullptr : it->second;
}

// The streams of `device`, the legacy one included if it exists.
std::vector<StreamPtr> streams_of(int device) {
  Hidden hidden;
  Handles& h = handles();
  std::lock_guard lock(h.m);
  std::vector<StreamPtr> out;
  for (auto& [handle, s] : h.streams)
    if (s->device == device) out.push_back(s);
  if (h.legacy[device]) out.push_back(h.legacy[device]);
  return out;
}

// The implicit waits of an operation queued on `s`: CUDA's legacy default stream.
std::vector<std::pair<StreamPtr, std::uint64_t>> implicit_waits(const StreamPtr& s) {
  std::vector<std::pair<StreamPtr, std::uint64_t>> after;
  if (!s->blocking) return after;
  for (auto& other : streams_of(s->device)) {
    if (other == s || !other->blocking || (!s->legacy && !other->legacy)) continue;
    const std::uint64_t ticket = other->queued_so_far();
    if (ticket > 0) after.emplace_back(other, ticket);
  }
  return after;
}

cudaError_t push(const StreamPtr& s, Operation op, bool bookkeeping) {
  Queued q;
  q.op = std::move(op);
  q.bookkeeping = bookkeeping;
  q.after = implicit_waits(s);
  tsan_release(q.token.get());
  Hidden hidden;
  std::lock_guard lock(s->m);
  s->queue.push_back(std::move(q));
  ++s->enqueued;
  s->work.notify_one();
  return cudaSuccess;
}

}  // namespace

cudaError_t enqueue(cudaStream_t stream, Operation op) {
  StreamPtr s = resolve(stream);
  if (!s) return cudaErrorInvalidResourceHandle;
  if (const cudaError_t e = sticky(s->device); e != cudaSuccess) return e;
  return push(s, std::move(op), false);
}

int stream_device(cudaStream_t stream) {
  StreamPtr s = resolve(stream);
  return s ? s->device : -1;
}

cudaError_t synchronize(cudaStream_t stream) {
  StreamPtr s = resolve(stream);
  if (!s) return cudaErrorInvalidResourceHandle;
  s->wait_for(s->queued_so_far());
  return sticky(s->device);
}

cudaError_t synchronize_device(int device) {
  if (!valid_device(device)) return cudaErrorInvalidDevice;
  for (auto& s : streams_of(device)) s->wait_for(s->queued_so_far());
  return sticky(device);
}

void set_stream_delay(cudaStream_t stream, std::chrono::milliseconds delay) {
  if (StreamPtr s = resolve(stream)) {
    push(s, {"tlemu::delay_stream", [delay] { std::this_thread::sleep_for(delay); }}, true);
  }
}

}  // namespace tlemu::detail

using namespace tlemu::detail;

// --- streams ----------------------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0)
    return fail(cudaErrorInvalidValue);
  const int device = current_device();
  if (const cudaError_t e = sticky(device); e != cudaSuccess) return fail(e);
  StreamPtr s = start_stream(device, (flags & cudaStreamNonBlocking) == 0, false);
  *stream = reinterpret_cast<cudaStream_t>(s.get());
  Hidden hidden;
  Handles& h = handles();
  std::lock_guard lock(h.m);
  h.streams[*stream] = std::move(s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  StreamPtr s;
  {
    Hidden hidden;
    Handles& h = handles();
    std::lock_guard lock(h.m);
    auto it = h.streams.find(stream);
    if (it == h.streams.end()) return fail(cudaErrorInvalidResourceHandle);
    s = std::move(it->second);
    h.streams.erase(it);
  }
  {
    Hidden hidden;
    std::lock_guard lock(s->m);
    s->stop = true;
    s->work.notify_one();
  }
  s->worker.join();  // the queue drains first
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  const cudaError_t e = synchronize(stream);
  return e != cudaSuccess ? fail(e) : e;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  StreamPtr s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  {
    Hidden hidden;  // "not ready" orders nothing
    std::lock_guard lock(s->m);
    if (s->completed < s->enqueued) return cudaErrorNotReady;
  }
  tsan_acquire(&s->done_token);  // "done" orders the host after the stream's work
  return sticky(s->device);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
  auto e = find_event(event);
  StreamPtr s = resolve(stream);
  if (!e || !s || flags != 0)
    return fail(!e || !s ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
  const std::uint64_t ticket = e->recorded_so_far();
  if (ticket == 0) return cudaSuccess;  // never recorded: nothing to wait for
  return push(s,
              {"cudaStreamWaitEvent",
               [e, ticket] {
                 {
                   Hidden hidden;
                   std::unique_lock lock(e->m);
                   e->cv.wait(lock, [&] { return e->reached >= ticket; });
                 }
                 tsan_acquire(&e->token);
               }},
              true);
}

// --- events -----------------------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (event == nullptr || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0)
    return fail(cudaErrorInvalidValue);
  auto e = std::make_shared<EventState>();
  e->timing = (flags & cudaEventDisableTiming) == 0;
  *event = reinterpret_cast<cudaEvent_t>(e.get());
  Hidden hidden;
  Handles& h = handles();
  std::lock_guard lock(h.m);
  h.events[*event] = std::move(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Hidden hidden;
  Handles& h = handles();
  std::lock_guard lock(h.m);
  // Work already queued keeps the event's state alive until it has run.
  return h.events.erase(event) == 1 ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  auto e = find_event(event);
  StreamPtr s = resolve(stream);
  if (!e || !s) return fail(cudaErrorInvalidResourceHandle);
  std::uint64_t ticket;
  {
    Hidden hidden;
    std::lock_guard lock(e->m);
    ticket = ++e->recorded;
    e->device = s->device;
  }
  return push(s,
              {"cudaEventRecord",
               [e, ticket] {
                 tsan_release(&e->token);
                 Hidden hidden;
                 std::lock_guard lock(e->m);
                 e->reached = std::max(e->reached, ticket);
                 e->at = Clock::now();
                 e->cv.notify_all();
               }},
              true);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  auto e = find_event(event);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  const std::uint64_t ticket = e->recorded_so_far();
  int device;
  {
    Hidden hidden;  // "not ready" orders nothing
    std::lock_guard lock(e->m);
    if (e->reached < ticket) return cudaErrorNotReady;
    device = e->device;
  }
  tsan_acquire(&e->token);  // "done" orders the host after the work before the record
  return device >= 0 ? sticky(device) : cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  auto e = find_event(event);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  const std::uint64_t ticket = e->recorded_so_far();
  int device;
  {
    Hidden hidden;
    std::unique_lock lock(e->m);
    e->cv.wait(lock, [&] { return e->reached >= ticket; });
    device = e->device;
  }
  tsan_acquire(&e->token);
  const cudaError_t error = device >= 0 ? sticky(device) : cudaSuccess;
  return error != cudaSuccess ? fail(error) : error;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  auto a = find_event(start), b = find_event(end);
  if (ms == nullptr) return fail(cudaErrorInvalidValue);
  if (!a || !b || !a->timing || !b->timing) return fail(cudaErrorInvalidResourceHandle);
  if (a == b) {
    *ms = 0;
    return cudaSuccess;
  }
  Hidden hidden;  // timing only
  std::scoped_lock lock(a->m, b->m);
  if (a->recorded == 0 || b->recorded == 0) return fail(cudaErrorInvalidResourceHandle);
  if (a->reached < a->recorded || b->reached < b->recorded) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return cudaSuccess;
}
