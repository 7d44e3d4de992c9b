// TL_HOST_DEVICE marks a function that host code and CUDA kernels both call (the
// 16-bit conversions of engine/half.h, the generator of engine/philox.h), so the two
// run the same code and cannot differ: __host__ __device__ under nvcc; nothing for
// host compilers and for the emulated GPUs, which compile the .cu files as C++.
#pragma once

#if defined(__CUDACC__)
#define TL_HOST_DEVICE __host__ __device__
#else
#define TL_HOST_DEVICE
#endif
