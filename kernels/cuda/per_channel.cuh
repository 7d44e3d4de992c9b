// Helpers for per-channel kernels on x viewed as [N,C,S] (S = H*W): batch norm
// and bias add. Two access patterns:
//   - elementwise with a per-channel operand: a grid-stride loop over all N*C*S
//     elements that tracks each element's channel (ChannelTracker);
//   - per-channel reduction: a grid of (splits, C) blocks, block (j, c) summing
//     the j-th contiguous range of channel c's N*S values (ChannelRange), the
//     block partials combined by a second, tiny kernel in a fixed order (so the
//     result is the same bits run after run, no atomics).
// Both walk x in units of V, float or float4: when S % 4 == 0 and every buffer is
// 16-byte aligned (use_float4), a float4 never straddles two channel rows, so the
// kernels run on x viewed as [N,C,S/4] float4s (one 128-bit load or store per
// four values, a quarter of the index arithmetic) and apply their per-value
// operation to each component (map, each below); otherwise V = float.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "engine/allocator.h"
#include "kernels/cuda/launch.cuh"

namespace towerlab::cuda {

// The channel of flat index i = (n*C + c)*S + s as i advances by a fixed stride,
// without a division per element: the stride is split once into whole channels
// and a remainder, and the position within the channel carries over.
struct ChannelTracker {
  std::int64_t s, c;    // i % S and (i / S) % C
  std::int64_t ds, dc;  // stride % S and (stride / S) % C
  std::int64_t S, C;

  __host__ __device__ ChannelTracker(std::int64_t i, std::int64_t stride, std::int64_t C_,
                                     std::int64_t S_)
      : s(i % S_), c((i / S_) % C_), ds(stride % S_), dc((stride / S_) % C_), S(S_), C(C_) {}

  __host__ __device__ void advance() {
    s += ds;
    c += dc;
    if (s >= S) {
      s -= S;
      ++c;
    }
    if (c >= C) c -= C;  // c < 2C here, so one subtraction is enough
  }
};

// The k-th value of channel c (k = n*S + s, k in [0, N*S)) lives at offset
// (n*C + c)*S + s. ChannelRange walks k = begin, begin + step, ... keeping that
// offset, with the same carry trick as ChannelTracker.
struct ChannelRange {
  std::int64_t offset, s;
  std::int64_t d_offset, ds;  // offset and s increments for one step
  std::int64_t S, CS;

  __host__ __device__ ChannelRange(std::int64_t k, std::int64_t step, std::int64_t c,
                                   std::int64_t C, std::int64_t S_)
      : S(S_), CS(C * S_) {
    const std::int64_t n = k / S;
    s = k - n * S;
    offset = n * CS + c * S + s;
    ds = step % S;
    d_offset = (step / S) * CS + ds;
  }

  __host__ __device__ void advance() {
    offset += d_offset;
    s += ds;
    if (s >= S) {  // crossed into the next sample's row of this channel
      s -= S;
      offset += CS - S;
    }
  }

  // The inverse of advance(): the offset of k - step.
  __host__ __device__ void retreat() {
    offset -= d_offset;
    s -= ds;
    if (s < 0) {  // crossed back into the previous sample's row
      s += S;
      offset -= CS - S;
    }
  }
};

// Loads in flight per thread. A grid-stride loop that loads one value, uses it
// and moves on keeps a single load per warp outstanding, too few to cover DRAM
// latency at full bandwidth (Little's law); so each thread issues kUnroll
// independent loads before using any of them.
constexpr int kUnroll = 4;

// Elementwise over x [N,C,S] flattened (n = N*C*S values) with each element's
// channel: value = load(i) for kUnroll elements of this thread, then
// store(i, value, c) for each. All loads of a step come before its stores, which
// also keeps in-place use (an output aliasing an input) correct.
template <typename Load, typename Store>
__device__ void for_each_with_channel(std::int64_t n, std::int64_t C, std::int64_t S, Load load,
                                      Store store) {
  const std::int64_t start = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  ChannelTracker ch(start, stride, C, S);
  for (std::int64_t i = start; i < n; i += kUnroll * stride) {
    decltype(load(i)) value[kUnroll];
    std::int64_t channel[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t j = i + u * stride;
      channel[u] = ch.c;
      ch.advance();
      if (j < n) value[u] = load(j);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t j = i + u * stride;
      if (j < n) store(j, value[u], channel[u]);
    }
  }
}

// The block's share of channel c's values k in [begin, end): value = load(offset)
// for kUnroll values of this thread, then add(value) for each.
template <typename Load, typename Add>
__device__ void for_each_in_channel_range(std::int64_t begin, std::int64_t end, std::int64_t c,
                                          std::int64_t C, std::int64_t S, Load load, Add add) {
  const std::int64_t step = blockDim.x;
  ChannelRange r(begin + threadIdx.x, step, c, C, S);
  for (std::int64_t k = begin + threadIdx.x; k < end; k += kUnroll * step) {
    decltype(load(r.offset)) value[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k + u * step < end) value[u] = load(r.offset);
      r.advance();
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k + u * step < end) add(value[u]);
    }
  }
}

