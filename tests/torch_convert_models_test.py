#!/usr/bin/env python3
"""The MLP, ResNet-20 and the ViT of models/ cross between PyTorch and towerlab and predict the
same on the first images of the Fashion-MNIST test set, both ways, through
tools/torch_convert.py --model (tests/torch_convert_test.py does FashionNet, and its
helpers and tolerance serve here).

  torch_convert_models_test.py FASHION_MNIST_BINARY DATA_DIR WORK_DIR

For each model:
1. PyTorch trains its twin (tools/mlp_torch.py, tools/resnet_torch.py,
   tools/vit_torch.py) a few steps,
   the ResNet with convolution biases (folded into batch norm by the converter) and
   faster moving statistics; the converted checkpoint, evaluated by the sample
   (--model --eval-only --predictions), gives PyTorch's logits.
2. The sample trains a few steps; its checkpoint converted to a state_dict loads
   strictly into the twin and gives the sample's logits; converted back, every
   weight is the same bits.
3. Controls: the other model's names are refused, naming what is missing.

Exits 77 (ctest's skip) when PyTorch is not installed (Debian: python3-torch).
"""

import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
sys.path.insert(0, os.path.join(REPO, "tests"))

try:
    import torch
except ImportError:
    print("SKIP: PyTorch is not installed (Debian: python3-torch)")
    sys.exit(77)

import torch_convert  # noqa: E402  (after the path and the skip)
import torch_convert_test as base  # noqa: E402  (check, run, the data, the tolerance)
from mlp_torch import Mlp  # noqa: E402
from resnet_torch import ResNet  # noqa: E402
from vit_torch import ViT  # noqa: E402

STEPS = 20
BATCH = 64
TEST_IMAGES = 1000
CONVERT = base.CONVERT


def with_conv_biases(model):
    """The ResNet's convolutions with PyTorch's usual bias, which towerlab has not."""
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.bias = torch.nn.Parameter(torch.randn(module.out_channels) * 0.1)
    return model


