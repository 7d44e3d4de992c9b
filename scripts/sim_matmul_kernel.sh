#!/usr/bin/env bash
# Runs the CUDA GEMM kernel of kernels/cuda/matmul.cu on the host, for machines
# without a GPU: the kernel's text (tile constants, device helpers, gemm_kernel)
# is compiled as C++ with 256 std::threads per block and a std::barrier for
# __syncthreads, under AddressSanitizer, and compared with a double-precision
# loop on ragged, padded, misaligned, K = 0 and beta = 0 (NaN in C) cases in all
# four layouts. It checks indexing, guards and the double buffering, not speed,
# and not what only hardware shows (memory model, real races): run the CUDA
# tests on a GPU for that.
#   scripts/sim_matmul_kernel.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 - "$root/kernels/cuda/matmul.cu" "$work/kernel_body.inc" <<'PY'
import sys
src = open(sys.argv[1]).read()
open(sys.argv[2], "w").write(src[src.index("constexpr int kTileM"):src.index("bool aligned16")])
PY
cp "$root/scripts/matmul_kernel_sim.cpp" "$work/"
g++ -O1 -std=c++20 -fsanitize=address,undefined -I"$work" "$work/matmul_kernel_sim.cpp" \
  -o "$work/sim" -lpthread
"$work/sim"
