"""The GPU run's judge and summaries (scripts/gpu.py runs the commands): which skips a machine
with one GPU explains, what a crash, a time-out or a failing case means, how the test binary
is cut into shards, each step's time limit, and the short summaries of the benches, the A/B
runs, the profile, the check and what travels against the device tool's 64 MiB. Plain
functions of text and numbers, no processes and no files but where a name says so;
tests/gpu_script_test.py checks them on crafted gtest reports, logs and JSON. Standard library
only: this runs on the GPU machine's Python too.
"""
import collections
import gzip
import json
import os
import re
import statistics
import struct
import xml.etree.ElementTree as ET

LIMIT = 64 * 1024 * 1024  # what the device tool carries to the GPU machine
PACK_SECONDS = 30  # kept before the deadline for packing
LOG_CUT = 3 * 1024 * 1024  # no log pushes the archive past the 16 MiB a returned file may have

# Libraries the GPU machine has, by soname: the C and C++ runtime, the driver, and cuBLAS,
# cuDNN and NCCL from the toolkit or PyTorch's wheels (nvidia/*/lib). Everything else that
# ldd shows travels in lib/.
SYSTEM_LIBS = ("linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 "
               "libpthread.so.0 librt.so.1 libstdc++.so.6 libgcc_s.so.1 libcuda.so.1 "
               "libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2").split()
# Libraries that must not be linked into what the gpu preset builds: the runtime is linked
# in statically (one runtime, whatever the machine has), OpenBLAS and MPI are left out (no
# use on one GPU, and MPI needs its launcher and plugins).
REFUSED_LIBS = "libcudart.so libopenblas.so libblas.so libgfortran.so libmpi.so libmpi_cxx.so".split()
# Every bench with CUDA cases, the ones that matter most first: a bench that the deadline
# leaves out is then one of the last.
FIRST_BENCHES = ["matmul_bench", "conv2d_bench", "trainer_bench", "batchnorm_bench", "pool2d_bench"]

# The skips a machine with ONE GPU explains, and nothing else: (the skip message, matched
# whole; the cases that may give it, matched whole; why it is expected). Any other skip
# fails the run: on the GPU machine a CUDA case that skipped did not run ("no CUDA device",
# "this build of towerlab has no NCCL", ...).
EXPECTED_SKIPS = [
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
    # What the host CPU and the build are, which a GPU run does not judge: a CPU with every
    # GEMM ISA has none to refuse; a rehearsal's build may have MPI (the gpu preset has
    # none, so there the refusal runs).
    (r"this CPU has every GEMM ISA", r"SettingsEnvironment\.\w+", "CPU with every ISA"),
    (r"this build has MPI: .*", r"Cluster\.BuildWithoutMpi\w+", "a build with MPI"),
    # A host CPU without AVX-512 has no second ISA to compare the AVX2 paths' bits with.
    (r"this CPU has no AVX-512", r"(Conv2dDirect|Conv2dWinograd)\.Avx512GivesTheAvx2Bits",
     "CPU without AVX-512"),
]

# The shards of the test binary, each case in one (shard_cases):
#   cuda-kernels   the kernels' CUDA cases (small shapes; what the sanitizers run)
#   cuda-training  the other cases that reach a GPU (trainer, ring, determinism, ...)
#   cuda-nccl      NCCL on one GPU, apart: a collective that hangs takes only it
#   cpu            every other case
CUDA_CASES = (r"/cuda0$|Cuda|CUDA|Gpu|GPU|^Nccl|\.Nccl|"
              r"^(Trainer|CheckpointTest|Cluster|TensorCpu|RequireGpu|Device)\.")
NCCL_CASES = r"^Nccl|\.Nccl"
KERNEL_CASES = (r"^Backends/(BatchNorm|Bias|Conv2d|Elementwise|Fusion|Loss|Matmul|Optimizer|"
                r"Pool2d|Random|Reduce|Relu|Tensor|Stream|PeerAdd)Test\.|CudaVsCpu\.|"
                r"^(Conv2dShape|Conv2dWinogradCuda|TensorCuda|BatchNormMaxPoolTest)\.")
