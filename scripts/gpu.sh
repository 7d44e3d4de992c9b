#!/usr/bin/env bash
# The GPU run: every CUDA test, compute-sanitizer, the kernel benchmarks and the
# end-to-end FashionNet run on a machine with one NVIDIA GPU (H100/H200, sm_90).
# The GPU machine has the CUDA toolkit, the driver and PyTorch's wheels (cuDNN,
# cuBLAS), but no Debian packages and no network, so the binaries are built here
# and travel with the libraries it lacks:
#
#   scripts/gpu.sh prepare     here: the gpu preset (Release, sm_90, CUDA runtime
#                              linked in, no NCCL, no OpenBLAS), then build/gpu-carry/
#                              with bin.tar.gz (bin/: the binaries, stripped; lib/:
#                              what ldd shows the GPU machine lacks), data/
#                              (Fashion-MNIST) and build-info.txt. Refuses to finish
#                              when the repository's working tree plus the carry
#                              exceeds the device tool's 64 MiB.
#
# Then one device call per command below, each planned well inside the 10-minute
# limit (the times are estimates; every step has its own timeout), each writing one
# archive <command>.tar.gz and <command>-summary.txt to OUT:
#
#   scripts/gpu.sh check           libraries resolve (ldd) and a GPU is visible
#   scripts/gpu.sh tests OUT       the whole test binary in one process (~2-4 min)
#   scripts/gpu.sh sanitize OUT [memcheck|racecheck|synccheck]
#                                  compute-sanitizer on the CUDA tests: all three tools
#                                  when none is named (at most ~9 min), else the one
#                                  named with the whole budget
#   scripts/gpu.sh bench OUT       the CUDA cases of every bench, JSON (~2-5 min)
#   scripts/gpu.sh train OUT       FashionNet, 5 epochs on cuda:0, masters cuda:0 and cpu (~1-5 min)
#
# Device tool call for each (the repository root is the working directory there):
#   run(command='bash scripts/gpu.sh tests "$OUT"', carry=['build/gpu-carry'], timeout_s=600)
# and likewise with sanitize, bench, train. Every command runs the check first and
# stops, exit status 3, with a loud message when no GPU is visible; a CUDA test that
# skips or fails makes the command fail (TOWERLAB_REQUIRE_GPU=1 in the tests).
# TOWERLAB_GPU_REHEARSAL=1 runs a command's steps past a failed check, to try the
# script on a machine without a GPU; such a run always fails.
# Results the project relies on go into bench/results/ with the commit, the device
# name and the date (build-info.txt and each summary hold them).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build=build/gpu       # the gpu preset's build folder; stays here
carry=build/gpu-carry # what travels (ignored by git, like all of build/)
limit=$((64 * 1024 * 1024))
fashion_mnist=/usr/share/datasets/fashion-mnist

# Libraries the GPU machine has, by soname: the C and C++ runtime, the driver, and
# cuBLAS and cuDNN from the toolkit or PyTorch's wheels. Everything else that ldd
# shows travels in lib/.
system_libs=' linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libstdc++.so.6 libgcc_s.so.1 libcuda.so.1 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 '
# Libraries that must not be linked into what travels: the runtime is linked in
# statically, NCCL and OpenBLAS are left out by the gpu preset.
refused_libs='libcudart.so libnccl.so libopenblas.so libblas.so libgfortran.so'

die() {
  echo "gpu.sh: FAILED: $*" >&2
  exit 1
}

