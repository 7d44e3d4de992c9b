// Controls: each planted bug must be reported by the detector that exists to catch
// it, and each correct twin must pass silently. The emulated build is only worth
// its CI minutes if its detectors work, so a control that stays silent fails CI
// (emulator/tests/expect_report.cmake checks each run's exit status and output).
//
//   controls NAME
//
// Under ThreadSanitizer (a report exits with status 66):
//   missing-syncthreads    threads read a neighbour's shared write with no barrier
//   missing-syncwarp       lanes read a neighbour's shared write with no __syncwarp
//   host-read-before-sync  the host reads a pinned buffer an async copy is filling
//   ring-without-wait      a ring all-reduce reads gradients the towers' streams are
//                          still writing: the tower -> ring event is left out
//   handover-without-event the caching allocator hands a block to another stream
//                          without making it wait for the block's owner
// Under AddressSanitizer (exit status 1):
//   write-past-end         a kernel writes one element past its tensor
// In every build (the emulator's own checks, exit status 86):
//   divergent-barrier, shuffle-exited-lane, shuffle-divergent, shuffle-outside-mask,
//   async-copy-misaligned  a 16-byte __pipeline_memcpy_async from a 4-byte aligned source
//   mma-divergent          half the warp in mma.sync, the other half at a barrier
//   mma-exited-lane        mma.sync after a lane of the warp returned
//   mma-two-call-sites     the two halves of the warp in mma.sync at different lines
//   mma-beside-shuffle     half the warp in mma.sync, the other half in a shuffle
//   mma-partial-warp       mma.sync in a block of 16 threads
//   ldmatrix-misaligned    ldmatrix row addresses 2 bytes past a 16-byte boundary
//   ldmatrix-outside-shared  ldmatrix row addresses in global memory
// Correct twins, which must exit 0 with no report: syncthreads, syncwarp,
// host-read-after-sync, ring, handover, write-within, mma, ldmatrix.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/stream.h"
#include "engine/tensor.h"
#include "kernels/cuda/tensor_core.cuh"
#include "kernels/elementwise.h"
#include "parallel/ring_allreduce.h"
#include "tlemu/emulator.h"

// Where the host's read goes: a plain global that other files could see (a volatile
// access is not checked by GCC's ThreadSanitizer, and a store nobody can read is
// optimized away).
extern float tlemu_controls_read_back;
float tlemu_controls_read_back = 0.0f;

namespace {

using namespace std::chrono_literals;
using towerlab::Device;
using towerlab::Stream;
using towerlab::Tensor;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "controls: %s: %s\n", what, cudaGetErrorName(e));
    std::exit(3);
  }
}

// --- block and warp synchronization ------------------------------------------------

// y[t] = t's neighbour's value, passed through shared memory.
__global__ void rotate_kernel(float* y, bool barrier) {
  __shared__ float tile[64];
  const unsigned t = threadIdx.x;
  tile[t] = static_cast<float>(t);
  if (barrier) __syncthreads();
  y[t] = tile[(t + 1) % blockDim.x];
}

__global__ void rotate_in_warp_kernel(float* y, bool syncwarp) {
  __shared__ float tile[32];
  const unsigned lane = threadIdx.x;
  tile[lane] = static_cast<float>(lane);
  // A shuffle exchanges a value but orders no memory: it does not stand in for
  // __syncwarp.
  const float unused = __shfl_xor_sync(0xffffffffu, tile[lane], 1);
  (void)unused;
  if (syncwarp) __syncwarp();
  y[lane] = tile[(lane + 1) % 32];
}

void rotate(bool barrier) {
  float* y = nullptr;
  check(cudaMalloc(&y, 64 * sizeof(float)), "cudaMalloc");
  rotate_kernel<<<1, 64>>>(y, barrier);
  check(cudaDeviceSynchronize(), "rotate_kernel");
  cudaFree(y);
}

