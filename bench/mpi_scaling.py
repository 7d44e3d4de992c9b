#!/usr/bin/env python3
"""FashionNet training throughput across processes: towerlab's fashion_mnist sample as
1 process x 1 tower (the reference), 1 x 2, 2 x 1 and 2 x 2, the multi-process layouts
under mpirun over shared memory (Open MPI's vader, its default on one host) and over TCP
(`--mca btl self,tcp`, standing in for separate hosts), with the scaling efficiency of
each: its images/s over the 1 x 1 run's of the same round, divided by its workers
(processes x towers).

  bench/mpi_scaling.py                                  # 3 rounds of 40 timed steps
  bench/mpi_scaling.py --rounds 5 --steps 80 --markdown bench/results/fashion_scaling.md

Each round runs every configuration once, as a fresh job, for the same warm-up and timed
steps (batch 128, Adam, the real Fashion-MNIST that the sample reads, as
bench/compare_peers.py gets it); the order rotates from round to round, so load that
changes during the call falls on every configuration alike. Images/s come from rank 0's
progress lines (the global batch per step over the step's time). Processes are not
bound to cores (`--bind-to none`): each rank's kernels use a thread pool as wide as the
machine, as a single process does.

Output: a JSON file (every run's images/s and the load average when it started, the
machine, the Open MPI version) and, with --markdown, the results page.
"""
import argparse
import datetime
import math
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import compare_peers  # noqa: E402  (the data, the build, the sample's progress lines)
import results_page  # noqa: E402  (the JSON, the table and the results page)

ROOT = compare_peers.ROOT
TRANSPORTS = {"shm": ["--mca", "btl", "self,vader"],
              "tcp": ["--mca", "btl", "self,tcp", "--mca", "pml", "ob1"]}
# (processes, towers per process, transport); the first is the reference.
CONFIGS = [(1, 1, None), (1, 2, None), (2, 1, "shm"), (2, 2, "shm"), (2, 1, "tcp"), (2, 2, "tcp")]


def name(config):
    processes, towers, transport = config
    return f"{processes}x{towers}" + (f"-{transport}" if transport else "")


def openmpi_version(mpirun):
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0].strip()


def command(config, args, sample, mpirun):
    processes, towers, transport = config
    cmd = [sample, "--devices", ",".join(["cpu"] * towers), "--epochs", "1",
           "--steps", str(args.warmup + args.steps), "--batch", str(args.batch),
           "--optimizer", "adam", "--progress-every", "1", "--data", args.data]
    if processes == 1:
        return cmd
    # Plain copies in shared memory: the single-copy mechanism (CMA) needs ptrace
    # rights that containers often lack.
    return ([mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(processes),
             "--mca", "btl_vader_single_copy_mechanism", "none"] + TRANSPORTS[transport] + cmd)


def run(config, args, sample, mpirun, env):
    load = os.getloadavg()[0]
    ips, _, losses = compare_peers.run_sample(command(config, args, sample, mpirun), env,
                                              args.warmup, args.steps, args.batch)
    if not all(math.isfinite(loss) for loss in losses):
        raise RuntimeError(f"{name(config)}: a non-finite loss: {losses}")
    return {"images_per_second": ips, "load_average_1min": load, "first_loss": losses[0],
            "last_loss": losses[-1]}


def summarize(rounds):
    reference = name(CONFIGS[0])
    rows = []
    for config in CONFIGS:
        key = name(config)
        rates = [r[key]["images_per_second"] for r in rounds]
        # Against the reference of the same round, so that the rounds' load cancels.
        speedups = [r[key]["images_per_second"] / r[reference]["images_per_second"] for r in rounds]
        workers = config[0] * config[1]
        rows.append({"configuration": key, "processes": config[0], "towers": config[1],
                     "transport": config[2] or "-", "workers": workers,
                     "median_images_per_second": statistics.median(rates),
                     "min_images_per_second": min(rates), "max_images_per_second": max(rates),
                     "median_speedup": statistics.median(speedups),
                     "median_efficiency": statistics.median(speedups) / workers})
    return rows


