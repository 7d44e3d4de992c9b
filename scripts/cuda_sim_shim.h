// Host emulation of the CUDA features and launch.cuh helpers that the GEMM and
// conv2d kernels use, for scripts/sim_matmul_kernel.sh and
// scripts/sim_conv2d_kernels.sh: one std::thread per CUDA thread, a std::barrier
// for __syncthreads, blocks run one after another (so a function-static array
// is the block's shared memory), warp shuffles through a shared buffer. Every
// launch's grid is logged (sim_grids) and a test may hook in after each launch
// (sim_after_launch) and reach the newest scratch buffer (sim_last_scratch), to
// see which plan ran and to tamper with partial sums in control cases.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>
#include "engine/allocator.h"
#include "engine/error.h"
#include "engine/stream.h"

struct sim_dim3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline thread_local sim_dim3 threadIdx, blockIdx;
inline sim_dim3 gridDim, blockDim;
inline std::barrier<>* sim_barrier = nullptr;
inline float sim_xchg[1024];
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __forceinline__ inline
inline void __syncthreads() {
  sim_barrier->arrive_and_wait();
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return unsigned((uint64_t(a) * b) >> 32);
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
inline int min(int a, int b) {
  return a < b ? a : b;
}
inline int max(int a, int b) {
  return a > b ? a : b;
}
struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) {
  return {a, b, c, d};
}
inline float __shfl_down_sync(unsigned, float v, int offset) {
  int t = int(threadIdx.x);
  sim_xchg[t] = v;
  __syncthreads();
  int lane = t % 32;
  float r = lane + offset < 32 ? sim_xchg[t + offset] : v;
  __syncthreads();
  return r;
}
// The lane-0 result of launch.cuh's warp_sum: the xor butterfly over 32 values.
inline float sim_butterfly(float* v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    float next[32];
    for (int lane = 0; lane < 32; ++lane) next[lane] = v[lane] + v[lane ^ offset];
    std::copy(next, next + 32, v);
  }
  return v[0];
}
// launch.cuh's block_sum, the same tree (each warp's butterfly, then warp 0's over
// the warp sums), computed by thread 0 from the shared exchange buffer.
template <int kBlock, typename V>
V block_sum(V v) {
  static_assert(kBlock % 32 == 0 && kBlock <= 1024);
  const int t = int(threadIdx.x);
  sim_xchg[t] = v;
  __syncthreads();
  V result = V(0);
  if (t == 0) {
    float warp_sums[32] = {};
    for (int w = 0; w < kBlock / 32; ++w) {
      float lanes[32];
      std::copy(sim_xchg + 32 * w, sim_xchg + 32 * w + 32, lanes);
      warp_sums[w] = sim_butterfly(lanes);
    }
    result = sim_butterfly(warp_sums);
  }
  __syncthreads();
  return result;
}
typedef void* cudaStream_t;
enum { cudaDevAttrMultiProcessorCount = 16 };
extern int sim_sms;
inline int cudaDeviceGetAttribute(int* v, int, int) {
  *v = sim_sms;
  return 0;
}
#define TL_CUDA_CHECK(x) (void)(x)
#define TL_CUDA_CHECK_LAUNCH() (void)0
namespace towerlab {
struct CudaDeviceGuard {
  explicit CudaDeviceGuard(int) {}
};
}  // namespace towerlab
namespace towerlab::simcuda {
inline cudaStream_t native(const Stream& s) {
  return s.native_handle();
}
inline void* sim_last_scratch = nullptr;
inline std::size_t sim_last_scratch_bytes = 0;
// launch.cuh's Scratch, over the host allocator of the simulated stream's device.
class Scratch {
 public:
  Scratch(const Stream& stream, std::size_t bytes)
      : allocator_(device_allocator(stream.device())),
        ptr_(allocator_.allocate(bytes, native(stream))) {
    sim_last_scratch = ptr_, sim_last_scratch_bytes = bytes;
  }
  ~Scratch() { allocator_.deallocate(ptr_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  Allocator& allocator_;
  void* ptr_;
};
constexpr int kBlockSize = 256;
inline int sm_count(int) {
  return sim_sms;
}
// Two blocks per SM where launch.cuh gives 32: every kernel launched with it is
// a grid-stride loop, which fewer blocks check as well (each thread takes
// several elements) with a sixteenth of the host threads.
inline unsigned grid_for(std::int64_t n, const Stream&, int block = kBlockSize) {
  const std::int64_t wanted = (n + block - 1) / block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(wanted, 1, std::int64_t{2} * sim_sms));
}
extern long sim_blocks_run;
inline std::vector<sim_dim3> sim_grids;                    // every launch's grid, in order
inline std::function<void(std::size_t)> sim_after_launch;  // called with the launch's index
template <class F, class... Args>
void sim_launch(F kernel, dim3 grid, unsigned block, Args... args) {
  gridDim = {grid.x, grid.y, grid.z};
  blockDim = {block, 1, 1};
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::barrier<> bar(block);
        sim_barrier = &bar;
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < block; ++t)
          threads.emplace_back([&, t] {
            threadIdx = {t, 0, 0};
            blockIdx = {x, y, z};
            kernel(args...);
          });
        for (auto& th : threads) th.join();
        ++sim_blocks_run;
      }
  sim_grids.push_back({grid.x, grid.y, grid.z});
  if (sim_after_launch) sim_after_launch(sim_grids.size() - 1);
}
}  // namespace towerlab::simcuda
