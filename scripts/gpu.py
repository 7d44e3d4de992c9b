#!/usr/bin/env python3
"""The GPU run: every CUDA test, compute-sanitizer, the kernel benchmarks and the end-to-end
FashionNet run on a machine with one NVIDIA GPU (H100/H200, sm_90). The GPU machine has the
CUDA toolkit, the driver and PyTorch's wheels (cuDNN, cuBLAS, NCCL in site-packages/nvidia/*/lib,
its Python in /opt/torch/.venv), but no Debian packages and no network, so the binaries are
built here and travel with the libraries it lacks. Standard library only: this runs on the GPU
machine's Python and on the development machine's.

HERE, on the development machine (no GPU needed):

  scripts/gpu.py prepare   the gpu preset (Release, sm_90, CUDA runtime linked in, NCCL linked
                           dynamically, no OpenBLAS, no MPI), then build/gpu-carry/ with
                           bin.tar.gz (bin/: the binaries, stripped; lib/: what ldd shows the
                           GPU machine lacks), data/ (Fashion-MNIST) and build-info.txt. Refuses
                           to finish when the working tree plus the carry exceeds the device
                           tool's 64 MiB.

THERE, on the GPU machine: two device calls (scripts/gpu.sh starts this file with the GPU
machine's Python, /opt/torch/.venv/bin/python3, bare python3 may not be on its PATH); each has
a hard deadline of 9 minutes, every step its own time limit inside it, cut and reported as
such when the deadline comes:

  run(command='bash scripts/gpu.sh verify "$OUT"', carry=['build/gpu-carry'], timeout_s=600)
  run(command='bash scripts/gpu.sh measure "$OUT"', carry=['build/gpu-carry'], timeout_s=600)

  verify OUT    (~5-9 min) the check; the test binary in shards, each its own process, time
                limit and gtest XML: cuda-kernels (the kernels' CUDA cases), cuda-training
                (trainer, ring, determinism, checkpoints, ...), cuda-nccl (NCCL on one GPU)
                and cpu (every other case, once); then compute-sanitizer memcheck on the
                kernels' CUDA cases (their small shapes), racecheck and synccheck on the
                kernels with shared memory
  measure OUT   (~4-9 min) the check; the CUDA cases of every bench with their cuBLAS/cuDNN/
                copy references (JSON, until 6 min before the deadline); FashionNet's step
                against PyTorch eager and with CUDA graphs; FashionNet, 5 epochs on cuda:0,
                master on cuda:0 then cpu

The same steps one by one, and the commands of a short lease: `scripts/gpu.py --help` and
docs/gpu.md. Every command that takes OUT writes two files there (of the 8 allowed):
OUT/<command>.tar.gz (every log, the gtest XML of each shard and sanitizer, the bench JSON,
the training metrics, the check's output and build-info.txt) and OUT/<command>-summary.txt
(what was run, each shard's pass/fail/skip counts, the verdict). Exit status 0 only when
everything passed; 3 when no GPU is visible.

Judging (judge_shard, EXPECTED_SKIPS): a GPU is visible when towerlab_devices exits 0 and
checked cuda:0 (nvidia-smi is only logged). The tests run with TOWERLAB_REQUIRE_GPU=1. A case
that fails, a shard that crashes or times out, and every skip that is not on the list of
skips a one-GPU machine explains fail the command: a CUDA case that skipped did not run.
The judge and the summaries are plain functions in scripts/gpu_judge.py, tested by
tests/gpu_script_test.py.

Settings (environment):
  TOWERLAB_GPU_REHEARSAL=1  runs every step past a failed check, to rehearse the script where
                            there is no GPU; TOWERLAB_REQUIRE_GPU is then left unset, so the
                            CUDA cases skip (or run on the emulated GPUs of an emulated build)
  TOWERLAB_GPU_BUILD=DIR    take the binaries from build folder DIR (default build/gpu, which
                            prepare configures with the gpu preset; any other DIR must be
                            configured already, e.g. an emulated-GPU build); the carry is then
                            DIR-carry
  TOWERLAB_GPU_PYTHON=PATH  the Python for PyTorch (the peers) and for finding the wheels'
                            libraries (default /opt/torch/.venv/bin/python3, else this one)
  TOWERLAB_GPU_LIB_PATH     library folders put first on LD_LIBRARY_PATH there
  TOWERLAB_GPU_JOBS=N       prepare's build jobs (default: the CPU count)
  TOWERLAB_GPU_DEADLINE=S   a command's deadline in seconds (default 540), for a call that must
                            end sooner (what is left of a lease)
  TOWERLAB_GPU_BENCHES="A B" the benches to run (default: every bench with CUDA cases); for ab
                            and prepare's TOWERLAB_GPU_AB builds, default conv2d_bench
  TOWERLAB_GPU_AB="REF ..." prepare also builds those benches at each commit REF, each in a git
                            worktree under DIR-ab/, carried as bin/ab/<short hash>/ for `ab`
  TOWERLAB_GPU_PROFILE      what profile measures, one case per line: BENCH FILTER [SKIP
                            [COUNT]], e.g. 'matmul_bench BM_Cuda/cuda_NN/4096 20 1'

Results the project relies on go into bench/results/ with the commit, the device name and
the date (build-info.txt and each summary hold them).
"""
import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # nothing written into the tree that travels
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_judge import (  # noqa: E402  (the judge and the summaries, tested apart)
    FIRST_BENCHES, LIMIT, LOG_CUT, SANITIZER_SECONDS, SHARD_SECONDS, SYSTEM_LIBS, Failed,
    ab_table, bench_limit, bench_summary, check_summary, cut_log, devices_verdict, gtest_filter,
    judge_shard, libraries_to_carry, mib, parse_ldd, parse_test_list, profile_cases,
    profile_summary, shard_cases, shards_line, step_limit, step_line, travel_line, verdict_lines,
    write_idx_subset)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTED = time.monotonic()  # a command's deadline and its "took" count from here
