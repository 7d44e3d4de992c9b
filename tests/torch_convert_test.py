#!/usr/bin/env python3
"""FashionNet crosses between PyTorch and towerlab and predicts the same on the real
Fashion-MNIST test set, both ways, through tools/torch_convert.py.

  torch_convert_test.py FASHION_MNIST_BINARY DATA_DIR WORK_DIR

1. PyTorch trains FashionNet with convolution biases (which the converter folds into
   batch norm) for a few dozen steps; the converted checkpoint, evaluated by the
   fashion_mnist sample (--eval-only --predictions), gives the same logits.
2. The sample trains a few dozen steps; its checkpoint converted to a state_dict
   loads strictly into tools/fashion_net_torch.py's FashionNet and gives the same logits.
3. Controls: the same weights with PyTorch's default eps (1e-5) differ by more than
   the tolerance (so the comparison can fail), and --fold-eps makes them agree.
4. Plain weights load into the sample, partially when asked; bad input exits 2 with one line.

Tolerance: the two frameworks sum in different orders in float32. The longest sum
is fc1's 3136 products, whose round-off is typically sqrt(3136) * 2^-24 = 3e-6 of
the sum of the products' magnitudes (n * 2^-24 = 2e-4 at worst, never reached by
random-signed errors). The tolerance is 1e-5 of the largest |logit|: the observed
differences are 30 to 50 times smaller (about 4e-6 on logits up to 17), and a wrong
conversion is far larger (the eps control below moves logits by 0.1, hundreds of
times the tolerance). Argmax must agree on every image whose two best logits are
further apart than the tolerance (the others are reported; a difference within the
tolerance may legitimately flip them).

Exits 77 (ctest's skip) when PyTorch is not installed (Debian: python3-torch).
"""

import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
CONVERT = [sys.executable, os.path.join(REPO, "tools", "torch_convert.py")]

try:
    import torch
except ImportError:
    print("SKIP: PyTorch is not installed (Debian: python3-torch)")
    sys.exit(77)

import torch_convert  # noqa: E402  (after the path and the skip)
from fashion_mnist_data import load_split  # noqa: E402
from fashion_net_torch import FashionNet  # noqa: E402

RELATIVE_TOLERANCE = 1e-5
STEPS = 40
BATCH = 64
failures = []


def check(condition, message):
    print(("ok   " if condition else "FAIL ") + message)
    if not condition:
        failures.append(message)


def torch_logits(model, images):
    model.eval()
    with torch.no_grad():
        return np.concatenate([model(torch.from_numpy(images[i:i + 1000])).numpy()
                               for i in range(0, len(images), 1000)])


def run(command, expect=0):
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True)
    if result.returncode != expect:
        sys.exit(f"FAIL {' '.join(map(str, command))}\nexited {result.returncode}, expected "
                 f"{expect}\n{result.stdout}{result.stderr}")
    return result


def sample_logits(binary, data, checkpoint, predictions):
    out = run([binary, "--data", data, "--load", checkpoint, "--eval-only",
               "--predictions", predictions]).stdout
    tensors, _ = torch_convert.read_safetensors(predictions)
    return tensors["logits"], out


