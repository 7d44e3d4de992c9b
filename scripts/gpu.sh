#!/usr/bin/env bash
# The GPU run: every CUDA test, compute-sanitizer, the kernel benchmarks and the
# end-to-end FashionNet run on a machine with one NVIDIA GPU (H100/H200, sm_90).
# The GPU machine has the CUDA toolkit, the driver and PyTorch's wheels (cuDNN,
# cuBLAS, NCCL in site-packages/nvidia/*/lib, its Python in /opt/torch/.venv), but
# no Debian packages and no network, so the binaries are built here and travel
# with the libraries it lacks.
#
# HERE, on the development machine (no GPU needed):
#
#   scripts/gpu.sh prepare   the gpu preset (Release, sm_90, CUDA runtime linked in,
#                            NCCL linked dynamically, no OpenBLAS, no MPI), then
#                            build/gpu-carry/ with bin.tar.gz (bin/: the binaries,
#                            stripped; lib/: what ldd shows the GPU machine lacks),
#                            data/ (Fashion-MNIST) and build-info.txt. Refuses to
#                            finish when the working tree plus the carry exceeds the
#                            device tool's 64 MiB.
#
# THERE, on the GPU machine: two device calls, about 19 of the lease's 30 minutes
# (each has a hard deadline of 9 minutes; every step has its own time limit
# inside it and is cut, reported as such, when the deadline comes):
#
#   run(command='bash scripts/gpu.sh verify "$OUT"', carry=['build/gpu-carry'], timeout_s=600)
#   run(command='bash scripts/gpu.sh measure "$OUT"', carry=['build/gpu-carry'], timeout_s=600)
#
#   verify OUT    (~5-9 min) the check; the test binary in shards, each its own
#                 process, time limit and gtest XML: cuda-kernels (the kernels'
#                 CUDA cases), cuda-training (trainer, ring, determinism,
#                 checkpoints, ...), cuda-nccl (NCCL on one GPU) and cpu (every other
#                 case, once); then compute-sanitizer memcheck on the kernels' CUDA
#                 cases (their small shapes), racecheck and synccheck on the kernels
#                 with shared memory
#   measure OUT   (~4-9 min) the check; the CUDA cases of every bench with their
#                 cuBLAS/cuDNN/copy references (JSON, until 6 min before the
#                 deadline); FashionNet's step against PyTorch eager and with CUDA
#                 graphs; FashionNet, 5 epochs on cuda:0, master on cuda:0 then cpu
#
# The same steps one by one (each within one call; two calls above cost less):
#   check               libraries resolve (ldd -r), a GPU is visible, versions (cuDNN, NCCL)
#   tests OUT           the check and the test shards
#   sanitize OUT [memcheck|racecheck|synccheck]   the check and the sanitizers (all three,
#                       or the one named)
#   bench OUT           the check and the benches
#   train OUT           the check and FashionNet
#   peers OUT           the check and FashionNet's step against PyTorch eager and with
#                       CUDA graphs (bench/gpu_peers.py)
#   experiment OUT NAME [ARGS...]
#                       the check and one of bench/experiments/ (a standalone program
#                       timing a kernel's variants beside the vendor library), its
#                       output in the summary
#   profile OUT         the check and Nsight Compute (ncu --set full) on the bench
#                       cases TOWERLAB_GPU_PROFILE names: where a kernel's time goes
#   lease OUT           for a lease of 15 minutes (one call): the check, the GPU test
#                       shards, memcheck (90 s), the benches, FashionNet on cuda:0
#                       with the master on cuda:0
#   triage OUT          the first of two calls in a 15-minute lease that will change
#                       kernels (~2-3 min): the check, the GPU test shards, memcheck
#                       (60 s) and the profile of the cases TOWERLAB_GPU_PROFILE names;
#                       the second call measures the changed kernels (bench with
#                       TOWERLAB_GPU_BENCHES)
#   ab OUT FILTER [ROUNDS]
#                       the check, then an A/B of commits in one process tree: the
#                       bench cases FILTER selects, of the carry's own build and of
#                       each build prepare made for TOWERLAB_GPU_AB, run alternately
#                       ROUNDS times (default 2); the summary gives each case's times
#                       per build and each build's median against the carry's own
#
# Every command that takes OUT writes two files there (of the 8 allowed):
# OUT/<command>.tar.gz (every log, the gtest XML of each shard and sanitizer, the
# bench JSON, the training metrics, the check's output and build-info.txt) and
# OUT/<command>-summary.txt (what was run, each shard's pass/fail/skip counts, the
# verdict). Exit status 0 only when everything passed; 3 when no GPU is visible.
#
# Judging: a GPU is visible when towerlab_devices exits 0 and checked cuda:0
# (nvidia-smi is only logged; it may be missing). The tests run with
# TOWERLAB_REQUIRE_GPU=1. A case that fails, a shard that crashes or times out,
# and every skip that is not on the list of skips a one-GPU machine explains
# (judge_tests: the two- and three-GPU cases, CPU instances of CUDA-only cases, root, no
# numpy, no Debian dataset) fail the command: a CUDA case that skipped did not run.
#
# Settings:
#   TOWERLAB_GPU_REHEARSAL=1  runs every step past a failed check, to rehearse the
#                             script where there is no GPU; TOWERLAB_REQUIRE_GPU is
#                             then left unset, so the CUDA cases skip, and the judge
#                             must call that FAILED
#   TOWERLAB_GPU_BUILD=DIR    take the binaries from build folder DIR (default
#                             build/gpu, which prepare configures with the gpu
#                             preset; any other DIR must be configured already, e.g.
#                             an emulated-GPU build); the carry is then DIR-carry
#   TOWERLAB_GPU_PYTHON=PATH  the Python for the judges and the wheels' libraries
#                             (default /opt/torch/.venv/bin/python3, else python3)
#   TOWERLAB_GPU_LIB_PATH     library folders put first on LD_LIBRARY_PATH there
#   TOWERLAB_GPU_JOBS=N       prepare's build jobs (default: nproc)
#   TOWERLAB_GPU_DEADLINE=S   a command's deadline in seconds (default 540), for a
#                             call that must end sooner (what is left of a lease)
#   TOWERLAB_GPU_BENCHES="A B" the benches to run (default: every bench with CUDA
#                             cases), e.g. only those whose kernels changed; for ab
#                             and for prepare's TOWERLAB_GPU_AB builds, default
#                             conv2d_bench
#   TOWERLAB_GPU_AB="REF ..."  prepare also builds those benches at each commit REF (a
#                             branch, a tag, a hash: a lever not yet on main, or main
#                             before a change), each in a git worktree of its own
#                             under DIR-ab/ (DIR: the build folder), and carries them
#                             as bin/ab/<short hash>/ for the ab command
#   TOWERLAB_GPU_PROFILE      what profile measures, one case per line: BENCH FILTER
#                             [SKIP [COUNT]], e.g. 'matmul_bench BM_Cuda/cuda_NN/4096 20 1':
#                             ncu skips the first SKIP kernel launches of BENCH run with
#                             --benchmark_filter=FILTER (past set-up and cudnnFind's
#                             trials), then profiles COUNT of them (default 1)
#
# Results the project relies on go into bench/results/ with the commit, the device
# name and the date (build-info.txt and each summary hold them).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build=${TOWERLAB_GPU_BUILD:-build/gpu} # stays here
build=${build%/}
carry=$build-carry # what travels (ignored by git, like all of build/)
limit=$((64 * 1024 * 1024))
fashion_mnist=/usr/share/datasets/fashion-mnist

