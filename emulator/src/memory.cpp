// Device and pinned host memory of the emulated GPUs, copies and fills, and peer
// access.
//
// Every allocation is its own exact-size host block (posix_memalign, 256-byte
// aligned like cudaMalloc's), entered in a registry: pointer -> device, size. So
// AddressSanitizer reports a kernel that steps one element past a tensor, a copy is
// checked against the allocations it touches, and a launch's pointer arguments are
// checked against the device it runs on (src/block.cpp). The registry remembers the
// last freed blocks, so a message can say "freed" rather than "unknown".
//
// Copies follow CUDA's rules for host memory: from pageable host memory the source
// is read before the call returns (the stream copies from a staging buffer); to
// pageable host memory the call returns once the copy has run; with pinned memory
// both directions are asynchronous, so the host must synchronize before it reads.
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <sstream>

#include "internal.h"

namespace tlemu::detail {
namespace {

struct Registry {
  std::mutex m;
  std::map<const char*, Allocation> live;  // by base address
  std::deque<Allocation> freed;            // the most recent, for messages
  std::size_t used[kMaxDevices] = {};
  std::atomic<bool> peer[kMaxDevices][kMaxDevices] = {};
};

// Never destroyed, like the devices' memory it describes: a block nobody freed is
// still reachable at exit, not a host leak.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

std::string device_name(int device) {
  return device < 0 ? std::string("host") : "cuda:" + std::to_string(device);
}

std::string hex(const void* p) {
  std::ostringstream s;
  s << p;
  return s.str();
}

// The allocation whose block contains p (one past the end counts when `end_ok`).
std::optional<Allocation> containing(const std::map<const char*, Allocation>& live, const char* p,
                                     bool end_ok) {
  auto it = live.upper_bound(p);
  if (it == live.begin()) return std::nullopt;
  --it;
  const Allocation& a = it->second;
  if (p < a.base + a.bytes || (end_ok && p == a.base + a.bytes)) return a;
  return std::nullopt;
}

}  // namespace

std::optional<Allocation> find_allocation(const void* p, std::size_t bytes) {
  Hidden hidden;
  Registry& r = registry();
  std::lock_guard lock(r.m);
  const char* c = static_cast<const char*>(p);
  auto a = containing(r.live, c, bytes == 0);
  if (!a || c + bytes > a->base + a->bytes) return std::nullopt;
  return a;
}

std::string describe_pointer(const void* p) {
  Hidden hidden;
  Registry& r = registry();
  std::lock_guard lock(r.m);
  const char* c = static_cast<const char*>(p);
  if (auto a = containing(r.live, c, false)) {
    std::ostringstream s;
    s << (a->device < 0 ? "pinned host memory" : "device memory of " + device_name(a->device))
      << " (byte " << (c - a->base) << " of a " << a->bytes << "-byte allocation)";
    return s.str();
  }
  for (auto it = r.freed.rbegin(); it != r.freed.rend(); ++it) {
    if (c >= it->base && c < it->base + it->bytes) {
      return "freed " + (it->device < 0 ? std::string("pinned host memory")
                                        : "device memory of " + device_name(it->device));
    }
  }
  return "host memory the emulated GPUs did not allocate (" + hex(p) + ")";
}

bool peer_enabled(int from, int to) {
  return from == to || (valid_device(from) && valid_device(to) && registry().peer[from][to]);
}

void reset_peer_access() {
  for (auto& row : registry().peer)
    for (auto& cell : row) cell = false;
}

}  // namespace tlemu::detail

using namespace tlemu::detail;

