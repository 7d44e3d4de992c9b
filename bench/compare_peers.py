#!/usr/bin/env python3
"""Training throughput on this machine's CPU of FashionNet (or --model mlp, resnet, vit):
towerlab's fashion_mnist sample against PyTorch 2, TensorFlow 2 and JAX from PyPI, each
at its best on the same threads, run alternately in one call so that the ratios hold on
a machine shared with other work.

  bench/compare_peers.py                       # 4 rounds of 120 timed steps each
  bench/compare_peers.py --markdown bench/results/cpu_peers.md
  bench/compare_peers.py --isa avx2            # every contender held to AVX2 code
  bench/compare_peers.py --model resnet --steps 20 --warmup 5 --json ... --markdown ...

--model picks the model of models/ that every contender trains: fashion_net (the
default), mlp (784-512-256-10, dropout 0.2), resnet (ResNet-20, towerlab's towers with
synchronized batch norm, `--batchnorm sync`, which is the peers' batch norm over the
whole batch) or vit (the small vision transformer of models/vit.h). The peers train the
twins of tools/ (bench/peers/run_peer.py says how); each model has its own default
contenders (MODELS).

--isa avx2 holds every contender to AVX2 + FMA code on a machine that has AVX-512:
towerlab by TOWERLAB_GEMM_ISA, oneDNN (PyTorch's and TensorFlow's convolutions and
matrix products) by ONEDNN_MAX_CPU_ISA, PyTorch's own kernels by ATEN_CPU_CAPABILITY,
XLA (JAX, TensorFlow's XLA) by --xla_cpu_max_isa. It compares the AVX2 code of
all of them on the same run, not an AVX2 machine: the caches, clocks and memory stay
this machine's, so its table stands beside, never in place of, one from an AVX2 CPU.

Each round runs every contender once, as a fresh process, for the same warm-up and timed
steps of FashionNet (batch 128, Adam, the real Fashion-MNIST of Debian's
dataset-fashion-mnist); the order rotates from round to round. The peers run from a
virtual environment (build/peers-venv) that this script creates from
bench/peers/requirements.txt; towerlab's sample is built with a CMake preset. Every
contender is pinned to the same CPUs (taskset, where the machine has more than
--threads of them) and told its thread count. A run whose loss does not fall fails the
comparison: nobody is measured doing less work.

Output: a JSON file (every round's images/s, losses and load average, the CPU model and
flags, the versions; scripts/plots.py reads it), a table of medians and of the ratios
to the best peer on stdout, and with --markdown the results page itself.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import results_page  # noqa: E402  (the JSON, the table and the results page)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIREMENTS = os.path.join(ROOT, "bench", "peers", "requirements.txt")
RUN_PEER = os.path.join(ROOT, "bench", "peers", "run_peer.py")
PEER_NAMES = {"torch": "PyTorch", "tensorflow": "TensorFlow", "jax": "JAX"}
# What --isa sets so that every contender runs only code of that instruction set.
ISA_CAPS = {
    "native": {},
    "avx2": {"TOWERLAB_GEMM_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
             "XLA_FLAGS": "--xla_cpu_max_isa=AVX2",
             # torch.compile gets a cache of its own: given the one the native runs had
             # filled, its AVX2 process failed in the backward (an index of -1 out of
             # bounds); with a fresh cache it ran.
             "TORCHINDUCTOR_CACHE_DIR": os.path.join(tempfile.gettempdir(), "towerlab-peers-inductor-avx2")},
}
# Each model: its title on the page, what the sample adds to train it as the issue's
# recipe says, and the contenders run when --contenders is not given. The MLP has no
# convolution, so channels_last is eager NCHW there; the ViT's one convolution (the
# patches) is a sliver of its step; JAX has no ResNet-20 or ViT here.
MODELS = {
    "fashion_net": ("FashionNet", [], "towerlab:cpu,cpu;towerlab:cpu;torch;tensorflow;jax"),
    "mlp": ("MLP 784-512-256-10 (dropout 0.2)", ["--model", "mlp"],
            "towerlab:cpu,cpu;torch;torch:compile;tensorflow;tensorflow:xla;jax"),
    "resnet": ("ResNet-20", ["--model", "resnet", "--batchnorm", "sync"],
               "towerlab:cpu,cpu;torch;torch:channels_last;torch:compile;tensorflow;tensorflow:xla"),
    "vit": ("ViT (patches of 4, width 64, 4 blocks)", ["--model", "vit"],
            "towerlab:cpu,cpu;torch;torch:compile;tensorflow;tensorflow:xla"),
}
# The training set's size: a towerlab run is one epoch, so warm-up and timed steps fit in it.
TRAIN_IMAGES = 60000
# Debian's package of the data set the sample reads by default.
DATA_PACKAGE = "dataset-fashion-mnist"


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def run_checked(cmd, **kwargs):
    log("+", " ".join(cmd))
    subprocess.run(cmd, check=True, **kwargs)


def ensure_venv(venv):
    """The peers' environment, (re)installed when the requirements changed."""
    python = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, "requirements.installed")
    wanted = open(REQUIREMENTS).read()
    if os.path.exists(stamp) and open(stamp).read() == wanted:
        return python
    if not os.path.exists(python):
        run_checked([sys.executable, "-m", "venv", venv])
    run_checked([python, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    run_checked([python, "-m", "pip", "install", "-q", "-r", REQUIREMENTS])
    with open(stamp, "w") as f:
        f.write(wanted)
    return python


def ensure_data(data_dir):
    if os.path.exists(os.path.join(data_dir, "train-images-idx3-ubyte.gz")):
        return
    if data_dir != "/usr/share/datasets/fashion-mnist":
        sys.exit(f"compare_peers: no Fashion-MNIST in {data_dir}")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    run_checked(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends", DATA_PACKAGE],
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def build_sample(preset):
    run_checked(["cmake", "--preset", preset], cwd=ROOT, stdout=subprocess.DEVNULL)
    run_checked(["cmake", "--build", "--preset", preset, "--target", "fashion_mnist"], cwd=ROOT,
                stdout=subprocess.DEVNULL)
    return os.path.join(ROOT, "build", preset, "samples", "fashion_mnist")


def machine():
    info = {"cpu_model": platform.processor() or "unknown", "cpus": os.cpu_count(), "flags": []}
    try:
        text = open("/proc/cpuinfo").read()
        model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
        flags = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
        if model:
            info["cpu_model"] = model.group(1).strip()
        # The family and model numbers tell the kinds a model name leaves alike (an
        # "AMD EPYC" is a Zen 3 at family 25 model 1, a Zen 4 at 25/17, a Zen 5 at 26/2).
        family = re.search(r"^cpu family\s*:\s*(\d+)$", text, re.M)
        number = re.search(r"^model\s*:\s*(\d+)$", text, re.M)
        if family and number:
            info["cpu_family"], info["cpu_model_number"] = int(family.group(1)), int(number.group(1))
        if flags:
            have = set(flags.group(1).split())
            info["flags"] = [f for f in ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni",
                                         "avx512_bf16", "amx_tile") if f in have]
    except OSError:
        pass
    info["kernel"] = platform.release()
    return info


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def peer_versions(python):
    code = ("import importlib.metadata as m, json\n"
            "import platform\n"
            "print(json.dumps({'python': platform.python_version(), **{p: m.version(p) for p in "
            "('torch', 'tensorflow-cpu', 'keras', 'jax', 'jaxlib', 'numpy')}}))")
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True,
                                     check=True).stdout)


