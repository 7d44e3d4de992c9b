// The emulated devices: configuration from the environment, the current device of
// each host thread, errors (the thread's last error and each device's sticky one),
// properties, counters, fault injection, and the sanitizer annotations the other
// parts use.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "internal.h"

#ifdef TLEMU_TSAN
#include <sanitizer/tsan_interface.h>
extern "C" {
void AnnotateIgnoreSyncBegin(const char* file, int line);
void AnnotateIgnoreSyncEnd(const char* file, int line);
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
}
#endif

namespace tlemu::detail {

// --- ThreadSanitizer ----------------------------------------------------------------------

#ifdef TLEMU_TSAN
Hidden::Hidden() {
  AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
}
Hidden::~Hidden() {
  AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
}
void tsan_release(const void* token) {
  __tsan_release(const_cast<void*>(token));
}
void tsan_acquire(const void* token) {
  __tsan_acquire(const_cast<void*>(token));
}
#else
Hidden::Hidden() = default;
Hidden::~Hidden() = default;
void tsan_release(const void*) {}
void tsan_acquire(const void*) {}
#endif

namespace {

// "512M", "2G", "1048576": bytes, or 0 when the text is not such a number.
std::size_t parse_bytes(const char* text) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text, &end, 10);
  if (end == text) return 0;
  std::size_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = std::size_t{1} << 10, ++end;
  if (*end == 'M' || *end == 'm') scale = std::size_t{1} << 20, ++end;
  if (*end == 'G' || *end == 'g') scale = std::size_t{1} << 30, ++end;
  return *end == '\0' ? static_cast<std::size_t>(n) * scale : 0;
}

[[noreturn]] void bad_environment(const char* name, const char* value, const char* expected) {
  std::fprintf(stderr, "emulated GPU: %s=%s: expected %s\n", name, value, expected);
  std::exit(2);
}

Config read_environment() {
  Config c;
  if (const char* s = std::getenv("TOWERLAB_EMULATED_GPUS")) {
    char* end = nullptr;
    const long n = std::strtol(s, &end, 10);
    if (end == s || *end != '\0' || n < 1 || n > kMaxDevices)
      bad_environment("TOWERLAB_EMULATED_GPUS", s, "a device count from 1 to 8");
    c.devices = static_cast<int>(n);
  }
  if (const char* s = std::getenv("TOWERLAB_EMULATED_MEMORY")) {
    c.memory_bytes = parse_bytes(s);
    if (c.memory_bytes == 0)
      bad_environment("TOWERLAB_EMULATED_MEMORY", s, "bytes per device, e.g. 512M or 2G");
  }
  if (const char* s = std::getenv("TOWERLAB_EMULATED_SMS")) {
    char* end = nullptr;
    const long n = std::strtol(s, &end, 10);
    if (end == s || *end != '\0' || n < 1 || n > 1024)
      bad_environment("TOWERLAB_EMULATED_SMS", s, "a multiprocessor count from 1 to 1024");
    c.multiprocessors = static_cast<int>(n);
  }
  if (const char* s = std::getenv("TOWERLAB_EMULATED_PEER")) {
    if (std::strcmp(s, "0") != 0 && std::strcmp(s, "1") != 0)
      bad_environment("TOWERLAB_EMULATED_PEER", s, "0 (refuse peer access) or 1");
    c.peer_access = s[0] == '1';
  }
  return c;
}

struct DeviceState {
  std::atomic<int> sticky{cudaSuccess};
  std::atomic<std::size_t> memory_cap{0};
  std::atomic<int> allocation_fault{0};       // fail the nth allocation from now (0: none)
  std::atomic<int> allocation_fault_more{0};  // and this many right after it
  std::atomic<int> kernel_fault{0};
};

struct State {
  Config config = read_environment();
  std::atomic<bool> peer_access{config.peer_access};
  DeviceState devices[kMaxDevices];
  std::atomic<int> any_device_allocation_fault{0};
  std::atomic<int> any_device_allocation_fault_more{0};
  std::atomic<std::uint64_t> kernels{0}, blocks{0}, threads{0}, copies{0};
  State() {
    for (auto& d : devices) d.memory_cap = config.memory_bytes;
  }
};

State& state() {
  static State s;
  return s;
}

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current = 0;

// Counts a pending fault down; true when this call is the one it names.
bool take(std::atomic<int>& countdown) {
  int n = countdown.load();
  while (n > 0 && !countdown.compare_exchange_weak(n, n - 1)) {
  }
  return n == 1;
}

}  // namespace

cudaError_t fail(cudaError_t error) {
  if (error != cudaSuccess) last_error = error;
  return error;
}
cudaError_t fail(cudaError_t error, const std::string& why) {
  std::fprintf(stderr, "emulated GPU: %s: %s\n", cudaGetErrorName(error), why.c_str());
  return fail(error);
}

const Config& settings() {
  return state().config;
}
int device_count() {
  return state().config.devices;
}
bool valid_device(int device) {
  return device >= 0 && device < device_count();
}
int current_device() {
  return current;
}

cudaError_t sticky(int device) {
  if (!valid_device(device)) return cudaSuccess;
  return static_cast<cudaError_t>(state().devices[device].sticky.load());
}

void raise_sticky(int device, cudaError_t error, const std::string& why) {
  int expected = cudaSuccess;
  if (state().devices[device].sticky.compare_exchange_strong(expected, error)) {
    std::fprintf(stderr, "emulated GPU: cuda:%d: %s: %s\n", device, cudaGetErrorName(error),
                 why.c_str());
  }
}

void count_kernel(std::uint64_t blocks, std::uint64_t threads) {
  ++state().kernels;
  state().blocks += blocks;
  state().threads += threads;
}
void count_copy() {
  ++state().copies;
}

