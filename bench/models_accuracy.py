#!/usr/bin/env python3
"""Each model of models/ trained to the end beside its PyTorch twin with the same recipe.

towerlab: the sample, `fashion_mnist --model M --devices cpu,cpu --epochs E --seed S`
(Adam at 1e-3 with epsilon 1e-8, a cosine schedule from the rate to 0 over every step,
batch 128, synchronized batch norm where the model has it), its last "test accuracy".
PyTorch: the twin in tools/ (tools/mlp_torch.py, tools/resnet_torch.py), its own
initialization from torch.manual_seed(S), torch.optim.Adam with the same rate,
betas and epsilon, the same cosine per step, batches of 128 drawn in an order seeded
by S, on one device (which is what towerlab's towers compute), the inputs standardized
as towerlab's loader does. The two draw different initial weights, batch orders and
dropout masks: the comparison is of accuracy in distribution, which is why each is
run with several seeds.

--init twin starts towerlab from the twin's initial weights instead of its own: the
twin's state_dict right after torch.manual_seed(S), converted by tools/torch_convert.py
and given to the sample as --load, so that both engines start from the same weights
(the twins of the MLP and ResNet-20 keep PyTorch's default initialization, uniform in
+-1/sqrt(fan_in), where towerlab draws He normal; the ViT's twin draws towerlab's).
Those runs are kept apart from towerlab's own ("towerlab_twin_init" in the JSON).

Writes a JSON and a Markdown page (commit, machine, date, every run and the means).

usage: bench/models_accuracy.py --sample build/release/samples/fashion_mnist
           [--models mlp,resnet] [--epochs 10] [--seeds 1,2,3] [--init own|twin]
           [--out bench/results/NAME] [--add-to bench/results/OLD.json]

--add-to starts from an earlier run's JSON (the same epochs) and runs only the
(model, seed, engine) runs it lacks, so that a comparison of hours can be built up
over several sessions; every run keeps its own commit, machine and date.
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from fashion_mnist_data import load_split  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
BATCH = 128
LR = 1e-3
# towerlab's runs by their initial weights (--init), as the JSON keys them and the page names them
OURS = {"towerlab": "its own (He normal)", "towerlab_twin_init": "the twin's"}


def twin(model):
    if model == "mlp":
        from mlp_torch import Mlp
        return Mlp()
    if model == "resnet":
        from resnet_torch import ResNet
        return ResNet()
    if model == "vit":
        from vit_torch import ViT
        return ViT()
    raise SystemExit(f"models_accuracy: no PyTorch twin for {model}")


def twin_weights(model, seed, directory):
    """The twin's initial weights at `seed` (torch_run draws the same), as a towerlab file."""
    import torch
    torch.manual_seed(seed)
    path = os.path.join(directory, f"{model}_twin_init_seed{seed}")
    torch.save(twin(model).state_dict(), path + ".pt")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "torch_convert.py"), "to-towerlab",
                    "--model", model, path + ".pt", path + ".safetensors"],
                   check=True, capture_output=True)
    return path + ".safetensors"


def towerlab_run(sample, model, epochs, seed, load=None):
    command = [sample, "--model", model, "--devices", "cpu,cpu", "--epochs", str(epochs),
               "--seed", str(seed), "--batchnorm", "sync"] + (["--load", load] if load else [])
    start = time.time()
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    accuracy = [float(a) for a in re.findall(r"test accuracy ([0-9.]+)", out)]
    return {"accuracy": accuracy[-1], "per_epoch": accuracy, "seconds": time.time() - start,
            "command": " ".join(command[1:])}


