#!/usr/bin/env bash
# Builds and runs every test: the default build (CUDA when nvcc is found; CUDA
# cases skip without a GPU), the CPU-only build, the CPU-only build under
# AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer included; any report
# fails the test), the threaded tests under ThreadSanitizer, the host simulators of
# the CUDA kernels (scripts/sim_*.sh), each libFuzzer target
# for a short run, and a program that embeds towerlab through find_package() and
# through add_subdirectory().
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
  ctest --preset "$preset" -j "$jobs" "$@"
}

run_preset release
[ "${1:-}" = "--quick" ] && exit 0
# The PyTorch round trip (a minute of training in PyTorch) runs once, in the default build.
run_preset cpu -E 'torch_convert'
run_preset asan
# The tests that run threads: towers, the ring, synchronized batch norm, the thread
# pool (and the GEMM on it), determinism, two trainers side by side, the ranks of a
# job as threads (MultiRank: a trainer per rank meeting in a thread process group,
# and the job's trace). A report makes the test exit non-zero (halt_on_error),
# which fails it.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
run_preset tsan -R 'Trainer|Ring|NumericGuard|Determinism|ThreadPool|Concurrency|MatmulCpu|BadInput|MultiRank'

# The CUDA kernels on the host, for machines without a GPU: indexing, edge guards,
# barriers and warp-synchronous code under AddressSanitizer and ThreadSanitizer,
# compared with the CPU backend (each script's header says what it proves, and what not).
echo "== host simulators of the CUDA kernels"
time bash scripts/sim_matmul_kernel.sh build/release
time bash scripts/sim_conv2d_kernels.sh build/release
time bash scripts/sim_kernels.sh build/cpu

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
