"""FashionNet in PyTorch (see run_peer.py for the model every peer trains).

Variants (run_peer.py --variant): "" is the best configuration measured on the 2-core
machines (bench/results/cpu_peers.md): eager mode, NCHW. "channels_last" keeps the
activations NHWC for oneDNN; "compile" wraps the model in torch.compile (inductor's C++
kernels, compiled during the warm-up steps).
"""
import numpy as np
import torch
import torch.nn as nn

VARIANTS = ("", "channels_last", "compile")


def fashion_net():
    # PyTorch's batch-norm momentum is the weight of the new value: TensorFlow's decay
    # 0.99 is 0.01 here. No conv bias before batch norm, as in towerlab.
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32, eps=1e-3, momentum=0.01),
        nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64, eps=1e-3, momentum=0.01),
        nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


class Peer:
    def __init__(self, threads, seed, variant):
        if variant not in VARIANTS:
            raise ValueError(f"torch variant {variant!r}; expected one of {VARIANTS}")
        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.format = torch.channels_last if variant == "channels_last" else torch.contiguous_format
        self.model = fashion_net().to(memory_format=self.format)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
        self.forward = torch.compile(self.model) if variant == "compile" else self.model
        self.loss_fn = nn.CrossEntropyLoss()
        self.version = torch.__version__
        self.config = (f"{variant or 'eager NCHW'}, {threads} threads, MKL {torch.backends.mkl.is_available()}, "
                       f"oneDNN {torch.backends.mkldnn.is_available()}, CPU capability "
                       f"{torch.backends.cpu.get_cpu_capability()}")

    def _input(self, images):
        # [N,28,28,1] is NCHW's memory with one channel: a view, no copy.
        x = torch.from_numpy(images).view(-1, 1, 28, 28)
        return x.contiguous(memory_format=self.format)

    def step(self, images, labels):
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.forward(self._input(images)), torch.from_numpy(labels).long())
        loss.backward()
        self.opt.step()
        return loss.item()

    def predict(self, images):
        self.model.eval()
        with torch.no_grad():
            return self.model(self._input(images)).numpy()

    def set_lr(self, lr):
        for group in self.opt.param_groups:
            group["lr"] = lr


def build(threads, seed, variant):
    return Peer(threads, seed, variant)
