#!/usr/bin/env python3
"""FashionNet's training step on one GPU: towerlab's Trainer (bench/trainer_bench, the
cuda_local cases) against PyTorch eager and PyTorch with the whole step captured in a CUDA
graph, alternated round by round in one call on the GPU machine (scripts/gpu.py runs it).

  gpu_peers.py --trainer-bench BIN [--rounds 3] [--steps 200] [--json OUT.json]

Every contender trains the same model (bench/peers/torch_net.py's fashion_net(), which is
towerlab's models::fashion_net()) with Adam (lr 1e-3) on the same kind of batch: random
normal images and labels i % 10, taken from host memory each step, as trainer_bench's
Trainer::step takes them. Each step ends with its work done: towerlab's step reads the
loss and the guard's verdict on the host, PyTorch's reads loss.item(). PyTorch is at its
best for a small model on a GPU: cudnn.benchmark on, TF32 off in cuDNN and cuBLAS, Adam
fused (eager) or capturable (graph), warm-up before timing.

Output: a table of images/s per batch and contender (median over rounds, each round's
value beside it) and the ratios of towerlab's one tower to each peer; --json writes every
number with the versions and the device.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/peers")
sys.dont_write_bytecode = True
from torch_net import fashion_net  # noqa: E402  (the model every peer trains)


def torch_setup():
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def host_batch(batch):
    images = torch.randn(batch, 1, 28, 28)
    labels = torch.arange(batch) % 10
    return images, labels


def time_steps(step, steps, warmup):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    losses = [step() for _ in range(steps)]
    seconds = time.perf_counter() - start
    if not all(map(lambda v: v == v, losses)) or losses[-1] >= losses[0]:
        raise RuntimeError(f"the loss did not fall: {losses[0]} -> {losses[-1]}")
    return seconds / steps


def torch_eager(batch, steps, warmup):
    torch.manual_seed(1)
    model = fashion_net().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    loss_fn = nn.CrossEntropyLoss()
    images, labels = host_batch(batch)

    def step():
        x, y = images.cuda(), labels.cuda()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return time_steps(step, steps, warmup)


def torch_graph(batch, steps, warmup):
    # PyTorch's whole-network capture: warm-up on a side stream, then one graph of
    # forward, backward and the optimizer, replayed on static inputs.
    torch.manual_seed(1)
    model = fashion_net().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    loss_fn = nn.CrossEntropyLoss()
    images, labels = host_batch(batch)
    static_x, static_y = images.cuda(), labels.cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model(static_x), static_y)
        static_loss.backward()
        opt.step()

    def step():
        static_x.copy_(images)
        static_y.copy_(labels)
        graph.replay()
        return static_loss.item()

    return time_steps(step, steps, warmup)


def towerlab(binary, batches, towers):
    cases = "|".join(f"cuda_local/{t}/{b}/" for t in towers for b in batches)
    out = subprocess.run([binary, f"--benchmark_filter=BM_FashionNetStep/({cases})",
                          "--benchmark_min_time=0.5", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True).stdout
    results = {}
    for run in json.loads(out)["benchmarks"]:
        _, _, t, b, _ = run["name"].split("/", 4)
        results[(int(t), int(b))] = run["real_time"] / 1e3  # ms -> s
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trainer-bench", required=True, help="towerlab's trainer_bench binary")
    p.add_argument("--batches", default="128,512")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=200, help="PyTorch's timed steps per run")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--json", help="write every number here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_peers.py: PyTorch sees no CUDA device")
    torch_setup()
    batches = [int(b) for b in args.batches.split(",")]
    towers = (1, 2)
    names = [f"towerlab, {t} tower{'s' if t > 1 else ''}" for t in towers]
    names += ["PyTorch eager", "PyTorch CUDA graph"]
    seconds = {(n, b): [] for n in names for b in batches}
    for r in range(args.rounds):
        # The order rotates so that no contender always runs first or last.
        order = ["towerlab", "eager", "graph"]
        order = order[r % 3:] + order[:r % 3]
        for who in order:
            if who == "towerlab":
                for (t, b), s in towerlab(args.trainer_bench, batches, towers).items():
                    seconds[(names[towers.index(t)], b)].append(s)
            for b in batches:
                if who == "eager":
                    seconds[("PyTorch eager", b)].append(torch_eager(b, args.steps, args.warmup))
                elif who == "graph":
                    seconds[("PyTorch CUDA graph", b)].append(torch_graph(b, args.steps, args.warmup))
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)

    device = torch.cuda.get_device_name(0)
    print(f"FashionNet training step on {device}, PyTorch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}; images/s, median of {args.rounds} alternated rounds")
    table = {}
    for b in batches:
        print(f"\nbatch {b}:")
        for n in names:
            runs = [b / s for s in seconds[(n, b)]]
            table[(n, b)] = statistics.median(runs)
            print(f"  {n:22s} {table[(n, b)]:9.0f}  ({' / '.join(f'{v:.0f}' for v in runs)})"
                  f"  {1e3 * statistics.median(seconds[(n, b)]):.3f} ms/step")
        one = table[(names[0], b)]
        for peer in ("PyTorch eager", "PyTorch CUDA graph"):
            print(f"  towerlab 1 tower / {peer}: {one / table[(peer, b)]:.2f}x"
                  f"  (2 towers: {table[(names[1], b)] / table[(peer, b)]:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "rounds": args.rounds,
                       "seconds_per_step": {f"{n} | batch {b}": v for (n, b), v in seconds.items()}},
                      f, indent=1)


if __name__ == "__main__":
    main()