void rotate_in_warp(bool syncwarp) {
  float* y = nullptr;
  check(cudaMalloc(&y, 32 * sizeof(float)), "cudaMalloc");
  rotate_in_warp_kernel<<<1, 32>>>(y, syncwarp);
  check(cudaDeviceSynchronize(), "rotate_in_warp_kernel");
  cudaFree(y);
}

__global__ void divergent_barrier_kernel() {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
}

__global__ void shuffle_exited_lane_kernel(float* y) {
  if (threadIdx.x == 5) return;
  y[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1);
}

// Half the warp shuffles while the other half waits at a barrier: neither completes.
__global__ void shuffle_divergent_kernel(float* y) {
  if (threadIdx.x < 16) {
    y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  } else {
    __syncthreads();
  }
}

__global__ void shuffle_outside_mask_kernel(float* y) {
  if (threadIdx.x < 16) y[threadIdx.x] = __shfl_sync(0x0000ffffu, 1.0f, 20);
}

template <typename Launch>
void run_kernel_bug(Launch launch) {
  float* y = nullptr;
  check(cudaMalloc(&y, 32 * sizeof(float)), "cudaMalloc");
  launch(y);
  cudaDeviceSynchronize();
  std::fprintf(stderr, "controls: the kernel bug went unreported\n");
}

// A correct twin's kernel: it must run, and report nothing.
template <typename Launch>
void run_kernel(Launch launch) {
  float* y = nullptr;
  check(cudaMalloc(&y, 32 * sizeof(float)), "cudaMalloc");
  launch(y);
  check(cudaDeviceSynchronize(), "the kernel");
  cudaFree(y);
}

// --- the host and a stream --------------------------------------------------------------

void host_read(bool synchronize) {
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  float *device = nullptr, *pinned = nullptr;
  check(cudaMalloc(&device, 1024 * sizeof(float)), "cudaMalloc");
  check(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 1024 * sizeof(float), 0), "cudaHostAlloc");
  check(cudaMemsetAsync(device, 0, 1024 * sizeof(float), s), "cudaMemsetAsync");
  tlemu::delay_stream(s, 20ms);
  check(cudaMemcpyAsync(pinned, device, 1024 * sizeof(float), cudaMemcpyDeviceToHost, s),
        "cudaMemcpyAsync");
  if (synchronize) check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  tlemu_controls_read_back = pinned[0];  // before the copy has run, unless synchronized
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  cudaFreeHost(pinned);
  cudaFree(device);
  cudaStreamDestroy(s);
}

// --- towers and the ring ---------------------------------------------------------------

// Two towers on cuda:0 and cuda:1 write their gradients on their own streams; the
// ring reduces them on its own streams, after an event from each tower (or not).
void towers_then_ring(bool wait) {
  const std::vector<Device> devices = {Device::cuda(0), Device::cuda(1)};
  std::vector<Stream> towers, comm;
  std::vector<Tensor> grads;
  for (Device d : devices) {
    towers.emplace_back(d);
    comm.emplace_back(d);
  }
  for (int i = 0; i < 2; ++i) grads.push_back(Tensor::zeros({4096}, towers[i]));
  for (auto& s : towers) s.synchronize();
  towerlab::Ring ring({&comm[0], &comm[1]});
  for (int i = 0; i < 2; ++i) {
    tlemu::delay_stream(static_cast<cudaStream_t>(towers[i].native_handle()), 20ms);
    towerlab::fill(grads[i], 1.0 + i, towers[i]);  // the tower's backward, in miniature
    if (wait) {
      towerlab::Event done(devices[i]);
      done.record(towers[i]);
      comm[i].wait(done);
    }
  }
  ring.allreduce(grads);
  for (auto& s : comm) s.synchronize();
  const std::vector<float> sum = grads[0].to_host<float>(comm[0]);
  if (sum[0] != 3.0f) std::fprintf(stderr, "controls: the ring summed %g, not 3\n", sum[0]);
}

// --- the caching allocator's handover between streams --------------------------------