# Libraries the GPU machine has, by soname: the C and C++ runtime, the driver, and
# cuBLAS, cuDNN and NCCL from the toolkit or PyTorch's wheels (nvidia/*/lib).
# Everything else that ldd shows travels in lib/.
system_libs=' linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libstdc++.so.6 libgcc_s.so.1 libcuda.so.1 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 '
# Libraries that must not be linked into what travels: the runtime is linked in
# statically (one runtime, whatever the machine has), OpenBLAS and MPI are left out
# by the gpu preset (no use on one GPU, and MPI needs its launcher and plugins).
refused_libs='libcudart.so libopenblas.so libblas.so libgfortran.so libmpi.so libmpi_cxx.so'

die() {
  echo "gpu.sh: FAILED: $*" >&2
  exit 1
}

# The binaries that run on the GPU machine.
bench_names() {
  # Every bench with CUDA cases (io_bench is CPU-only), the ones that matter most
  # first: a bench that the deadline leaves out is then one of the last.
  local first='matmul_bench conv2d_bench trainer_bench batchnorm_bench pool2d_bench' all name
  all=$(grep -l 'cuda' bench/*_bench.cpp | xargs -n1 basename | sed 's/\.cpp$//')
  for name in $first; do grep -qx "$name" <<<"$all" && echo "$name"; done
  grep -vx -F "${first// /$'\n'}" <<<"$all" || true
}
binaries() {
  echo towerlab_tests fashion_mnist towerlab_devices
  bench_names
  experiment_names
}
# The GPU experiments (bench/experiments/*.cu, `experiment OUT NAME [ARGS]`).
experiment_names() {
  ls bench/experiments/*.cu 2>/dev/null | xargs -rn1 basename | sed 's/\.cu$//'
}
source_of() {
  if grep -qx -F "$1" <<<"$(experiment_names)"; then
    echo "$build/bench/experiments/$1"
    return
  fi
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
  if [ "$build" = build/gpu ]; then
    cmake --preset gpu >/dev/null
  elif [ ! -f "$build/CMakeCache.txt" ]; then
    die "$build is not configured (TOWERLAB_GPU_BUILD=$build): configure it first, then prepare"
  fi
  # shellcheck disable=SC2046
  cmake --build "$build" -j "${TOWERLAB_GPU_JOBS:-$(nproc)}" --target $(binaries)
  # The binaries, stripped, and the libraries they need, staged as they will be
  # unpacked there: bin/ and lib/ side by side.
  local stage=$build/stage
  rm -rf "$stage" "$carry"
  mkdir -p "$stage/bin" "$stage/lib" "$carry/data"
  for name in $(binaries); do
    strip -o "$stage/bin/$name" "$(source_of "$name")"
  done
  ab_builds

  # The gpu preset links NCCL (from the toolkit here, from PyTorch's wheels there):
  # without it the one-GPU NCCL cases would skip, which the judge calls a failure.
  # (grep reads a here-string, not a pipe: under pipefail `ldd | grep -q` fails
  # whenever grep's early exit kills ldd with SIGPIPE.)
  if [ "$build" = build/gpu ] && ! grep -q 'libnccl\.so\.2' <<<"$(ldd "$stage/bin/towerlab_tests")"; then
    die "towerlab_tests does not link libnccl.so.2: CMake did not find NCCL in the toolkit"
  fi

  # Shared libraries: refuse the ones that must not travel, copy the ones the GPU
  # machine lacks (under their soname, as the loader looks them up).
  local line soname path refused
  while read -r line; do
    soname=$(basename "${line%% *}")
    path=$(echo "$line" | awk '$2 == "=>" {print $3}')
    case $line in *"not found"*) die "$soname is not found here (ldd $stage/bin/*)" ;; esac
    # Another build (a rehearsal's, TOWERLAB_GPU_BUILD) may link them: they travel.
    for refused in $refused_libs; do
      [[ $build == build/gpu && $soname == "$refused"* ]] &&
        die "$soname is linked, but the gpu preset keeps it out (check CMakePresets.json)"
    done
    [[ $system_libs == *" $soname "* ]] && continue
    [ -n "$path" ] && cp -L "$path" "$stage/lib/$soname"
  done < <(for b in "$stage"/bin/*; do ldd "$b"; done | sed 's/^[[:space:]]*//; s/ (0x.*//' | sort -u)
  find "$stage/lib" -type f -exec strip --strip-unneeded {} +
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
    echo "built: $(date -u +%FT%TZ) on $(uname -n), $build ($(grep -o 'CMAKE_BUILD_TYPE:STRING=.*' \
      "$build/CMakeCache.txt" | cut -d= -f2)), $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1)"
    echo "dataset: $(cat "$carry/data/contents.txt")"
    [ -z "${TOWERLAB_GPU_AB:-}" ] || echo "ab builds: $(for ref in $TOWERLAB_GPU_AB; do
      echo -n "$ref=$(git rev-parse --short=7 "$ref^{commit}") "
    done)($(ab_bench_names))"
    echo "carried libraries: $(find "$stage/lib" -type f -printf '%f ' | sort)"
    echo "from the GPU machine: $system_libs"
    echo "newest glibc symbol version needed: $(objdump -T "$stage"/bin/* "$stage"/lib/* 2>/dev/null |
      grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
  } >"$carry/build-info.txt"

  read -r tree carried < <(travel_bytes)
  echo
  cat "$carry/build-info.txt"
  echo "in $carry/bin.tar.gz (unpacked sizes):"
  (cd "$stage" && du -b bin/* lib/* 2>/dev/null | awk '{printf "  %10d  %s\n", $1, $2}')
  echo "in $carry:"
  (cd "$carry" && find . -type f -printf '%s %P\n' | sort -k2 | awk '{printf "  %10d  %s\n", $1, $2}')
  echo "travels: working tree $(mib "$tree") + $carry $(mib "$carried") = $(mib $((tree + carried))) (limit 64 MiB)"
  ((tree + carried <= limit)) || die "$(mib $((tree + carried))) does not fit the device tool's 64 MiB"
  echo "comes back: 2 files per command, <command>.tar.gz and <command>-summary.txt (limit 8)"
  echo
  local env=""
  [ "$build" = build/gpu ] || env="TOWERLAB_GPU_BUILD=$build "
  echo "device tool calls, two, each with carry=['$carry'] and timeout_s=600:"
  for command in verify measure; do
    echo "  ${env}bash scripts/gpu.sh $command \"\$OUT\""
  done
}

# The benches of an A/B (ab, and prepare's TOWERLAB_GPU_AB builds).
ab_bench_names() { echo "${TOWERLAB_GPU_BENCHES:-conv2d_bench}"; }

# For each commit of TOWERLAB_GPU_AB: a worktree at DIR-ab/<short hash> (made once,
# then checked out again), the same preset as DIR, its A/B benches built (ccache
# shares every unchanged object with DIR's build) and staged, stripped, as
# bin/ab/<short hash>/.
ab_builds() {
  local ref sha short tree preset name
  preset=$(basename "$build")
  for ref in ${TOWERLAB_GPU_AB:-}; do
    sha=$(git rev-parse --verify --quiet "$ref^{commit}") || die "TOWERLAB_GPU_AB: '$ref' is not a commit"
    short=$(git rev-parse --short=7 "$sha")
    tree=$build-ab/$short
    [ -e "$tree/.git" ] || git worktree add --detach "$tree" "$sha" >/dev/null ||
      die "TOWERLAB_GPU_AB: no worktree for $ref at $tree"
    git -C "$tree" checkout --quiet --detach "$sha"
    (cd "$tree" && cmake --preset "$preset" >/dev/null) || die "TOWERLAB_GPU_AB: $ref does not configure"
    # shellcheck disable=SC2046
    cmake --build "$tree/build/$preset" -j "${TOWERLAB_GPU_JOBS:-$(nproc)}" --target $(ab_bench_names) ||
      die "TOWERLAB_GPU_AB: $ref does not build"
    mkdir -p "$stage/bin/ab/$short"
    for name in $(ab_bench_names); do
      strip -o "$stage/bin/ab/$short/$name" "$tree/build/$preset/bench/$name"
    done
    echo "ab: $ref = $short ($(git log -1 --format=%s "$sha" | cut -c1-100))"
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

# The Python for the judges and for finding the wheels: bare python3 may not be on
# the GPU machine's PATH, whose Python (with PyTorch) lives in /opt/torch/.venv.
find_python() {
  [ -z "${python:-}" ] || return 0
  local p
  for p in "${TOWERLAB_GPU_PYTHON:-}" /opt/torch/.venv/bin/python3 "$(command -v python3 || true)"; do
    if [ -n "$p" ] && [ -x "$p" ]; then
      python=$p
      return 0
    fi
  done
  die "no Python: neither /opt/torch/.venv/bin/python3 nor python3 on the PATH (set TOWERLAB_GPU_PYTHON)"
}

# Unpacks the binaries and libraries into a fresh temporary folder: $bin and $lib.
unpack() {
  [ -z "${bin:-}" ] || return 0
  [ -f "$carry/bin.tar.gz" ] ||
    die "$carry/bin.tar.gz is missing: run '${TOWERLAB_GPU_BUILD:+TOWERLAB_GPU_BUILD=$build }scripts/gpu.sh prepare' here and carry $carry"
  unpacked=$(mktemp -d "${TMPDIR:-/tmp}/towerlab-gpu.XXXXXX")
  trap 'rm -rf "$unpacked" ${work:+"$work"}' EXIT
  tar -xzf "$carry/bin.tar.gz" -C "$unpacked"
  bin=$unpacked/bin lib=$unpacked/lib
}

# The library path for our binaries: the carried libraries, the toolkit's, then
# every lib/ folder of the NVIDIA wheels beside PyTorch (nvidia/cudnn/lib,
# nvidia/nccl/lib, nvidia/cu13/lib, ...), found through $python's site-packages
# and the nvidia namespace package. TOWERLAB_GPU_LIB_PATH, when set, comes first.
set_library_path() {
  [ -z "${gpu_sh_library_path:-}" ] || return 0
  gpu_sh_library_path=1
  find_python
  local dirs=() site d
  [ -n "${TOWERLAB_GPU_LIB_PATH:-}" ] && dirs+=("$TOWERLAB_GPU_LIB_PATH")
  dirs+=("$lib")
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -d "$d" ] && dirs+=("$d"); done
  for site in $("$python" -c 'import site, sysconfig
dirs = [sysconfig.get_paths()["purelib"]] + site.getsitepackages()
try:
    import nvidia
    dirs += [p + "/.." for p in nvidia.__path__]
except ImportError:
    pass
print(" ".join(dirs))' 2>/dev/null) /opt/torch/.venv/lib/python3*/site-packages; do
    for d in "$site"/nvidia/*/lib; do
      [ -d "$d" ] || continue
      d=$(cd "$d" && pwd -P)
      [[ " ${dirs[*]} " != *" $d "* ]] && dirs+=("$d")
    done
  done
  LD_LIBRARY_PATH=$(
    IFS=:
    echo "${dirs[*]}"
  )${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH
}

# Every carried binary's libraries and symbols resolve, then a GPU is visible. Prints
# what it saw; exits 1 on a missing library or symbol or a wrong answer, 3 (loudly)
# when no GPU is visible.
check() {
  unpack
  set_library_path
  cat "$carry/build-info.txt"
  echo "python: $python"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  local missing=0 b
  for b in "$bin"/*; do
    # -r: also the symbols, so that a library too old for what was linked here
    # (NCCL from the wheels, say) shows now and not as a crash in a test.
    if grep -q -E 'not found|undefined symbol' <<<"$(ldd -r "$b" 2>&1)"; then
      echo "gpu.sh: $(basename "$b"): $(ldd -r "$b" 2>&1 | grep -E 'not found|undefined symbol' |
        tr -s ' \t' ' ' | sort -u | head -20 | tr '\n' ';')" >&2
      missing=1
    fi
  done
  ((missing == 0)) || die "libraries or symbols are missing (above); nothing was run"
  # Outside the GPU machine's own libraries, each must come from the carried ones:
  # this also catches, on a machine that happens to have it, one that did not travel.
  local stray
  stray=$(for b in "$bin"/*; do ldd "$b"; done | awk -v own="$system_libs" -v carried="$lib/" '
    $2 == "=>" && index(own, " " $1 " ") == 0 && index($3, carried) != 1 {print "  " $1 " => " $3}' |
    sort -u)
  [ -z "$stray" ] || die "libraries that did not travel and the GPU machine lacks:
$stray"
  echo "libraries: every binary in $carry/bin.tar.gz resolves all its libraries and symbols:"
  for b in "$bin"/*; do ldd "$b"; done | awk '$2 == "=>" {print "  " $1 " => " $3}' | sort -u
  # The versions of the libraries found by soname, as the binaries will load them.
  "$python" - <<'PY' || true
import ctypes
def loaded(soname):
    with open("/proc/self/maps") as maps:
        paths = {l.split()[-1] for l in maps if soname in l}
    return ", ".join(sorted(paths)) or "?"
def version(soname, get):
    try:
        lib = ctypes.CDLL(soname)
    except OSError as e:
        return f"{soname}: not loadable ({e})"
    try:
        return f"{soname}: {get(lib)} from {loaded(soname)}"
    except Exception as e:  # a library without the call
        return f"{soname}: no version ({e}) from {loaded(soname)}"
def cudnn(lib):
    v = lib.cudnnGetVersion()  # cuDNN 9: major * 10000 + minor * 100 + patch
    return f"cudnnGetVersion() = {v} ({v // 10000}.{v // 100 % 100}.{v % 100})"
def nccl(lib):
    v = ctypes.c_int()
    lib.ncclGetVersion(ctypes.byref(v))  # NCCL >= 2.9: major * 10000 + minor * 100 + patch
    v = v.value
    return f"ncclGetVersion() = {v} ({v // 10000}.{v // 100 % 100}.{v % 100})"
def cublas(lib):
    v = ctypes.c_int()
    lib.cublasGetProperty(0, ctypes.byref(v)); major = v.value
    lib.cublasGetProperty(1, ctypes.byref(v)); minor = v.value
    lib.cublasGetProperty(2, ctypes.byref(v))
    return f"cublasGetProperty = {major}.{minor}.{v.value}"
print("versions:")
for soname, get in (("libcudnn.so.9", cudnn), ("libnccl.so.2", nccl), ("libcublas.so.13", cublas)):
    print("  " + version(soname, get))
PY
  local devices devices_rc=0
  devices=$("$bin/towerlab_devices" 2>&1) || devices_rc=$?
  echo "$devices"
  echo "towerlab_devices: exit $devices_rc"
  # nvidia-smi is logged when there: its absence is no sign of a missing GPU.
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 ||
      echo "nvidia-smi: exit $? (towerlab_devices above is what counts)"
  else
    echo "nvidia-smi: not on the PATH (towerlab_devices above is what counts)"
  fi
  if ((devices_rc == 0)) && grep -q -E '^ *cuda:0 .* ok$' <<<"$devices"; then
    return 0
  fi
  {
    echo
    echo "################################################################################"
    if ((devices_rc != 0)); then
      echo "gpu.sh: FAILED: towerlab_devices exited $devices_rc (a wrong answer or an error, above)."
    else
      echo "gpu.sh: FAILED: no GPU visible: towerlab_devices (above) checked no cuda:0."
    fi
    echo "Without a GPU every CUDA test would skip and read as a pass."
    echo "################################################################################"
  } >&2
  ((devices_rc != 0)) && grep -q -E '^ *cuda:0 ' <<<"$devices" && exit 1
  exit 3
}

# Begins a device command: a fresh folder for its logs (pack() turns it into
# OUT/<command>.tar.gz), the library path, the check (a failed one ends the command
# with its status), the deadline for its steps, and the tests' settings: a GPU
# required, the corpus in the tree.
begin() {
  out=${1:?usage: scripts/gpu.sh $command OUT}
  deadline=$((SECONDS + ${TOWERLAB_GPU_DEADLINE:-${2:-540}}))
  mkdir -p "$out"
  unpack
  work=$(mktemp -d "${TMPDIR:-/tmp}/towerlab-gpu-$command.XXXXXX")
  summary="$out/$command-summary.txt"
  : >"$summary"
  status=0 check_status=0
  note "$command on $(uname -n), $(date -u +%FT%TZ), deadline $((deadline - SECONDS))s"
  note "$(grep -E '^(commit|built):' "$carry/build-info.txt")"
  set_library_path
  local check_rc=0
  (check) >"$work/check.log" 2>&1 || check_rc=$?
  grep -E '^(python|  lib(cudnn|nccl|cublas)\.so.*: |towerlab sees|  (cpu|cuda:)|no CUDA device|towerlab_devices:|nvidia-smi|[^ ].*, [0-9]+ MiB$|gpu.sh: )' \
    "$work/check.log" | sed 's/^/  /' | tee -a "$summary" || true
  export TOWERLAB_FUZZ_DIR=$repo/fuzz
  if ((check_rc == 0)); then
    note "check: passed, ${SECONDS}s"
    export TOWERLAB_REQUIRE_GPU=1
    return 0
  fi
  status=$check_rc check_status=$check_rc
  cat "$work/check.log" >&2
  note "check: FAILED (exit $check_rc)"
  if [ "${TOWERLAB_GPU_REHEARSAL:-}" != 1 ]; then
    note "nothing else was run"
    pack
  fi
  # A rehearsal (on a machine without a GPU) goes on to exercise the steps and the
  # judging; TOWERLAB_REQUIRE_GPU stays unset so that the CPU cases run and the CUDA
  # cases skip, which the judge must call a failure. The command fails all the same.
  note "rehearsal: the steps run anyway, without TOWERLAB_REQUIRE_GPU; the command fails"
}
note() { echo "$*" | tee -a "$summary"; }
pack() {
  ((check_status == 0)) || status=$check_status # the reason that explains the others
  if ((status == 0)); then note "$command: PASSED"; else note "$command: FAILED (exit $status; see above)"; fi
  note "$command took ${SECONDS}s"
  cp "$summary" "$carry/build-info.txt" "$work/"
  # No log may push the archive past the 16 MiB a returned file may have.
  local f
  for f in "$work"/*; do
    if [ "$(stat -c %s "$f")" -gt $((3 * 1024 * 1024)) ]; then
      { head -c 1M "$f"; echo; echo "[... cut by gpu.sh ...]"; tail -c 1M "$f"; } >"$f.cut"
      mv "$f.cut" "$f"
    fi
  done
  tar -czf "$out/$command.tar.gz" -C "$work" .
  exit "$status"
}
# step NAME SECONDS CMD...: runs CMD with its output in NAME.log, under SECONDS or
# what is left before the command's deadline (30 s are kept for packing), whichever
# is less. Returns CMD's status; 124 when it ran out of time or was not started.
step() {
  local name=$1 seconds=$2 rc=0 start=$SECONDS left
  shift 2
  left=$((deadline - SECONDS - 30))
  if ((left < 10)); then
    note "$name: NOT RUN, the command's deadline has come"
    return 124
  fi
  ((seconds <= left)) || seconds=$left
  timeout --kill-after=10 "$seconds" "$@" >"$work/$name.log" 2>&1 || rc=$?
  if ((rc == 124 || rc == 137)); then
    note "$name: TIMED OUT after ${seconds}s"
    rc=124
  else
    note "$name: exit $rc, $((SECONDS - start))s"
  fi
  # A failed step's last words, often the reason (a test's "[  FAILED  ]" lines are
  # judged on their own).
  ((rc == 0 || rc == 124)) || note "  last line: $(tail -n 1 "$work/$name.log" | cut -c1-200)"
  return $rc
}

# judge_tests NAME: judges NAME.xml (gtest's report) and NAME.log, of the cases
# listed in cases-NAME.txt. Prints the counts, each failure and each kind of skip;
# fails on a failure, a case that did not run, a missing report (a crash or a
# time-out: the case that was running is named) and every skip not listed below.
judge_tests() {
  "$python" - "$work" "$1" <<'PY' | tee -a "$summary"
import os, re, sys, xml.etree.ElementTree as ET
work, name = sys.argv[1], sys.argv[2]
# The skips a machine with ONE GPU explains, and nothing else: (the skip message,
# matched whole; the cases that may give it, matched whole; why it is expected).
# Any other skip fails the run: on the GPU machine a CUDA case that skipped did
# not run ("no CUDA device", "this build of towerlab has no NCCL", ...).
EXPECTED = [
    (r"needs two CUDA devices", r".*", "two GPUs"),
    (r"needs three CUDA devices", r".*", "three GPUs"),
    (r"needs 2 GPU\(s\) for as many NCCL ranks; 1 visible", r"Nccl\w*\.\w+", "two GPUs"),
    # The CPU instance of a case that only means something on a GPU.
    (r"compares the CUDA kernels with the CPU backend", r".*/cpu", "CPU instance"),
    (r"CUDA-only: .*", r".*/cpu", "CPU instance"),
    (r"a host stream's work has finished when each call returns", r".*/cpu", "CPU instance"),
    # The GPU machine itself: root, no Debian packages.
    (r"running as root, which ignores directory permissions", r".*", "root"),
    (r"/usr/bin/python3 with numpy not available", r".*", "no Debian numpy"),
    (r"Debian's dataset-fashion-mnist is not installed", r".*", "no Debian dataset"),
    # What the host CPU and the build are, which a GPU run does not judge: a CPU
    # with every GEMM ISA has none to refuse; a rehearsal's build may have MPI (the
    # gpu preset has none, so there the refusal runs).
    (r"this CPU has every GEMM ISA", r"SettingsEnvironment\.\w+", "CPU with every ISA"),
    (r"this build has MPI: .*", r"Cluster\.BuildWithoutMpi\w+", "a build with MPI"),
    # A host CPU without AVX-512 has no second ISA to compare the AVX2 paths' bits with.
    (r"this CPU has no AVX-512", r"(Conv2dDirect|Conv2dWinograd)\.Avx512GivesTheAvx2Bits",
     "CPU without AVX-512"),
]
def expected(why, case):
    for message, cases, label in EXPECTED:
        if re.fullmatch(message, why) and re.fullmatch(cases, case):
            return label
    return None
def message(element):
    # "file:line" and then the message, in the text or the message attribute.
    text = (element.text or element.get("message") or "").strip()
    lines = text.splitlines()
    if lines and re.match(r"^\S+:\d+$", lines[0].strip()): lines = lines[1:]
    return " ".join(l.strip() for l in lines if l.strip()) or "(no message)"
def last_started(log):
    # The case a crash or a time-out interrupted: started, never finished.
    running = None
    try:
        for line in open(log, errors="replace"):
            m = re.match(r"\[ RUN      \] (\S+)", line)
            if m: running = m.group(1)
            elif re.match(r"\[ +(OK|FAILED|SKIPPED) +\] ", line): running = None
    except OSError:
        pass
    return running
listed = set(open(os.path.join(work, f"cases-{name}.txt")).read().split())
try:
    root = ET.parse(os.path.join(work, f"{name}.xml")).getroot()
except (OSError, ET.ParseError) as e:
    running = last_started(os.path.join(work, f"{name}.log"))
    print(f"  {name}: {len(listed)} cases, NO REPORT (a crash or a time-out; {e.__class__.__name__})"
          + (f"; it was running {running}" if running else ""))
    sys.exit(1)
passed = failed = unexpected = 0; failures = []; skips = {}; seen = set()
for case in root.iter("testcase"):
    full = f"{case.get('classname')}.{case.get('name')}"
    failed += bool(case.findall("failure"))
    for failure in case.findall("failure"):
        # The suite-less entry holds failures outside any test (a global set-up).
        failures.append(f"{full if full != '.' else '(outside any test)'}: {message(failure)}")
    if case.get("status") != "run" or full == ".": continue
    seen.add(full)
    skip = case.find("skipped")
    if skip is not None or case.get("result") == "skipped":
        why = message(skip) if skip is not None else "(no message)"
        label = expected(why, full)
        unexpected += label is None
        skips.setdefault((why, label), []).append(full)
    elif not case.findall("failure"):
        passed += 1
not_run = sorted(listed - seen)
skipped = sum(map(len, skips.values()))
print(f"  {name}: {len(listed)} cases: {passed} passed, {failed} failed, {skipped} skipped"
      f" ({skipped - unexpected} expected, {unexpected} UNEXPECTED), {len(not_run)} not run")
for f in failures[:20]: print(f"    FAILED {f[:300]}")
if len(failures) > 20: print(f"    ... and {len(failures) - 20} more failures")
for (why, label), cases in sorted(skips.items(), key=lambda kv: (kv[0][1] is not None, kv[0][0])):
    mark = f"expected ({label})" if label else "UNEXPECTED"
    print(f"    skipped {len(cases)}, {mark}: {why[:160]} (e.g. {cases[0]})")
for c in not_run[:5]: print(f"    NOT RUN {c}")
sys.exit(1 if failures or unexpected or not_run or not seen else 0)
PY
}