DATA_MARGIN = 2 * 1024 * 1024  # kept free when the dataset is added
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
DEFAULT_DEADLINE = 540  # inside the device tool's 600 s, with room to unpack and pack

# --- here: prepare ----------------------------------------------------------------------------

def read(path):
    """A text file's contents; undecodable bytes (a crashed binary's log) replaced."""
    with open(path, errors="replace") as f:
        return f.read()


def sh(*args, **kwargs):
    """Runs a command (no shell); its output as text. A failure raises Failed."""
    try:
        return subprocess.run(args, check=True, text=True, stdout=subprocess.PIPE, **kwargs).stdout
    except subprocess.CalledProcessError as e:
        raise Failed(f"{' '.join(args)}: exit {e.returncode}") from None
    except FileNotFoundError as e:
        raise Failed(f"{args[0]}: {e.strerror}") from None


def bench_names(repo=REPO):
    """The benches with CUDA cases (io_bench is CPU-only), the ones that matter most first."""
    every = sorted(os.path.basename(p)[:-4] for p in glob.glob(f"{repo}/bench/*_bench.cpp")
                   if "cuda" in read(p))
    return [b for b in FIRST_BENCHES if b in every] + [b for b in every if b not in FIRST_BENCHES]


def experiment_names(repo=REPO):
    """The GPU experiments (bench/experiments/*.cu, `experiment OUT NAME [ARGS]`)."""
    return sorted(os.path.basename(p)[:-3] for p in glob.glob(f"{repo}/bench/experiments/*.cu"))


def binaries(repo=REPO):
    return ["towerlab_tests", "fashion_mnist", "towerlab_devices"] + bench_names(repo) + experiment_names(repo)


def source_of(build, name, repo=REPO):
    if name in experiment_names(repo):
        return f"{build}/bench/experiments/{name}"
    if name == "towerlab_tests":
        return f"{build}/tests/{name}"
    if name in ("fashion_mnist", "towerlab_devices"):
        return f"{build}/samples/{name}"
    return f"{build}/bench/{name}"


def ab_bench_names():
    """The benches of an A/B (ab, and prepare's TOWERLAB_GPU_AB builds)."""
    return (os.environ.get("TOWERLAB_GPU_BENCHES") or "conv2d_bench").split()


def folder_bytes(folder):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def travel_bytes(carry):
    """(working tree, carry) bytes that the device tool sends: tracked and untracked files
    git does not ignore, a shared/ folder (it travels even where git ignores it), the carry."""
    names = sh("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    tree = sum(os.path.getsize(n) for n in names if n and os.path.isfile(n))
    if os.path.isdir("shared") and subprocess.run(["git", "check-ignore", "-q", "shared"]).returncode == 0:
        tree += folder_bytes("shared")
    return tree, folder_bytes(carry)


def ab_builds(build, stage):
    """For each commit of TOWERLAB_GPU_AB: a worktree at DIR-ab/<short hash> (made once, then
    checked out again), the same preset as DIR, its A/B benches built (ccache shares every
    unchanged object with DIR's build) and staged, stripped, as bin/ab/<short hash>/."""
    preset = os.path.basename(build)
    for ref in os.environ.get("TOWERLAB_GPU_AB", "").split():
        found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                               text=True, stdout=subprocess.PIPE)
        if found.returncode != 0:
            raise Failed(f"TOWERLAB_GPU_AB: '{ref}' is not a commit")
        sha = found.stdout.strip()
        short = sh("git", "rev-parse", "--short=7", sha).strip()
        tree = f"{build}-ab/{short}"
        if not os.path.exists(f"{tree}/.git"):
            sh("git", "worktree", "add", "--detach", tree, sha)
        sh("git", "-C", tree, "checkout", "--quiet", "--detach", sha)
        sh("cmake", "--preset", preset, cwd=tree)
        sh("cmake", "--build", f"{tree}/build/{preset}", "-j", jobs(), "--target", *ab_bench_names())
        os.makedirs(f"{stage}/bin/ab/{short}")
        for name in ab_bench_names():
            sh("strip", "-o", f"{stage}/bin/ab/{short}/{name}", f"{tree}/build/{preset}/bench/{name}")
        subject = sh("git", "log", "-1", "--format=%s", sha).strip()[:100]
        print(f"ab: {ref} = {short} ({subject})")


def jobs():
    return os.environ.get("TOWERLAB_GPU_JOBS") or str(os.cpu_count() or 1)


