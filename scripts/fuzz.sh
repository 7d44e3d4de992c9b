#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, CPU only, ASan + UBSan)
# and runs each for a set time, starting from its seed corpus (fuzz/corpus/<target>)
# and its regression inputs (fuzz/regressions/<target>).
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET ...]
#   SECONDS  per target (default 60); TARGET: safetensors idx config device (default all)
#
# Inputs that reach new code collect in build/fuzz/corpus/<target>; the committed
# seed corpus stays as it is. A crash, a leak, a hang over 10 s or an allocation
# over 2 GiB leaves its input in build/fuzz/artifacts/ and fails the script: fix the
# bug, then add the input to fuzz/regressions/<target>/ so that every test build
# replays it (tests/fuzz_corpus_test.cpp). Prints one line per target with the
# executions it survived, the numbers fuzz/RESULTS.md records.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(safetensors idx config device)

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"

artifacts=build/fuzz/artifacts
mkdir -p "$artifacts"
summary=()
status=0
for target in "${targets[@]}"; do
  binary=build/fuzz/fuzz/fuzz_${target}
  [ -x "$binary" ] || { echo "fuzz.sh: no target '${target}'" >&2; exit 2; }
  work=build/fuzz/corpus/${target}
  mkdir -p "$work" "fuzz/regressions/${target}"
  log=build/fuzz/${target}.log
  echo "== fuzz_${target}: ${seconds} s"
  # The first directory receives the new inputs; the others only seed the run.
  if "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
      -print_final_stats=1 -artifact_prefix="${artifacts}/${target}-" \
      "$work" "fuzz/corpus/${target}" "fuzz/regressions/${target}" >"$log" 2>&1; then
    result=ok
  else
    result=FAILED
    status=1
    grep -E "ERROR|SUMMARY|Test unit written" "$log" >&2 || tail -n 30 "$log" >&2
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n 1 | cut -d' ' -f2)
  summary+=("$(printf '%-12s %-6s %10s executions  %5s s  coverage %s' \
    "$target" "$result" "${runs:-?}" "$seconds" "${cov:-?}")")
done
echo "== fuzz summary ($(date -u +%Y-%m-%d), $(clang --version | head -n 1))"
printf '%s\n' "${summary[@]}"
exit $status