# The test binary's cases, one full name a line (Suite.Case, Backends/Suite.Case/cpu).
list_cases() {
  "$bin/towerlab_tests" --gtest_list_tests | awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}' |
    grep -v -E '(^|[./])DISABLED_' || true
}

# Splits the cases into the shards, cases-<shard>.txt, each case in one shard:
#   cuda-kernels   the kernels' CUDA cases (small shapes; what the sanitizers run)
#   cuda-nccl      NCCL on one GPU, apart: a collective that hangs takes only it
#   cuda-training  the other cases that reach a GPU (trainer, ring, determinism, ...)
#   cpu            every other case
shard_cases() {
  list_cases >"$work/cases-all.txt"
  local cuda='/cuda0$|Cuda|CUDA|Gpu|GPU|^Nccl|\.Nccl|^(Trainer|CheckpointTest|Cluster|TensorCpu|RequireGpu|Device)\.'
  local nccl='^Nccl|\.Nccl'
  local kernels='^Backends/(BatchNorm|Bias|Conv2d|Elementwise|Fusion|Loss|Matmul|Optimizer|Pool2d|Random|Reduce|Relu|Tensor|Stream|PeerAdd)Test\.|CudaVsCpu\.|^(Conv2dShape|Conv2dWinogradCuda|TensorCuda|BatchNormMaxPoolTest)\.'
  grep -E "$cuda" "$work/cases-all.txt" | grep -v '/cpu$' >"$work/cases-cuda.txt" || true
  grep -v -x -F -f "$work/cases-cuda.txt" "$work/cases-all.txt" >"$work/cases-cpu.txt" || true
  grep -E "$nccl" "$work/cases-cuda.txt" >"$work/cases-cuda-nccl.txt" || true
  grep -v -E "$nccl" "$work/cases-cuda.txt" | grep -E "$kernels" >"$work/cases-cuda-kernels.txt" || true
  grep -v -x -F -f "$work/cases-cuda-nccl.txt" -f "$work/cases-cuda-kernels.txt" "$work/cases-cuda.txt" \
    >"$work/cases-cuda-training.txt" || true
  # The sanitizers' cases: the kernels' CUDA cases on their small shapes (not the
  # FashionNet-sized layers); racecheck and synccheck only those with shared memory
  # (matmul, conv2d, batch norm, losses, pooling, bias, reductions).
  grep -E '/cuda0$|CudaVsCpu\.|^Conv2dWinogradCuda\.' "$work/cases-cuda-kernels.txt" |
    grep -v -E 'OnLargeLayers' \
    >"$work/cases-memcheck.txt" || true
  grep -E '^(Backends/)?(BatchNorm|Bias|Conv2d|Loss|Matmul|Pool2d|Reduce)(Test|CudaVsCpu)\.|^Conv2dWinogradCuda\.' \
    "$work/cases-memcheck.txt" >"$work/cases-shared-memory.txt" || true
  cp "$work/cases-shared-memory.txt" "$work/cases-racecheck.txt"
  cp "$work/cases-shared-memory.txt" "$work/cases-synccheck.txt"
  note "cases: $(wc -l <"$work/cases-all.txt") in the test binary: cuda-kernels $(wc -l <"$work/cases-cuda-kernels.txt"), cuda-training $(wc -l <"$work/cases-cuda-training.txt"), cuda-nccl $(wc -l <"$work/cases-cuda-nccl.txt"), cpu $(wc -l <"$work/cases-cpu.txt"); memcheck $(wc -l <"$work/cases-memcheck.txt"), racecheck and synccheck $(wc -l <"$work/cases-shared-memory.txt")"
}