namespace {

void* allocate_block(std::size_t bytes) {
  void* p = nullptr;
  return posix_memalign(&p, 256, bytes) == 0 ? p : nullptr;
}

void enter(const Allocation& a) {
  Hidden hidden;
  Registry& r = registry();
  std::lock_guard lock(r.m);
  r.live[a.base] = a;
  if (a.device >= 0) r.used[a.device] += a.bytes;
}

// Removes the allocation that starts at p and is of the kind `device_memory` asks
// for; nullopt when there is none.
std::optional<Allocation> leave(const void* p, bool device_memory) {
  Hidden hidden;
  Registry& r = registry();
  std::lock_guard lock(r.m);
  auto it = r.live.find(static_cast<const char*>(p));
  if (it == r.live.end() || (it->second.device >= 0) != device_memory) return std::nullopt;
  const Allocation a = it->second;
  r.live.erase(it);
  if (a.device >= 0) r.used[a.device] -= a.bytes;
  r.freed.push_back(a);
  if (r.freed.size() > 4096) r.freed.pop_front();
  return a;
}

std::size_t used_bytes(int device) {
  Hidden hidden;
  Registry& r = registry();
  std::lock_guard lock(r.m);
  return r.used[device];
}

// Where one side of a copy is.
struct Side {
  bool device = false;  // device memory (else host: pinned or pageable)
  bool pinned = false;
  int index = -1;  // the device, for device memory
};

// Classifies [p, p + bytes) for `call`; an error when p starts inside an
// allocation but the range runs past its end.
cudaError_t classify(const char* call, const char* which, const void* p, std::size_t bytes,
                     Side* side) {
  if (p == nullptr)
    return fail(cudaErrorInvalidValue, std::string(call) + ": " + which + " is null");
  if (auto a = find_allocation(p, bytes)) {
    side->device = a->device >= 0;
    side->pinned = a->device < 0;
    side->index = a->device;
    return cudaSuccess;
  }
  if (find_allocation(p, 1)) {
    return fail(cudaErrorInvalidValue, std::string(call) + ": " + which + " " +
                                           describe_pointer(p) + ": " + std::to_string(bytes) +
                                           " bytes run past the allocation's end");
  }
  // Anything else is pageable host memory. (Freed device memory went back to the host
  // heap and may hold a new host buffer by now; AddressSanitizer reports a copy from
  // a block still in its quarantine.)
  *side = Side{};
  return cudaSuccess;
}

cudaError_t check_kind(const char* call, cudaMemcpyKind kind, const Side& dst, const Side& src) {
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToHost:
      ok = !dst.device && !src.device;
      break;
    case cudaMemcpyHostToDevice:
      ok = dst.device && !src.device;
      break;
    case cudaMemcpyDeviceToHost:
      ok = !dst.device && src.device;
      break;
    case cudaMemcpyDeviceToDevice:
      ok = dst.device && src.device;
      break;
    case cudaMemcpyDefault:
      break;
    default:
      return fail(cudaErrorInvalidMemcpyDirection);
  }
  if (ok) return cudaSuccess;
  return fail(cudaErrorInvalidValue, std::string(call) +
                                         ": the copy's kind does not match its pointers (dst is " +
                                         (dst.device ? "device" : "host") + " memory, src is " +
                                         (src.device ? "device" : "host") + " memory)");
}

// Queues a copy on `stream` with CUDA's rules for pageable host memory.
cudaError_t queue_copy(const char* call, void* dst, const void* src, std::size_t bytes,
                       const Side& dst_side, const Side& src_side, cudaStream_t stream) {
  const bool from_pageable = !src_side.device && !src_side.pinned;
  const bool to_pageable = !dst_side.device && !dst_side.pinned;
  Operation op;
  op.what = call;
  if (from_pageable) {
    // Staged now: the caller may reuse its buffer as soon as the call returns.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    op.run = [dst, staged] {
      std::memcpy(dst, staged->data(), staged->size());
      count_copy();
    };
  } else {
    op.run = [dst, src, bytes] {
      std::memmove(dst, src, bytes);
      count_copy();
    };
  }
  cudaError_t e = enqueue(stream, std::move(op));
  if (e != cudaSuccess) return fail(e);
  if (to_pageable) {
    e = synchronize(stream);
    if (e != cudaSuccess) return fail(e);
  }
  return cudaSuccess;
}

// The synchronous calls: what was queued on the legacy default stream, then a wait
// for that stream.
cudaError_t then_synchronize(cudaError_t queued) {
  if (queued != cudaSuccess) return queued;
  const cudaError_t e = synchronize(0);
  return e != cudaSuccess ? fail(e) : e;
}

}  // namespace

