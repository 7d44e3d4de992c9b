#!/usr/bin/env bash
# Runs towerlab's CUDA GEMM (kernels/cuda/matmul.cu: split plan, launcher,
# gemm_kernel, and the split reduction of kernels/cuda/split_reduce.cuh) on the
# host, for machines without a GPU. The code up to the cuBLAS section is turned
# into C++ (scripts/cuda_sim_transform.py: launches become loops over blocks
# with 256 std::threads each, a std::barrier for __syncthreads, shared memory as
# function statics), built under AddressSanitizer and compared with a
# double-precision loop: ragged, padded, misaligned, K = 0 and beta = 0 (NaN in
# C) cases in all four layouts with the split plans for 8 and 132 SMs,
# FashionNet's linear layer, forced plans with ragged and empty splits, the
# same bits on a rerun and a tampered partial that must be caught. It checks
# indexing, guards, the double buffering and the reduction, not speed, and not
# what only hardware shows (memory model, real races): run the CUDA tests on a
# GPU for that.
#   scripts/sim_matmul_kernel.sh [build-dir]   (build-dir: build/release, for libtowerlab.a)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build/release}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
py="$root/scripts/cuda_sim_transform.py"
python3 "$py" "$root/kernels/cuda/matmul.cu" "$work/matmul_sim.inc" --stop-at "// cuBLAS: one handle"
python3 "$py" "$root/kernels/cuda/split_reduce.cuh" "$work/split_reduce.sim.h"
cp "$root/scripts/cuda_sim_shim.h" "$work/"
libs=("$build/libtowerlab.a" -lpthread)
if grep -q cudart "$build/CMakeCache.txt" 2>/dev/null; then
  libs+=(-L/usr/local/cuda/lib64 -lcudart -lcublas)
fi
g++ -O1 -std=c++20 -fsanitize=address,undefined -I"$root" -I"$work" -I/usr/local/cuda/include \
  -DTOWERLAB_WITH_CUDA=1 "$root/scripts/matmul_kernel_sim.cpp" "${libs[@]}" -o "$work/sim"
"$work/sim"