# The gtest filter of cases-$1.txt; fails on an empty list (a filter that no longer
# matches is a bug of this script, not a pass).
filter_of() {
  [ -s "$work/cases-$1.txt" ] || return 1
  local filter
  filter=$(paste -sd: "$work/cases-$1.txt")
  ((${#filter} < 120000)) || die "the $1 filter is ${#filter} characters, over what one argument may have"
  echo "$filter"
}

# run_shard NAME SECONDS [PREFIX...]: the cases of cases-NAME.txt in one process,
# with PREFIX (a sanitizer) before the test binary; NAME.log, NAME.xml, judged.
run_shard() {
  local name=$1 seconds=$2 filter
  shift 2
  if ! filter=$(filter_of "$name"); then
    note "  $name: no case matched its filter: FAILED"
    status=1
    return 0
  fi
  step "$name" "$seconds" "$@" "$bin/towerlab_tests" --gtest_filter="$filter" \
    --gtest_output=xml:"$work/$name.xml" || status=1
  judge_tests "$name" || status=1
}

# The shards' limits: the GPU cases first, the CPU cases last (CI runs them too).
test_shards() {
  shard_cases
  run_shard cuda-kernels 100
  run_shard cuda-training 120
  run_shard cuda-nccl 60
  [ "${1:-}" = cuda ] || run_shard cpu 120
}

sanitizers() {
  local tools=${1:-memcheck racecheck synccheck}
  [ -f "$work/cases-all.txt" ] || shard_cases
  local sanitizer tool seconds
  sanitizer=$(command -v compute-sanitizer || true)
  for tool in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -n "$sanitizer" ] || [ ! -x "$tool" ] || sanitizer=$tool
  done
  if [ -z "$sanitizer" ]; then
    note "compute-sanitizer is not on the PATH nor in /usr/local/cuda: FAILED"
    status=1
    [ "${TOWERLAB_GPU_REHEARSAL:-}" = 1 ] || return 0
    # A rehearsal goes on without it, to exercise the sanitizers' shards.
    note "rehearsal: the sanitizers' shards run without compute-sanitizer"
    sanitizer="env"
  fi
  for tool in $tools; do
    case $tool in
      memcheck) seconds=180 ;;
      racecheck) seconds=100 ;;
      synccheck) seconds=60 ;;
      *) die "unknown sanitizer tool '$tool' (memcheck, racecheck or synccheck)" ;;
    esac
    # One tool named: it has the whole budget, or the seconds given.
    [ "$tools" = "$tool" ] && seconds=${2:-480}
    if [ "$sanitizer" = env ]; then
      run_shard "$tool" "$seconds" env
    else
      # Exact blocks: no cached segment hides an overrun from memcheck.
      run_shard "$tool" "$seconds" env TOWERLAB_EXACT_ALLOCATIONS=1 \
        "$sanitizer" --tool "$tool" --error-exitcode 99 --print-limit 200
    fi
    grep -E '(ERROR|RACECHECK) SUMMARY' "$work/$tool.log" | sed 's/^/    /' | tee -a "$summary" || true
  done
}