def table(doc):
    columns = ["processes x towers", "transport", "images/s, median (min-max)",
               "speed-up over 1 x 1", "scaling efficiency"]
    rows = [[f"{row['processes']} x {row['towers']}", row["transport"], results_page.rate_cell(row),
             f"{row['median_speedup']:.2f}", f"{row['median_efficiency']:.2f}"]
            for row in doc["summary"]]
    return results_page.table(columns, rows)


def markdown(doc, json_path):
    m, s = doc["machine"], doc["settings"]
    loads = results_page.load_averages(doc)
    cores = m["cpus"]
    notes = [
        f"- Machine: {m['cpu_model']}, {cores} CPUs ({', '.join(m['flags']) or 'no AVX'}), "
        f"Linux {m['kernel']}; {doc['openmpi']}.",
        f"- Load average (1 min) when the runs started: {min(loads):.2f} to {max(loads):.2f}.",
        "- Speed-up and efficiency are medians over rounds of the configuration's images/s over "
        "the 1 x 1 run of the same round (efficiency: the speed-up divided by processes x towers).",
        "- Processes run unbound (`--bind-to none`) and each rank's kernels use a thread pool of "
        f"{cores} threads, as one process does.",
    ]
    if cores < 4:
        notes.append(f"- This machine has {cores} CPUs, and 1 x 1 already keeps them busy (its "
                     "kernels' thread pool): 2 x 2 runs four towers and 2 x 1 two processes of "
                     f"{cores} kernel threads each on them, so these layouts are oversubscribed. "
                     "No layout can be much faster than 1 x 1 here, and the efficiency is "
                     "bounded by about 1 / workers: the table shows what splitting the batch "
                     "and the all-reduce cost, not how the layouts scale with a core or a GPU "
                     "per worker.")
    intro = [
        f"Written by `bench/mpi_scaling.py --markdown` ({doc['date']}, towerlab "
        f"{doc['towerlab_commit']}); its JSON is `{os.path.relpath(json_path, ROOT)}`.",
        f"{s['rounds']} round{'s' if s['rounds'] > 1 else ''}; in each every configuration, as a fresh job, trains FashionNet for "
        f"{s['warmup']} warm-up and {s['steps']} timed steps (global batch {s['batch']}, Adam, real "
        "Fashion-MNIST), the order rotating from round to round. Shared memory is Open MPI's "
        "vader transport (`--mca btl self,vader`), TCP is `--mca btl self,tcp` on loopback.",
    ]
    return results_page.page(
        "FashionNet across processes: 1 x 2, 2 x 1 and 2 x 2 over shared memory and TCP", intro,
        table(doc), ["Notes:", "", *notes])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--preset", default="cpu", help="CMake preset that builds the sample")
    p.add_argument("--sample", help="a built fashion_mnist to use instead of building one")
    p.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "fashion_scaling.json"))
    p.add_argument("--markdown", help="write the results page here")
    args = p.parse_args()
    if min(args.rounds, args.steps, args.batch) < 1 or args.warmup < 0:
        sys.exit("mpi_scaling: --rounds, --steps and --batch must be positive, --warmup >= 0")
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("mpi_scaling: no mpirun on PATH (Debian: openmpi-bin)")
    compare_peers.ensure_data(args.data)
    sample = args.sample or compare_peers.build_sample(args.preset)
    # As root (containers, CI) Open MPI needs to be told that is intended.
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    rounds = []
    for i in range(args.rounds):
        order = CONFIGS[i % len(CONFIGS):] + CONFIGS[:i % len(CONFIGS)]
        results = {}
        for config in order:
            results[name(config)] = run(config, args, sample, mpirun, env)
            compare_peers.log(f"round {i + 1}: {name(config)}: "
                              f"{results[name(config)]['images_per_second']:.0f} images/s "
                              f"(load {results[name(config)]['load_average_1min']:.2f})")
        rounds.append(results)
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "towerlab_commit": compare_peers.git_commit(), "machine": compare_peers.machine(),
           "openmpi": openmpi_version(mpirun),
           "settings": {"rounds": args.rounds, "warmup": args.warmup, "steps": args.steps,
                        "batch": args.batch, "data": args.data},
           "rounds": rounds}
    doc["summary"] = summarize(rounds)
    results_page.write(doc, args.json, args.markdown, table, markdown)


if __name__ == "__main__":
    main()