def prepare(build, carry):
    sh("bash", "scripts/deps.sh")
    if build == "build/gpu":
        sh("cmake", "--preset", "gpu")
    elif not os.path.isfile(f"{build}/CMakeCache.txt"):
        raise Failed(f"{build} is not configured (TOWERLAB_GPU_BUILD={build}): configure it first, then prepare")
    if subprocess.run(["cmake", "--build", build, "-j", jobs(), "--target", *binaries()]).returncode != 0:
        raise Failed(f"{build} does not build (above)")
    # The binaries, stripped, and the libraries they need, staged as they will be unpacked
    # there: bin/ and lib/ side by side.
    stage = f"{build}/stage"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.rmtree(carry, ignore_errors=True)
    for d in (f"{stage}/bin", f"{stage}/lib", f"{carry}/data"):
        os.makedirs(d)
    for name in binaries():
        sh("strip", "-o", f"{stage}/bin/{name}", source_of(build, name))
    ab_builds(build, stage)
    staged = sorted(glob.glob(f"{stage}/bin/*"))
    staged = [b for b in staged if os.path.isfile(b)]

    # The gpu preset links NCCL (from the toolkit here, from PyTorch's wheels there): without
    # it the one-GPU NCCL cases would skip, which the judge calls a failure.
    if build == "build/gpu" and "libnccl.so.2" not in sh("ldd", f"{stage}/bin/towerlab_tests"):
        raise Failed("towerlab_tests does not link libnccl.so.2: CMake did not find NCCL in the toolkit")
    # Shared libraries: refuse the ones that must not travel (another build, a rehearsal's,
    # may link them: they travel), copy the ones the GPU machine lacks under their soname, as
    # the loader looks them up.
    libraries = {}
    for b in staged:
        libraries.update(parse_ldd(sh("ldd", b)))
    for soname, path in libraries_to_carry(libraries, refuse=build == "build/gpu").items():
        shutil.copyfile(path, f"{stage}/lib/{soname}")
    lib_files = sorted(glob.glob(f"{stage}/lib/*"))
    if lib_files:
        sh("strip", "--strip-unneeded", *lib_files)
    # gzip makes the CUDA fat binaries about a third of their size; tar and gzip are on every
    # machine.
    sh("tar", "-czf", f"{carry}/bin.tar.gz", "-C", stage, "bin", "lib")

    # Fashion-MNIST as Debian ships it (.gz, read as is by the sample), when it fits; else a
    # subset, never silently (build-info.txt and the train summary say which).
    tree, carried = travel_bytes(carry)
    data = sorted(glob.glob(f"{FASHION_MNIST}/*-ubyte.gz"))
    if tree + carried + sum(map(os.path.getsize, data)) <= LIMIT - DATA_MARGIN:
        for f in data:
            shutil.copy(f, f"{carry}/data/")
        contents = "full: 60000 training and 10000 test images"
    else:
        contents = write_idx_subset(FASHION_MNIST, f"{carry}/data", LIMIT - DATA_MARGIN - tree - carried)
    with open(f"{carry}/data/contents.txt", "w") as f:
        f.write(contents + "\n")

    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "."]).returncode != 0
    build_type = re.search(r"^CMAKE_BUILD_TYPE:STRING=(.*)$", read(f"{build}/CMakeCache.txt"), re.M)
    nvcc = subprocess.run(["/usr/local/cuda/bin/nvcc", "--version"], text=True, capture_output=True) \
        if os.path.exists("/usr/local/cuda/bin/nvcc") else None
    info = [
        f"commit: {sh('git', 'rev-parse', 'HEAD').strip()}{' (with uncommitted changes)' if dirty else ''}",
        f"built: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} on {os.uname().nodename}, {build} "
        f"({build_type.group(1) if build_type else ''}), "
        f"{nvcc.stdout.strip().splitlines()[-1] if nvcc and nvcc.stdout.strip() else ''}",
        f"dataset: {contents}",
    ]
    if os.environ.get("TOWERLAB_GPU_AB"):
        refs = " ".join(ref + "=" + sh("git", "rev-parse", "--short=7", ref + "^{commit}").strip()
                        for ref in os.environ["TOWERLAB_GPU_AB"].split())
        info.append(f"ab builds: {refs} ({' '.join(ab_bench_names())})")
    glibc = re.findall(r"GLIBC_[0-9.]+", subprocess.run(
        ["objdump", "-T", *staged, *lib_files], text=True, capture_output=True).stdout)
    newest = max(set(glibc), key=lambda v: [int(x) for x in v[6:].split(".") if x], default="")
    info += [f"carried libraries: {' '.join(os.path.basename(f) for f in lib_files)}",
             f"from the GPU machine: {' '.join(SYSTEM_LIBS)}",
             f"newest glibc symbol version needed: {newest}"]
    with open(f"{carry}/build-info.txt", "w") as f:
        f.write("\n".join(info) + "\n")

    tree, carried = travel_bytes(carry)
    print()
    print("\n".join(info))
    print(f"in {carry}/bin.tar.gz (unpacked sizes):")
    for f in staged + lib_files:
        print(f"  {os.path.getsize(f):10d}  {os.path.relpath(f, stage)}")
    print(f"in {carry}:")
    for d, _, files in sorted(os.walk(carry)):
        for name in sorted(files):
            path = os.path.join(d, name)
            print(f"  {os.path.getsize(path):10d}  {os.path.relpath(path, carry)}")
    fits, line = travel_line(tree, carried, carry)
    print(line)
    if not fits:
        raise Failed(f"{mib(tree + carried)} does not fit the device tool's 64 MiB")
    print("comes back: 2 files per command, <command>.tar.gz and <command>-summary.txt (limit 8)")
    print()
    env = "" if build == "build/gpu" else f"TOWERLAB_GPU_BUILD={build} "
    print(f"device tool calls, two, each with carry=['{carry}'] and timeout_s=600:")
    for command in ("verify", "measure"):
        print(f'  {env}bash scripts/gpu.sh {command} "$OUT"')