# The sanitizers' cases: the kernels' CUDA cases on their small shapes (not the
# FashionNet-sized layers); racecheck and synccheck only those with shared memory (matmul,
# conv2d, batch norm, losses, pooling, bias, reductions).
MEMCHECK_CASES = r"/cuda0$|CudaVsCpu\.|^Conv2dWinogradCuda\."
SHARED_MEMORY_CASES = (r"^(Backends/)?(BatchNorm|Bias|Conv2d|Loss|Matmul|Pool2d|Reduce)"
                       r"(Test|CudaVsCpu)\.|^Conv2dWinogradCuda\.")
SHARD_SECONDS = {"cuda-kernels": 100, "cuda-training": 120, "cuda-nccl": 60, "cpu": 120}
SANITIZER_SECONDS = {"memcheck": 180, "racecheck": 100, "synccheck": 60}
MAX_FILTER = 120000  # characters one argument may have, with room to spare

# The lines of the check's log that the summary keeps.
CHECK_SUMMARY = re.compile(r"^(python|  lib(cudnn|nccl|cublas)\.so.*: |towerlab sees|  (cpu|cuda:)|"
                           r"no CUDA device|towerlab_devices:|nvidia-smi|[^ ].*, [0-9]+ MiB$|gpu\.py: )")
# The lines of an Nsight Compute report that the profile's summary keeps.
PROFILE_SUMMARY = re.compile(
    r"^  [^ ].*\(([0-9]+, ){2}[0-9]+\)x\(|^ +(Duration|Compute \(SM\) Throughput|Memory Throughput|"
    r"DRAM Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|"
    r"Dynamic Shared Memory Per Block|Static Shared Memory Per Block) ")


class Failed(Exception):
    """Ends the command at once with exit status 1 and its message ("gpu.py: FAILED: ...")."""


# --- the judge and the summaries: plain functions (tests/gpu_script_test.py) -----------------

def expected_skip(why, case):
    """The label of the expected skip that explains `why` for `case`, None when none does."""
    for message, cases, label in EXPECTED_SKIPS:
        if re.fullmatch(message, why) and re.fullmatch(cases, case):
            return label
    return None


def failure_message(element):
    """A gtest <failure> or <skipped>'s message: "file:line" dropped, lines joined."""
    text = (element.text or element.get("message") or "").strip()
    lines = text.splitlines()
    if lines and re.match(r"^\S+:\d+$", lines[0].strip()):
        lines = lines[1:]
    return " ".join(line.strip() for line in lines if line.strip()) or "(no message)"


def last_started(log_text):
    """The case a crash or a time-out interrupted: started, never finished; None if none."""
    running = None
    for line in log_text.splitlines():
        m = re.match(r"\[ RUN      \] (\S+)", line)
        if m:
            running = m.group(1)
        elif re.match(r"\[ +(OK|FAILED|SKIPPED) +\] ", line):
            running = None
    return running