class Contender:
    """One configuration measured each round: towerlab's sample on a device list, or a
    peer framework with a variant (run_peer.py)."""

    def __init__(self, spec):
        self.spec = spec
        if spec.startswith("towerlab:"):
            self.devices, _, self.precision = spec.split(":", 1)[1].partition("+")
            if self.precision not in ("", "fp32", "bf16", "fp16"):
                raise ValueError(f"contender {spec!r}: expected towerlab:DEVICES[+fp32|bf16|fp16]")
            self.framework = None
            towers = len(self.devices.split(","))
            precision = f" --precision {self.precision}" if self.precision else ""
            self.label = (f"towerlab, {towers} CPU tower{'s' if towers > 1 else ''} "
                          f"(`--devices {self.devices}{precision}`)")
        else:
            self.framework, _, self.variant = spec.partition(":")
            if self.framework not in PEER_NAMES:
                raise ValueError(f"contender {spec!r}: expected towerlab:DEVICES or one of "
                                 f"{sorted(PEER_NAMES)}[:VARIANT]")
            self.label = PEER_NAMES[self.framework] + (f" ({self.variant})" if self.variant else "")

    @property
    def is_peer(self):
        return self.framework is not None


PROGRESS = re.compile(r"^\s*epoch \d+ step (\d+)/\d+\s+loss (\S+)\s+(\S+) images/s")


