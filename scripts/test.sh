#!/usr/bin/env bash
# Builds and runs every test: the default build (CUDA when nvcc is found: every .cu
# compiles for sm_90, and its CUDA cases skip without a GPU), the CPU-only build,
# the CUDA backend on emulated GPUs (emulator/) under AddressSanitizer +
# UndefinedBehaviorSanitizer (LeakSanitizer included; every GPU tensor its own
# exact-size heap block; the CPU cases too, so it stands in for a CPU-only ASan
# build) with the emulator's controls, the threaded tests on the emulated GPUs under
# ThreadSanitizer (their CPU instances too, so it stands in for a CPU-only TSan
# build), each libFuzzer target for a short run, and a program that embeds towerlab
# through find_package() and through add_subdirectory().
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

# The resume tests kill and restart the sample (2.5 minutes); the cpu build runs them.
if [ "${1:-}" = "--quick" ]; then
  run_preset release
  exit 0
fi
run_preset release -E 'resume'

# The PyTorch round trips and the models' first steps against PyTorch (minutes of
# training in PyTorch, on CPU towers in every build) run once, in the default build.
run_preset cpu -E 'torch_convert|models_vs_torch'
# Four emulated GPUs (the trainer on cuda:0,cuda:1,cuda:2, the two-GPU cases among
# four; the controls and the sample set 2 themselves): every CUDA case runs, and the
# run says how many did.
export TOWERLAB_EXACT_ALLOCATIONS=1
TOWERLAB_EMULATED_GPUS=4 run_preset emulated-asan -E 'torch_convert|models_vs_torch'
python3 scripts/count_cuda_cases.py build/emulated-asan-ctest.xml
# The kernels' launch plans for a GPU of 8 SMs too (grids that wrap, other splits of
# the GEMM's K and of the per-channel reductions).
TOWERLAB_EMULATED_SMS=8 ctest --preset emulated-asan -j "$jobs" -R 'cuda0|Cuda' \
  -E 'Trainer|Ring|Determinism|ReadOrder|Stream|Nccl|MultiRank|Bucket|Tensor|Safetensors|Error'
unset TOWERLAB_EXACT_ALLOCATIONS
# The tests that run threads, under ThreadSanitizer, on two emulated GPUs and on
# the CPU: towers on streams and on host threads, the ring, buckets on comm
# streams, synchronized batch norm, the caching allocator's streams, the thread pool
# (and the GEMM on it), determinism, two trainers side by side, NCCL and the ranks
# of a job as threads (MultiRank), the injected faults; and the emulator's own tests
# and controls: a missing __syncthreads or __syncwarp, the host reading a buffer
# before its copy, a ring reading gradients without the towers' event and an
# allocator handing a block to another stream without its event must each be
# reported, their twins pass. A report makes the test exit non-zero
# (halt_on_error), which fails it.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
threaded='Trainer|Ring|NumericGuard|Determinism|ThreadPool|Concurrency|MatmulCpu|BadInput'
threaded+='|MultiRank|Stream|Allocator|Bucket|Nccl|SyncBatchNorm|Emulat|ReadOrder|Memory|TensorCuda'
run_preset emulated-tsan -R "$threaded"

echo "== fuzz: every target for 30 s from its seed corpus and regression inputs"
bash scripts/fuzz.sh 30

echo "== embedding: find_package(towerlab) from an installed copy (the CPU-only package)"
rm -rf build/install build/consumer-installed build/consumer-subdir
cmake --install build/cpu --prefix build/install >/dev/null
cmake -S tests/consumer -B build/consumer-installed -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/consumer-installed >/dev/null
build/consumer-installed/consumer

echo "== embedding: samples/embed from the installed copy (train, save, reload, infer)"
rm -rf build/embed-installed
cmake -S samples/embed -B build/embed-installed -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/embed-installed >/dev/null
(cd build/embed-installed && ./embed)

# A program built against the CPU-only package runs where the CUDA libraries are
# absent: it links none of them (docs/building.md, the two packages).
for program in build/consumer-installed/consumer build/embed-installed/embed; do
  if ldd "$program" | grep -E 'libcudart|libcublas|libnccl'; then
    echo "$program, built against the CPU-only package, links the CUDA libraries above"
    exit 1
  fi
done

# The CUDA package, where the release build has the CUDA backend: find_package finds
# the runtime, cuBLAS and NCCL through CUDAToolkit on this machine (no path of the
# build is in the package), and the sample trains on CPU towers with no GPU present.
# It links cuBLAS: the control that shows the check above can fail.
rm -rf build/install-release build/embed-release
cmake --install build/release --prefix build/install-release >/dev/null
if grep -rqs 'CUDA::cublas' build/install-release --include=towerlabTargets.cmake; then
  echo "== embedding: samples/embed from the installed CUDA package"
  cmake -S samples/embed -B build/embed-release -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install-release" >/dev/null
  cmake --build build/embed-release >/dev/null
  (cd build/embed-release && ./embed)
  if ! grep -q libcublas <<<"$(ldd build/embed-release/embed)"; then
    echo "build/embed-release/embed, built against the CUDA package, does not link cuBLAS: the ldd check above proves nothing"
    exit 1
  fi
fi

echo "== embedding: add_subdirectory(towerlab)"
cmake -S tests/consumer -B build/consumer-subdir -G Ninja -DTOWERLAB_SOURCE_DIR="$PWD" -DTOWERLAB_CUDA=OFF >/dev/null
cmake --build build/consumer-subdir >/dev/null
build/consumer-subdir/consumer
echo "== all tests passed"
