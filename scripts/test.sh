#!/usr/bin/env bash
# Builds and runs every test: the default build (CUDA when nvcc is found: every .cu
# compiles for sm_90, and its CUDA cases skip without a GPU), the CPU-only build,
# the CUDA backend on emulated GPUs (emulator/) under AddressSanitizer +
# UndefinedBehaviorSanitizer (LeakSanitizer included; every GPU tensor its own
# exact-size heap block; the CPU cases too, so it stands in for a CPU-only ASan
# build) with the emulator's controls, the threaded tests under ThreadSanitizer,
# each libFuzzer target for a short run, and a program that embeds towerlab through
# find_package() and through add_subdirectory().
# Usage: scripts/test.sh [--quick]   (--quick: the default build's tests only)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh

jobs=$(nproc)
run_preset() {
  local preset=$1
  shift
  echo "== ${preset}: configure, build, test"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  ctest --preset "$preset" -j "$jobs" --output-junit "$PWD/build/$preset-ctest.xml" "$@"
}

run_preset release
[ "${1:-}" = "--quick" ] && exit 0
# The PyTorch round trip (a minute of training in PyTorch) runs once, in the default build.
run_preset cpu -E 'torch_convert'
# The emulated GPUs (TOWERLAB_EMULATED_GPUS devices, 2 by default; the emulator's
# own tests set 4): every CUDA case runs, and the run says how many did.
export TOWERLAB_EXACT_ALLOCATIONS=1
run_preset emulated-asan -E 'torch_convert'
python3 scripts/count_cuda_cases.py build/emulated-asan-ctest.xml
# The kernels' launch plans for a GPU of 8 SMs too (grids that wrap, other splits of
# the GEMM's K and of the per-channel reductions).
TOWERLAB_EMULATED_SMS=8 ctest --preset emulated-asan -j "$jobs" -R 'cuda0|Cuda' \
  -E 'Trainer|Ring|Determinism|ReadOrder|Stream|Nccl|MultiRank|Bucket|Tensor|Safetensors|Error'
unset TOWERLAB_EXACT_ALLOCATIONS
# The tests that run threads: towers, the ring, synchronized batch norm, the thread
# pool (and the GEMM on it), determinism, two trainers side by side, the ranks of a
# job as threads (MultiRank: a trainer per rank meeting in a thread process group,
# and the job's trace). A report makes the test exit non-zero (halt_on_error), which
# fails it. (The same on the emulated GPUs, streams included, is the emulated-tsan
# preset: below, only its emulator tests and controls run.)
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
run_preset tsan -R 'Trainer|Ring|NumericGuard|Determinism|ThreadPool|Concurrency|MatmulCpu|BadInput|MultiRank'

# The emulator's own tests and its controls under ThreadSanitizer: a missing
# __syncthreads or __syncwarp, the host reading a buffer before its copy, a ring
# reading gradients without the towers' event and an allocator handing a block to
# another stream without its event must each be reported, their twins pass.
echo "== emulated-tsan: the emulator's tests and controls"
cmake --preset emulated-tsan >/dev/null
cmake --build --preset emulated-tsan -j "$jobs" --target emulator_tests emulator_controls
ctest --preset emulated-tsan -j "$jobs" -R '^Emulator'

echo "== fuzz: every target for 30 s from its seed corpus and regression inputs"
bash scripts/fuzz.sh 30

echo "== embedding: find_package(towerlab) from an installed copy"
rm -rf build/install build/consumer-installed build/consumer-subdir
cmake --install build/cpu --prefix build/install >/dev/null
cmake -S tests/consumer -B build/consumer-installed -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/consumer-installed >/dev/null
build/consumer-installed/consumer

echo "== embedding: add_subdirectory(towerlab)"
cmake -S tests/consumer -B build/consumer-subdir -G Ninja -DTOWERLAB_SOURCE_DIR="$PWD" -DTOWERLAB_CUDA=OFF >/dev/null
cmake --build build/consumer-subdir >/dev/null
build/consumer-subdir/consumer
echo "== all tests passed"