// cudaMalloc'd segments; wait_stream orders the waiter after the owner with an
// event, unless `planted`, which leaves the event out.
class HandoverBackend final : public towerlab::MemoryBackend {
 public:
  explicit HandoverBackend(bool planted) : planted_(planted) {}
  void* raw_allocate(std::size_t bytes) noexcept override {
    void* p = nullptr;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
  }
  void raw_free(void* p) noexcept override { cudaFree(p); }
  std::size_t total_memory() const override { return std::size_t{4} << 20; }
  void wait_stream(void* waiter, void* owner) override {
    if (planted_) return;
    cudaEvent_t e;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(e, static_cast<cudaStream_t>(owner)), "cudaEventRecord");
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), e, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(e);
  }
  std::string name() const override { return "handover"; }

 private:
  bool planted_;
};

__global__ void write_kernel(int n, float* y, float value) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = value;
}

void handover(bool planted) {
  towerlab::MemoryOptions options;
  options.limit_bytes = std::size_t{2} << 20;  // one segment: the second stream must take it over
  towerlab::Allocator allocator(std::make_unique<HandoverBackend>(planted), options);
  cudaStream_t a, b;
  check(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "cudaStreamCreate");
  const int n = 1 << 18;
  auto* first = static_cast<float*>(allocator.allocate(n * sizeof(float), a));
  tlemu::delay_stream(a, 20ms);
  write_kernel<<<4, 256, 0, a>>>(n, first, 1.0f);
  allocator.deallocate(first);  // a's work on it is queued; the block stays a's
  auto* second = static_cast<float*>(allocator.allocate(n * sizeof(float), b));
  write_kernel<<<4, 256, 0, b>>>(n, second, 2.0f);
  check(cudaStreamSynchronize(b), "cudaStreamSynchronize");
  check(cudaStreamSynchronize(a), "cudaStreamSynchronize");
  allocator.deallocate(second);
  allocator.release_stream(a);
  allocator.release_stream(b);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// --- an asynchronous copy that hardware would fault on --------------------------------------

__global__ void async_copy_misaligned_kernel(float* y) {
  __shared__ __align__(16) float s[4];
  __pipeline_memcpy_async(s, y + 1, 16);  // cp.async of 16 bytes needs a 16-byte aligned source
  __pipeline_commit();
  __pipeline_wait_prior(0);
  y[0] = s[0];
}

// --- tensor-core instructions that hardware leaves undefined --------------------------------

enum class MmaMisuse { none, divergent, exited_lane, two_call_sites, beside_shuffle };

// One mma.sync of zeros by the warp, or the planted misuse.
__global__ void mma_kernel(float* y, MmaMisuse misuse) {
  const std::uint32_t a[4] = {}, b[2] = {};
  const float c[4] = {};
  float d[4] = {};
  const unsigned lane = threadIdx.x % 32;
  if (misuse == MmaMisuse::exited_lane && lane == 5) return;
  if (misuse == MmaMisuse::divergent && lane >= 16) {
    __syncthreads();
  } else if (misuse == MmaMisuse::beside_shuffle && lane >= 16) {
    d[0] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  } else if (misuse == MmaMisuse::two_call_sites && lane >= 16) {
    towerlab::cuda::mma_m16n8k16_bf16(d, a, b, c);
  } else {
    towerlab::cuda::mma_m16n8k16_bf16(d, a, b, c);
  }
  y[threadIdx.x] = d[0];
}

// ldmatrix.x4 of rows in shared memory, `offset` bytes past their 16-byte boundary, or
// of rows in global memory.
__global__ void ldmatrix_kernel(float* y, int offset, bool global_rows) {
  __shared__ __align__(16) std::uint16_t rows[32 * 16];
  for (int e = threadIdx.x; e < 32 * 16; e += blockDim.x) rows[e] = 0;
  __syncthreads();
  const char* row = global_rows ? reinterpret_cast<const char*>(y + threadIdx.x % 8 * 4)
                                : reinterpret_cast<const char*>(&rows[threadIdx.x * 16]) + offset;
  std::uint32_t r[4];
  towerlab::cuda::ldmatrix_x4(r, row);
  y[threadIdx.x] = static_cast<float>(r[0] + r[3]);
}

// --- a kernel past its tensor's end ------------------------------------------------------

__global__ void write_n_kernel(int n, float* y) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = 1.0f;
}

