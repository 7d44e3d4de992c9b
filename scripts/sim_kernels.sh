#!/usr/bin/env bash
# Runs the CUDA kernels of every hand-written family except GEMM and conv2d (which
# have scripts/sim_matmul_kernel.sh and scripts/sim_conv2d_kernels.sh): batch norm,
# bias, elementwise, losses, optimizers, pooling, random, reduce, ReLU, with
# kernels/cuda/launch.cuh and per_channel.cuh, on the host, for machines without a
# GPU. The .cu files go through one mechanical rewrite (scripts/kernel_sim/rewrite.py:
# launches become calls, namespace cuda becomes simcuda) and are compiled as C++
# against scripts/kernel_sim/sim_cuda.h: a block's threads are real threads,
# __syncthreads is a barrier over the block, shuffles and votes meet at a per-warp
# barrier with CUDA's mask rules checked. The driver calls each launcher on odd
# shapes (sizes 0, 1, 31, 33, 257, past the grid so grid-stride loops wrap; C = 1,
# ragged spatial sizes, every reduction split plan) with launch plans for 1, 8 and
# 132 SMs, and compares every output with towerlab's CPU backend.
#
# Two builds: AddressSanitizer + UBSan (every tensor and scratch buffer is its own
# exact-size heap block, so an out-of-bounds index is reported) and ThreadSanitizer
# (threads of a block touching one word with no barrier between them, a missing
# __syncthreads or __syncwarp, is reported as a data race). Control runs prove the
# detectors work: a write one past a tensor's end must fail under AddressSanitizer;
# launch.cuh's block_sum with a barrier deleted, a kernel missing its barrier and
# one missing its __syncwarp must each fail under ThreadSanitizer;
# shuffles with an exited lane, in divergent code and from outside the mask must
# each be reported by the simulator. The script fails if any control passes.
#
# It checks indexing, edge guards, barriers and warp-synchronous code, not speed,
# and not what only hardware shows (the memory model, races between blocks, which
# run one after another here, CUB's own kernels, the CUDA runtime's behaviour): run
# the CUDA tests on a GPU for that.
#   scripts/sim_kernels.sh [build-dir]   (build-dir holds libtowerlab.a: build/cpu,
#                                         else build/release)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-}"
if [ -z "$build" ]; then
  build="$root/build/cpu"
  [ -f "$build/libtowerlab.a" ] || build="$root/build/release"
fi
[ -f "$build/libtowerlab.a" ] || { echo "sim_kernels.sh: no libtowerlab.a in $build" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
sim="$root/scripts/kernel_sim"
families=(batchnorm bias elementwise loss optimizer pool2d random reduce relu)
libs=("$build/libtowerlab.a" -lpthread
  -Wl,--wrap=_ZN8towerlab9Allocator8allocateEmPv -Wl,--wrap=_ZN8towerlab9Allocator10deallocateEPv)
if grep -q cudart "$build/CMakeCache.txt" 2>/dev/null; then
  libs+=(-L/usr/local/cuda/lib64 -lcudart -lcublas)
fi

# build NAME SANITIZER [FAMILY-OBJECTS-FROM]: $work/NAME/sim. With a third
# argument, only the driver is compiled here (against launch.cuh with block_sum's
# barrier removed) and the families' objects come from that build.
build() {
  local name=$1 sanitize=$2 objects_from=${3:-}
  local dir="$work/$name"
  mkdir -p "$dir"
  python3 "$sim/rewrite.py" "$root" "$dir/src" ${objects_from:+--drop-block-sum-barrier}
  local flags=(-O1 -g1 -std=c++20 -fsanitize="$sanitize" -fno-omit-frame-pointer
    -I"$dir/src" -I"$sim" -I"$root")
  if [ -z "$objects_from" ]; then
    printf '%s\n' "${families[@]}" | xargs -P 2 -I{} \
      g++ "${flags[@]}" -c "$dir/src/kernels/cuda/{}.cpp" -o "$dir/{}.o"
    objects_from=$dir
  fi
  local objects=("$dir/kernel_sim.o")
  for f in "${families[@]}"; do objects+=("$objects_from/$f.o"); done
  g++ "${flags[@]}" -c "$sim/kernel_sim.cpp" -o "$dir/kernel_sim.o"
  g++ "${flags[@]}" "${objects[@]}" "${libs[@]}" -o "$dir/sim"
}

# expect_fail WHAT STATUS PATTERN COMMAND...: the command must exit with STATUS
# and print PATTERN.
expect_fail() {
  local what=$1 want=$2 pattern=$3
  shift 3
  local status=0
  "$@" >"$work/out" 2>&1 || status=$?
  if [ "$status" -eq "$want" ] && grep -q "$pattern" "$work/out"; then
    echo "control $what: failed as it must ($pattern)"
  else
    echo "control $what: exit $status, expected $want with '$pattern': the detector is broken"
    cat "$work/out"
    return 1
  fi
}

status=0
echo "== build: AddressSanitizer + UBSan, ThreadSanitizer, ThreadSanitizer with a barrier removed"
build asan address,undefined
build tsan thread
build tsan-mutant thread "$work/tsan"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export TSAN_OPTIONS="halt_on_error=1:exitcode=66:report_signal_unsafe=0"

for sms in 1 8 132; do
  echo "== AddressSanitizer + UBSan, launch plans for $sms SMs"
  "$work/asan/sim" "$sms" || status=1
done
# ThreadSanitizer (several times slower) once, with the plan for 1 SM: grids wrap,
# and the per-channel shapes take both kinds of split (bound by the work, bound by
# the SM count).
echo "== ThreadSanitizer, launch plans for 1 SM"
"$work/tsan/sim" 1 || status=1

echo "== controls"
"$work/tsan/sim" 8 control-block-sum || { echo "control-block-sum fails unmutated"; status=1; }
expect_fail "block_sum without its barrier" 66 "ThreadSanitizer: data race" \
  "$work/tsan-mutant/sim" 8 control-block-sum || status=1
expect_fail "missing __syncthreads" 66 "ThreadSanitizer: data race" \
  "$work/tsan/sim" 8 control-missing-barrier || status=1
expect_fail "missing __syncwarp" 66 "ThreadSanitizer: data race" \
  "$work/tsan/sim" 8 control-missing-syncwarp || status=1
expect_fail "write one past a tensor's end" 1 "heap-buffer-overflow" \
  "$work/asan/sim" 8 control-out-of-bounds || status=1
expect_fail "shuffle naming an exited lane" 86 "already exited\|exited instead" \
  "$work/asan/sim" 8 control-shuffle-exited || status=1
expect_fail "shuffle in divergent code" 86 "never arrived\|never reach" \
  env SIM_WAIT_LIMIT_S=2 "$work/asan/sim" 8 control-shuffle-divergent || status=1
expect_fail "shuffle from outside the mask" 86 "not in the mask" \
  "$work/asan/sim" 8 control-shuffle-outside-mask || status=1
[ "$status" -eq 0 ] && echo "== sim_kernels: all passed"
exit $status