# The CUDA cases of each bench and their GPU references (cuBLAS, cuDNN, the device
# copy), one after another, until $1 seconds before the deadline.
benches() {
  local keep=$1 name seconds
  for name in ${TOWERLAB_GPU_BENCHES:-$(bench_names)}; do
    seconds=$((deadline - keep - SECONDS))
    ((seconds < 60)) || seconds=60
    if ((seconds < 10)); then
      note "$name: NOT RUN, its share of the command's time is spent: FAILED"
      status=1
      continue
    fi
    # The training step is the noisiest (host threads, launches): its cases run 5
    # times each, interleaved at random, and the report takes the medians.
    local repeat=()
    [ "$name" = trainer_bench ] &&
      repeat=(--benchmark_repetitions=5 --benchmark_enable_random_interleaving=true)
    step "$name" "$seconds" "$bin/$name" --benchmark_filter='cuda|cublas|cudnn' \
      --benchmark_min_time=0.2 "${repeat[@]}" --benchmark_format=json \
      --benchmark_out="$work/$name.json" || status=1
    "$python" - "$work/$name.json" <<'PY' | tee -a "$summary" || status=1
import json, sys
try:
    runs = json.load(open(sys.argv[1]))["benchmarks"]
except (OSError, ValueError, KeyError) as e:
    print(f"  no readable results ({e.__class__.__name__}): FAILED"); sys.exit(1)
errors = [r["name"] + ": " + r.get("error_message", "") for r in runs if r.get("error_occurred")]
print(f"  {len(runs)} benchmarks, {len(errors)} with an error")
for e in errors[:3]: print(f"  error: {e}")
sys.exit(1 if errors or not runs else 0)
PY
  done
}