// As for_each_in_channel_range, with two steps of kUnroll loads in flight: the
// loads of step m + 1 are issued before the values of step m are used. The
// plain walk waits for each step's loads to come back before it issues the
// next, so a short range (a dozen float4s a thread when the whole grid is one
// resident wave) spends a full memory round trip per step with nothing in
// flight behind it; here each wait overlaps the next step's transfer. Two
// buffers a and b alternate (no copy between them: a copy would wait for the
// loads). The values are added in the same order as the plain walk.
template <typename Load, typename Add>
__device__ void for_each_in_channel_range_pipelined(std::int64_t begin, std::int64_t end,
                                                    std::int64_t c, std::int64_t C, std::int64_t S,
                                                    Load load, Add add) {
  const std::int64_t step = blockDim.x;
  ChannelRange r(begin + threadIdx.x, step, c, C, S);
  using V = decltype(load(r.offset));
  V a[kUnroll], b[kUnroll];
  // Loads step k (its first value k) into buffer v, leaving r at step k + kUnroll * step.
  const auto fetch = [&](V* v, std::int64_t k) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k + u * step < end) v[u] = load(r.offset);
      r.advance();
    }
  };
  const auto use = [&](const V* v, std::int64_t k) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k + u * step < end) add(v[u]);
    }
  };
  const std::int64_t stride = kUnroll * step;
  std::int64_t k = begin + threadIdx.x;
  if (k >= end) return;
  fetch(a, k);
  while (true) {
    if (k + stride < end) fetch(b, k + stride);
    use(a, k);
    k += stride;
    if (k >= end) return;
    if (k + stride < end) fetch(a, k + stride);
    use(b, k);
    k += stride;
    if (k >= end) return;
  }
}

// The block's share of channel c's values k in [begin, end), last step first:
// value = load(offset) for kUnroll values of this thread, then store(offset,
// value) for each. Thread t takes k = begin + t + m*blockDim.x for m from the
// last row down to 0, every thread of a warp on the same row m (coalesced).
// An elementwise pass after a reduction over the same split walks each range
// this way so that it starts on the values the reduction read last, the ones
// still in L2.
template <typename Load, typename Store>
__device__ void for_each_in_channel_range_reversed(std::int64_t begin, std::int64_t end,
                                                   std::int64_t c, std::int64_t C, std::int64_t S,
                                                   Load load, Store store) {
  const std::int64_t step = blockDim.x;
  const std::int64_t rows = (end - begin + step - 1) / step;
  if (rows <= 0) return;
  const std::int64_t last = begin + threadIdx.x + (rows - 1) * step;
  ChannelRange r(last, step, c, C, S);
  for (std::int64_t k = last; k >= begin; k -= kUnroll * step) {
    decltype(load(r.offset)) value[kUnroll];
    std::int64_t offset[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t j = k - u * step;
      offset[u] = r.offset;
      if (j >= begin && j < end) value[u] = load(r.offset);
      r.retreat();
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t j = k - u * step;
      if (j >= begin && j < end) store(offset[u], value[u]);
    }
  }
}

// As for_each_in_channel_range_reversed, with two steps of kSteps loads in
// flight (as for_each_in_channel_range_pipelined): step m + 1's loads are issued
// before step m's stores. A second cursor w retraces r's walk one step behind it
// for the stores' offsets (the two share their increments, so it costs two
// registers of position where a table of kUnroll offsets a buffer would cost
// sixteen). Each value is stored by the thread that loaded it and every load of
// a value precedes its store, so y may alias x.
template <int kSteps, typename Load, typename Store>
__device__ void for_each_in_channel_range_reversed_pipelined(std::int64_t begin, std::int64_t end,
                                                             std::int64_t c, std::int64_t C,
                                                             std::int64_t S, Load load,
                                                             Store store) {
  const std::int64_t step = blockDim.x;
  const std::int64_t rows = (end - begin + step - 1) / step;
  if (rows <= 0) return;
  std::int64_t k = begin + threadIdx.x + (rows - 1) * step;
  ChannelRange r(k, step, c, C, S);
  ChannelRange w = r;
  using V = decltype(load(r.offset));
  V a[kSteps], b[kSteps];
  const auto fetch = [&](V* v, std::int64_t first) {
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const std::int64_t j = first - u * step;
      if (j >= begin && j < end) v[u] = load(r.offset);
      r.retreat();
    }
  };
  const auto put = [&](const V* v, std::int64_t first) {
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const std::int64_t j = first - u * step;
      if (j >= begin && j < end) store(w.offset, v[u]);
      w.retreat();
    }
  };
  const std::int64_t stride = kSteps * step;
  fetch(a, k);
  while (true) {
    if (k - stride >= begin) fetch(b, k - stride);
    put(a, k);
    k -= stride;
    if (k < begin) return;
    if (k - stride >= begin) fetch(a, k - stride);
    put(b, k);
    k -= stride;
    if (k < begin) return;
  }
}