def judge_shard(name, listed, xml_text, log_text):
    """Judges one shard: gtest's XML report (None when there is none: a crash or a time-out)
    and its log, of the cases `listed`. Returns (passed, lines for the summary). Fails on a
    failure, a case that did not run, a missing or unreadable report (naming the case that
    was running) and every skip that EXPECTED_SKIPS does not explain."""
    listed = set(listed)
    try:
        if xml_text is None:
            raise OSError("no XML report")
        root = ET.fromstring(xml_text)
    except (OSError, ET.ParseError) as e:
        running = last_started(log_text or "")
        return False, [f"  {name}: {len(listed)} cases, NO REPORT (a crash or a time-out; "
                       f"{e.__class__.__name__})" + (f"; it was running {running}" if running else "")]
    passed = failed = unexpected = 0
    failures, skips, seen = [], {}, set()
    for case in root.iter("testcase"):
        full = f"{case.get('classname')}.{case.get('name')}"
        failed += bool(case.findall("failure"))
        for failure in case.findall("failure"):
            # The suite-less entry holds failures outside any test (a global set-up).
            where = full if full != "." else "(outside any test)"
            failures.append(f"{where}: {failure_message(failure)}")
        if case.get("status") != "run" or full == ".":
            continue
        seen.add(full)
        skip = case.find("skipped")
        if skip is not None or case.get("result") == "skipped":
            why = failure_message(skip) if skip is not None else "(no message)"
            label = expected_skip(why, full)
            unexpected += label is None
            skips.setdefault((why, label), []).append(full)
        elif not case.findall("failure"):
            passed += 1
    not_run = sorted(listed - seen)
    skipped = sum(map(len, skips.values()))
    lines = [f"  {name}: {len(listed)} cases: {passed} passed, {failed} failed, {skipped} skipped"
             f" ({skipped - unexpected} expected, {unexpected} UNEXPECTED), {len(not_run)} not run"]
    lines += [f"    FAILED {f[:300]}" for f in failures[:20]]
    if len(failures) > 20:
        lines.append(f"    ... and {len(failures) - 20} more failures")
    for (why, label), cases in sorted(skips.items(), key=lambda kv: (kv[0][1] is not None, kv[0][0])):
        mark = f"expected ({label})" if label else "UNEXPECTED"
        lines.append(f"    skipped {len(cases)}, {mark}: {why[:160]} (e.g. {cases[0]})")
    lines += [f"    NOT RUN {c}" for c in not_run[:5]]
    return not (failures or unexpected or not_run or not seen), lines


def parse_test_list(text):
    """The full case names (Suite.Case, Backends/Suite.Case/cpu) of --gtest_list_tests'
    output, the disabled ones left out."""
    cases, suite = [], ""
    for line in text.splitlines():
        if line and not line[0].isspace():
            suite = line.split()[0]
        elif line.startswith("  ") and line.split():
            cases.append(suite + line.split()[0])
    return [c for c in cases if not re.search(r"(^|[./])DISABLED_", c)]


def shard_cases(cases):
    """The cases of each shard and of each sanitizer: {name: [case, ...]}, in the binary's
    order; every case is in exactly one of cuda-kernels, cuda-training, cuda-nccl and cpu."""
    cuda = [c for c in cases if re.search(CUDA_CASES, c) and not c.endswith("/cpu")]
    cuda_set = set(cuda)
    nccl = [c for c in cuda if re.search(NCCL_CASES, c)]
    kernels = [c for c in cuda if not re.search(NCCL_CASES, c) and re.search(KERNEL_CASES, c)]
    apart = set(nccl) | set(kernels)
    memcheck = [c for c in kernels if re.search(MEMCHECK_CASES, c) and "OnLargeLayers" not in c]
    shared = [c for c in memcheck if re.search(SHARED_MEMORY_CASES, c)]
    return {
        "all": list(cases), "cuda": cuda, "cpu": [c for c in cases if c not in cuda_set],
        "cuda-nccl": nccl, "cuda-kernels": kernels,
        "cuda-training": [c for c in cuda if c not in apart],
        "memcheck": memcheck, "shared-memory": shared, "racecheck": shared, "synccheck": shared,
    }


def shards_line(shards):
    return (f"cases: {len(shards['all'])} in the test binary: cuda-kernels {len(shards['cuda-kernels'])}, "
            f"cuda-training {len(shards['cuda-training'])}, cuda-nccl {len(shards['cuda-nccl'])}, "
            f"cpu {len(shards['cpu'])}; memcheck {len(shards['memcheck'])}, racecheck and synccheck "
            f"{len(shards['racecheck'])}")


def gtest_filter(cases, shard):
    """The --gtest_filter of a shard's cases; None for no case (a filter that no longer
    matches is a bug of this script, not a pass)."""
    if not cases:
        return None
    text = ":".join(cases)
    if len(text) >= MAX_FILTER:
        raise Failed(f"the {shard} filter is {len(text)} characters, over what one argument may have")
    return text


def step_limit(seconds, left):
    """A step's time limit: what it asks for, or what is left before the command's deadline
    less the packing's share, whichever is less; None when under 10 s are left (NOT RUN)."""
    left -= PACK_SECONDS
    if left < 10:
        return None
    return min(seconds, left)


