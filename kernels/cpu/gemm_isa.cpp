// Which micro-kernel the CPU GEMM runs: the ISAs this CPU has (CPUID, at run time,
// never the build machine's), the choice (the best one, or TOWERLAB_GEMM_ISA, or
// set_gemm_isa) and the bfloat16 kernel's (set_bf16_gemm_kernel, TOWERLAB_BF16_GEMM), behind
// engine/settings.h's public functions. The kernels are kernels/cpu/gemm_kernels.cpp's
// and kernels/cpu/gemm_bf16.cpp's; the entry points (kernels/cpu/matmul.cpp,
// kernels/cpu/gemm_packed.cpp) read the choice once a call, and the other CPU
// kernels' vector code follows it (kernels/cpu/x86.h).
#include <atomic>
#include <cctype>
#include <string>

#include "engine/error.h"
#include "engine/settings.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_blocked.h"
#include "kernels/cpu/x86.h"

namespace towerlab::cpu {

namespace {

bool cpu_has(GemmIsa isa) {
#if TL_CPU_X86
  __builtin_cpu_init();  // safe to repeat; needed if we run before libgcc's constructors
#endif
  switch (isa) {
    case GemmIsa::Auto:
    case GemmIsa::Portable:
      return true;
#if TL_CPU_X86
    case GemmIsa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case GemmIsa::Avx512:
      return __builtin_cpu_supports("avx512f");
#endif
    default:
      return false;
  }
}

GemmIsa best_isa() {
  if (cpu_has(GemmIsa::Avx512)) return GemmIsa::Avx512;
  if (cpu_has(GemmIsa::Avx2)) return GemmIsa::Avx2;
  return GemmIsa::Portable;
}

const char* isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::Auto:
      return "Auto";
    case GemmIsa::Portable:
      return "Portable";
    case GemmIsa::Avx2:
      return "Avx2";
    case GemmIsa::Avx512:
      return "Avx512";
  }
  return "?";
}

// The environment may pin the kernel (TOWERLAB_GEMM_ISA=portable|avx2|avx512),
// e.g. to rule one out on a new machine; an unknown name, or an ISA this CPU lacks,
// warns once and leaves the automatic choice (engine/settings.h).
GemmIsa initial_isa() {
  const auto wanted =
      detail::environment_choice("TOWERLAB_GEMM_ISA", {"portable", "avx2", "avx512"});
  if (!wanted) return best_isa();
  for (GemmIsa isa : {GemmIsa::Portable, GemmIsa::Avx2, GemmIsa::Avx512}) {
    std::string lower = isa_name(isa);
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (*wanted != lower) continue;
    if (cpu_has(isa)) return isa;
    detail::warn_about_environment("TOWERLAB_GEMM_ISA", *wanted, "is not supported by this CPU");
  }
  return best_isa();
}

// Whether Auto takes vdpbf16ps: where it issues at the float32 FMAs' rate, so that its
// 32 multiply-adds an instruction against an FMA's 16 double the GEMM's peak. AMD's
// cores with avx512_bf16 run it so (measured on Zen 5; Zen 4 is taken on the same
// rule); the Intel Xeon measured ran it at a quarter of that rate, below the widening
// path (docs/kernels.md). The rule reads CPUID only, never a timing, so one machine
// always gets the same bits.
bool vdpbf16ps_pays() {
#if TL_CPU_X86
  return cpu_has_avx512_bf16() && __builtin_cpu_is("amd");
#else
  return false;
#endif
}

// TOWERLAB_BF16_GEMM=auto|widen|avx512bf16 sets the initial bfloat16 kernel, as
// TOWERLAB_GEMM_ISA does the float32 one; avx512bf16 on a CPU without it warns once
// and leaves Auto.
Bf16GemmKernel initial_bf16_kernel() {
  const auto wanted =
      detail::environment_choice("TOWERLAB_BF16_GEMM", {"auto", "widen", "avx512bf16"});
  if (wanted == "widen") return Bf16GemmKernel::Widen;
  if (wanted == "avx512bf16") {
    if (cpu_has_avx512_bf16()) return Bf16GemmKernel::Avx512Bf16;
    detail::warn_about_environment("TOWERLAB_BF16_GEMM", *wanted,
                                   "is not supported by this CPU (no avx512_bf16)");
  }
  return Bf16GemmKernel::Auto;
}

std::atomic<Bf16GemmKernel>& selected_bf16_kernel() {
  static std::atomic<Bf16GemmKernel> kernel{initial_bf16_kernel()};
  return kernel;
}

}  // namespace

namespace gemm_detail {

std::atomic<GemmIsa>& selected_isa() {
  static std::atomic<GemmIsa> isa{initial_isa()};
  return isa;
}

bool bf16_dot_selected() {
  switch (selected_bf16_kernel().load(std::memory_order_relaxed)) {
    case Bf16GemmKernel::Avx512Bf16:
      return true;
    case Bf16GemmKernel::Auto:
      // Auto follows the float32 ISA too: a GEMM held to AVX2 or portable code
      // (set_gemm_isa, TOWERLAB_GEMM_ISA) widens.
      return selected_isa().load(std::memory_order_relaxed) == GemmIsa::Avx512 && vdpbf16ps_pays();
    default:
      return false;
  }
}

}  // namespace gemm_detail

}  // namespace towerlab::cpu

namespace towerlab {

bool gemm_isa_supported(GemmIsa isa) {
  return cpu::cpu_has(isa);
}

void set_gemm_isa(GemmIsa isa) {
  TL_CHECK(cpu::cpu_has(isa), NotSupported,
           "set_gemm_isa: this CPU does not support the " << cpu::isa_name(isa) << " GEMM kernel");
  cpu::gemm_detail::selected_isa().store(isa == GemmIsa::Auto ? cpu::best_isa() : isa);
}

GemmIsa gemm_isa() {
  return cpu::gemm_detail::selected_isa().load();
}

bool bf16_gemm_kernel_supported(Bf16GemmKernel kernel) {
  return kernel != Bf16GemmKernel::Avx512Bf16 || cpu::cpu_has_avx512_bf16();
}

void set_bf16_gemm_kernel(Bf16GemmKernel kernel) {
  TL_CHECK(bf16_gemm_kernel_supported(kernel), NotSupported,
           "set_bf16_gemm_kernel: this CPU does not report avx512_bf16 (vdpbf16ps); Widen and "
           "Auto run everywhere");
  cpu::selected_bf16_kernel().store(kernel);
}

Bf16GemmKernel bf16_gemm_kernel() {
  return cpu::selected_bf16_kernel().load();
}

bool bf16_gemm_runs_vdpbf16ps() {
  return cpu::gemm_detail::bf16_dot_selected();
}

}  // namespace towerlab