# --- there: the check -------------------------------------------------------------------------

def find_python():
    """The Python for PyTorch and for finding the wheels: TOWERLAB_GPU_PYTHON, the GPU
    machine's /opt/torch/.venv, else the one running this."""
    for p in (os.environ.get("TOWERLAB_GPU_PYTHON"), "/opt/torch/.venv/bin/python3", sys.executable):
        if p and os.access(p, os.X_OK):
            return p
    raise Failed("no Python: neither /opt/torch/.venv/bin/python3 nor python3 (set TOWERLAB_GPU_PYTHON)")


SITE_DIRS = """import site, sysconfig
dirs = [sysconfig.get_paths()["purelib"]] + site.getsitepackages()
try:
    import nvidia
    dirs += [p + "/.." for p in nvidia.__path__]
except ImportError:
    pass
print(" ".join(dirs))"""


def library_path(lib, python):
    """The library path for our binaries: TOWERLAB_GPU_LIB_PATH, the carried libraries, the
    toolkit's, then every lib/ folder of the NVIDIA wheels beside PyTorch (nvidia/cudnn/lib,
    nvidia/nccl/lib, nvidia/cu13/lib, ...), found through `python`'s site-packages."""
    dirs = [os.environ["TOWERLAB_GPU_LIB_PATH"]] if os.environ.get("TOWERLAB_GPU_LIB_PATH") else []
    dirs.append(lib)
    dirs += [d for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/lib") if os.path.isdir(d)]
    found = subprocess.run([python, "-c", SITE_DIRS], text=True, capture_output=True).stdout.split()
    for site in found + glob.glob("/opt/torch/.venv/lib/python3*/site-packages"):
        for d in sorted(glob.glob(f"{site}/nvidia/*/lib")):
            d = os.path.realpath(d)
            if os.path.isdir(d) and d not in dirs:
                dirs.append(d)
    return ":".join(dirs + ([os.environ["LD_LIBRARY_PATH"]] if os.environ.get("LD_LIBRARY_PATH") else []))


def versions():
    """The cuDNN, NCCL and cuBLAS versions as this process loads them (the check runs it
    with the binaries' library path)."""
    import ctypes

    def loaded(soname):
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if soname in line}
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
        lib.cublasGetProperty(0, ctypes.byref(v))
        major = v.value
        lib.cublasGetProperty(1, ctypes.byref(v))
        minor = v.value
        lib.cublasGetProperty(2, ctypes.byref(v))
        return f"cublasGetProperty = {major}.{minor}.{v.value}"

    print("versions:")
    for soname, get in (("libcudnn.so.9", cudnn), ("libnccl.so.2", nccl), ("libcublas.so.13", cublas)):
        print("  " + version(soname, get))


class Carry:
    """The carried binaries, unpacked into a fresh temporary folder (bin/, lib/), with the
    library path set for them; removed at exit."""

    def __init__(self, build, carry):
        self.build, self.carry = build, carry
        archive = f"{carry}/bin.tar.gz"
        if not os.path.isfile(archive):
            env = f"TOWERLAB_GPU_BUILD={build} " if os.environ.get("TOWERLAB_GPU_BUILD") else ""
            raise Failed(f"{archive} is missing: run '{env}scripts/gpu.py prepare' here and carry {carry}")
        self.unpacked = tempfile.mkdtemp(prefix="towerlab-gpu.", dir=os.environ.get("TMPDIR"))
        sh("tar", "-xzf", archive, "-C", self.unpacked)
        self.bin, self.lib = f"{self.unpacked}/bin", f"{self.unpacked}/lib"
        self.python = find_python()
        os.environ["LD_LIBRARY_PATH"] = library_path(self.lib, self.python)

    def binaries(self):
        return [b for b in sorted(glob.glob(f"{self.bin}/*")) if os.path.isfile(b)]

    def close(self):
        shutil.rmtree(self.unpacked, ignore_errors=True)


