#!/usr/bin/env python3
"""PyTorch peer of samples/fashion_mnist: the same FashionNet, batch, optimizer and
data, trained for a fixed number of steps; prints images/s as JSON.

Run through bench/fashion_mnist_compare.sh, which sets the peer at its best
(OpenBLAS for SkylakeX with 2 threads, see ../shared/PEERS.md) and runs towerlab
beside it in the same call.
"""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from fashion_net_torch import FashionNet  # noqa: E402  (the twin of towerlab's fashion_net())


def load(dir_, prefix):
    with gzip.open(f"{dir_}/{prefix}-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{dir_}/{prefix}-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    images = (images.astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--epochs", type=int, default=0,
                   help="train whole epochs instead and report the test accuracy (the accuracy peer)")
    p.add_argument("--schedule", choices=["constant", "cosine"], default="cosine",
                   help="with --epochs: the learning rate, as samples/fashion_mnist --schedule")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    images, labels = load(args.data, "train")
    model = FashionNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    order = torch.randperm(len(labels))

    def step(i):
        idx = order[(i * args.batch) % (len(labels) - args.batch):][: args.batch]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(images[idx]), labels[idx])
        loss.backward()
        opt.step()
        return loss.item()

    if args.epochs > 0:
        test_images, test_labels = load(args.data, "t10k")
        steps_per_epoch = (len(labels) + args.batch - 1) // args.batch
        # Per step, like towerlab's LearningRate::cosine: 1e-3 down to 0 over the run.
        scheduler = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps_per_epoch * args.epochs)
                     if args.schedule == "cosine" else None)
        start = time.perf_counter()
        for epoch in range(args.epochs):
            model.train()
            perm = torch.randperm(len(labels))
            for b in range(0, len(labels), args.batch):
                idx = perm[b:b + args.batch]
                opt.zero_grad(set_to_none=True)
                loss_fn(model(images[idx]), labels[idx]).backward()
                opt.step()
                if scheduler:
                    scheduler.step()
            model.eval()
            with torch.no_grad():
                correct = sum((model(test_images[b:b + 1000]).argmax(1) == test_labels[b:b + 1000]).sum().item()
                              for b in range(0, len(test_labels), 1000))
            print(json.dumps({"epoch": epoch + 1, "test_accuracy": correct / len(test_labels),
                              "seconds": time.perf_counter() - start}), flush=True)
        return

    for i in range(args.warmup):
        step(i)
    start = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup + i)
    seconds = time.perf_counter() - start
    print(json.dumps({"peer": "pytorch " + torch.__version__, "threads": args.threads,
                      "batch": args.batch, "steps": args.steps,
                      "images_per_second": args.steps * args.batch / seconds, "last_loss": loss}))


if __name__ == "__main__":
    main()