def bench_limit(left, keep):
    """A bench's time limit: at most 60 s, and never into the `keep` seconds the steps after
    the benches need; None when under 10 s remain for it."""
    seconds = min(60, left - keep)
    return None if seconds < 10 else seconds


def step_line(name, rc, seconds, elapsed):
    """How the summary reports a step: (rc as judged, line). 124 (timeout's status) and 137
    (a kill) read as a time-out."""
    if rc in (124, 137):
        return 124, f"{name}: TIMED OUT after {seconds}s"
    return rc, f"{name}: exit {rc}, {elapsed}s"


def bench_summary(json_text):
    """One bench's JSON (Google Benchmark's; None when it wrote none) as (passed, lines): the
    count, the errors."""
    try:
        if json_text is None:
            raise FileNotFoundError
        runs = json.loads(json_text)["benchmarks"]
    except (OSError, ValueError, KeyError) as e:
        return False, [f"  no readable results ({e.__class__.__name__}): FAILED"]
    errors = [r["name"] + ": " + r.get("error_message", "") for r in runs if r.get("error_occurred")]
    lines = [f"  {len(runs)} benchmarks, {len(errors)} with an error"]
    lines += [f"  error: {e}" for e in errors[:3]]
    return bool(runs) and not errors, lines


def ab_table(results, builds):
    """An A/B's table: `results` maps each JSON's file name (ab-<bench>-<build>-<round>.json)
    to its text. Gives each case's times per build and each build's median against head's,
    as (passed, lines)."""
    times = collections.defaultdict(list)  # (case, build) -> times
    unit = {}
    for name in sorted(results):
        m = re.match(r"ab-(.+)-([^-]+)-(\d+)\.json$", name)
        try:
            runs = json.loads(results[name])["benchmarks"]
        except (TypeError, ValueError, KeyError):
            return False, [f"  {name}: no readable results: FAILED"]
        for run in runs:
            if run.get("error_occurred"):
                return False, [f"  {run['name']}: {run.get('error_message', 'error')}: FAILED"]
            case = run["name"].replace("/manual_time", "").replace("/real_time", "")
            times[(case, m.group(2))].append(run["real_time"])
            unit[case] = run.get("time_unit", "")
    cases = sorted({c for c, _ in times})
    if not cases:
        return False, ["  no case matched the filter: FAILED"]
    lines = ["  " + " | ".join(["case"] + builds + [f"{b} / head" for b in builds[1:]])]
    for case in cases:
        cells = [" / ".join(f"{t:.1f}" for t in times[(case, b)]) or "-" for b in builds]
        head = times[(case, "head")]
        ratios = [f"{statistics.median(times[(case, b)]) / statistics.median(head):.3f}"
                  if head and times[(case, b)] else "-" for b in builds[1:]]
        lines.append(f"  {case} ({unit[case]}) | " + " | ".join(cells + ratios))
    return True, lines


def profile_cases(text):
    """TOWERLAB_GPU_PROFILE's lines as (bench, filter, skip, count); skip 20 and count 1 by
    default."""
    cases = []
    for line in text.splitlines():
        fields = line.split(None, 3)
        if fields:
            bench, filter_, skip, count = (fields + [""] * 4)[:4]
            cases.append((bench, filter_, skip.strip() or "20", count.strip() or "1"))
    return cases


def profile_summary(report):
    """The lines of an ncu report the summary keeps: each kernel's grid, time, throughputs,
    registers and occupancy."""
    return ["    " + line.lstrip(" ") for line in report.splitlines() if PROFILE_SUMMARY.search(line)]


def check_summary(check_log):
    """The lines of the check's log that go into a command's summary, indented."""
    return ["  " + line for line in check_log.splitlines() if CHECK_SUMMARY.search(line)]


def devices_verdict(devices_output, rc):
    """The check's verdict on towerlab_devices: 0 when it exited 0 having checked cuda:0;
    1 when it saw cuda:0 and failed (a wrong answer or an error); 3 when no GPU is visible."""
    if rc == 0 and re.search(r"^ *cuda:0 .* ok$", devices_output, re.M):
        return 0
    if rc != 0 and re.search(r"^ *cuda:0 ", devices_output, re.M):
        return 1
    return 3