def cpu_seconds(pid):
    """User plus system CPU time of a live process, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_sample(cmd, env, warmup, steps, batch):
    """Runs towerlab's sample with --progress-every 1 (one line per step with its loss
    and images/s): images/s over the timed steps, the CPU seconds the process spent in
    them (read from /proc as the warm-up's last line and the last step's line arrive),
    and the losses."""
    rows, text, cpu = [], [], {}
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        if warmup == 0:
            cpu[0] = cpu_seconds(proc.pid)
        for line in proc.stdout:
            text.append(line)
            m = PROGRESS.match(line)
            if m:
                rows.append((int(m.group(1)), float(m.group(2)), float(m.group(3))))
                if rows[-1][0] in (warmup, warmup + steps):
                    cpu[rows[-1][0]] = cpu_seconds(proc.pid)
        if proc.wait() != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{err.read()[-3000:]}")
    if len(rows) != warmup + steps or len(cpu) != 2:
        raise RuntimeError(f"fashion_mnist printed {len(rows)} progress lines, expected "
                           f"{warmup + steps}:\n{''.join(text)[-2000:]}")
    seconds = sum(batch / rate for step, _, rate in rows if step > warmup)
    return steps * batch / seconds, cpu[warmup + steps] - cpu[warmup], [loss for _, loss, _ in rows]


def run_contender(c, args, sample, python, pin, env):
    load = os.getloadavg()[0]
    if c.is_peer:
        cmd = [python, RUN_PEER, c.framework] + (["--model", args.model] if args.model != "fashion_net" else [])
        cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup),
               "--batch", str(args.batch), "--threads", str(args.threads), "--data", args.data]
        if c.variant:
            cmd += ["--variant", c.variant]
        out = subprocess.run(pin + cmd, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"{c.spec} exited {out.returncode}:\n{out.stderr[-3000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        ips, cpu, losses = result["images_per_second"], result["cpu_seconds"], result["losses"]
        config = result["config"]
    else:
        cmd = [sample, *MODELS[args.model][1], "--devices", c.devices, "--epochs", "1", "--steps", str(args.warmup + args.steps),
               "--batch", str(args.batch), "--progress-every", "1", "--data", args.data]
        precision = ["--precision", c.precision] if c.precision else []
        ips, cpu, losses = run_sample(pin + cmd + precision, env, args.warmup, args.steps, args.batch)
        config = (f"{' '.join(MODELS[args.model][1] + ['--devices', c.devices] + precision)}, thread pool of "
                  f"{args.threads} (the machine's CPUs)")
    # Training, not idling: the last ten steps' mean loss well below the first step's.
    first, last = losses[0], statistics.mean(losses[-10:])
    if not last < 0.8 * first:
        raise RuntimeError(f"{c.spec}: the loss did not fall ({first:.3f} at the first step, "
                           f"{last:.3f} over the last ten)")
    return {"contender": c.spec, "images_per_second": ips, "cpu_seconds": cpu,
            "images_per_cpu_second": args.steps * args.batch / cpu, "load_average_1min": load,
            "first_loss": first, "last_loss": last, "config": config}


def summarize(contenders, rounds, versions):
    rows = []
    peers = [c.spec for c in contenders if c.is_peer]
    for c in contenders:
        rates = [r[c.spec]["images_per_second"] for r in rounds]
        cpu = [r[c.spec]["images_per_cpu_second"] for r in rounds if "images_per_cpu_second" in r[c.spec]]
        # Ratio to the best peer of the same round: the rounds alternate, so load
        # that changes between rounds cancels out of these.
        ratios = [r[c.spec]["images_per_second"] / max(r[p]["images_per_second"] for p in peers)
                  for r in rounds] if peers else []
        label = c.label
        if c.is_peer:  # the version after the name: "PyTorch 2.15.0 (compile)"
            name, _, rest = label.partition(" ")
            package = {"torch": "torch", "tensorflow": "tensorflow-cpu", "jax": "jax"}[c.framework]
            label = f"{name} {versions[package].split('+')[0]}" + (f" {rest}" if rest else "")
        rows.append({"contender": c.spec, "label": label, "median_images_per_second": statistics.median(rates),
                     "min_images_per_second": min(rates), "max_images_per_second": max(rates),
                     "median_ratio_to_best_peer": statistics.median(ratios) if ratios else None,
                     "median_images_per_cpu_second": statistics.median(cpu) if cpu else None})
    return rows


def table(doc):
    columns = ["configuration", "images/s, median of rounds (min-max)", "ratio to the best peer",
               "images per CPU-second"]
    rows = []
    for row in doc["summary"]:
        ratio, cpu = row["median_ratio_to_best_peer"], row["median_images_per_cpu_second"]
        rows.append([row["label"], results_page.rate_cell(row),
                     "-" if ratio is None else f"{ratio:.2f}", "-" if cpu is None else f"{cpu:.0f}"])
    return results_page.table(columns, rows)


def markdown(doc, json_path):
    m, s = doc["machine"], doc["settings"]
    loads = results_page.load_averages(doc)
    configs = {}
    for rnd in doc["rounds"]:
        for spec, r in rnd.items():
            configs.setdefault(spec, r["config"])
    v = doc["versions"]
    title = MODELS[doc.get("model", "fashion_net")][0]
    intro = [
        f"Written by `bench/compare_peers.py --markdown` ({doc['date']}, towerlab {doc['towerlab_commit']}); "
        f"its JSON is `{os.path.relpath(json_path, ROOT)}`.",
        f"{s['rounds']} rounds; in each every contender, as a fresh process, trains {title} for "
        f"{s['warmup']} warm-up and {s['steps']} timed steps (batch {s['batch']}, Adam, real "
        f"Fashion-MNIST), the order rotating from round to round, all on {s['threads']} threads. "
        "The ratio is the median over rounds of the contender's images/s over the best peer's "
        "in the same round: on a shared machine only such alternated ratios count. Images per "
        "CPU-second (the process's user and system time over the timed steps, all threads) "
        "does not depend on the share of the cores a process gets on a loaded machine: "
        "spinning threads and idle cores it cannot use count against it, not other processes.",
    ]
    notes = [
        f"- Command: `{doc.get('command', 'bench/compare_peers.py')}`.",
        f"- CPU: {m['cpu_model']}"
        + (f" (family {m['cpu_family']} model {m['cpu_model_number']})" if "cpu_family" in m else "")
        + f", {m['cpus']} CPUs, flags {' '.join(m['flags'])}; Linux {m['kernel']}.",
        *isa_note(doc.get("isa", "native")),
        f"- Load average (1 minute) before each run: {min(loads):.1f} to {max(loads):.1f} "
        f"(median {statistics.median(loads):.1f}).",
        f"- Peers from PyPI (`bench/peers/requirements.txt`): torch {v['torch']}, tensorflow-cpu "
        f"{v['tensorflow-cpu']} with Keras {v['keras']}, jax {v['jax']} with jaxlib {v['jaxlib']}, "
        f"numpy {v['numpy']}; Python {v['python']}.",
        f"- OpenMP threads (PyTorch's pool) wait {doc['omp_wait_policy']} (`--omp-wait-policy`).",
        "- Configurations (each peer's is its best on these machines; `bench/peers/*_net.py` say "
        "what else was tried, and `--contenders` runs those variants beside them):",
    ]
    notes += [f"  - {spec}: {config}" for spec, config in configs.items()]
    notes += ["", "Every run's loss must fall (the mean of its last ten steps below 0.8 times its "
              "first step's) or the comparison stops: nobody is measured doing less work."]
    peers = [name for framework, name in PEER_NAMES.items()
             if any(spec.partition(":")[0] == framework for spec in configs)]
    against = "PyTorch, TensorFlow and JAX" if "model" not in doc else \
        " and ".join([", ".join(peers[:-1]), peers[-1]] if len(peers) > 1 else peers)
    return results_page.page(
        f"{title} training on the CPU: towerlab against {against}", intro,
        table(doc), notes)


def isa_note(isa):
    """The results page's line on --isa: what held every contender to which code."""
    if isa == "native":
        return ["- Instruction set: each contender's own choice for this CPU (`--isa native`)."]
    caps = ", ".join(f"`{k}={v}`" for k, v in ISA_CAPS[isa].items() if k != "TORCHINDUCTOR_CACHE_DIR")
    return [f"- Instruction set: every contender held to {isa.upper()} code (`--isa {isa}`: {caps}). "
            f"This machine's caches, clocks and memory stay its own: the table compares {isa.upper()} "
            f"code, it does not stand in for an {isa.upper()} machine."]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=120, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before them")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", choices=sorted(MODELS), default="fashion_net",
                   help="the model every contender trains (see above)")
    p.add_argument("--contenders",
                   help="';'-separated: towerlab:DEVICES with an optional +PRECISION (the sample's "
                        "--precision: towerlab:cpu,cpu+bf16), or torch, tensorflow, jax with an optional "
                        ":VARIANT (bench/peers/*_net.py list theirs: torch:channels_last+bf16, "
                        "tensorflow:mixed_bfloat16); default: the model's "
                        "(MODELS above)")
    p.add_argument("--omp-wait-policy", choices=["auto", "active", "passive"], default="auto",
                   help="OMP_WAIT_POLICY for the contenders. auto: passive when the 1-minute load "
                        "average exceeds --threads at the start (spinning OpenMP threads then lose "
                        "their time slices to the other processes), else OpenMP's default (active)")
    p.add_argument("--isa", choices=sorted(ISA_CAPS), default="native",
                   help="native: each contender picks its code for this CPU; avx2: every one is held "
                        "to AVX2 + FMA code (see above)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--venv", default=os.path.join(ROOT, "build", "peers-venv"))
    p.add_argument("--preset", default="cpu", help="CMake preset that builds the sample")
    p.add_argument("--sample", help="a built fashion_mnist to use instead of building one")
    p.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "cpu_peers.json"))
    p.add_argument("--markdown", help="also write the results page here")
    p.add_argument("--render", action="store_true",
                   help="measure nothing: recompute the summary of --json's rounds, print the "
                        "table and write --markdown")
    args = p.parse_args()
    if args.render:
        with open(args.json) as f:
            doc = json.load(f)
        args.model = doc.get("model", "fashion_net")
        contenders = [Contender(spec) for spec in doc["rounds"][0]]
        doc["summary"] = summarize(contenders, doc["rounds"], doc["versions"])
        results_page.write(doc, args.json, args.markdown, table, markdown)
        return
    for name in ("rounds", "steps", "batch", "threads"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} is {getattr(args, name)}; it must be positive")
    if args.warmup < 0:
        p.error(f"--warmup is {args.warmup}; it must be 0 or more")
    if args.steps < 10:
        p.error("--steps must be at least 10: the loss check averages the last ten steps")
    if args.warmup + args.steps > TRAIN_IMAGES // args.batch:
        p.error(f"--warmup {args.warmup} + --steps {args.steps} exceed one epoch "
                f"({TRAIN_IMAGES // args.batch} steps of {args.batch}): towerlab's run is one epoch")
    try:
        contenders = [Contender(s) for s in (args.contenders or MODELS[args.model][2]).split(";") if s]
    except ValueError as e:
        p.error(str(e))
    if args.isa != "native" and args.isa not in machine()["flags"]:
        p.error(f"--isa {args.isa}: this CPU has no {args.isa.upper()}")

    ensure_data(args.data)
    python = ensure_venv(args.venv) if any(c.is_peer for c in contenders) else None
    sample = args.sample or (build_sample(args.preset) if not all(c.is_peer for c in contenders) else None)

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < args.threads:
        p.error(f"--threads {args.threads}: this process may use only {len(cpus)} CPUs")
    pin = (["taskset", "-c", ",".join(map(str, cpus[:args.threads]))]
           if len(cpus) > args.threads and shutil.which("taskset") else [])
    n = str(args.threads)
    env = {**os.environ, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n,
           **ISA_CAPS[args.isa]}
    wait = args.omp_wait_policy
    if wait == "auto":
        wait = "passive" if os.getloadavg()[0] > args.threads else "active"
    env["OMP_WAIT_POLICY"] = wait.upper()
    log(f"OMP_WAIT_POLICY={wait.upper()}, load average {os.getloadavg()[0]:.1f}")

    commit = git_commit()  # before the rounds: the tree the sample was built from
    rounds = []
    for r in range(args.rounds):
        k = r % len(contenders)
        results = {}
        for c in contenders[k:] + contenders[:k]:
            results[c.spec] = run_contender(c, args, sample, python, pin, env)
            log(f"round {r + 1}/{args.rounds}: {c.label}: {results[c.spec]['images_per_second']:.0f} images/s "
                f"(load {results[c.spec]['load_average_1min']:.1f}, loss {results[c.spec]['first_loss']:.2f} "
                f"-> {results[c.spec]['last_loss']:.2f})")
        rounds.append({c.spec: results[c.spec] for c in contenders})

    versions = peer_versions(python) if python else {}
    doc = {"command": " ".join(["bench/compare_peers.py"] + sys.argv[1:]),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "towerlab_commit": commit, **({"model": args.model} if args.model != "fashion_net" else {}),
           "machine": machine(),
           "versions": versions,
           "settings": {k: getattr(args, k) for k in ("rounds", "steps", "warmup", "batch", "threads")},
           "pinned_cpus": pin[2] if pin else "all (the machine has no more than --threads)",
           "omp_wait_policy": wait, "isa": args.isa, "rounds": rounds, "summary": summarize(contenders, rounds, versions)}
    results_page.write(doc, args.json, args.markdown, table, markdown)


if __name__ == "__main__":
    main()