# Nsight Compute on the cases TOWERLAB_GPU_PROFILE names, one report each
# (profile-N-BENCH.log); the summary keeps each kernel's name, time, throughputs,
# registers and occupancy.
profile_kernels() {
  local ncu tool bench filter skip count i=0
  ncu=$(command -v ncu || true)
  for tool in /usr/local/cuda/bin/ncu /usr/local/cuda/nsight-compute*/ncu; do
    [ -n "$ncu" ] || [ ! -x "$tool" ] || ncu=$tool
  done
  [ -n "$ncu" ] || { note "ncu is not on the PATH nor in /usr/local/cuda: FAILED"; status=1; return 0; }
  [ -n "${TOWERLAB_GPU_PROFILE:-}" ] || die "profile: TOWERLAB_GPU_PROFILE names no case"
  while read -r bench filter skip count; do
    [ -n "$bench" ] || continue
    i=$((i + 1))
    [ -x "$bin/$bench" ] || { note "profile $i: no bench '$bench' in the carry: FAILED"; status=1; continue; }
    step "profile-$i-$bench" 90 "$ncu" --set full --launch-skip "${skip:-20}" \
      --launch-count "${count:-1}" "$bin/$bench" --benchmark_filter="$filter" \
      --benchmark_min_time=0.05 || status=1
    note "  $bench $filter:"
    grep -E '^  [^ ].*\(([0-9]+, ){2}[0-9]+\)x\(|^ +(Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Dynamic Shared Memory Per Block|Static Shared Memory Per Block) ' \
      "$work/profile-$i-$bench.log" | sed 's/^ */    /' | tee -a "$summary" || true
  done <<<"$TOWERLAB_GPU_PROFILE"
}