def check(carry, out):
    """Every carried binary's libraries and symbols resolve, then a GPU is visible. Writes
    what it saw to `out`; returns 1 on a missing library or symbol or a wrong answer, 3 when
    no GPU is visible (loudly), 0 otherwise."""
    def say(text=""):
        print(text, file=out, flush=True)

    say(read(f"{carry.carry}/build-info.txt").rstrip("\n"))
    say(f"python: {carry.python}")
    say(f"LD_LIBRARY_PATH={os.environ['LD_LIBRARY_PATH']}")
    missing = False
    for b in carry.binaries():
        # -r: also the symbols, so that a library too old for what was linked here (NCCL
        # from the wheels, say) shows now and not as a crash in a test.
        text = subprocess.run(["ldd", "-r", b], text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT).stdout
        bad = sorted({" ".join(line.split()) for line in text.splitlines()
                      if "not found" in line or "undefined symbol" in line})
        if bad:
            say(f"gpu.py: {os.path.basename(b)}: {';'.join(bad[:20])};")
            missing = True
    if missing:
        say("gpu.py: FAILED: libraries or symbols are missing (above); nothing was run")
        return 1
    # Outside the GPU machine's own libraries, each must come from the carried ones: this
    # also catches, on a machine that happens to have it, one that did not travel.
    resolved = {}
    for b in carry.binaries():
        resolved.update(parse_ldd(sh("ldd", b)))
    stray = [f"  {s} => {p}" for s, p in sorted(resolved.items())
             if p and s not in SYSTEM_LIBS and not p.startswith(carry.lib + "/")]
    if stray:
        say("gpu.py: FAILED: libraries that did not travel and the GPU machine lacks:\n" + "\n".join(stray))
        return 1
    say(f"libraries: every binary in {carry.carry}/bin.tar.gz resolves all its libraries and symbols:")
    for s, p in sorted(resolved.items()):
        if p:
            say(f"  {s} => {p}")
    # The versions of the libraries found by soname, as the binaries will load them.
    say(subprocess.run([carry.python, os.path.abspath(__file__), "versions"], text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT).stdout.rstrip("\n"))
    devices = subprocess.run([f"{carry.bin}/towerlab_devices"], text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    say(devices.stdout.rstrip("\n"))
    say(f"towerlab_devices: exit {devices.returncode}")
    # nvidia-smi is logged when there: its absence is no sign of a missing GPU.
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        say(smi.stdout.rstrip("\n"))
        if smi.returncode != 0:
            say(f"nvidia-smi: exit {smi.returncode} (towerlab_devices above is what counts)")
    else:
        say("nvidia-smi: not on the PATH (towerlab_devices above is what counts)")
    verdict = devices_verdict(devices.stdout, devices.returncode)
    if verdict != 0:
        say("\n" + "#" * 80)
        if devices.returncode != 0:
            say(f"gpu.py: FAILED: towerlab_devices exited {devices.returncode} (a wrong answer or an error, above).")
        else:
            say("gpu.py: FAILED: no GPU visible: towerlab_devices (above) checked no cuda:0.")
        say("Without a GPU every CUDA test would skip and read as a pass.")
        say("#" * 80)
    return verdict


# --- there: a device command and its steps ----------------------------------------------------

class Command:
    """One device command: a fresh folder for its logs (packed into OUT/<command>.tar.gz), the
    summary OUT/<command>-summary.txt, the deadline its steps share, the status."""

    def __init__(self, name, out, carry):
        self.name, self.out, self.carry = name, out, carry
        self.deadline = STARTED + int(os.environ.get("TOWERLAB_GPU_DEADLINE") or DEFAULT_DEADLINE)
        self.rehearsal = os.environ.get("TOWERLAB_GPU_REHEARSAL") == "1"
        os.makedirs(out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix=f"towerlab-gpu-{name}.", dir=os.environ.get("TMPDIR"))
        self.summary = f"{out}/{name}-summary.txt"
        open(self.summary, "w").close()
        self.status = self.check_status = 0
        self.shards = None

    def elapsed(self):
        return int(time.monotonic() - STARTED)

    def left(self):
        """Whole seconds left before the deadline."""
        return int(self.deadline - time.monotonic())

    def note(self, *lines):
        with open(self.summary, "a") as f:
            for line in lines:
                print(line, flush=True)
                f.write(line + "\n")

    def path(self, name):
        return os.path.join(self.work, name)

    def begin(self):
        """The check (a failed one ends the command with its status, except in a rehearsal),
        and the tests' settings: a GPU required, the corpus in the tree."""
        self.note(f"{self.name} on {os.uname().nodename}, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, "
                  f"deadline {int(self.left())}s")
        info = read(f"{self.carry.carry}/build-info.txt")
        self.note(*[line for line in info.splitlines() if re.match(r"^(commit|built):", line)])
        with open(self.path("check.log"), "w") as log:
            try:
                rc = check(self.carry, log)
            except Failed as e:
                print(f"gpu.py: FAILED: {e}", file=log)
                rc = 1
        check_log = read(self.path("check.log"))
        self.note(*check_summary(check_log))
        os.environ["TOWERLAB_FUZZ_DIR"] = f"{REPO}/fuzz"
        if rc == 0:
            self.note(f"check: passed, {self.elapsed()}s")
            os.environ["TOWERLAB_REQUIRE_GPU"] = "1"
            return
        self.status = self.check_status = rc
        sys.stderr.write(check_log)
        self.note(f"check: FAILED (exit {rc})")
        if not self.rehearsal:
            self.note("nothing else was run")
            self.pack()
        # A rehearsal (on a machine without a GPU) goes on to exercise the steps and the
        # judging; TOWERLAB_REQUIRE_GPU stays unset so that the CPU cases run and the CUDA
        # cases skip (or run on emulated GPUs). The command fails all the same.
        self.note("rehearsal: the steps run anyway, without TOWERLAB_REQUIRE_GPU; the command fails")

    def pack(self):
        """The verdict, OUT/<command>.tar.gz, and the end of the command with its status."""
        if self.check_status != 0:
            self.status = self.check_status  # the reason that explains the others
        self.note(*verdict_lines(self.name, self.status, self.elapsed()))
        shutil.copy(self.summary, self.work)
        shutil.copy(f"{self.carry.carry}/build-info.txt", self.work)
        for name in os.listdir(self.work):
            path = self.path(name)
            if os.path.isfile(path) and os.path.getsize(path) > LOG_CUT:
                with open(path, "rb") as f:
                    data = cut_log(f.read())
                with open(path, "wb") as f:
                    f.write(data)
        sh("tar", "-czf", f"{self.out}/{self.name}.tar.gz", "-C", self.work, ".")
        raise SystemExit(self.status)

    def step(self, name, seconds, command):
        """Runs `command` with its output in NAME.log, under `seconds` or what is left before
        the deadline (step_limit), whichever is less. Returns its status; 124 when it ran out
        of time or was not started."""
        seconds = step_limit(seconds, self.left())
        if seconds is None:
            self.note(f"{name}: NOT RUN, the command's deadline has come")
            return 124
        start = time.monotonic()
        with open(self.path(f"{name}.log"), "wb") as log:
            rc = run_with_limit(command, seconds, log)
        rc, line = step_line(name, rc, seconds, int(time.monotonic() - start))
        self.note(line)
        # A failed step's last words, often the reason (a test's "[  FAILED  ]" lines are
        # judged on their own).
        if rc not in (0, 124):
            lines = read(self.path(f"{name}.log")).splitlines()
            self.note(f"  last line: {(lines[-1] if lines else '')[:200]}")
        return rc

    # The test shards, the sanitizers, the benches, the peers, FashionNet, the profile, an A/B.

    def cases(self):
        if self.shards is None:
            listing = subprocess.run([f"{self.carry.bin}/towerlab_tests", "--gtest_list_tests"], text=True,
                                     stdout=subprocess.PIPE).stdout
            self.shards = shard_cases(parse_test_list(listing))
            for shard, cases in self.shards.items():
                with open(self.path(f"cases-{shard}.txt"), "w") as f:
                    f.write("".join(c + "\n" for c in cases))
            self.note(shards_line(self.shards))
        return self.shards

    def run_shard(self, name, seconds, prefix=()):
        """The cases of shard NAME in one process, with `prefix` (a sanitizer) before the test
        binary; NAME.log, NAME.xml, judged."""
        cases = self.cases()[name]
        filter_ = gtest_filter(cases, name)
        if filter_ is None:
            self.note(f"  {name}: no case matched its filter: FAILED")
            self.status = 1
            return
        xml = self.path(f"{name}.xml")
        if self.step(name, seconds, [*prefix, f"{self.carry.bin}/towerlab_tests", f"--gtest_filter={filter_}",
                                     f"--gtest_output=xml:{xml}"]) != 0:
            self.status = 1
        xml_text = read(xml) if os.path.exists(xml) else None
        passed, lines = judge_shard(name, cases, xml_text, read(self.path(f"{name}.log"))
                                    if os.path.exists(self.path(f"{name}.log")) else "")
        self.note(*lines)
        if not passed:
            self.status = 1

    def test_shards(self, cuda_only=False):
        """The GPU cases first, the CPU cases last (CI runs them too)."""
        for shard in ("cuda-kernels", "cuda-training", "cuda-nccl") + (() if cuda_only else ("cpu",)):
            self.run_shard(shard, SHARD_SECONDS[shard])

    def sanitizers(self, tool=None, seconds=None):
        """compute-sanitizer's memcheck, racecheck and synccheck on their shards, or the one
        named, which then has the whole budget (480 s) or the seconds given."""
        tools = [tool] if tool else list(SANITIZER_SECONDS)
        for t in tools:
            if t not in SANITIZER_SECONDS:
                raise Failed(f"unknown sanitizer tool '{t}' (memcheck, racecheck or synccheck)")
        self.cases()
        sanitizer = shutil.which("compute-sanitizer") or next(
            (t for t in ("/usr/local/cuda/bin/compute-sanitizer",
                         "/usr/local/cuda/compute-sanitizer/compute-sanitizer") if os.access(t, os.X_OK)), None)
        if sanitizer is None:
            self.note("compute-sanitizer is not on the PATH nor in /usr/local/cuda: FAILED")
            self.status = 1
            if not self.rehearsal:
                return
            # A rehearsal goes on without it, to exercise the sanitizers' shards.
            self.note("rehearsal: the sanitizers' shards run without compute-sanitizer")
        for t in tools:
            limit = (seconds or 480) if tool else SANITIZER_SECONDS[t]
            # Exact blocks: no cached segment hides an overrun from memcheck.
            prefix = ["env"] if sanitizer is None else [
                "env", "TOWERLAB_EXACT_ALLOCATIONS=1", sanitizer, "--tool", t, "--error-exitcode", "99",
                "--print-limit", "200"]
            self.run_shard(t, limit, prefix)
            log = read(self.path(f"{t}.log")) if os.path.exists(self.path(f"{t}.log")) else ""
            self.note(*["    " + line for line in log.splitlines() if re.search(r"(ERROR|RACECHECK) SUMMARY", line)])

    def benches(self, keep):
        """The CUDA cases of each bench and their GPU references (cuBLAS, cuDNN, the device
        copy), one after another, until `keep` seconds before the deadline."""
        names = (os.environ.get("TOWERLAB_GPU_BENCHES") or "").split() or bench_names()
        for name in names:
            seconds = bench_limit(self.left(), keep)
            if seconds is None:
                self.note(f"{name}: NOT RUN, its share of the command's time is spent: FAILED")
                self.status = 1
                continue
            # The training step is the noisiest (host threads, launches): its cases run 5 times
            # each, interleaved at random, and the report takes the medians.
            repeat = ["--benchmark_repetitions=5", "--benchmark_enable_random_interleaving=true"] \
                if name == "trainer_bench" else []
            out = self.path(f"{name}.json")
            if self.step(name, seconds, [f"{self.carry.bin}/{name}", "--benchmark_filter=cuda|cublas|cudnn",
                                         "--benchmark_min_time=0.2", *repeat, "--benchmark_format=json",
                                         f"--benchmark_out={out}"]) != 0:
                self.status = 1
            passed, lines = bench_summary(read(out) if os.path.exists(out) else None)
            self.note(*lines)
            if not passed:
                self.status = 1

    def profile(self):
        """Nsight Compute on the cases TOWERLAB_GPU_PROFILE names, one report each
        (profile-N-BENCH.log); the summary keeps each kernel's grid, time, throughputs,
        registers and occupancy."""
        ncu = shutil.which("ncu") or next((t for t in ["/usr/local/cuda/bin/ncu",
                                                        *sorted(glob.glob("/usr/local/cuda/nsight-compute*/ncu"))]
                                           if os.access(t, os.X_OK)), None)
        if ncu is None:
            self.note("ncu is not on the PATH nor in /usr/local/cuda: FAILED")
            self.status = 1
            return
        if not os.environ.get("TOWERLAB_GPU_PROFILE"):
            raise Failed("profile: TOWERLAB_GPU_PROFILE names no case")
        for i, (bench, filter_, skip, count) in enumerate(profile_cases(os.environ["TOWERLAB_GPU_PROFILE"]), 1):
            binary = f"{self.carry.bin}/{bench}"
            if not os.access(binary, os.X_OK):
                self.note(f"profile {i}: no bench '{bench}' in the carry: FAILED")
                self.status = 1
                continue
            name = f"profile-{i}-{bench}"
            if self.step(name, 90, [ncu, "--set", "full", "--launch-skip", skip, "--launch-count", count, binary,
                                    f"--benchmark_filter={filter_}", "--benchmark_min_time=0.05"]) != 0:
                self.status = 1
            self.note(f"  {bench} {filter_}:")
            self.note(*profile_summary(read(self.path(f"{name}.log"))))

    def peers(self, seconds):
        """FashionNet's training step: towerlab (trainer_bench) against PyTorch eager and
        PyTorch with CUDA graphs, alternated in one process tree (bench/gpu_peers.py)."""
        if self.step("gpu_peers", seconds, [self.carry.python, f"{REPO}/bench/gpu_peers.py", "--trainer-bench",
                                            f"{self.carry.bin}/trainer_bench", "--json",
                                            self.path("gpu_peers.json")]) != 0:
            self.status = 1
        log = read(self.path("gpu_peers.log")).splitlines() \
            if os.path.exists(self.path("gpu_peers.log")) else []
        start = next((i for i, line in enumerate(log) if line.startswith("FashionNet")), len(log))
        self.note(*["  " + line for line in log[start:]])

    def training(self, masters=("cuda:0", "cpu")):
        """FashionNet, 5 epochs on cuda:0, with the master on each of `masters`."""
        self.note("dataset: " + read(f"{self.carry.carry}/data/contents.txt").strip())
        for master in masters:
            name = f"fashion_mnist-master-{master.split(':')[0]}"
            if self.step(name, 105, [f"{self.carry.bin}/fashion_mnist", "--devices", "cuda:0", "--master", master,
                                     "--data", f"{self.carry.carry}/data", "--epochs", "5", "--progress-every", "0",
                                     "--metrics", self.path(f"{name}.json")]) != 0:
                self.status = 1
            log = read(self.path(f"{name}.log")) if os.path.exists(self.path(f"{name}.log")) else ""
            self.note(*["  " + line for line in log.splitlines() if line.startswith("epoch")])

    def ab(self, filter_, rounds):
        """The A/B benches' cases `filter_` selects, for the carry's own build ("head") and each
        of bin/ab/*, one after the other in every round; then ab_table."""
        if not os.path.isdir(f"{self.carry.bin}/ab"):
            raise Failed("ab: the carry has no A/B builds (prepare with TOWERLAB_GPU_AB)")
        builds = ["head"] + sorted(os.listdir(f"{self.carry.bin}/ab"))
        for name in ab_bench_names():
            for r in range(1, rounds + 1):
                for label in builds:
                    binary = f"{self.carry.bin}/{name}" if label == "head" else f"{self.carry.bin}/ab/{label}/{name}"
                    run = f"ab-{name}-{label}-{r}"
                    if self.step(run, 120, [binary, f"--benchmark_filter={filter_}", "--benchmark_min_time=0.1",
                                            "--benchmark_format=json", f"--benchmark_out={self.path(run + '.json')}"]) != 0:
                        self.status = 1
        results = {os.path.basename(p): read(p) for p in glob.glob(self.path("ab-*.json"))}
        passed, lines = ab_table(results, builds)
        self.note(*lines)
        if not passed:
            self.status = 1

    def experiment(self, name, args):
        binary = f"{self.carry.bin}/{name}"
        if not os.access(binary, os.X_OK):
            raise Failed(f"experiment: no '{name}' in the carry (bench/experiments/{name}.cu)")
        if self.step(f"experiment-{name}", 300, [binary, *args]) != 0:
            self.status = 1
        self.note(*["  " + line for line in read(self.path(f"experiment-{name}.log")).splitlines()])

    def close(self):
        shutil.rmtree(self.work, ignore_errors=True)


def run_with_limit(command, seconds, log):
    """Runs `command` with its output in `log`; past `seconds` its whole process group gets
    SIGTERM, 10 s later SIGKILL (as timeout --kill-after=10 does). Returns the exit status as
    a shell gives it: 124 for a time-out, 128 + N for a death by signal N."""
    try:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        log.write(f"gpu.py: cannot start {command[0]}: {e.strerror}\n".encode())
        return 127
    try:
        rc = process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return 124
    return 128 - rc if rc < 0 else rc


# --- the commands -----------------------------------------------------------------------------

# What each device command runs, in order. Each has a deadline of 540 s, inside the device
# tool's 600 s with room for unpacking and packing; its steps share it as their limits say.
def verify(c, a):
    c.test_shards()
    c.sanitizers()


def measure(c, a):
    c.benches(keep=350)  # kept for the peers (100 s) and FashionNet (two runs of at most 105 s)
    c.peers(100)
    c.training()


# A lease of 15 minutes, start-up included, has room for one full command: the GPU shards
# (CI runs the CPU cases), memcheck, the benches and FashionNet with the master on cuda:0.
# What it leaves out is in its summary, NOT RUN.
def lease(c, a):
    c.test_shards(cuda_only=True)
    c.sanitizers("memcheck", 90)
    c.benches(keep=140)  # kept for FashionNet: one run of at most 105 s, and packing
    c.training(["cuda:0"])


# The first of two calls in a lease that will change kernels: the GPU shards, memcheck and
# the profile; the second call measures the changed kernels (lease with TOWERLAB_GPU_BENCHES).
def triage(c, a):
    c.test_shards(cuda_only=True)
    c.sanitizers("memcheck", 60)
    c.profile()


COMMANDS = {
    "verify": (verify, "the check, the test shards, memcheck, racecheck and synccheck"),
    "measure": (measure, "the check, the benches, FashionNet's step against PyTorch, FashionNet 5 epochs"),
    "lease": (lease, "for a lease of 15 minutes: the check, the GPU shards, memcheck (90 s), the "
                     "benches, FashionNet with the master on cuda:0"),
    "triage": (triage, "the first call of a lease that changes kernels: the check, the GPU shards, "
                       "memcheck (60 s), the profile of TOWERLAB_GPU_PROFILE's cases"),
    "tests": (lambda c, a: c.test_shards(), "the check and the test shards"),
    "sanitize": (lambda c, a: c.sanitizers(a.tool), "the check and the sanitizers (all three, or the one named)"),
    "bench": (lambda c, a: c.benches(keep=0), "the check and the benches"),
    "train": (lambda c, a: c.training(), "the check and FashionNet"),
    "peers": (lambda c, a: c.peers(480), "the check and FashionNet's step against PyTorch (bench/gpu_peers.py)"),
    "profile": (lambda c, a: c.profile(), "the check and Nsight Compute on TOWERLAB_GPU_PROFILE's cases"),
    "ab": (lambda c, a: c.ab(a.filter, a.rounds), "the check and an A/B of the carry's build and "
                                                  "TOWERLAB_GPU_AB's builds on the bench cases FILTER selects"),
    "experiment": (lambda c, a: c.experiment(a.name, a.args), "the check and one of bench/experiments/"),
}


def parser():
    p = argparse.ArgumentParser(prog="scripts/gpu.py", description="The GPU run: prepare here, the "
                                "commands there (docs/gpu.md).")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="build the binaries and pack build/gpu-carry (here)")
    sub.add_parser("check", help="libraries resolve (ldd -r), a GPU is visible, versions")
    sub.add_parser("versions", help="the cuDNN, NCCL and cuBLAS versions this Python loads (the check's)")
    for name, (_, text) in COMMANDS.items():
        s = sub.add_parser(name, help=text)
        s.add_argument("out", metavar="OUT", help="the folder for <command>.tar.gz and <command>-summary.txt")
        if name == "sanitize":
            s.add_argument("tool", nargs="?", choices=list(SANITIZER_SECONDS))
        elif name == "ab":
            s.add_argument("filter", metavar="FILTER")
            s.add_argument("rounds", metavar="ROUNDS", nargs="?", type=int, default=2)
        elif name == "experiment":
            s.add_argument("name", metavar="NAME")
            s.add_argument("args", metavar="ARGS", nargs=argparse.REMAINDER)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    os.chdir(REPO)
    build = (os.environ.get("TOWERLAB_GPU_BUILD") or "build/gpu").rstrip("/")  # stays here
    carry_dir = f"{build}-carry"  # what travels (ignored by git, like all of build/)
    carry = command = None
    try:
        if args.command == "prepare":
            return prepare(build, carry_dir)
        if args.command == "versions":
            return versions()
        carry = Carry(build, carry_dir)
        if args.command == "check":
            return check(carry, sys.stdout)
        command = Command(args.command, args.out, carry)
        command.begin()
        COMMANDS[args.command][0](command, args)
        command.pack()
    except Failed as e:
        print(f"gpu.py: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        if command:
            command.close()
        if carry:
            carry.close()


if __name__ == "__main__":
    sys.exit(main())