def compare(what, reference, got, labels):
    """Checks `got` against `reference` logits; returns the largest difference."""
    tolerance = RELATIVE_TOLERANCE * float(np.abs(reference).max())
    difference = float(np.abs(reference - got).max())
    top2 = np.sort(reference, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > tolerance
    agree = reference.argmax(1) == got.argmax(1)
    accuracy = float((reference.argmax(1) == labels).mean())
    print(f"     {what}: max |difference| {difference:.3g} (tolerance {tolerance:.3g}), argmax "
          f"agrees on {int(agree.sum())}/{len(agree)}, {int((~clear).sum())} near-ties, "
          f"accuracy {accuracy:.4f}")
    check(difference <= tolerance, f"{what}: logits within the tolerance")
    check(bool(agree[clear].all()), f"{what}: same argmax on every image that is not a near-tie")
    check(accuracy > 0.5, f"{what}: the model learned something (accuracy {accuracy:.4f})")
    return difference, tolerance


def expect_refusal(what, command, fragment, quiet=True):
    """Exit 2, one line on stderr and (when `quiet`) nothing on stdout."""
    result = run(command, expect=2)
    lines = result.stderr.splitlines()
    check(len(lines) == 1 and fragment in lines[0] and not (quiet and result.stdout),
          f"{what}: exit 2 with one line containing '{fragment}' (got {result.stderr.strip()!r})")


def pytorch_to_towerlab(binary, data, work, train, test):
    torch.manual_seed(0)
    model = FashionNet(conv_bias=True)
    # Faster moving statistics than FashionNet's 0.01, so that a few dozen steps give
    # moving statistics worth predicting with; the converter does not carry momentum.
    model.bn1.momentum = model.bn2.momentum = 0.1
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
    check(float(model.conv1.bias.abs().max()) > 1e-3, "the PyTorch conv biases are not zero")
    state = model.state_dict()
    pt = os.path.join(work, "torch.pt")
    torch.save(state, pt)
    st = os.path.join(work, "torch.safetensors")
    torch_convert.write_safetensors(
        st, {k: v.numpy() for k, v in state.items()}, {"format": "pt"})

    ours = os.path.join(work, "from_torch.safetensors")
    out = run(CONVERT + ["to-towerlab", pt, ours]).stdout
    check("folded conv1.bias into bn1/moving_mean" in out, f"the converter says so: {out.strip()}")
    also = os.path.join(work, "from_torch_st.safetensors")
    run(CONVERT + ["to-towerlab", st, also])
    with open(ours, "rb") as a, open(also, "rb") as b:
        check(a.read() == b.read(), "a .pt and a .safetensors state_dict convert to the same bytes")
    _, metadata = torch_convert.read_safetensors(ours)
    check(metadata.get("step") == str(STEPS), f"step = num_batches_tracked = {STEPS}")

    test_images, test_labels = test
    reference = torch_logits(model, test_images)
    got, _ = sample_logits(binary, data, ours, os.path.join(work, "pred_from_torch.safetensors"))
    difference, tolerance = compare("PyTorch -> towerlab", reference, got, test_labels)

    # Control: PyTorch's default eps gives other logits, beyond the tolerance...
    for bn in (model.bn1, model.bn2):
        bn.eps = 1e-5
    other = torch_logits(model, test_images)
    moved = float(np.abs(other - got).max())
    check(moved > 10 * tolerance,
          f"control: eps 1e-5 moves the logits by {moved:.3g}, beyond 10x the tolerance")
    # ... which the converter refuses, and folds into gamma when asked.
    expect_refusal("eps 1e-5", CONVERT + ["to-towerlab", pt, also, "--bn-eps", "1e-5"],
                   "batch norm eps 1e-05 is not towerlab's 0.001")
    torch.save(model.state_dict(), pt)
    run(CONVERT + ["to-towerlab", pt, also, "--bn-eps", "1e-5", "--fold-eps"])
    folded, _ = sample_logits(binary, data, also, os.path.join(work, "pred_folded.safetensors"))
    compare("PyTorch eps 1e-5 -> towerlab --fold-eps", other, folded, test_labels)
    return difference


def towerlab_to_pytorch(binary, data, work, test):
    ours = os.path.join(work, "towerlab.safetensors")
    predictions = os.path.join(work, "pred_towerlab.safetensors")
    run([binary, "--data", data, "--epochs", "1", "--steps", str(STEPS),
         "--batch", str(BATCH), "--progress-every", "0", "--save", ours,
         "--predictions", predictions])
    got, _ = torch_convert.read_safetensors(predictions)

    pt = os.path.join(work, "to_torch.pt")
    out = run(CONVERT + ["to-torch", ours, pt]).stdout
    check("dropped the adam state" in out, f"the converter says so: {out.strip()}")
    model = FashionNet()
    model.load_state_dict(torch.load(pt), strict=True)  # every name, shape and dtype
    check(int(model.bn2.num_batches_tracked) == STEPS, f"num_batches_tracked = step {STEPS}")
    test_images, test_labels = test
    difference, _ = compare("towerlab -> PyTorch", got["logits"], torch_logits(model, test_images),
                            test_labels)

    # Back again through safetensors: the same weights, bit for bit.
    st = os.path.join(work, "to_torch.safetensors")
    run(CONVERT + ["to-torch", ours, st])
    back = os.path.join(work, "back.safetensors")
    run(CONVERT + ["to-towerlab", st, back])
    first, _ = torch_convert.read_safetensors(ours)
    second, _ = torch_convert.read_safetensors(back)
    check(all(np.array_equal(first[n], second[n]) for n in second) and
          set(second) == {n for n in first if not n.startswith("optimizer/")},
          "towerlab -> PyTorch -> towerlab keeps every weight bit for bit")
    return difference, ours


def plain_weights(binary, data, work, checkpoint):
    """The checkpoint's weights without its metadata and optimizer state, one
    variable short and one entry too many: refused, then loaded with --load-partial."""
    tensors, _ = torch_convert.read_safetensors(checkpoint)
    weights = {n: t for n, t in tensors.items() if not n.startswith("optimizer/")}
    del weights["fc2/bias"]
    weights["head/weight"] = np.zeros(3, dtype=np.float32)
    partial = os.path.join(work, "partial.safetensors")
    torch_convert.write_safetensors(partial, weights, {})
    command = [binary, "--data", data, "--load", partial, "--eval-only"]
    expect_refusal("a partial file without --load-partial", command,
                   "missing fc2/bias [10]; unexpected head/weight (the file has no towerlab "
                   "format metadata, so it was read as plain weights", quiet=False)
    out = run(command + ["--load-partial"]).stdout
    check("loaded plain weights " + partial + " (no step, no optimizer state); not in the file, "
          "kept: fc2/bias; unused in the file: head/weight" in out,
          "--load-partial loads plain weights and reports what is kept and what is unused")


def bad_input(work):
    state = FashionNet().state_dict()
    wide = dict(state)
    wide["fc1.weight"] = torch.zeros(128, 3137)
    torch.save(wide, os.path.join(work, "wide.pt"))
    extra = dict(state)
    extra["fc3.weight"] = torch.zeros(2)
    torch.save(extra, os.path.join(work, "extra.pt"))
    torch.save([1, 2], os.path.join(work, "list.pt"))
    torch.save(state, os.path.join(work, "good.pt"))
    with open(os.path.join(work, "junk.safetensors"), "wb") as f:
        f.write(b"\xff" * 64)
    out = os.path.join(work, "out.safetensors")
    for what, args, fragment in [
        ("a missing file", ["to-towerlab", os.path.join(work, "absent.pt"), out],
         "No such file or directory"),
        ("a wrong shape", ["to-towerlab", os.path.join(work, "wide.pt"), out],
         "fc1.weight has shape [128,3137], FashionNet's is [128,3136]"),
        ("an unknown entry", ["to-towerlab", os.path.join(work, "extra.pt"), out],
         "not a PyTorch state_dict of FashionNet: unknown fc3.weight"),
        ("not a state_dict", ["to-towerlab", os.path.join(work, "list.pt"), out],
         "holds a list, not a state_dict"),
        ("not safetensors", ["to-torch", os.path.join(work, "junk.safetensors"), out],
         "runs past the end of the file"),
        ("a bad flag", ["to-towerlab", "a.pt", out, "--bn-eps", "x"], "invalid float value"),
        ("an output in no directory",
         ["to-towerlab", os.path.join(work, "good.pt"), os.path.join(work, "none", "x.safetensors")],
         "cannot write it (No such file or directory)"),
    ]:
        expect_refusal(what, CONVERT + args, fragment)
    check(not os.path.exists(out), "refused conversions write nothing")


def main():
    binary, data, work = sys.argv[1:4]
    torch.set_num_threads(os.cpu_count() or 1)
    os.makedirs(work, exist_ok=True)
    train, test = load_split(data, "train"), load_split(data, "t10k")
    pytorch_to_towerlab(binary, data, work, train, test)
    _, checkpoint = towerlab_to_pytorch(binary, data, work, test)
    plain_weights(binary, data, work, checkpoint)
    bad_input(work)
    print(f"{len(failures)} failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