# FashionNet's training step: towerlab (trainer_bench) against PyTorch eager and
# PyTorch with CUDA graphs, alternated in one process tree (bench/gpu_peers.py).
peers() {
  step gpu_peers "$1" "$python" "$repo/bench/gpu_peers.py" --trainer-bench "$bin/trainer_bench" \
    --json "$work/gpu_peers.json" || status=1
  sed -n '/^FashionNet/,$p' "$work/gpu_peers.log" | sed 's/^/  /' | tee -a "$summary" || true
}

# FashionNet, 5 epochs on cuda:0 with the master on cuda:0, then on the CPU.
training() {
  note "dataset: $(cat "$carry/data/contents.txt")"
  local master
  for master in ${1:-cuda:0 cpu}; do
    step "fashion_mnist-master-${master%%:*}" 105 "$bin/fashion_mnist" --devices cuda:0 \
      --master "$master" --data "$carry/data" --epochs 5 --progress-every 0 \
      --metrics "$work/fashion_mnist-master-${master%%:*}.json" || status=1
    grep '^epoch' "$work/fashion_mnist-master-${master%%:*}.log" | sed 's/^/  /' |
      tee -a "$summary" || true
  done
}

# ab_runs FILTER ROUNDS: the A/B benches' cases FILTER selects, for the carry's own
# build ("head") and each of bin/ab/*, one after the other in every round; then the
# table of times (us or ms, as the bench reports) and each build's median against
# head's, case by case.
ab_runs() {
  local filter=$1 rounds=$2 name r label binary builds=()
  [ -d "$bin/ab" ] || die "ab: the carry has no A/B builds (prepare with TOWERLAB_GPU_AB)"
  mapfile -t builds < <(cd "$bin/ab" && ls)
  builds=(head "${builds[@]}")
  for name in $(ab_bench_names); do
    for ((r = 1; r <= rounds; r++)); do
      for label in "${builds[@]}"; do
        binary=$bin/$name
        [ "$label" = head ] || binary=$bin/ab/$label/$name
        step "ab-$name-$label-$r" 120 "$binary" --benchmark_filter="$filter" \
          --benchmark_min_time=0.1 --benchmark_format=json \
          --benchmark_out="$work/ab-$name-$label-$r.json" || status=1
      done
    done
  done
  "$python" - "$work" "${builds[@]}" <<'PY' | tee -a "$summary" || status=1
import collections, glob, json, os, re, statistics, sys
work, builds = sys.argv[1], sys.argv[2:]
times = collections.defaultdict(list)  # (case, build) -> times
unit = {}
for path in sorted(glob.glob(os.path.join(work, "ab-*.json"))):
    m = re.match(r"ab-(.+)-([^-]+)-(\d+)\.json$", os.path.basename(path))
    try:
        runs = json.load(open(path))["benchmarks"]
    except (OSError, ValueError, KeyError):
        print(f"  {os.path.basename(path)}: no readable results: FAILED"); sys.exit(1)
    for run in runs:
        if run.get("error_occurred"):
            print(f"  {run['name']}: {run.get('error_message', 'error')}: FAILED"); sys.exit(1)
        case = run["name"].replace("/manual_time", "").replace("/real_time", "")
        times[(case, m.group(2))].append(run["real_time"])
        unit[case] = run.get("time_unit", "")
cases = sorted({c for c, _ in times})
if not cases:
    print("  no case matched the filter: FAILED"); sys.exit(1)
print("  " + " | ".join(["case"] + builds + [f"{b} / head" for b in builds[1:]]))
for case in cases:
    cells = [" / ".join(f"{t:.1f}" for t in times[(case, b)]) or "-" for b in builds]
    head = times[(case, "head")]
    ratios = [f"{statistics.median(times[(case, b)]) / statistics.median(head):.3f}"
              if head and times[(case, b)] else "-" for b in builds[1:]]
    print(f"  {case} ({unit[case]}) | " + " | ".join(cells + ratios))
PY
}