// With exact blocks (TOWERLAB_EXACT_ALLOCATIONS=1), the tensor is its own heap block.
void write_tensor(int past_end) {
  Stream stream(Device::cuda(0));
  Tensor t = Tensor::empty({100}, stream);
  check(cudaSetDevice(0), "cudaSetDevice");
  write_n_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream.native_handle())>>>(
      static_cast<int>(t.numel()) + past_end, t.data<float>());
  stream.synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, std::function<void()>> controls = {
      {"syncthreads", [] { rotate(true); }},
      {"missing-syncthreads", [] { rotate(false); }},
      {"syncwarp", [] { rotate_in_warp(true); }},
      {"missing-syncwarp", [] { rotate_in_warp(false); }},
      {"host-read-after-sync", [] { host_read(true); }},
      {"host-read-before-sync", [] { host_read(false); }},
      {"ring", [] { towers_then_ring(true); }},
      {"ring-without-wait", [] { towers_then_ring(false); }},
      {"handover", [] { handover(false); }},
      {"handover-without-event", [] { handover(true); }},
      {"write-within", [] { write_tensor(0); }},
      {"write-past-end", [] { write_tensor(1); }},
      {"divergent-barrier",
       [] { run_kernel_bug([](float*) { divergent_barrier_kernel<<<1, 32>>>(); }); }},
      {"shuffle-exited-lane",
       [] { run_kernel_bug([](float* y) { shuffle_exited_lane_kernel<<<1, 32>>>(y); }); }},
      {"shuffle-divergent",
       [] { run_kernel_bug([](float* y) { shuffle_divergent_kernel<<<1, 32>>>(y); }); }},
      {"shuffle-outside-mask",
       [] { run_kernel_bug([](float* y) { shuffle_outside_mask_kernel<<<1, 32>>>(y); }); }},
      {"async-copy-misaligned",
       [] { run_kernel_bug([](float* y) { async_copy_misaligned_kernel<<<1, 1>>>(y); }); }},
      {"mma", [] { run_kernel([](float* y) { mma_kernel<<<1, 32>>>(y, MmaMisuse::none); }); }},
      {"mma-divergent",
       [] { run_kernel_bug([](float* y) { mma_kernel<<<1, 32>>>(y, MmaMisuse::divergent); }); }},
      {"mma-exited-lane",
       [] { run_kernel_bug([](float* y) { mma_kernel<<<1, 32>>>(y, MmaMisuse::exited_lane); }); }},
      {"mma-two-call-sites",
       [] {
         run_kernel_bug([](float* y) { mma_kernel<<<1, 32>>>(y, MmaMisuse::two_call_sites); });
       }},
      {"mma-beside-shuffle",
       [] {
         run_kernel_bug([](float* y) { mma_kernel<<<1, 32>>>(y, MmaMisuse::beside_shuffle); });
       }},
      {"mma-partial-warp",
       [] { run_kernel_bug([](float* y) { mma_kernel<<<1, 16>>>(y, MmaMisuse::none); }); }},
      {"ldmatrix", [] { run_kernel([](float* y) { ldmatrix_kernel<<<1, 32>>>(y, 0, false); }); }},
      {"ldmatrix-misaligned",
       [] { run_kernel_bug([](float* y) { ldmatrix_kernel<<<1, 32>>>(y, 2, false); }); }},
      {"ldmatrix-outside-shared",
       [] { run_kernel_bug([](float* y) { ldmatrix_kernel<<<1, 32>>>(y, 0, true); }); }},
  };
  auto it = argc == 2 ? controls.find(argv[1]) : controls.end();
  if (it == controls.end()) {
    std::fprintf(stderr, "usage: controls NAME (see emulator/tests/controls.cu)\n");
    return 2;
  }
  it->second();
  std::printf("controls: %s ran to the end\n", argv[1]);
  return 0;
}