# The binaries that run on the GPU machine.
bench_names() {
  # Every bench with CUDA cases (io_bench is CPU-only).
  grep -l 'cuda' bench/*_bench.cpp | xargs -n1 basename | sed 's/\.cpp$//'
}
binaries() {
  echo towerlab_tests fashion_mnist towerlab_devices
  bench_names
}
source_of() {
  case $1 in
    towerlab_tests) echo "$build/tests/$1" ;;
    fashion_mnist | towerlab_devices) echo "$build/samples/$1" ;;
    *) echo "$build/bench/$1" ;;
  esac
}

# Bytes that the device tool sends: tracked and untracked-not-ignored files, plus
# the carried folder.
travel_bytes() {
  local tree carried
  tree=$( (git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null ||
    true) | awk '{s += $1} END {print s + 0}')
  # A shared/ folder in the checkout travels even where git ignores it.
  if [ -d shared ] && git check-ignore -q shared; then
    tree=$((tree + $(find shared -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')))
  fi
  carried=$(find "$carry" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  echo "$tree $carried"
}
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }

prepare() {
  bash scripts/deps.sh
  cmake --preset gpu >/dev/null
  # shellcheck disable=SC2046
  cmake --build --preset gpu -j "$(nproc)" --target $(binaries)
  # The binaries, stripped, and the libraries they need, staged as they will be
  # unpacked there: bin/ and lib/ side by side.
  local stage=$build/stage
  rm -rf "$stage" "$carry"
  mkdir -p "$stage/bin" "$stage/lib" "$carry/data"
  for name in $(binaries); do
    strip -o "$stage/bin/$name" "$(source_of "$name")"
  done

  # Shared libraries: refuse the ones that must not travel, copy the ones the GPU
  # machine lacks (under their soname, as the loader looks them up).
  local line soname path refused
  while read -r line; do
    soname=$(basename "${line%% *}")
    path=$(echo "$line" | awk '$2 == "=>" {print $3}')
    case $line in *"not found"*) die "$soname is not found here (ldd $stage/bin/*)" ;; esac
    for refused in $refused_libs; do
      [[ $soname == "$refused"* ]] &&
        die "$soname is linked, but the gpu preset keeps it out (check CMakePresets.json)"
    done
    [[ $system_libs == *" $soname "* ]] && continue
    [ -n "$path" ] && cp -L "$path" "$stage/lib/$soname"
  done < <(for b in "$stage"/bin/*; do ldd "$b"; done | sed 's/^[[:space:]]*//; s/ (0x.*//' | sort -u)
  strip --strip-unneeded "$stage"/lib/*
  # gzip makes the CUDA fat binaries about a third of their size; tar and gzip are
  # on every machine.
  tar -czf "$carry/bin.tar.gz" -C "$stage" bin lib

  # Fashion-MNIST as Debian ships it (.gz, read as is by the sample), when it fits;
  # else a subset, never silently (build-info.txt and the train summary say which).
  local tree carried data_bytes margin=$((2 * 1024 * 1024))
  read -r tree carried < <(travel_bytes)
  data_bytes=$(cat "$fashion_mnist"/*-ubyte.gz | wc -c)
  if ((tree + carried + data_bytes <= limit - margin)); then
    cp "$fashion_mnist"/*-ubyte.gz "$carry/data/"
    echo "full: 60000 training and 10000 test images" >"$carry/data/contents.txt"
  else
    subset_dataset "$carry/data" $((limit - margin - tree - carried))
  fi

  {
    echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- . 2>/dev/null ||
      echo ' (with uncommitted changes)')"
    echo "built: $(date -u +%FT%TZ) on $(uname -n), preset gpu, $(/usr/local/cuda/bin/nvcc --version | tail -1)"
    echo "dataset: $(cat "$carry/data/contents.txt")"
    echo "carried libraries: $(find "$stage/lib" -type f -printf '%f ' | sort)"
    echo "newest glibc symbol version needed: $(objdump -T "$stage"/bin/* "$stage"/lib/* 2>/dev/null |
      grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
  } >"$carry/build-info.txt"

  read -r tree carried < <(travel_bytes)
  echo
  cat "$carry/build-info.txt"
  echo "in $carry/bin.tar.gz (unpacked sizes):"
  (cd "$stage" && du -b bin/* lib/* | awk '{printf "  %10d  %s\n", $1, $2}')
  echo "in $carry:"
  (cd "$carry" && find . -type f -printf '%s %P\n' | sort -k2 | awk '{printf "  %10d  %s\n", $1, $2}')
  echo "travels: working tree $(mib "$tree") + $carry $(mib "$carried") = $(mib $((tree + carried))) (limit 64 MiB)"
  ((tree + carried <= limit)) || die "$(mib $((tree + carried))) does not fit the device tool's 64 MiB"
  echo "comes back: 2 files per command, <command>.tar.gz and <command>-summary.txt (limit 8)"
  echo
  echo "device tool calls, one each, with carry=['$carry'] and timeout_s=600:"
  for command in tests sanitize bench train; do
    echo "  bash scripts/gpu.sh $command \"\$OUT\""
  done
}

# Writes a prefix of Fashion-MNIST as valid IDX files (header counts set to the
# subset's) into $1, as many training images as fit in $2 bytes with the whole test
# set. gzip -9 of the raw files, which the sample reads as it reads Debian's.
subset_dataset() {
  local dir=$1 budget=$2
  python3 - "$fashion_mnist" "$dir" "$budget" <<'PY'
import gzip, struct, sys
src, dst, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
def read(name):
    with gzip.open(f"{src}/{name}.gz") as f:
        return f.read()
def write(name, header_dims, data, count):
    magic = struct.unpack(">I", data[:4])[0]
    header = struct.pack(">I", magic) + struct.pack(">I", count) + b"".join(
        struct.pack(">I", d) for d in header_dims)
    item = 1
    for d in header_dims: item *= d
    offset = 8 + 4 * len(header_dims)
    blob = gzip.compress(header + data[offset:offset + count * item], 9)
    with open(f"{dst}/{name}.gz", "wb") as f:
        f.write(blob)
    return len(blob)
used = 0
for split in ("t10k",):
    used += write(f"{split}-labels-idx1-ubyte", [], read(f"{split}-labels-idx1-ubyte"), 10000)
    used += write(f"{split}-images-idx3-ubyte", [28, 28], read(f"{split}-images-idx3-ubyte"), 10000)
images, labels = read("train-images-idx3-ubyte"), read("train-labels-idx1-ubyte")
# About 440 bytes per image after gzip; shrink until it fits.
count = min(60000, (budget - used) // 440 // 1000 * 1000)
while count > 0:
    size = write("train-labels-idx1-ubyte", [], labels, count)
    size += write("train-images-idx3-ubyte", [28, 28], images, count)
    if used + size <= budget: break
    count -= 1000
if count <= 0: sys.exit("gpu.sh: not even 1000 training images fit")
with open(f"{dst}/contents.txt", "w") as f:
    f.write(f"subset: the first {count} of 60000 training images (IDX headers set to {count}),"
            f" all 10000 test images; the whole set does not fit the 64 MiB that travels\n")
PY
}

# --- on the GPU machine ------------------------------------------------------

# Unpacks the binaries and libraries into a fresh temporary folder: $bin and $lib.
unpack() {
  [ -z "${bin:-}" ] || return 0
  [ -f "$carry/bin.tar.gz" ] ||
    die "$carry/bin.tar.gz is missing: run 'scripts/gpu.sh prepare' here and carry $carry"
  unpacked=$(mktemp -d "${TMPDIR:-/tmp}/towerlab-gpu.XXXXXX")
  trap 'rm -rf "$unpacked"' EXIT
  tar -xzf "$carry/bin.tar.gz" -C "$unpacked"
  bin=$unpacked/bin lib=$unpacked/lib
}

# The library path for our binaries: the carried libraries, the toolkit's, then
# every lib/ folder of the NVIDIA wheels beside PyTorch (nvidia/cudnn/lib,
# nvidia/cu13/lib, ...). TOWERLAB_GPU_LIB_PATH, when set, comes first.
set_library_path() {
  [ -z "${gpu_sh_library_path:-}" ] || return 0
  gpu_sh_library_path=1
  local dirs=() site d
  [ -n "${TOWERLAB_GPU_LIB_PATH:-}" ] && dirs+=("$TOWERLAB_GPU_LIB_PATH")
  dirs+=("$lib")
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -d "$d" ] && dirs+=("$d"); done
  for site in $(python3 -c 'import site, sysconfig
print(" ".join([sysconfig.get_paths()["purelib"]] + site.getsitepackages()))' 2>/dev/null) \
    /opt/torch/.venv/lib/python3*/site-packages; do
    for d in "$site"/nvidia/*/lib; do
      [ -d "$d" ] && [[ " ${dirs[*]} " != *" $d "* ]] && dirs+=("$d")
    done
  done
  LD_LIBRARY_PATH=$(
    IFS=:
    echo "${dirs[*]}"
  )${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH
}

# Every carried binary's libraries resolve, then a GPU is visible. Prints what it
# saw; exits 1 on a missing library, 3 (loudly) when no GPU is visible.
check() {
  unpack
  set_library_path
  cat "$carry/build-info.txt"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  local missing=0 b
  for b in "$bin"/*; do
    if ldd "$b" | grep -q 'not found'; then
      echo "gpu.sh: $b: $(ldd "$b" | grep 'not found' | tr -s ' \t' ' ' | tr '\n' ';')" >&2
      missing=1
    fi
  done
  ((missing == 0)) || die "libraries are missing (above); nothing was run"
  # Outside the GPU machine's own libraries, each must come from the carried ones:
  # this also catches, on a machine that happens to have it, one that did not travel.
  local stray
  stray=$(for b in "$bin"/*; do ldd "$b"; done | awk -v own="$system_libs" -v carried="$lib/" '
    $2 == "=>" && index(own, " " $1 " ") == 0 && index($3, carried) != 1 {print "  " $1 " => " $3}' |
    sort -u)
  [ -z "$stray" ] || die "libraries that did not travel and the GPU machine lacks:
$stray"
  echo "libraries: every binary in $carry/bin.tar.gz resolves all its libraries:"
  for b in "$bin"/*; do ldd "$b"; done | awk '$2 == "=>" {print "  " $1 " => " $3}' | sort -u
  local devices
  devices=$("$bin/towerlab_devices" 2>&1) || true
  echo "$devices"
  if ! nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 ||
    ! grep -q 'cuda:0' <<<"$devices"; then
    {
      echo
      echo "################################################################################"
      echo "gpu.sh: FAILED: no GPU visible (nvidia-smi or towerlab_devices above)."
      echo "Nothing else was run: without a GPU every CUDA test would skip and read as a pass."
      echo "################################################################################"
    } >&2
    exit 3
  fi
}

# Begins a device command: a fresh folder for its logs (pack() turns it into
# OUT/<command>.tar.gz), the library path, the check (a failed one ends the command
# with its status), and the tests' settings: a GPU required, the corpus in the tree.
begin() {
  out=${1:?usage: scripts/gpu.sh $command OUT}
  mkdir -p "$out"
  work=$(mktemp -d)
  summary="$out/$command-summary.txt"
  : >"$summary"
  status=0
  note "$command on $(uname -n), $(date -u +%FT%TZ)"
  unpack
  set_library_path
  (check) >"$work/check.log" 2>&1 || {
    status=$?
    cat "$work/check.log" >&2
    # A rehearsal (TOWERLAB_GPU_REHEARSAL=1, on a machine without a GPU) goes on to
    # exercise the steps and the judging; the command fails all the same.
    [ "${TOWERLAB_GPU_REHEARSAL:-}" = 1 ] || pack
    note "rehearsal: the check failed (exit $status); the steps run, the command fails"
  }
  grep -A1 '^towerlab sees' "$work/check.log" | tee -a "$summary"
  export TOWERLAB_REQUIRE_GPU=1 TOWERLAB_FUZZ_DIR=$repo/fuzz
}
note() { echo "$*" | tee -a "$summary"; }
pack() {
  if ((status == 0)); then note "$command: PASSED"; else note "$command: FAILED (see above)"; fi
  cp "$summary" "$carry/build-info.txt" "$work/"
  # No log may push the archive past the 16 MiB a returned file may have.
  local f
  for f in "$work"/*; do
    if [ "$(stat -c %s "$f")" -gt $((4 * 1024 * 1024)) ]; then
      { head -c 2M "$f"; echo; echo "[... cut by gpu.sh ...]"; tail -c 2M "$f"; } >"$f.cut"
      mv "$f.cut" "$f"
    fi
  done
  tar -czf "$out/$command.tar.gz" -C "$work" .
  rm -rf "$work"
  exit "$status"
}
# step NAME SECONDS CMD...: runs CMD under a time limit with its output in NAME.log.
step() {
  local name=$1 seconds=$2 rc=0 start=$SECONDS
  shift 2
  timeout --kill-after=10 "$seconds" "$@" >"$work/$name.log" 2>&1 || rc=$?
  if ((rc == 124 || rc == 137)); then
    note "$name: TIMED OUT after ${seconds}s"
  else
    note "$name: exit $rc, $((SECONDS - start))s"
  fi
  return $rc
}

# Judges a gtest XML report: tests ran, none failed, and every skip is one that a
# one-GPU machine explains (never "no CUDA device").
judge_tests() {
  python3 - "$1" <<'PY' | tee -a "$summary"
import sys, xml.etree.ElementTree as ET
# Skips a one-GPU machine explains: the CPU instance of a CUDA-only case, cases that
# need two GPUs, root ignoring permissions, no numpy or no Debian dataset there.
expected = ("compares the CUDA kernels with the CPU backend", "CUDA-only",
            "needs two CUDA devices", "running as root", "numpy not available",
            "dataset-fashion-mnist is not installed")
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as e:
    print(f"  no readable test report ({e}): FAILED"); sys.exit(1)
def message(element):
    # The text is "file:line" and then the message.
    lines = (element.text or element.get("message") or "").strip().splitlines()[1:]
    return " ".join(l.strip() for l in lines if l.strip()) or "(no message)"
ran = 0; failures = []; skips = {}
for case in root.iter("testcase"):
    if case.get("status") != "run": continue
    name = f"{case.get('classname')}.{case.get('name')}"
    # The suite-less entry holds failures outside any test (a global set-up).
    ran += name != "."
    for failure in case.findall("failure"): failures.append(f"{name}: {message(failure)}")
    skip = case.find("skipped")
    if skip is not None: skips.setdefault(message(skip), []).append(name)
unexpected = {why: names for why, names in skips.items() if not any(e in why for e in expected)}
print(f"  {ran} tests ran, {len(failures)} failures, {sum(map(len, skips.values()))} skipped")
for f in failures[:20]: print(f"  FAILED {f[:300]}")
for why, names in sorted(skips.items()):
    mark = "UNEXPECTED " if why in unexpected else ""
    print(f"  {mark}skipped {len(names)}: {why[:200]} (e.g. {names[0]})")
if ran == 0: print("  no test ran: FAILED")
sys.exit(1 if failures or unexpected or ran == 0 else 0)
PY
}

tests() {
  begin "$@"
  step tests 480 "$bin/towerlab_tests" --gtest_output=xml:"$work/tests.xml" || status=1
  tail -5 "$work/tests.log"
  judge_tests "$work/tests.xml" || status=1
  pack
}

# The test binary's cases, one full name a line, that match the extended regular
# expression $1 (and are not CPU instances).
cases_matching() {
  "$bin/towerlab_tests" --gtest_list_tests |
    awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}' | grep -E "$1" | grep -v '/cpu$' || true
}

sanitize() {
  local tools=${2:-memcheck racecheck synccheck}
  begin "$1"
  # memcheck: every case that reaches the GPU: the cuda0 instances of the backend
  # tests, the tests named for CUDA or GPUs, and the suites that use a GPU when one
  # is visible. racecheck and synccheck: the kernels with shared memory (matmul,
  # conv2d, batch norm, losses, pooling, bias, reductions).
  cases_matching '/cuda0$|Cuda|CUDA|Gpu|GPU|^(Trainer|Memory|DeviceAllocator|CheckpointTest|Stream)\.' \
    >"$work/cases-memcheck.txt"
  grep -E '^(Backends/)?(BatchNorm|Bias|Conv2d|Loss|Matmul|Pool2d|Reduce)(Test|CudaVsCpu)\.' \
    "$work/cases-memcheck.txt" >"$work/cases-shared-memory.txt" || true
  local list
  for list in cases-memcheck cases-shared-memory; do
    note "$list: $(wc -l <"$work/$list.txt") cases"
    if [ ! -s "$work/$list.txt" ]; then
      note "no test matched the $list filter: FAILED"
      status=1
      pack
    fi
  done
  local sanitizer tool cases seconds
  sanitizer=$(command -v compute-sanitizer || true)
  for tool in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -n "$sanitizer" ] || [ ! -x "$tool" ] || sanitizer=$tool
  done
  if [ -z "$sanitizer" ]; then
    note "compute-sanitizer is not on the PATH nor in /usr/local/cuda: FAILED"
    status=1
    pack
  fi
  for tool in $tools; do
    case $tool in
      memcheck) cases=cases-memcheck seconds=260 ;;
      racecheck) cases=cases-shared-memory seconds=160 ;;
      synccheck) cases=cases-shared-memory seconds=100 ;;
      *) die "unknown sanitizer tool '$tool' (memcheck, racecheck or synccheck)" ;;
    esac
    # One tool named: it has the whole budget.
    [ "$tools" = "$tool" ] && seconds=540
    step "$tool" "$seconds" "$sanitizer" --tool "$tool" --error-exitcode 99 --print-limit 200 \
      "$bin/towerlab_tests" --gtest_filter="$(paste -sd: "$work/$cases.txt")" \
      --gtest_output=xml:"$work/$tool.xml" || status=1
    grep -E '(ERROR|RACECHECK) SUMMARY' "$work/$tool.log" | tee -a "$summary" || true
    judge_tests "$work/$tool.xml" || status=1
  done
  pack
}

bench() {
  begin "$@"
  # The CUDA cases and their GPU references (cuBLAS, cuDNN, the device copy), the
  # benches one after another inside one deadline.
  local name seconds deadline=$((SECONDS + 500))
  for name in $(bench_names); do
    seconds=$((deadline - SECONDS < 120 ? deadline - SECONDS : 120))
    if ((seconds < 10)); then
      note "$name: not run, the command's time is spent: FAILED"
      status=1
      continue
    fi
    step "$name" "$seconds" "$bin/$name" --benchmark_filter='cuda|cublas|cudnn' \
      --benchmark_min_time=0.2 --benchmark_format=json --benchmark_out="$work/$name.json" ||
      status=1
    python3 - "$work/$name.json" <<'PY' | tee -a "$summary" || status=1
import json, sys
try:
    runs = json.load(open(sys.argv[1]))["benchmarks"]
except (OSError, ValueError, KeyError) as e:
    print(f"  no readable results ({e}): FAILED"); sys.exit(1)
errors = [r["name"] + ": " + r.get("error_message", "") for r in runs if r.get("error_occurred")]
print(f"  {len(runs)} benchmarks, {len(errors)} with an error")
for e in errors[:3]: print(f"  error: {e}")
sys.exit(1 if errors or not runs else 0)
PY
  done
  pack
}

train() {
  begin "$@"
  note "dataset: $(cat "$carry/data/contents.txt")"
  local master
  for master in cuda:0 cpu; do
    step "fashion_mnist-master-${master%%:*}" 270 "$bin/fashion_mnist" --devices cuda:0 \
      --master "$master" --data "$carry/data" --epochs 5 --progress-every 0 \
      --metrics "$work/fashion_mnist-master-${master%%:*}.json" || status=1
    grep '^epoch' "$work/fashion_mnist-master-${master%%:*}.log" | tee -a "$summary" || true
  done
  pack
}

command=${1:-}
case $command in
  prepare) prepare ;;
  check) check ;;
  tests | bench | train) shift; "$command" "$@" ;;
  sanitize) shift; sanitize "$@" ;;
  *)
    echo "usage: scripts/gpu.sh prepare | check | tests OUT | sanitize OUT [memcheck|racecheck|synccheck] | bench OUT | train OUT" >&2
    exit 2
    ;;
esac