command=${1:-}
[ $# -gt 0 ] && shift
case $command in
  prepare) prepare ;;
  check) check ;;
  # Each command has a deadline of 540 s, inside the device tool's 600 s with room
  # for unpacking and packing; its steps share it as their limits say.
  verify)
    begin "${1:-}" 540
    test_shards
    sanitizers
    pack
    ;;
  measure)
    begin "${1:-}" 540
    benches 350 # kept for the peers (100 s) and FashionNet (two runs of at most 105 s)
    peers 100
    training
    pack
    ;;
  # A lease of 15 minutes, start-up included, has room for one full command: the
  # GPU shards (CI runs the CPU cases), memcheck, the benches and FashionNet with
  # the master on cuda:0. What it leaves out is in its summary, NOT RUN.
  lease)
    begin "${1:-}" 540
    test_shards cuda
    sanitizers memcheck 90
    benches 140 # kept for FashionNet: one run of at most 105 s, and packing
    training cuda:0
    pack
    ;;
  triage)
    begin "${1:-}" 540
    test_shards cuda
    sanitizers memcheck 60
    profile_kernels
    pack
    ;;
  tests)
    begin "${1:-}" 540
    test_shards
    pack
    ;;
  sanitize)
    begin "${1:-}" 540
    sanitizers "${2:-}"
    pack
    ;;
  bench)
    begin "${1:-}" 540
    benches 0
    pack
    ;;
  train)
    begin "${1:-}" 540
    training
    pack
    ;;
  peers)
    begin "${1:-}" 540
    peers 480
    pack
    ;;
  profile)
    begin "${1:-}" 540
    profile_kernels
    pack
    ;;
  ab)
    begin "${1:-}" 540
    ab_runs "${2:?usage: scripts/gpu.sh ab OUT FILTER [ROUNDS]}" "${3:-2}"
    pack
    ;;
  experiment)
    begin "${1:-}" 540
    name=${2:?usage: scripts/gpu.sh experiment OUT NAME [ARGS...]}
    shift 2
    [ -x "$bin/$name" ] || die "experiment: no '$name' in the carry (bench/experiments/$name.cu)"
    step "experiment-$name" 300 "$bin/$name" "$@" || status=1
    sed 's/^/  /' "$work/experiment-$name.log" | tee -a "$summary"
    pack
    ;;
  *)
    echo "usage: scripts/gpu.sh prepare | check | verify OUT | measure OUT | lease OUT | triage OUT | tests OUT | sanitize OUT [memcheck|racecheck|synccheck] | bench OUT | train OUT | peers OUT | profile OUT | ab OUT FILTER [ROUNDS] | experiment OUT NAME [ARGS...]" >&2
    exit 2
    ;;
esac