def train_torch(model, train):
    for module in model.modules():  # moving statistics worth predicting with (see base)
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum = 0.1
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    images, labels = train
    order = np.random.default_rng(0).permutation(len(labels))
    model.train()
    for step in range(STEPS):
        batch = order[step * BATCH:(step + 1) * BATCH]
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(images[batch])),
                                                 torch.from_numpy(labels[batch]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def compare(what, reference, got, labels):
    """tests/torch_convert_test.py's comparison, less its accuracy check: after 20
    steps the ResNet's moving statistics (momentum 0.99) are still far from the data's,
    so its predictions are poor, but they must not be constant (a comparison of
    constant logits could not fail)."""
    tolerance = base.RELATIVE_TOLERANCE * float(np.abs(reference).max())
    difference = float(np.abs(reference - got).max())
    top2 = np.sort(reference, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > tolerance
    agree = reference.argmax(1) == got.argmax(1)
    spread = float(reference.std(axis=0).max())
    print(f"     {what}: max |difference| {difference:.3g} (tolerance {tolerance:.3g}), argmax "
          f"agrees on {int(agree.sum())}/{len(agree)}, {int((~clear).sum())} near-ties, "
          f"accuracy {float((reference.argmax(1) == labels).mean()):.4f}")
    base.check(difference <= tolerance, f"{what}: logits within the tolerance")
    base.check(bool(agree[clear].all()), f"{what}: same argmax on every image that is not a "
               "near-tie")
    base.check(spread > 100 * tolerance, f"{what}: the logits vary over the images ({spread:.3g})")


def sample_logits(binary, data, name, checkpoint, predictions):
    base.run([binary, "--model", name, "--data", data, "--load", checkpoint, "--eval-only",
              "--test-samples", TEST_IMAGES, "--predictions", predictions])
    tensors, _ = torch_convert.read_safetensors(predictions)
    return tensors["logits"]


def pytorch_to_towerlab(binary, data, work, name, model, train, test):
    model = train_torch(model, train)
    pt = os.path.join(work, f"{name}_torch.pt")
    torch.save(model.state_dict(), pt)
    ours = os.path.join(work, f"{name}_from_torch.safetensors")
    out = base.run(CONVERT + ["to-towerlab", "--model", name, pt, ours]).stdout
    print(f"     {out.strip()}")
    got = sample_logits(binary, data, name, ours, os.path.join(work, f"{name}_pred.safetensors"))
    images, labels = test
    compare(f"{name}: PyTorch -> towerlab", base.torch_logits(model, images), got, labels)


def towerlab_to_pytorch(binary, data, work, name, twin, test):
    ours = os.path.join(work, f"{name}.safetensors")
    predictions = os.path.join(work, f"{name}_pred_towerlab.safetensors")
    base.run([binary, "--model", name, "--data", data, "--epochs", "1", "--steps", STEPS,
              "--batch", BATCH, "--progress-every", "0", "--test-samples", TEST_IMAGES,
              "--save", ours, "--predictions", predictions])
    got, _ = torch_convert.read_safetensors(predictions)
    pt = os.path.join(work, f"{name}_to_torch.pt")
    base.run(CONVERT + ["to-torch", "--model", name, ours, pt])
    twin.load_state_dict(torch.load(pt), strict=True)  # every name, shape and dtype
    images, labels = test
    compare(f"{name}: towerlab -> PyTorch", got["logits"], base.torch_logits(twin, images),
                 labels)
    st = os.path.join(work, f"{name}_to_torch.safetensors")
    back = os.path.join(work, f"{name}_back.safetensors")
    base.run(CONVERT + ["to-torch", "--model", name, ours, st])
    base.run(CONVERT + ["to-towerlab", "--model", name, st, back])
    first, _ = torch_convert.read_safetensors(ours)
    second, _ = torch_convert.read_safetensors(back)
    base.check(all(np.array_equal(first[n], second[n]) for n in second) and
               set(second) == {n for n in first if not n.startswith("optimizer/")},
               f"{name}: towerlab -> PyTorch -> towerlab keeps every weight bit for bit")
    return pt


def main():
    binary, data, work = sys.argv[1:4]
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    os.makedirs(work, exist_ok=True)
    train = base.load_split(data, "train")
    images, labels = base.load_split(data, "t10k")
    test = images[:TEST_IMAGES], labels[:TEST_IMAGES]
    pytorch_to_towerlab(binary, data, work, "mlp", Mlp(), train, test)
    pytorch_to_towerlab(binary, data, work, "resnet", with_conv_biases(ResNet()), train, test)
    pytorch_to_towerlab(binary, data, work, "vit", ViT(), train, test)
    mlp_pt = towerlab_to_pytorch(binary, data, work, "mlp", Mlp(), test)
    resnet_pt = towerlab_to_pytorch(binary, data, work, "resnet", ResNet(), test)
    vit_pt = towerlab_to_pytorch(binary, data, work, "vit", ViT(), test)
    out = os.path.join(work, "wrong.safetensors")
    base.expect_refusal("an MLP as a ResNet", CONVERT + ["to-towerlab", "--model", "resnet",
                                                         mlp_pt, out],
                        "not a PyTorch state_dict of ResNet-20: missing stem.conv.weight")
    base.expect_refusal("a ResNet as an MLP", CONVERT + ["to-towerlab", "--model", "mlp",
                                                         resnet_pt, out],
                        "not a PyTorch state_dict of MLP: missing fc1.weight")
    base.expect_refusal("a ViT as a ResNet", CONVERT + ["to-towerlab", "--model", "resnet",
                                                        vit_pt, out],
                        "not a PyTorch state_dict of ResNet-20: missing stem.conv.weight")
    base.expect_refusal("a model the converter does not know",
                        CONVERT + ["to-torch", "--model", "vgg", out, out], "invalid choice: 'vgg'")
    print(f"{len(base.failures)} failed" if base.failures else "all checks passed")
    return 1 if base.failures else 0


if __name__ == "__main__":
    sys.exit(main())
