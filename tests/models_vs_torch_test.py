#!/usr/bin/env python3
"""The first 20 training steps of the MLP, ResNet-20 and the ViT (models/) against PyTorch from
the same initial weights on the same batches. The test binary's
ModelsVsTorch.WritesSteps trains each model on two CPU towers (synchronized batch
norm, SGD with momentum 0.9, lr 0.01; the MLP and the ViT without dropout, whose masks
PyTorch draws otherwise) and writes the initial variables, the batches, its losses and its
final variables; this script loads the initial variables into the PyTorch twin
(tools/mlp_torch.py, tools/resnet_torch.py, tools/vit_torch.py) through tools/torch_convert.py's name
table, takes the same 20 steps with torch.optim.SGD in float64 and float32, and
compares towerlab's losses (1e-5 relative) on the steps where PyTorch's float32 run
still matches its float64 run, at least 3; where all 20 do, the final weights too
(compare() says why). A control takes PyTorch's steps at lr 0.0101 (1 % more) and
must miss. Exits 77 (ctest's skip) without PyTorch.

usage: models_vs_torch_test.py path/to/towerlab_tests"""

import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
import torch_convert  # noqa: E402  (after the path)

try:
    import torch
except ImportError:
    print("models_vs_torch: no PyTorch in this Python; skipped")
    sys.exit(77)

from mlp_torch import Mlp  # noqa: E402
from resnet_torch import ResNet  # noqa: E402
from vit_torch import ViT  # noqa: E402

STEPS = 20
LR, MOMENTUM = 0.01, 0.9
# A loss matches when within 1e-5 of itself (plus 1e-7 for losses near 0).
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-7
WEIGHT_ATOL, WEIGHT_RTOL = 1e-5, 1e-4
# The prefix of steps that must match: at least this many (ResNet-20's float32 steps
# leave the float64 ones after 4 to 5 steps, PyTorch's as towerlab's).
MIN_STEPS = 3
MODELS = {"mlp": (lambda: Mlp(dropout=0.0), torch_convert.mlp()),
          "resnet": (ResNet, torch_convert.resnet()),
          "vit": (lambda: ViT(dropout=0.0), torch_convert.vit())}


def torch_steps(name, tensors, lr, dtype=torch.float32, steps=STEPS):
    """PyTorch's losses and final state_dict after `steps` steps from towerlab's
    initial variables."""
    make, table = MODELS[name]
    initial = {n[len("initial/"):]: t for n, t in tensors.items() if n.startswith("initial/")}
    state, _ = torch_convert.to_torch(name, initial, {"step": "0"}, table)
    model = make().to(dtype)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()},
                          strict=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    model.train()
    losses = []
    for s in range(steps):
        images = torch.from_numpy(np.array(tensors[f"batch{s}/images"])).to(dtype)
        labels = torch.from_numpy(np.array(tensors[f"batch{s}/labels"])).long()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return np.array(losses), model.state_dict()


def matches(a, b):
    return np.abs(a - b) <= LOSS_ATOL + LOSS_RTOL * np.abs(b)


def weights_close(name, tensors, state):
    _, table = MODELS[name]
    close = True
    for t, tl, _ in torch_convert.name_table(table):
        if t.endswith(("running_mean", "running_var")):
            continue  # moving statistics: towerlab's momentum convention, not the steps
        theirs = state[t].double().numpy()
        close &= bool(np.all(np.abs(tensors[f"final/{tl}"] - theirs) <=
                             WEIGHT_ATOL + WEIGHT_RTOL * np.abs(theirs)))
    return close


def compare(name, tensors):
    """Towerlab's losses against PyTorch's in float64 on the steps where PyTorch's own
    float32 run still matches its float64 run: past them, float rounding has grown
    beyond the tolerance in any float32 framework (training a ResNet amplifies it step
    by step), and the steps can only be reported."""
    ours = tensors["losses"]
    theirs32, _ = torch_steps(name, tensors, LR)
    theirs, state = torch_steps(name, tensors, LR, torch.float64)
    stable = matches(theirs32, theirs)
    prefix = STEPS if stable.all() else int(np.argmin(stable))
    ok = prefix >= MIN_STEPS and bool(matches(ours, theirs)[:prefix].all())
    if prefix == STEPS:
        ok &= weights_close(name, tensors, state)
    relative = np.abs(ours - theirs) / np.abs(theirs)
    relative32 = np.abs(theirs32 - theirs) / np.abs(theirs)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: losses {ours[0]:.4f} .. {ours[-1]:.4g}; the first "
          f"{prefix} steps match PyTorch float64 (largest relative difference "
          f"{relative[:prefix].max():.2g}; PyTorch float32 {relative32[:prefix].max():.2g})"
          f"{', and the final weights' if prefix == STEPS else ''}")
    if prefix < STEPS:
        print(f"     steps {prefix + 1}-{STEPS}: towerlab {relative[prefix:].max():.2g}, PyTorch "
              f"float32 {relative32[prefix:].max():.2g} relative to PyTorch float64")
    # The control needs only the steps the comparison used.
    checked = max(prefix, 1)
    control, _ = torch_steps(name, tensors, LR * 1.01, torch.float64, checked)
    caught = not matches(ours[:checked], control).all()
    print(f"{'ok  ' if caught else 'FAIL'} {name} control: PyTorch at lr 1% higher misses "
          f"towerlab's steps")
    return ok and caught


def main():
    binary = sys.argv[1]
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as directory:
        # im2col: Winograd, the CPU's default for the 3x3 convolutions, rounds its
        # transforms otherwise (kernels/cpu/winograd.h), and the ResNet's steps amplify
        # the difference past the tolerance within a few steps.
        env = dict(os.environ, TOWERLAB_MODELS_VS_TORCH_DIR=directory,
                   TOWERLAB_CONV2D_ALGORITHM="im2col")
        subprocess.run([binary, "--gtest_filter=ModelsVsTorch.*"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        results = [compare(name, torch_convert.read_safetensors(
            os.path.join(directory, f"{name}.safetensors"))[0]) for name in MODELS]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