// A run of faults: the countdown to its first, then the ones that follow it.
bool take_run(std::atomic<int>& countdown, std::atomic<int>& more) {
  if (take(countdown)) return true;
  if (countdown.load() != 0) return false;  // the first is still ahead
  int n = more.load();
  while (n > 0 && !more.compare_exchange_weak(n, n - 1)) {
  }
  return n > 0;
}

bool take_allocation_fault(int device) {
  return take_run(state().any_device_allocation_fault, state().any_device_allocation_fault_more) ||
         take_run(state().devices[device].allocation_fault,
                  state().devices[device].allocation_fault_more);
}
bool take_kernel_fault(int device) {
  return take(state().devices[device].kernel_fault);
}

void set_memory_cap(int device, std::size_t bytes) {
  state().devices[device].memory_cap = bytes;
}

bool peer_access_allowed() {
  return state().peer_access;
}

std::size_t memory_cap(int device) {
  return state().devices[device].memory_cap;
}

}  // namespace tlemu::detail

// --- the emulator's controls ---------------------------------------------------------------

namespace tlemu {

using namespace detail;

Config config() {
  Config c = settings();
  c.peer_access = state().peer_access;
  return c;
}
void set_memory_limit(int device, std::size_t bytes) {
  if (valid_device(device)) set_memory_cap(device, bytes);
}
void set_peer_access_allowed(bool allowed) {
  state().peer_access = allowed;
}
void fail_allocation(int nth, int device, int times) {
  const int more = std::max(times - 1, 0);
  if (device < 0) {
    state().any_device_allocation_fault_more = more;
    state().any_device_allocation_fault = nth;
  } else if (valid_device(device)) {
    state().devices[device].allocation_fault_more = more;
    state().devices[device].allocation_fault = nth;
  }
}
void fault_kernel(int nth, int device) {
  if (valid_device(device)) state().devices[device].kernel_fault = nth;
}
void delay_stream(cudaStream_t stream, std::chrono::milliseconds delay) {
  set_stream_delay(stream, delay);
}
void clear_faults() {
  for (int d = 0; d < device_count(); ++d) synchronize_device(d);
  for (auto& d : state().devices) {
    d.sticky = cudaSuccess;
    d.allocation_fault = 0;
    d.allocation_fault_more = 0;
    d.kernel_fault = 0;
    d.memory_cap = settings().memory_bytes;
  }
  state().any_device_allocation_fault = 0;
  state().any_device_allocation_fault_more = 0;
  last_error = cudaSuccess;
}
void reset() {
  clear_faults();
  state().peer_access = settings().peer_access;
  reset_peer_access();
}
Counters counters() {
  return {state().kernels, state().blocks, state().threads, state().copies};
}
cudaError_t sticky_error(int device) {
  return detail::sticky(device);
}

}  // namespace tlemu

// --- the runtime API: errors and devices ------------------------------------------------------

using namespace tlemu::detail;

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
#define TLEMU_NAME(e) \
  case e:             \
    return #e;
    TLEMU_NAME(cudaSuccess)
    TLEMU_NAME(cudaErrorInvalidValue)
    TLEMU_NAME(cudaErrorMemoryAllocation)
    TLEMU_NAME(cudaErrorInitializationError)
    TLEMU_NAME(cudaErrorInvalidConfiguration)
    TLEMU_NAME(cudaErrorInvalidDevicePointer)
    TLEMU_NAME(cudaErrorInvalidMemcpyDirection)
    TLEMU_NAME(cudaErrorInvalidResourceHandle)
    TLEMU_NAME(cudaErrorNoDevice)
    TLEMU_NAME(cudaErrorInvalidDevice)
    TLEMU_NAME(cudaErrorNotReady)
    TLEMU_NAME(cudaErrorIllegalAddress)
    TLEMU_NAME(cudaErrorLaunchFailure)
    TLEMU_NAME(cudaErrorPeerAccessUnsupported)
    TLEMU_NAME(cudaErrorPeerAccessAlreadyEnabled)
    TLEMU_NAME(cudaErrorPeerAccessNotEnabled)
    TLEMU_NAME(cudaErrorUnknown)
#undef TLEMU_NAME
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorNotReady:
      return "device not ready";
    default:
      return cudaGetErrorName(error);
  }
}

cudaError_t cudaGetLastError() {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  if (e == cudaSuccess) e = sticky(current);
  return e;
}

cudaError_t cudaPeekAtLastError() {
  return last_error != cudaSuccess ? last_error : sticky(current);
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = current;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!valid_device(device)) {
    return fail(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) +
                                            "): " + std::to_string(device_count()) + " devices");
  }
  current = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "towerlab emulated H100 (cuda:%d)", device);
  // The same UUID for the same index in every process, as one machine's GPUs have.
  std::memcpy(prop->uuid.bytes, "tlemu-emulated-", 15);
  prop->uuid.bytes[15] = static_cast<char>(device);
  prop->totalGlobalMem = memory_cap(device);
  prop->sharedMemPerBlock = 48 << 10;
  prop->sharedMemPerMultiprocessor = 228 << 10;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = settings().multiprocessors;
  prop->l2CacheSize = 50 << 20;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->unifiedAddressing = 1;
  prop->memoryBusWidth = 5120;
  prop->pciBusID = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, device);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = p.maxThreadsPerBlock;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(p.sharedMemPerBlock);
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = p.warpSize;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = p.multiProcessorCount;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = p.major;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = p.minor;
      return cudaSuccess;
  }
  return fail(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceSynchronize() {
  const cudaError_t e = synchronize_device(current);
  return e != cudaSuccess ? fail(e) : e;
}

cudaError_t cudaDeviceReset() {
  synchronize_device(current);
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) {
  return cudaRuntimeGetVersion(version);
}
