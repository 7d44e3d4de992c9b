// Process-wide settings, all of them in one place.
//
// Everything else in towerlab belongs to an object the caller owns (a Trainer, a
// Tape, a Stream, a VariableStore), so two trainers in one process never share
// state. These few govern a resource the whole process shares, and so are
// process-wide functions rather than options of a Trainer:
//
//   set_memory_options(device, options)   the device's caching allocator: a cap
//       (a share of the device's memory, or bytes) and whether memory is reserved as
//       it is needed or the whole cap at once (TensorFlow's
//       per_process_gpu_memory_fraction and allow_growth). Every trainer, tape and
//       tensor on that device allocates under the one cap.
//   set_num_threads(n)                    how many host threads a CPU kernel may
//       spread over (engine/thread_pool.h), shared by every CPU tower.
//   set_gemm_backend(backend)             towerlab's kernel or cuBLAS for float32
//       GEMM on CUDA devices (cuBLAS for comparison).
//   set_gemm_isa(isa)                     the CPU GEMM's vector micro-kernel;
//       TOWERLAB_GEMM_ISA=portable|avx2|avx512 in the environment sets the initial
//       one.
//   set_bf16_gemm_kernel(kernel)          the CPU's bfloat16 GEMM: vdpbf16ps, or
//       the values widened to float32 for the float32 kernel;
//       TOWERLAB_BF16_GEMM=auto|widen|avx512bf16 sets the initial one.
//   set_conv2d_algorithm(algorithm)       how float32 conv2d computes (im2col or
//       Winograd on the CPU, the implicit GEMM or Winograd on CUDA);
//       TOWERLAB_CONV2D_ALGORITHM=auto|im2col|winograd in the environment sets the
//       initial one.
//
// Each has a getter, may be called from any thread, and takes effect for work
// submitted after it returns. Set them once, before the trainers are made: a
// setting changed while another thread trains changes that training too.
//
// The environment. TOWERLAB_GEMM_ISA, TOWERLAB_BF16_GEMM, TOWERLAB_CONV2D_ALGORITHM and
// TOWERLAB_EXACT_ALLOCATIONS (1 or 0) are read once, when the setting is first
// used. A value that is not one of the variable's choices (a misspelling, an ISA
// this CPU lacks) leaves the default in place and prints one line on stderr naming
// the variable, the value and the choices, once per variable: a run that meant to
// pin a setting does not quietly measure another. (TOWERLAB_MPI_DEADLINE_S, an
// option of parallel/cluster.h, throws for a malformed value instead.)
#pragma once

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "device.h"

