#!/usr/bin/env bash
# The GPU run: every CUDA test, compute-sanitizer, the kernel benchmarks and the
# end-to-end FashionNet run, on a machine with an NVIDIA GPU (H100/H200, sm_90).
# See ../shared/GPU.md. Two halves, because the GPU machine has the CUDA toolkit
# but neither GoogleTest, Google Benchmark nor a network:
#
#   scripts/gpu.sh prepare        here (no GPU needed): a Release CUDA build of the
#                                 tests, benches and samples in build/gpu, plus the
#                                 shared libraries the device lacks in build/gpu/lib
#                                 and the Fashion-MNIST files in build/gpu/data.
#                                 Carry build/gpu to the device (it must stay under
#                                 the device tool's 64 MiB; the script prints its size).
#   scripts/gpu.sh run OUTDIR     on the device, in the repository root with build/gpu
#                                 present: writes logs and JSON results to OUTDIR.
#
# Results that the project relies on go into bench/results/ with the commit, the
# device name and the date (GPU.md).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/gpu

prepare() {
  bash scripts/deps.sh
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTOWERLAB_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  local benches
  benches=$(cd bench && ls *_bench.cpp | sed 's/\.cpp$//')
  cmake --build "$build" -j "$(nproc)" --target towerlab_tests fashion_mnist regression placement \
    towerlab_devices $benches
  mkdir -p "$build/lib" "$build/data"
  # Shared libraries of ours that the device image lacks (cuBLAS/cuDNN come from its toolkit or PyTorch).
  for lib in libbenchmark.so.1 libyaml-cpp.so.0.7; do
    path=$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')
    [ -n "$path" ] && cp -L "$path" "$build/lib/"
  done
  cp /usr/share/datasets/fashion-mnist/*.gz "$build/data/"
  # Only what the run needs travels: drop objects and CMake state.
  find "$build" -name '*.o' -delete
  du -sh "$build"
}

run() {
  local out=${1:?usage: scripts/gpu.sh run OUTDIR}
  mkdir -p "$out"
  export LD_LIBRARY_PATH="$PWD/$build/lib:${LD_LIBRARY_PATH:-}"
  # cuDNN for the reference benches: the toolkit's, else PyTorch's bundled copy.
  if ! ldconfig -p | grep -q libcudnn.so.9; then
    torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null || true)
    [ -n "$torch_lib" ] && export LD_LIBRARY_PATH="$torch_lib:$LD_LIBRARY_PATH"
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/device.csv" || true
  git rev-parse HEAD > "$out/commit.txt" 2>/dev/null || true
  date -u +%FT%TZ > "$out/date.txt"
  local status=0
  "$build/samples/towerlab_devices" | tee "$out/devices.log" || status=1
  "$build/tests/towerlab_tests" --gtest_output=json:"$out/tests.json" > "$out/tests.log" 2>&1 || status=1
  tail -5 "$out/tests.log"
  # Sanitizers on the CUDA cases: memcheck for all, racecheck for the shared-memory kernels.
  compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/towerlab_tests" \
    --gtest_filter='*cuda*:*Cuda*' > "$out/memcheck.log" 2>&1 || status=1
  compute-sanitizer --tool racecheck --error-exitcode 1 "$build/tests/towerlab_tests" \
    --gtest_filter='*Matmul*cuda*:*Conv2d*cuda*:*BatchNorm*cuda*:*Reduce*cuda*:*Loss*cuda*' \
    > "$out/racecheck.log" 2>&1 || status=1
  for bench in "$build"/bench/*_bench; do
    "$bench" --benchmark_filter='cuda|cublas|cudnn|Reference' --benchmark_format=json \
      --benchmark_out="$out/$(basename "$bench").json" > /dev/null 2>> "$out/bench.log" || status=1
  done
  "$build/samples/fashion_mnist" --devices cuda:0 --data "$build/data" --epochs 5 \
    --metrics "$out/fashion_mnist_cuda.json" > "$out/fashion_mnist_cuda.log" 2>&1 || status=1
  return $status
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) echo "usage: scripts/gpu.sh prepare | run OUTDIR" >&2; exit 2 ;;
esac
