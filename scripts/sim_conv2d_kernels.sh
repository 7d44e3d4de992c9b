#!/usr/bin/env bash
# Runs the CUDA conv2d kernels of kernels/cuda/conv2d.cu on the host, for machines
# without a GPU, and compares every pass (forward, backward-data, backward-weight
# with its split reduction, grad_bias) with towerlab's CPU backend on odd shapes:
# 1x1 and 5x5 kernels, ragged strides, dilation, C = 1, prime K, vector and
# scalar epilogues, every tile configuration (planned for 8 and for 132 SMs),
# FashionNet's backward-weight at batch 128 and 512. A split backward-weight is
# also run twice (same bits) and once with one partial sum tampered with (the
# comparison must fail). The .cu file is turned into C++ (launches become loops over blocks with one
# std::thread per CUDA thread, a std::barrier for __syncthreads, shared memory as
# function statics) and built under AddressSanitizer, which catches out-of-tile
# shared-memory and global accesses. It checks indexing, guards and double
# buffering, not speed, and not what only hardware shows (memory model, real
# races, alignment faults): run the CUDA tests on a GPU for that.
#   scripts/sim_conv2d_kernels.sh [build-dir] [large]   (build-dir: build/release)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build/release}"
large="${2:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
py="$root/scripts/cuda_sim_transform.py"
python3 "$py" "$root/kernels/cuda/conv2d.cu" "$work/conv2d_sim.cpp"
python3 "$py" "$root/kernels/cuda/split_reduce.cuh" "$work/split_reduce.sim.h"
cp "$root/scripts/cuda_sim_shim.h" "$work/"
flags=(-O1 -std=c++20 -fsanitize=address,undefined -I"$root" -I"$work" -DTOWERLAB_WITH_CUDA=1)
libs=("$build/libtowerlab.a" -lpthread)
if grep -q cudart "$build/CMakeCache.txt" 2>/dev/null; then
  libs+=(-L/usr/local/cuda/lib64 -lcudart -lcublas)
fi
g++ "${flags[@]}" -I/usr/local/cuda/include -c "$work/conv2d_sim.cpp" -o "$work/conv2d_sim.o"
g++ "${flags[@]}" -I/usr/local/cuda/include "$root/scripts/conv2d_kernels_sim.cpp" \
  "$work/conv2d_sim.o" "${libs[@]}" -o "$work/sim"
status=0
for sms in 8 132; do
  echo "== launch plans for $sms SMs"
  "$work/sim" "$sms" $large || status=1
done
exit $status