namespace towerlab {

// --- memory -----------------------------------------------------------------
struct MemoryOptions {
  double fraction = 1.0;        // (0, 1]: share of the device's total memory
  std::size_t limit_bytes = 0;  // optional absolute cap; 0 = none. The smaller cap wins.
  bool allow_growth = true;
  // Every allocation its own segment of exactly the requested size, given back when
  // freed: no caching, so an access past a tensor's end is an access past a heap
  // block (AddressSanitizer on the CPU and the emulated GPUs, compute-sanitizer on
  // a GPU) instead of a read of the cache's next block. Slow (each free waits for
  // the device): for sanitizer runs. TOWERLAB_EXACT_ALLOCATIONS=1 turns it on for
  // every GPU's allocator.
  bool exact_blocks = false;
};

// Cached segments are released first; throws InvalidArgument for a fraction
// outside (0, 1], a cap below what the device has in use or a change of
// exact_blocks while a tensor is alive on the device, DeviceError for a device that
// is not present.
void set_memory_options(Device device, const MemoryOptions& options);
MemoryOptions memory_options(Device device);

// --- host threads -------------------------------------------------------------
// Total threads a CPU kernel's parallel_for may use, the caller included (>= 1).
int num_threads();
// Sets that number; 0 restores the default (std::thread::hardware_concurrency).
// Waits for any parallel_for in flight on other threads to finish. Throws
// InvalidArgument for a negative n or when called from inside a parallel_for chunk.
void set_num_threads(int n);

// --- GEMM -------------------------------------------------------------------
// Which code runs float32 GEMM on CUDA devices: towerlab's kernel (the default) or
// cuBLAS (TF32 off). A call already in flight finishes with the backend it started
// with.
enum class GemmBackend { Towerlab, Cublas };
void set_gemm_backend(GemmBackend backend);
GemmBackend gemm_backend();

// The CPU's float32 GEMM picks its vector micro-kernel from the host CPU (AVX-512,
// AVX2+FMA, or portable vector code). Only ISAs this CPU supports can be chosen;
// Auto restores the automatic choice.
enum class GemmIsa { Auto, Portable, Avx2, Avx512 };
bool gemm_isa_supported(GemmIsa isa);
void set_gemm_isa(GemmIsa isa);  // throws NotSupported for an ISA this CPU lacks
GemmIsa gemm_isa();              // the one in use (never Auto)

// The CPU's bfloat16 GEMM (matmul with bfloat16 A and B; kernels/matmul.h):
// Widen converts the values to float32 while packing for gemm_isa()'s float32
// kernel (float16 always takes it); Avx512Bf16 runs the vdpbf16ps kernel, and
// throws NotSupported on a CPU without avx512_bf16. Auto runs vdpbf16ps where it
// pays: an AMD CPU with avx512_bf16 (the Zen 5 measured issues it at the FMAs' rate,
// twice their multiply-adds) while gemm_isa() is Avx512; it widens elsewhere (on the
// Intel Xeon measured, vdpbf16ps issued at a quarter of the FMAs' rate;
// docs/kernels.md). The two paths agree within matmul's tolerance, not bit for bit.
// TOWERLAB_BF16_GEMM=auto|widen|avx512bf16 in the environment sets the initial one.
enum class Bf16GemmKernel { Auto, Widen, Avx512Bf16 };
bool bf16_gemm_kernel_supported(Bf16GemmKernel kernel);
void set_bf16_gemm_kernel(Bf16GemmKernel kernel);
Bf16GemmKernel bf16_gemm_kernel();  // the setting, Auto included
bool bf16_gemm_runs_vdpbf16ps();    // what the setting runs now, on this CPU

// --- conv2d -----------------------------------------------------------------
// How the CPU's float32 conv2d computes its three passes (float64 always lowers
// with im2col: it serves the gradient checks). Auto takes Winograd (the forward and
// input gradient F(4x4,3x3) with 32 or more channels each side, F(2x2,3x3) below;
// the weight gradient F(3x3,2x2); kernels/cpu/winograd.h) where it applies and pays
// (all three passes of 3x3 layers with 16 or more input and output channels), im2col or
// the implicit weight gradient elsewhere; Im2col and Winograd force one for all
// three, for tests and benchmarks (a forced Winograd still lowers the shapes it
// cannot do). kernels/cpu/conv2d.h's
// ScopedConv2dAlgorithm sets it for a scope. On CUDA devices the same setting
// chooses between the implicit GEMM (Im2col) and Winograd F(4x4,3x3) for all three
// passes; there Auto chooses each pass on its own (kernels/cuda/conv2d_winograd.h).
enum class Conv2dAlgorithm { Auto, Im2col, Winograd };
void set_conv2d_algorithm(Conv2dAlgorithm algorithm);
Conv2dAlgorithm conv2d_algorithm();

namespace detail {
// The value of environment variable `variable` when it is set (and not empty) and
// one of `choices`. Any other value reads as unset, after a warning on stderr, the
// first time only for each variable.
std::optional<std::string> environment_choice(const char* variable,
                                              std::initializer_list<std::string_view> choices);
// Prints "towerlab: <variable>=<value> <why>; <what happens>" on stderr, the first
// time only for each variable.
void warn_about_environment(const char* variable, std::string_view value, std::string_view why);
}  // namespace detail

}  // namespace towerlab