def parse_ldd(text):
    """ldd's lines as {soname: path or None}; a library ldd did not find raises Failed."""
    libraries = {}
    for line in text.splitlines():
        line = re.sub(r" \(0x.*", "", line.strip())
        if not line or line.endswith(":"):  # "path:" heads ldd's output for several files
            continue
        soname = os.path.basename(line.split()[0])
        if "not found" in line:
            raise Failed(f"{soname} is not found here (ldd of the staged binaries)")
        fields = line.split()
        libraries[soname] = fields[2] if len(fields) >= 3 and fields[1] == "=>" else None
    return libraries


def libraries_to_carry(libraries, refuse):
    """Of {soname: path}, the libraries that travel ({soname: path}: what the GPU machine
    lacks); with `refuse` (the gpu preset), a REFUSED_LIBS library raises Failed."""
    carried = {}
    for soname, path in sorted(libraries.items()):
        if refuse and any(soname.startswith(r) for r in REFUSED_LIBS):
            raise Failed(f"{soname} is linked, but the gpu preset keeps it out (check CMakePresets.json)")
        if soname not in SYSTEM_LIBS and path:
            carried[soname] = path
    return carried


def mib(size):
    return f"{size / 1048576:.1f} MiB"


def travel_line(tree, carried, carry):
    """The sizes line of prepare and whether they fit the device tool's 64 MiB."""
    total = tree + carried
    return total <= LIMIT, (f"travels: working tree {mib(tree)} + {carry} {mib(carried)} = "
                            f"{mib(total)} (limit 64 MiB)")


def cut_log(data, keep=1024 * 1024):
    """A log over LOG_CUT bytes as its first and last `keep` bytes; others as they are."""
    if len(data) <= LOG_CUT:
        return data
    return data[:keep] + b"\n[... cut by gpu.py ...]\n" + data[-keep:]


def verdict_lines(command, status, seconds):
    return [f"{command}: PASSED" if status == 0 else f"{command}: FAILED (exit {status}; see above)",
            f"{command} took {seconds}s"]


def write_idx_subset(src, dst, budget):
    """Writes a prefix of Fashion-MNIST as valid IDX files (header counts set to the
    subset's) into dst: the whole test set, and as many training images as fit in `budget`
    bytes, in thousands. gzip -9 of the raw files, which the sample reads as it reads
    Debian's. Returns the line of data/contents.txt."""
    def read(name):
        with gzip.open(f"{src}/{name}.gz") as f:
            return f.read()

    def write(name, header_dims, data, count):
        magic = struct.unpack(">I", data[:4])[0]
        header = struct.pack(">I", magic) + struct.pack(">I", count) + b"".join(
            struct.pack(">I", d) for d in header_dims)
        item = 1
        for d in header_dims:
            item *= d
        offset = 8 + 4 * len(header_dims)
        blob = gzip.compress(header + data[offset:offset + count * item], 9)
        with open(f"{dst}/{name}.gz", "wb") as f:
            f.write(blob)
        return len(blob)

    used = write("t10k-labels-idx1-ubyte", [], read("t10k-labels-idx1-ubyte"), 10000)
    used += write("t10k-images-idx3-ubyte", [28, 28], read("t10k-images-idx3-ubyte"), 10000)
    images, labels = read("train-images-idx3-ubyte"), read("train-labels-idx1-ubyte")
    # About 440 bytes per image after gzip; shrink until it fits.
    count = min(60000, (budget - used) // 440 // 1000 * 1000)
    while count > 0:
        size = write("train-labels-idx1-ubyte", [], labels, count)
        size += write("train-images-idx3-ubyte", [28, 28], images, count)
        if used + size <= budget:
            break
        count -= 1000
    if count <= 0:
        raise Failed("not even 1000 training images fit")
    return (f"subset: the first {count} of 60000 training images (IDX headers set to {count}),"
            f" all 10000 test images; the whole set does not fit the 64 MiB that travels")
