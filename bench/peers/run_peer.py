#!/usr/bin/env python3
"""Trains a model (FashionNet by default; --model mlp, resnet or vit) with one peer framework
for a fixed number of steps and prints one line of JSON: images/s and CPU seconds (all threads) over the timed steps, the losses,
the framework's version and configuration. bench/compare_peers.py runs it in the peers' virtual environment,
alternating with towerlab's fashion_mnist sample.

Every peer trains the model of towerlab's models::fashion_net() (models/fashion_net.cpp): conv
3x3 1->32 (no bias) + batch norm + ReLU + max pool 2, conv 3x3 32->64 (no bias) + batch
norm + ReLU + max pool 2, linear 3136->128 + ReLU, linear 128->10; batch norm with
epsilon 1e-3 and TensorFlow's moving-average decay 0.99; softmax cross-entropy; Adam
(lr 1e-3, betas 0.9 and 0.999, epsilon 1e-8); the standardized Fashion-MNIST images,
shuffled and taken batch by batch like towerlab's Batcher. Each framework's file
(torch_net.py, tf_net.py, jax_net.py) builds it and returns a step function that
trains on one batch and returns the loss as a Python float, so each timed step ends
with its work done, as towerlab's Trainer::step does.

--model mlp, --model resnet and --model vit train the twins of towerlab's models::mlp(),
models::resnet() and models::vit() (tools/mlp_torch.py, tools/resnet_torch.py and
tools/vit_torch.py: MLP 784-512-256-10 with dropout 0.2; ResNet-20 with batch norm over
the whole batch, which is what towerlab's synchronized batch norm computes on its towers;
the small ViT, patches of 4, width 64, 4 heads, 4 blocks, dropout 0.1) with the same data,
loss and Adam. JAX has FashionNet and the MLP only.

  run_peer.py torch|tensorflow|jax [--model fashion_net|mlp|resnet|vit] [--steps 120] [--warmup 10] [--batch 128] [--threads 2]
  run_peer.py torch --epochs 5   # whole epochs, cosine rate, test accuracy per epoch
"""
import argparse
import gzip
import importlib
import json
import math
import os
import sys
import time

import numpy as np

# towerlab's kFashionMnistMean and kFashionMnistStd (engine/dataset.h).
MEAN, STD = 0.2860, 0.3530
FRAMEWORKS = {"torch": "torch_net", "tensorflow": "tf_net", "jax": "jax_net"}


def load(data_dir, prefix):
    """Images as float32 [N,28,28,1] (NHWC; with one channel also NCHW's bytes), labels int32."""
    with gzip.open(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28, 1)
    with gzip.open(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return (images.astype(np.float32) / 255.0 - MEAN) / STD, labels.astype(np.int32)


def batches(n, batch, seed):
    """Index arrays of full batches, a new shuffle each epoch (as towerlab's Batcher)."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(n)
        for b in range(0, n - batch + 1, batch):
            yield order[b:b + batch]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("framework", choices=sorted(FRAMEWORKS))
    p.add_argument("--model", choices=["fashion_net", "mlp", "resnet", "vit"], default="fashion_net")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=120, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before them")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--variant", default="",
                   help="a framework's configuration other than its best (see its file)")
    p.add_argument("--epochs", type=int, default=0,
                   help="train whole epochs instead (cosine rate 1e-3 to 0 per step, as the sample's "
                        "--schedule cosine) and print the test accuracy after each")
    args = p.parse_args()
    for name, value in (("batch", args.batch), ("steps", args.steps), ("threads", args.threads)):
        if value <= 0:
            p.error(f"--{name} is {value}; it must be positive")
    if args.warmup < 0 or args.epochs < 0:
        p.error("--warmup and --epochs must be 0 or more")

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    net = importlib.import_module(FRAMEWORKS[args.framework])
    peer = net.build(threads=args.threads, seed=args.seed, variant=args.variant, model=args.model)
    images, labels = load(args.data, "train")
    order = batches(len(labels), args.batch, args.seed)

    if args.epochs > 0:
        test_images, test_labels = load(args.data, "t10k")
        per_epoch = len(labels) // args.batch
        total, step, start = per_epoch * args.epochs, 0, time.perf_counter()
        for epoch in range(args.epochs):
            for _ in range(per_epoch):
                peer.set_lr(1e-3 * 0.5 * (1.0 + math.cos(math.pi * step / total)))
                idx = next(order)
                peer.step(images[idx], labels[idx])
                step += 1
            correct = sum(int((peer.predict(test_images[b:b + 1000]).argmax(1) ==
                               test_labels[b:b + 1000]).sum()) for b in range(0, len(test_labels), 1000))
            print(json.dumps({"epoch": epoch + 1, "test_accuracy": correct / len(test_labels),
                              "seconds": time.perf_counter() - start}), flush=True)
        return

    losses = []
    for _ in range(args.warmup):
        idx = next(order)
        losses.append(peer.step(images[idx], labels[idx]))
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        idx = next(order)
        losses.append(peer.step(images[idx], labels[idx]))
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    print(json.dumps({"framework": args.framework, "version": peer.version, "config": peer.config,
                      "threads": args.threads, "batch": args.batch, "warmup": args.warmup,
                      "steps": args.steps, "seconds": seconds, "cpu_seconds": cpu_seconds,
                      "images_per_second": args.steps * args.batch / seconds,
                      "losses": [round(float(x), 5) for x in losses]}))


if __name__ == "__main__":
    main()