// --- allocation -------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  const int device = current_device();
  if (const cudaError_t e = sticky(device); e != cudaSuccess) return fail(e);
  if (bytes == 0) return cudaSuccess;
  if (take_allocation_fault(device)) return fail(cudaErrorMemoryAllocation);
  if (used_bytes(device) + bytes > memory_cap(device)) return fail(cudaErrorMemoryAllocation);
  void* p = allocate_block(bytes);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  enter({static_cast<const char*>(p), bytes, device});
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  auto a = find_allocation(ptr, 0);
  if (!a || a->base != ptr || a->device < 0) {
    return fail(cudaErrorInvalidValue,
                "cudaFree: " + describe_pointer(ptr) + " is not the start of a device allocation");
  }
  // cudaFree waits for the device, as on hardware: nothing queued may still use the block.
  synchronize_device(a->device);
  leave(ptr, true);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, std::size_t bytes, unsigned) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* p = allocate_block(bytes);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  enter({static_cast<const char*>(p), bytes, -1});
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, std::size_t bytes) {
  return cudaHostAlloc(ptr, bytes, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  if (!leave(ptr, false)) {
    return fail(cudaErrorInvalidValue,
                "cudaFreeHost: " + describe_pointer(ptr) + " is not a pinned host allocation");
  }
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return fail(cudaErrorInvalidValue);
  const int device = current_device();
  const std::size_t cap = memory_cap(device), used = used_bytes(device);
  *total_bytes = cap;
  *free_bytes = used < cap ? cap - used : 0;
  return cudaSuccess;
}

// --- copies and fills ---------------------------------------------------------------------------

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  Side d, s;
  if (cudaError_t e = classify("cudaMemcpyAsync", "dst", dst, bytes, &d); e != cudaSuccess)
    return e;
  if (cudaError_t e = classify("cudaMemcpyAsync", "src", src, bytes, &s); e != cudaSuccess)
    return e;
  if (cudaError_t e = check_kind("cudaMemcpyAsync", kind, d, s); e != cudaSuccess) return e;
  return queue_copy("cudaMemcpyAsync", dst, src, bytes, d, s, stream);
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  return then_synchronize(cudaMemcpyAsync(dst, src, bytes, kind, 0));
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device,
                                std::size_t bytes, cudaStream_t stream) {
  if (!valid_device(dst_device) || !valid_device(src_device)) return fail(cudaErrorInvalidDevice);
  if (bytes == 0) return cudaSuccess;
  Side d, s;
  if (cudaError_t e = classify("cudaMemcpyPeerAsync", "dst", dst, bytes, &d); e != cudaSuccess)
    return e;
  if (cudaError_t e = classify("cudaMemcpyPeerAsync", "src", src, bytes, &s); e != cudaSuccess)
    return e;
  if (!d.device || d.index != dst_device || !s.device || s.index != src_device) {
    return fail(cudaErrorInvalidValue, "cudaMemcpyPeerAsync: dst is " + describe_pointer(dst) +
                                           " (named cuda:" + std::to_string(dst_device) +
                                           "), src is " + describe_pointer(src) +
                                           " (named cuda:" + std::to_string(src_device) + ")");
  }
  // Without peer access the copy is staged through the host; either way it is one
  // ordered operation on `stream`.
  return queue_copy("cudaMemcpyPeerAsync", dst, src, bytes, d, s, stream);
}

cudaError_t cudaMemcpyPeer(void* dst, int dst_device, const void* src, int src_device,
                           std::size_t bytes) {
  return then_synchronize(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, 0));
}

cudaError_t cudaMemsetAsync(void* ptr, int value, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!find_allocation(ptr, bytes)) {
    return fail(cudaErrorInvalidValue, "cudaMemsetAsync of " + std::to_string(bytes) +
                                           " bytes: " + describe_pointer(ptr) +
                                           " is not that much device or pinned memory");
  }
  return enqueue(stream, {"cudaMemsetAsync", [ptr, value, bytes] {
                            std::memset(ptr, value, bytes);
                            count_copy();
                          }});
}

cudaError_t cudaMemset(void* ptr, int value, std::size_t bytes) {
  return then_synchronize(cudaMemsetAsync(ptr, value, bytes, 0));
}

// --- peer access ---------------------------------------------------------------------------------

cudaError_t cudaDeviceCanAccessPeer(int* can_access, int device, int peer_device) {
  if (can_access == nullptr) return fail(cudaErrorInvalidValue);
  if (!valid_device(device) || !valid_device(peer_device)) return fail(cudaErrorInvalidDevice);
  *can_access = device != peer_device && peer_access_allowed() ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer_device, unsigned flags) {
  const int device = current_device();
  if (flags != 0) return fail(cudaErrorInvalidValue);
  if (!valid_device(peer_device) || peer_device == device) return fail(cudaErrorInvalidDevice);
  if (!peer_access_allowed()) {
    return fail(cudaErrorPeerAccessUnsupported, "peer access from cuda:" + std::to_string(device) +
                                                    " to cuda:" + std::to_string(peer_device) +
                                                    " is refused (TOWERLAB_EMULATED_PEER=0)");
  }
  if (registry().peer[device][peer_device].exchange(true))
    return fail(cudaErrorPeerAccessAlreadyEnabled);
  return cudaSuccess;
}

cudaError_t cudaDeviceDisablePeerAccess(int peer_device) {
  const int device = current_device();
  if (!valid_device(peer_device)) return fail(cudaErrorInvalidDevice);
  if (!registry().peer[device][peer_device].exchange(false))
    return fail(cudaErrorPeerAccessNotEnabled);
  return cudaSuccess;
}