// Threads per block of the per-channel reduction kernels; their block sums are
// block_sum<kReduceBlock> (launch.cuh).
constexpr int kReduceBlock = 256;

// Blocks per SM the reduction grid is sized for (splits_for); the partial kernels
// declare it in __launch_bounds__, which holds them to 64 registers a thread so
// that this many fit.
constexpr int kReduceBlocksPerSm = 4;

// How many blocks to split each channel's `per_channel` units over: at most
// blocks_per_sm (kReduceBlocksPerSm unless a kernel of more registers, two
// streams or more, shares the split) blocks per SM over all C channels (rounded
// down), so that the
// whole grid is resident at once and no SM runs a lone second wave; four blocks of
// threads with kUnroll float4 loads each keep 64 KiB in flight per SM, several
// times what DRAM latency asks. At least one unrolled step (kUnroll units) per
// thread.
inline std::int64_t splits_for(std::int64_t C, std::int64_t per_channel, int device,
                               int blocks_per_sm = kReduceBlocksPerSm) {
  const std::int64_t wanted = blocks_per_sm * std::int64_t{sm_count(device)} / C;
  const std::int64_t most = (per_channel + kUnroll * kReduceBlock - 1) / (kUnroll * kReduceBlock);
  return std::clamp<std::int64_t>(std::min(wanted, most), 1, 65535);
}

// The plan of a per-channel reduction over x [N,C,S]: each channel's N*S values
// cut into `splits` ranges of `chunk` (the last one shorter), block (c, j) of a
// (C, splits) grid summing range j of channel c into partial [C, splits] at
// partial_index(); a C-thread kernel then adds each channel's partials in the
// order j = 0, 1, ... Launched by launch_channel_split, which passes the plan to
// the kernel as its first argument.
struct ChannelSplit {
  std::int64_t C, S;
  std::int64_t per_channel;  // N*S
  std::int64_t splits, chunk;

  __device__ std::int64_t channel() const { return blockIdx.x; }
  __device__ std::int64_t split() const { return blockIdx.y; }
  __device__ std::int64_t begin() const { return split() * chunk; }
  __device__ std::int64_t end() const { return min(per_channel, begin() + chunk); }
  __device__ std::int64_t partial_index() const { return channel() * splits + split(); }
};

inline ChannelSplit channel_split(std::int64_t N, std::int64_t C, std::int64_t S,
                                  const Stream& stream, int blocks_per_sm = kReduceBlocksPerSm) {
  const std::int64_t per_channel = N * S;
  const std::int64_t splits = splits_for(C, per_channel, stream.device().index, blocks_per_sm);
  return {C, S, per_channel, splits, (per_channel + splits - 1) / splits};
}

// The block's share of its channel under `split`: for_each_in_channel_range over
// [split.begin(), split.end()) of split.channel().
template <typename Load, typename Add>
__device__ void for_each_in_split(const ChannelSplit& split, Load load, Add add) {
  for_each_in_channel_range(split.begin(), split.end(), split.channel(), split.C, split.S, load,
                            add);
}

// for_each_in_channel_range_pipelined over the block's share under `split`.
template <typename Load, typename Add>
__device__ void for_each_in_split_pipelined(const ChannelSplit& split, Load load, Add add) {
  for_each_in_channel_range_pipelined(split.begin(), split.end(), split.channel(), split.C, split.S,
                                      load, add);
}

// for_each_in_channel_range_reversed over the block's share under `split`.
template <typename Load, typename Store>
__device__ void for_each_in_split_reversed(const ChannelSplit& split, Load load, Store store) {
  for_each_in_channel_range_reversed(split.begin(), split.end(), split.channel(), split.C, split.S,
                                     load, store);
}

// for_each_in_channel_range_reversed_pipelined over the block's share under `split`.
template <int kSteps, typename Load, typename Store>
__device__ void for_each_in_split_reversed_pipelined(const ChannelSplit& split, Load load,
                                                     Store store) {
  for_each_in_channel_range_reversed_pipelined<kSteps>(split.begin(), split.end(), split.channel(),
                                                       split.C, split.S, load, store);
}

