"""The peers' models in PyTorch (see run_peer.py for what every peer trains): FashionNet
written here, the MLP, ResNet-20 and the small ViT imported from their twins in tools/
(tools/mlp_torch.py, tools/resnet_torch.py, tools/vit_torch.py), the very modules the converter
and bench/models_accuracy.py use.

Variants (run_peer.py --variant): "" is the best configuration measured on the 2-core
machines (bench/results/cpu_peers.md): eager mode, NCHW. "channels_last" keeps the
activations NHWC for oneDNN; "compile" wraps the model in torch.compile (inductor's C++
kernels, compiled during the warm-up steps). Any of them with "+bf16" runs the forward
pass under torch.autocast("cpu", torch.bfloat16) (oneDNN's BF16 kernels where the CPU
has avx512_bf16).
"""
import os
import sys

import torch
import torch.nn as nn

VARIANTS = ("", "channels_last", "compile")
TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools")


def fashion_net():
    # PyTorch's batch-norm momentum is the weight of the new value: TensorFlow's decay
    # 0.99 is 0.01 here. No conv bias before batch norm, as in towerlab.
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32, eps=1e-3, momentum=0.01),
        nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64, eps=1e-3, momentum=0.01),
        nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def make_model(model):
    if model == "fashion_net":
        return fashion_net()
    sys.path.insert(0, TOOLS)
    if model == "mlp":
        from mlp_torch import Mlp
        return Mlp()
    if model == "resnet":
        from resnet_torch import ResNet
        return ResNet()
    from vit_torch import ViT
    return ViT()


class Peer:
    def __init__(self, threads, seed, variant, model="fashion_net"):
        base, bf16, rest = variant.partition("+bf16")
        if base not in VARIANTS or rest:
            raise ValueError(f"torch variant {variant!r}; expected one of {VARIANTS}, optionally +bf16")
        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.bf16 = bool(bf16)
        self.format = torch.channels_last if base == "channels_last" else torch.contiguous_format
        self.model = make_model(model).to(memory_format=self.format)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
        self.forward = torch.compile(self.model) if base == "compile" else self.model
        self.loss_fn = nn.CrossEntropyLoss()
        self.version = torch.__version__
        self.config = (f"{base or 'eager NCHW'}{', bf16 autocast' if self.bf16 else ''}, {threads} threads, MKL {torch.backends.mkl.is_available()}, "
                       f"oneDNN {torch.backends.mkldnn.is_available()}, CPU capability "
                       f"{torch.backends.cpu.get_cpu_capability()}")

    def _input(self, images):
        # [N,28,28,1] is NCHW's memory with one channel: a view, no copy.
        x = torch.from_numpy(images).view(-1, 1, 28, 28)
        return x.contiguous(memory_format=self.format)

    def step(self, images, labels):
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16, enabled=self.bf16):
            logits = self.forward(self._input(images))
        loss = self.loss_fn(logits.float(), torch.from_numpy(labels).long())
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


def build(threads, seed, variant, model="fashion_net"):
    return Peer(threads, seed, variant, model)