def torch_run(model, epochs, seed, train, test):
    import torch
    torch.set_num_threads(2)
    torch.manual_seed(seed)
    net = twin(model)
    images, labels = torch.from_numpy(train[0]), torch.from_numpy(train[1])
    steps_per_epoch = len(labels) // BATCH
    total = steps_per_epoch * epochs
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + np.cos(np.pi * min(step, total) / total)))
    order = torch.Generator().manual_seed(seed)
    accuracy = []
    start = time.time()
    for _ in range(epochs):
        net.train()
        permutation = torch.randperm(len(labels), generator=order)
        for s in range(steps_per_epoch):
            index = permutation[s * BATCH:(s + 1) * BATCH]
            loss = torch.nn.functional.cross_entropy(net(images[index]), labels[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        net.eval()
        with torch.no_grad():
            predicted = torch.cat([net(torch.from_numpy(test[0][i:i + 1000])).argmax(1)
                                   for i in range(0, len(test[1]), 1000)])
        accuracy.append(float((predicted.numpy() == test[1]).mean()))
        print(f"  {model} seed {seed} PyTorch epoch {len(accuracy)}: test accuracy "
              f"{accuracy[-1]:.4f}, {time.time() - start:.0f} s", flush=True)
    return {"accuracy": accuracy[-1], "per_epoch": accuracy, "seconds": time.time() - start,
            "torch": torch.__version__}


def machine():
    with open("/proc/cpuinfo") as f:
        info = f.read()
    name = re.search(r"model name\s*:\s*(.*)", info).group(1)
    flags = re.search(r"flags\s*:\s*(.*)", info).group(1).split()
    isa = "avx512_bf16" if "avx512_bf16" in flags else "avx512f" if "avx512f" in flags else "avx2"
    return f"{name}, {os.cpu_count()} CPUs, {isa}, {platform.system()}"


def markdown(doc):
    lines = [f"# Models against PyTorch, trained to the end ({doc['commit']})", "",
             f"Commit {doc['commit']}, {doc['machine']}, {doc['date']}. Made by "
             f"`bench/models_accuracy.py` (its docstring gives the recipe); {doc['epochs']} "
             f"epochs, seeds {', '.join(map(str, doc['seeds']))}. The machine was shared with "
             "other builds: the seconds are for orientation only.", "",
             "Each row pairs the seeds both engines ran; the mean difference is the mean "
             "of the paired differences.", "",
             "| model | towerlab's initial weights | seeds | towerlab test accuracy | mean | "
             "PyTorch test accuracy | mean | towerlab - PyTorch per seed (points) | "
             "mean (points) |",
             "|---|---|---|---|---|---|---|---|---|"]
    unpaired = []
    for model, runs in doc["models"].items():
        theirs = {r["seed"]: r["accuracy"] for r in runs["torch"]}
        for who, weights in OURS.items():
            ours = {r["seed"]: r["accuracy"] for r in runs.get(who, [])}
            if not ours:
                continue
            seeds = sorted(ours.keys() & theirs.keys())
            unpaired += [f"{model}, towerlab from {weights} weights, seed {s}"
                         for s in sorted(ours.keys() - theirs.keys())]
            unpaired += [f"{model}, PyTorch, seed {s} (beside towerlab from {weights} weights)"
                         for s in sorted(theirs.keys() - ours.keys())]
            if not seeds:
                continue
            a = [ours[s] for s in seeds]
            b = [theirs[s] for s in seeds]
            d = [100 * (x - y) for x, y in zip(a, b)]
            lines.append(f"| {model} | {weights} | {', '.join(map(str, seeds))} | "
                         f"{', '.join(f'{x:.4f}' for x in a)} | {np.mean(a):.4f} | "
                         f"{', '.join(f'{y:.4f}' for y in b)} | {np.mean(b):.4f} | "
                         f"{', '.join(f'{x:+.2f}' for x in d)} | {np.mean(d):+.2f} |")
    if unpaired:
        lines += ["", "Runs without a partner of the same seed (not in the table): "
                  + "; ".join(sorted(set(unpaired))) + "."]
    where = sorted({(r.get("commit", doc["commit"]), r.get("machine", doc["machine"]))
                    for runs in doc["models"].values() for who in runs for r in runs[who]})
    if len(where) > 1:
        lines += ["", "The runs came from more than one tree or machine (`--add-to`):", ""]
        for model, runs in doc["models"].items():
            for who in runs:
                for r in runs[who]:
                    lines.append(f"- {model}, {who}, seed {r['seed']}: "
                                 f"{r.get('commit', doc['commit'])}, "
                                 f"{r.get('machine', doc['machine'])}, "
                                 f"{r.get('date', doc['date'])}")
    lines += ["", "Seconds per run (towerlab on 2 CPU towers, PyTorch on 2 threads):", ""]
    for model, runs in doc["models"].items():
        seconds = {who: ", ".join(f"{r['seconds']:.0f}" for r in runs[who]) for who in runs}
        ours = [f"towerlab from {OURS[who]} weights {seconds[who]}" for who in OURS if runs.get(who)]
        lines.append(f"- {model}: {'; '.join(ours)}; PyTorch {seconds['torch']}")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sample", required=True, help="a built fashion_mnist")
    p.add_argument("--models", default="mlp")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--out", help="bench/results/NAME: writes NAME.json and NAME.md")
    p.add_argument("--add-to", help="an earlier run's JSON: keep its runs, add the missing ones")
    p.add_argument("--init", choices=("own", "twin"), default="own",
                   help="towerlab's initial weights: its own, or the twin's (the same as PyTorch's)")
    args = p.parse_args()
    # PyTorch's OpenMP threads wait passively: spinning, they take CPU from the
    # towerlab runs and the machine's other work (compare_peers.py's --omp-wait-policy).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    seeds = [int(s) for s in args.seeds.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    now = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
    doc = {"commit": commit, "machine": machine(), "epochs": args.epochs, "seeds": seeds,
           "date": now, "models": {}}
    if args.add_to:
        with open(args.add_to) as f:
            doc = json.load(f)
        if doc["epochs"] != args.epochs:
            raise SystemExit(f"models_accuracy: {args.add_to} has {doc['epochs']} epochs, "
                             f"not {args.epochs}")
        for runs in doc["models"].values():  # runs written before runs kept their own
            for run in (run for who in runs.values() for run in who):
                run.setdefault("commit", doc["commit"])
                run.setdefault("machine", doc["machine"])
                run.setdefault("date", doc["date"])
        doc["seeds"] = sorted(set(doc["seeds"]) | set(seeds))
        doc["commit"], doc["date"] = commit, now
    train, test = load_split(DATA, "train"), load_split(DATA, "t10k")
    ours = "towerlab_twin_init" if args.init == "twin" else "towerlab"
    scratch = tempfile.TemporaryDirectory(prefix="models_accuracy_")  # --init twin's files
    for model in args.models.split(","):
        runs = doc["models"].setdefault(model, {"torch": []})
        runs.setdefault(ours, [])
        for seed in seeds:  # alternated, so that a change in the machine's load hits both
            def towerlab():
                load = twin_weights(model, seed, scratch.name) if args.init == "twin" else None
                return towerlab_run(args.sample, model, args.epochs, seed, load)

            for who, run in ((ours, towerlab),
                             ("torch", lambda: torch_run(model, args.epochs, seed, train, test))):
                if any(r["seed"] == seed for r in runs[who]):
                    continue
                runs[who].append(dict(run(), seed=seed, commit=commit, machine=machine(),
                                      date=datetime.datetime.utcnow().strftime(
                                          "%Y-%m-%d %H:%M UTC")))
                print(model, seed, who, runs[who][-1]["per_epoch"],
                      f"{runs[who][-1]['seconds']:.0f} s", flush=True)
                if args.out:  # after every run: hours of training survive an interrupted session
                    with open(args.out + ".json", "w") as f:
                        json.dump(doc, f, indent=1)
    page = markdown(doc)
    print(page)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(page)


if __name__ == "__main__":
    main()