// Launches kernel(split, args...) on the (C, splits) grid of kReduceBlock threads.
// As launch_grid_stride, the arguments convert to the kernel's parameter types
// here, so a mismatch is a compile error at the call site.
template <typename... Params>
void launch_channel_split(void (*kernel)(ChannelSplit, Params...), const ChannelSplit& split,
                          const Stream& stream, std::type_identity_t<Params>... args) {
  CudaDeviceGuard guard(stream.device().index);
  const dim3 grid(static_cast<unsigned>(split.C), static_cast<unsigned>(split.splits));
  kernel<<<grid, kReduceBlock, 0, native(stream)>>>(split, args...);
  TL_CUDA_CHECK_LAUNCH();
}

// --- float or float4 units ------------------------------------------------------

// Whether x [N,C,S] and the buffers walked with it can be taken in float4s: S a
// multiple of 4 (a float4 stays within one channel row) and every buffer 16-byte
// aligned (views may start at any element). Null buffers do not count.
inline bool use_float4(std::int64_t S, std::initializer_list<const void*> buffers) {
  if (S % 4 != 0) return false;
  for (const void* p : buffers) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// Floats per unit V.
template <typename V>
constexpr std::int64_t kWidth = sizeof(V) / sizeof(float);

// Unit i of a float buffer viewed as V.
template <typename V>
__device__ __forceinline__ const V& unit(const float* p, std::int64_t i) {
  return reinterpret_cast<const V*>(p)[i];
}
template <typename V>
__device__ __forceinline__ V& unit(float* p, std::int64_t i) {
  return reinterpret_cast<V*>(p)[i];
}

// Unit i of a float, bfloat16 or float16 buffer as V (float or float4): a float
// buffer is read and written as V directly (unit above); a 16-bit one is widened
// exactly on load (the four values from 4i for a float4) and rounded once to
// nearest even on store (engine/half.h), so a kernel templated on the storage type
// computes in float32 whatever it stores.
template <typename V, typename T>
__device__ __forceinline__ V load_unit(const T* p, std::int64_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return unit<V>(p, i);
  } else if constexpr (std::is_same_v<V, float>) {
    return static_cast<float>(p[i]);
  } else {
    const T* q = p + 4 * i;
    return make_float4(static_cast<float>(q[0]), static_cast<float>(q[1]), static_cast<float>(q[2]),
                       static_cast<float>(q[3]));
  }
}
template <typename T, typename V>
__device__ __forceinline__ void store_unit(T* p, std::int64_t i, V v) {
  if constexpr (std::is_same_v<T, float>) {
    unit<V>(p, i) = v;
  } else if constexpr (std::is_same_v<V, float>) {
    p[i] = T(v);
  } else {
    T* q = p + 4 * i;
    q[0] = T(v.x);
    q[1] = T(v.y);
    q[2] = T(v.z);
    q[3] = T(v.w);
  }
}

// f applied to each component of one, two or three units (component-wise map).
template <typename F>
__device__ __forceinline__ float map(F f, float a) {
  return f(a);
}
template <typename F>
__device__ __forceinline__ float4 map(F f, float4 a) {
  return make_float4(f(a.x), f(a.y), f(a.z), f(a.w));
}
template <typename F>
__device__ __forceinline__ float map(F f, float a, float b) {
  return f(a, b);
}
template <typename F>
__device__ __forceinline__ float4 map(F f, float4 a, float4 b) {
  return make_float4(f(a.x, b.x), f(a.y, b.y), f(a.z, b.z), f(a.w, b.w));
}
template <typename F>
__device__ __forceinline__ float map(F f, float a, float b, float c) {
  return f(a, b, c);
}
template <typename F>
__device__ __forceinline__ float4 map(F f, float4 a, float4 b, float4 c) {
  return make_float4(f(a.x, b.x, c.x), f(a.y, b.y, c.y), f(a.z, b.z, c.z), f(a.w, b.w, c.w));
}

// f called on each component of one or two units, in the order x, y, z, w (a
// reduction adding them keeps a fixed order).
template <typename F>
__device__ __forceinline__ void each(F f, float a) {
  f(a);
}
template <typename F>
__device__ __forceinline__ void each(F f, float4 a) {
  f(a.x);
  f(a.y);
  f(a.z);
  f(a.w);
}
template <typename F>
__device__ __forceinline__ void each(F f, float a, float b) {
  f(a, b);
}
template <typename F>
__device__ __forceinline__ void each(F f, float4 a, float4 b) {
  f(a.x, b.x);
  f(a.y, b.y);
  f(a.z, b.z);
  f(a.w, b.w);
}

// Two and three units loaded together (a load step's value).
template <typename V>
struct Units2 {
  V a, b;
};
template <typename V>
struct Units3 {
  V a, b, c;
};

}  // namespace towerlab::cuda
