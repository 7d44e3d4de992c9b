// CUB on the emulated GPUs (include/cub/device/device_reduce.cuh): the templates are
// in the header; what they queue goes through here, checked as a kernel launch is
// (src/block.cpp): at the call, the stream; when it runs, the memory it touches.
#include <cub/device/device_reduce.cuh>

#include "internal.h"

namespace tlemu::detail {
namespace {

// Why `span` is not memory a kernel on `device` may touch; "" when it is.
std::string span_problem(const DeviceSpan& span, int device) {
  if (span.bytes == 0) return "";
  if (span.p == nullptr) return "null";
  auto a = find_allocation(span.p, span.bytes);
  if (!a) {
    if (find_allocation(span.p, 1)) {
      return describe_pointer(span.p) + ", and its " + std::to_string(span.bytes) +
             " bytes run past the allocation's end";
    }
    return describe_pointer(span.p);
  }
  if (a->device >= 0 && !peer_enabled(device, a->device)) {
    return describe_pointer(span.p) + ", and peer access from cuda:" + std::to_string(device) +
           " to cuda:" + std::to_string(a->device) + " is not enabled";
  }
  return "";
}

// What the stream's worker runs: the kernel's checks, then the algorithm.
void run_checked(const char* what, int device, const std::vector<DeviceSpan>& spans,
                 const std::function<void()>& run) {
  if (take_kernel_fault(device)) {
    raise_sticky(device, cudaErrorIllegalAddress,
                 std::string(what) + ": an injected fault (tlemu::fault_kernel)");
    return;
  }
  for (const DeviceSpan& span : spans) {
    if (const std::string problem = span_problem(span, device); !problem.empty()) {
      raise_sticky(device, cudaErrorIllegalAddress,
                   std::string(what) + " on cuda:" + std::to_string(device) + ": " + span.name +
                       " is " + problem);
      return;
    }
  }
  run();
  count_kernel(1, 1);
}

}  // namespace

cudaError_t queue_device_algorithm(const char* what, cudaStream_t stream,
                                   std::vector<DeviceSpan> spans, std::function<void()> run) {
  const int device = stream_device(stream);
  if (device < 0) {
    return fail(cudaErrorInvalidResourceHandle,
                std::string(what) + ": the stream is not a live stream");
  }
  if (device != current_device()) {
    return fail(cudaErrorInvalidResourceHandle,
                std::string(what) + ": queued on a stream of cuda:" + std::to_string(device) +
                    " while the current device is cuda:" + std::to_string(current_device()));
  }
  const cudaError_t e =
      enqueue(stream, {what, [what, device, spans = std::move(spans), run = std::move(run)] {
                         run_checked(what, device, spans, run);
                       }});
  return e != cudaSuccess ? fail(e) : e;
}

}  // namespace tlemu::detail
