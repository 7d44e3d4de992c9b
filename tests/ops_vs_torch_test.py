#!/usr/bin/env python3
"""Op families, forward and backward, against PyTorch on the same inputs. The test
binary's <Op>VsTorch.WritesCases cases (tests/ops_vs_torch.h) write towerlab's inputs
and results into a scratch directory, one <family>.safetensors each; this script
computes PyTorch's in float64 from those inputs and compares: float64 results within
about 1e-10 relative, float32 within the tolerances each family's header states, and
the bf16 policy's matmul, conv2d and batch norm against PyTorch's own bfloat16 ops
(check_bf16: bounds per element, with a control). A
file with no check here fails the test, so that no family goes unchecked. Exits 77
(ctest's skip) without PyTorch, non-zero on the first mismatch.

A family adds its tolerances to TOLERANCE and a check_<family>(tensors) to CHECKS.

usage: ops_vs_torch_test.py path/to/towerlab_tests"""

import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
import torch_convert  # noqa: E402  (after the path: its numpy safetensors reader)

try:
    import torch
except ImportError:
    print("ops_vs_torch: no PyTorch in this Python; skipped")
    sys.exit(77)

# (atol, rtol) by dtype; float32 is the tolerance each header states for its backends
# against the reference. (Layer norm's row around 100 stays within it; a row around 1e4
# would not in float32: the saved float32 mean's rounding reaches grad_x and
# grad_weight, as kernels/layer_norm.h says, where PyTorch here has float64 statistics.)
# Permute, concat, split and slice move values (exact); batched matmul's atol is a
# coefficient, 2 u, of kernels/matmul.h's bound 2 (K + 2) u S (S the product of |a| and
# |b|, u the unit roundoff), which compare's `scale` supplies element by element.
TOLERANCE = {
    "softmax": {"float64": (1e-12, 1e-10), "float32": (1e-6, 1e-5)},
    "layer_norm": {"float64": (1e-11, 1e-10), "float32": (1e-5, 1e-4)},
    "embedding": {"float64": (1e-12, 1e-10), "float32": (1e-6, 1e-5)},
    "broadcast": {"float64": (1e-12, 1e-10), "float32": (1e-6, 1e-5)},
    "permute": {"float64": (0.0, 0.0), "float32": (0.0, 0.0)},
    "slice_copy": {"float64": (0.0, 0.0), "float32": (0.0, 0.0)},
    "batched_matmul": {"float64": (2.0**-52, 0.0), "float32": (2.0**-23, 0.0)},
    # The bf16 family passes each element's bound as compare's scale (check_bf16).
    "bf16": {"float32": (1.0, 0.0)},
    "conv2d_grouped": {"float64": (1e-12, 1e-10), "float32": (1e-4, 1e-5)},
    "label_smoothing": {"float64": (1e-12, 1e-10), "float32": (1e-6, 1e-5)},
}


def run_cases(binary, directory):
    env = dict(os.environ, TOWERLAB_OPS_VS_TORCH_DIR=directory)
    subprocess.run([binary, "--gtest_filter=*VsTorch.WritesCases"], env=env,
                   check=True, stdout=subprocess.DEVNULL)


def prefixes(tensors):
    return sorted({name.split("/")[0] for name in tensors})


def compare(family, what, actual, expected, dtype, scale=1.0):
    """Within atol * scale + rtol |torch| (scale: a number or an array of the shape)."""
    atol, rtol = TOLERANCE[family][dtype]
    actual = np.asarray(actual, dtype=np.float64)
    expected = expected.detach().double().numpy().reshape(actual.shape)
    atol = atol * np.broadcast_to(np.asarray(scale, dtype=np.float64), actual.shape)
    same_nonfinite = np.array_equal(np.isfinite(actual), np.isfinite(expected)) and np.array_equal(
        actual[~np.isfinite(actual)], expected[~np.isfinite(expected)])
    finite = np.isfinite(expected)
    close = np.all(np.abs(actual[finite] - expected[finite]) <=
                   atol[finite] + rtol * np.abs(expected[finite]))
    if not (same_nonfinite and close):
        worst = np.nanmax(np.abs(np.where(finite, actual - expected, 0.0)))
        raise AssertionError(f"{what}: differs from PyTorch (largest difference {worst:g}; "
                             f"tolerance {np.max(atol):g} + {rtol:g} |torch|)")
    print(f"ok {what}")


def check_softmax(tensors):
    for prefix in prefixes(tensors):
        dtype = prefix.split("_", 1)[1]
        for causal in (False, True):
            tail = "_causal" if causal else ""
            x = torch.tensor(np.array(tensors[f"{prefix}/x{tail}"]), dtype=torch.float64,
                             requires_grad=True)
            grad_y = torch.tensor(np.array(tensors[f"{prefix}/grad_y{tail}"]), dtype=torch.float64)
            for op, fn in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
                inputs = x
                if causal:
                    t = x.shape[-1]
                    later = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
                    inputs = x.masked_fill(later, float("-inf"))
                y = fn(inputs, -1)
                (grad_x,) = torch.autograd.grad(y, x, grad_y)
                name = f"{prefix}/{op}{tail}"
                compare("softmax", f"{name}/y", tensors[f"{name}/y"], y, dtype)
                compare("softmax", f"{name}/grad_x", tensors[f"{name}/grad_x"], grad_x, dtype)


def check_layer_norm(tensors):
    for prefix in prefixes(tensors):
        dtype = prefix.split("_", 1)[1]
        leaf = {name: torch.tensor(np.array(tensors[f"{prefix}/{name}"]), dtype=torch.float64,
                                   requires_grad=True) for name in ("x", "weight", "bias")}
        grad_y = torch.tensor(np.array(tensors[f"{prefix}/grad_y"]), dtype=torch.float64)
        d = leaf["x"].shape[-1]
        y, mean, rstd = torch.native_layer_norm(leaf["x"], [d], leaf["weight"], leaf["bias"], 1e-5)
        grads = torch.autograd.grad(y, [leaf["x"], leaf["weight"], leaf["bias"]], grad_y)
        expected = {"y": y, "mean": mean, "rstd": rstd, "grad_x": grads[0],
                    "grad_weight": grads[1], "grad_bias": grads[2]}
        for name, value in expected.items():
            compare("layer_norm", f"{prefix}/{name}", tensors[f"{prefix}/{name}"], value, dtype)


def check_embedding(tensors):
    for prefix in prefixes(tensors):
        dtype = prefix.split("_", 1)[1]
        ids = torch.tensor(np.array(tensors[f"{prefix}/ids"]), dtype=torch.float64).long()
        table = torch.tensor(np.array(tensors[f"{prefix}/table"]), dtype=torch.float64,
                             requires_grad=True)
        grad_y = torch.tensor(np.array(tensors[f"{prefix}/grad_y"]), dtype=torch.float64)
        y = torch.nn.functional.embedding(ids, table)
        (grad_table,) = torch.autograd.grad(y, table, grad_y)
        compare("embedding", f"{prefix}/y", tensors[f"{prefix}/y"], y, dtype)
        compare("embedding", f"{prefix}/grad_table", tensors[f"{prefix}/grad_table"], grad_table,
                dtype)


def check_broadcast(tensors):
    for prefix in prefixes(tensors):
        dtype = prefix.split("_", 1)[1]
        cases = sorted({name.split("/")[1] for name in tensors if name.startswith(prefix + "/")})
        for case in cases:
            p = f"{prefix}/{case}"
            leaf = {name: torch.tensor(np.array(tensors[f"{p}/{name}"]), dtype=torch.float64,
                                       requires_grad=True) for name in ("a", "b")}
            grad_y = torch.tensor(np.array(tensors[f"{p}/grad_y"]), dtype=torch.float64)
            for op, fn in (("add", torch.add), ("sub", torch.sub), ("mul", torch.mul)):
                y = fn(leaf["a"], leaf["b"])
                grad_a, grad_b = torch.autograd.grad(y, [leaf["a"], leaf["b"]], grad_y)
                for name, value in (("y", y), ("grad_a", grad_a), ("grad_b", grad_b)):
                    what = f"{p}/{op}/{name}"
                    compare("broadcast", what, tensors[what], value, dtype)
def leaf(tensors, name):
    return torch.tensor(np.array(tensors[name]), dtype=torch.float64, requires_grad=True)


def check_permute(tensors):
    cases = {"permute_0231": (0, 2, 3, 1), "permute_0213": (0, 2, 1, 3)}
    for prefix in prefixes(tensors):
        dtype = prefix.split("_", 1)[1]
        x = leaf(tensors, f"{prefix}/x")
        for name in ("permute_0231", "permute_0213", "transpose"):
            y = x.transpose(-1, -2) if name == "transpose" else x.permute(*cases[name])
            grad_y = torch.tensor(np.array(tensors[f"{prefix}/{name}/grad_y"]), dtype=torch.float64)
            (grad_x,) = torch.autograd.grad(y, x, grad_y)
            compare("permute", f"{prefix}/{name}/y", tensors[f"{prefix}/{name}/y"], y, dtype)
            compare("permute", f"{prefix}/{name}/grad_x", tensors[f"{prefix}/{name}/grad_x"],
                    grad_x, dtype)


def check_slice_copy(tensors):
    for prefix in prefixes(tensors):
        dtype = prefix.split("_", 1)[1]
        value = lambda name: torch.tensor(np.array(tensors[f"{prefix}/{name}"]),  # noqa: E731
                                          dtype=torch.float64)
        a, b = leaf(tensors, f"{prefix}/cat/a"), leaf(tensors, f"{prefix}/cat/b")
        y = torch.cat([a, b], 1)
        grads = torch.autograd.grad(y, [a, b], value("cat/grad_y"))
        for name, expected in (("y", y), ("grad_a", grads[0]), ("grad_b", grads[1])):
            compare("slice_copy", f"{prefix}/cat/{name}", tensors[f"{prefix}/cat/{name}"],
                    expected, dtype)
        x = leaf(tensors, f"{prefix}/split/x")
        y0, y1 = torch.split(x, [3, 7], -1)
        (grad_x,) = torch.autograd.grad([y0, y1], x, [value("split/grad_y0"), value("split/grad_y1")])
        for name, expected in (("y0", y0), ("y1", y1), ("grad_x", grad_x)):
            compare("slice_copy", f"{prefix}/split/{name}", tensors[f"{prefix}/split/{name}"],
                    expected, dtype)
        x = leaf(tensors, f"{prefix}/slice/x")
        y = x.narrow(1, 1, 2)
        (grad_x,) = torch.autograd.grad(y, x, value("slice/grad_y"))
        assert torch.equal(y, x[:, 1:3])
        for name, expected in (("y", y), ("grad_x", grad_x)):
            compare("slice_copy", f"{prefix}/slice/{name}", tensors[f"{prefix}/slice/{name}"],
                    expected, dtype)


def check_batched_matmul(tensors):
    """a [3,5,7] times b [3,7,4], b^T stored [3,4,7], or a shared b [7,4]. Each result's
    bound is (K + 2) S for the K it sums over (7 for y, 4 for grad_a, 5 for grad_b, 15
    for a shared b's, summed over the batch too), S the same result computed from the
    absolute values of its operands."""
    for prefix in prefixes(tensors):
        dtype = prefix.split("_", 1)[1]
        for name in ("bmm", "bmm_bt", "shared_b"):
            def product(u, v):
                return torch.bmm(u, v.transpose(-1, -2)) if name == "bmm_bt" else torch.matmul(u, v)
            a, b = leaf(tensors, f"{prefix}/{name}/a"), leaf(tensors, f"{prefix}/{name}/b")
            grad_y = torch.tensor(np.array(tensors[f"{prefix}/{name}/grad_y"]), dtype=torch.float64)
            y = product(a, b)
            grad_a, grad_b = torch.autograd.grad(y, [a, b], grad_y)
            abs_a = a.detach().abs().requires_grad_()
            abs_b = b.detach().abs().requires_grad_()
            s_y = product(abs_a, abs_b)
            s_a, s_b = torch.autograd.grad(s_y, [abs_a, abs_b], grad_y.abs())
            sums = {"y": (7, s_y), "grad_a": (4, s_a), "grad_b": (15 if name == "shared_b" else 5, s_b)}
            for what, expected in (("y", y), ("grad_a", grad_a), ("grad_b", grad_b)):
                k, s = sums[what]
                compare("batched_matmul", f"{prefix}/{name}/{what}",
                        tensors[f"{prefix}/{name}/{what}"], expected, dtype,
                        scale=(k + 2) * s.detach().numpy())


def check_conv2d_grouped(tensors):
    """Each case's parameters come with it: [stride_h, stride_w, pad_h, pad_w,
    dilation_h, dilation_w, groups]."""
    cases = sorted({tuple(name.split("/")[:2]) for name in tensors})
    for prefix, case in cases:
        dtype = prefix.split("_", 1)[1]
        name = f"{prefix}/{case}"
        leaf = {what: torch.tensor(np.array(tensors[f"{name}/{what}"]), dtype=torch.float64,
                                   requires_grad=True) for what in ("x", "weight", "bias")}
        grad_y = torch.tensor(np.array(tensors[f"{name}/grad_y"]), dtype=torch.float64)
        sh, sw, ph, pw, dh, dw, groups = (int(v) for v in np.array(tensors[f"{name}/params"]))
        y = torch.nn.functional.conv2d(leaf["x"], leaf["weight"], leaf["bias"], stride=(sh, sw),
                                       padding=(ph, pw), dilation=(dh, dw), groups=groups)
        grads = torch.autograd.grad(y, [leaf["x"], leaf["weight"], leaf["bias"]], grad_y)
        expected = {"y": y, "grad_x": grads[0], "grad_weight": grads[1], "grad_bias": grads[2]}
        for what, value in expected.items():
            compare("conv2d_grouped", f"{name}/{what}", tensors[f"{name}/{what}"], value, dtype)


def check_label_smoothing(tensors):
    """torch.nn.functional.cross_entropy(label_smoothing=eps), each case's eps and
    reduction written with it."""
    for prefix, case in sorted({tuple(name.split("/")[:2]) for name in tensors}):
        dtype = prefix.split("_", 1)[1]
        name = f"{prefix}/{case}"
        logits = torch.tensor(np.array(tensors[f"{name}/logits"]), dtype=torch.float64,
                              requires_grad=True)
        labels = torch.tensor(np.array(tensors[f"{name}/labels"]), dtype=torch.float64).long()
        eps = float(np.array(tensors[f"{name}/eps"])[0])
        reduction = "sum" if float(np.array(tensors[f"{name}/sum"])[0]) == 1.0 else "mean"
        grad_loss = torch.tensor(np.array(tensors[f"{name}/grad_loss"]), dtype=torch.float64)
        loss = torch.nn.functional.cross_entropy(logits, labels, reduction=reduction,
                                                 label_smoothing=eps)
        (grad_logits,) = torch.autograd.grad(loss, logits, grad_loss.reshape(()))
        compare("label_smoothing", f"{name}/loss (eps {eps}, {reduction})",
                tensors[f"{name}/loss"], loss.reshape(1), dtype)
        compare("label_smoothing", f"{name}/grad_logits", tensors[f"{name}/grad_logits"],
                grad_logits, dtype)


def check_control(tensors):
    """The comparison can fail: towerlab's softmax with one probability nudged by 1e-4."""
    name = "cpu_float32/softmax/y"
    nudged = np.array(tensors[name], dtype=np.float64)
    nudged[1, 2] += 1e-4
    x = torch.tensor(np.array(tensors["cpu_float32/x"]), dtype=torch.float64)
    try:
        compare("softmax", "control", nudged, torch.softmax(x, -1), "float32")
    except AssertionError:
        print("ok control: a nudged probability is caught")
        return
    raise AssertionError("control: a probability nudged by 1e-4 passed the comparison")


def check_bound_control(tensors):
    """The batched matmul bound can fail: one product nudged by 1e-5 of its size."""
    a = torch.tensor(np.array(tensors["cpu_float32/bmm/a"]), dtype=torch.float64)
    b = torch.tensor(np.array(tensors["cpu_float32/bmm/b"]), dtype=torch.float64)
    nudged = np.array(tensors["cpu_float32/bmm/y"], dtype=np.float64)
    nudged[1, 2, 3] *= 1 + 1e-5
    try:
        compare("batched_matmul", "bound control", nudged, torch.bmm(a, b), "float32",
                scale=(7 + 2) * torch.bmm(a.abs(), b.abs()).numpy())
    except AssertionError:
        print("ok bound control: a product nudged by 1e-5 is caught")
        return
    raise AssertionError("bound control: a product nudged by 1e-5 passed the comparison")


def half_ulp_bf16(t):
    """Half a bfloat16 ulp of each element of t: how far its rounding may move it."""
    x = np.abs(t.detach().double().numpy())
    exponent = np.floor(np.log2(np.where(x > 0, x, 2.0**-126)))
    return 2.0 ** (np.maximum(exponent, -126) - 8)


def sums_bound(k, s):
    """Two float32 sums of the same products in their own orders: 2 (k + 2) u S each."""
    return 4 * (k + 2) * 2.0**-24 * s.detach().numpy()


def gemm_bound(expected, k, s):
    """|towerlab - torch| for a product torch rounds to bfloat16 and towerlab keeps in
    float32, both summing the same bfloat16 operands in float32 in their own orders:
    torch's rounding (half an ulp) plus both sums' error, 2 (k + 2) u S each
    (kernels/matmul.h; u = 2^-24, S the sum of the products' magnitudes)."""
    return half_ulp_bf16(expected) + sums_bound(k, s)


def rounded_output_bound(bound, result):
    """A bound on a GEMM's output, which towerlab rounds to bfloat16 too (the working
    dtype between ops, docs/precision.md): its own rounding, half an ulp of the result,
    on top."""
    return bound + half_ulp_bf16(result)


def matmul_products(a, b, grad_y, nt):
    """y = a b (b transposed when nt; 2-D, or batched over the first dimension) and its
    gradients for grad_y, in the operands' dtype: (y, grad_a, grad_b)."""
    a, b = (v.detach().requires_grad_() for v in (a, b))
    y = a @ (b.transpose(-1, -2) if nt else b)
    return (y.detach(), *torch.autograd.grad(y, [a, b], grad_y))


def torch_strays(products, exact, sums, depths, where):
    """Whether torch's bfloat16 products stray from the exact ones (float64 on the same
    values) further than one float32 sum rounded once to bfloat16 may: half an ulp plus
    2 (k + 2) u S. Says by how much when they do."""
    worst = max(np.max(np.abs(t.double().numpy() - e.numpy()) -
                       (half_ulp_bf16(e) + 2 * (k + 2) * 2.0**-24 * s.numpy()))
                for t, e, s, k in zip(products, exact, sums, depths))
    if worst > 0:
        print(f"note {where}: torch's bfloat16 products stray {worst:g} beyond a float32 sum "
              "rounded once; the oracle is the definition")
    return worst > 0


def conv_products(x, w, grad_y):
    """conv2d(x, w) with padding 1 and its gradients for grad_y, in the operands' dtype:
    (y, grad_x, grad_w)."""
    x, w = (v.detach().requires_grad_() for v in (x, w))
    y = torch.nn.functional.conv2d(x, w, padding=1)
    return (y.detach(), *torch.autograd.grad(y, [x, w], grad_y))


def bf16(tensors, name, grad=False):
    return torch.tensor(np.array(tensors[name]), dtype=torch.float32).bfloat16().requires_grad_(grad)


def check_bf16(tensors):
    """The bf16 policy against PyTorch's own bfloat16 ops (tests/precision_vs_torch_test.cpp):
    matmul, batched matmul and conv2d on bfloat16 operands with a bfloat16 output gradient (torch rounds
    its outputs and gradients to bfloat16, towerlab its outputs only, its gradients are
    float32: gemm_bound, and rounded_output_bound for y), the bias added in float32; batch norm on a bfloat16 input with float32 gamma and beta, as autocast
    runs it after a bfloat16 convolution: torch rounds y and grad_x to bfloat16 and
    takes grad_y in bfloat16 (towerlab keeps it float32), so each bound is half an ulp
    of torch's output plus 2^-9 of the terms grad_y enters with. Where torch's products
    are not float32 sums rounded once (its bmm; its mm and conv2d on a CPU without
    AVX-512 BF16), the products' oracle is their definition, float32 math on the rounded
    values, and the script says so."""
    for prefix in sorted({name.split("/")[0] for name in tensors}):
        for name in ("matmul_nn", "matmul_nt", "batched_matmul_nn"):
            p = f"{prefix}/{name}"
            a, b = bf16(tensors, f"{p}/a"), bf16(tensors, f"{p}/b")
            grad_y = bf16(tensors, f"{p}/grad_y")
            nt, batched = name == "matmul_nt", name.startswith("batched")
            y, grad_a, grad_b = matmul_products(a, b, grad_y, nt)
            exact = matmul_products(a.double(), b.double(), grad_y.double(), nt)
            s_y, s_a, s_b = matmul_products(a.double().abs(), b.double().abs(),
                                            grad_y.double().abs(), nt)
            k_y, k_a, k_b = a.shape[-1], y.shape[-1], a.shape[-2]
            # torch's own bfloat16 bmm on the CPU strays further from the exact product
            # than a float32 sum may (0.0107 here, against towerlab's 7e-8), and so do its
            # 2-D products on a CPU without AVX-512 BF16 (0.054 on a Zen 3 EPYC, where half
            # an ulp is 0.0156): there the oracle is the definition instead, float32 math
            # on the rounded values.
            definition = batched or torch_strays((y, grad_a, grad_b), exact, (s_y, s_a, s_b),
                                                 (k_y, k_a, k_b), p)
            if definition:
                y, grad_a, grad_b = matmul_products(a.float(), b.float(), grad_y.float(), nt)
            for what, expected, k, s in (("y", y, k_y, s_y), ("grad_a", grad_a, k_a, s_a),
                                         ("grad_b", grad_b, k_b, s_b)):
                # Against the float32 oracle, no rounding of torch's: both sums' error
                # only, and towerlab's rounding of y.
                bound = sums_bound(k, s) if definition else gemm_bound(expected, k, s)
                if what == "y":
                    bound = rounded_output_bound(bound, expected)
                compare("bf16", f"{p}/{what}", tensors[f"{p}/{what}"], expected, "float32",
                        scale=bound)
            if batched and prefix.startswith("cpu"):
                unrounded = (torch.tensor(np.array(tensors[f"{p}/a"]), dtype=torch.float64) @
                             torch.tensor(np.array(tensors[f"{p}/b"]), dtype=torch.float64))
                try:
                    compare("bf16", "control", unrounded.numpy(), y, "float32",
                            scale=sums_bound(k_y, s_y))
                except AssertionError:
                    print(f"ok {p}/control: the product of unrounded operands is caught")
                else:
                    raise AssertionError(f"{p}: the bound misses the product of unrounded operands")
            if prefix.startswith("cpu") and not batched:
                check_bf16_control(tensors, p, nt, y,
                                   sums_bound(k_y, s_y) if definition else gemm_bound(y, k_y, s_y))
        p = f"{prefix}/conv2d"
        x, w = bf16(tensors, f"{p}/x", True), bf16(tensors, f"{p}/weight", True)
        bias = leaf(tensors, f"{p}/bias")
        grad_y = torch.tensor(np.array(tensors[f"{p}/grad_y"]), dtype=torch.float64)
        # torch's product is bfloat16, so its backward takes grad_y rounded to bfloat16.
        rounded_grad_y = grad_y.bfloat16()
        product, grad_x, grad_w = conv_products(x, w, rounded_grad_y)
        exact = conv_products(x.double(), w.double(), rounded_grad_y.double())
        s_y, s_x, s_w = conv_products(x.double().abs(), w.double().abs(),
                                      rounded_grad_y.double().abs())
        c, r = w.shape[1], w.shape[2]
        depths = (c * r * r, w.shape[0] * r * r, x.shape[0] * product.shape[2] * product.shape[3])
        # As the products above: where torch's own bfloat16 convolution strays (0.081
        # beyond that bound on a Zen 3 EPYC), the oracle is the definition.
        definition = torch_strays((product, grad_x, grad_w), exact, (s_y, s_x, s_w), depths, p)
        if definition:
            product, grad_x, grad_w = conv_products(x.float(), w.float(), rounded_grad_y.float())
        y = product.double() + bias.detach().double().view(1, -1, 1, 1)
        grad_bias = grad_y.sum((0, 2, 3))

        def bound(result, k, s):
            return sums_bound(k, s) if definition else gemm_bound(result, k, s)
        bounds = {"y": rounded_output_bound(bound(product, depths[0], s_y), y),
                  "grad_x": bound(grad_x, depths[1], s_x),
                  "grad_weight": bound(grad_w, depths[2], s_w),
                  "grad_bias": 4 * (depths[2] + 2) * 2.0**-24 * grad_y.abs().sum((0, 2, 3)).numpy()}
        for what, expected in (("y", y), ("grad_x", grad_x), ("grad_weight", grad_w),
                               ("grad_bias", grad_bias)):
            compare("bf16", f"{p}/{what}", tensors[f"{p}/{what}"], expected, "float32",
                    scale=bounds[what])
        p = f"{prefix}/batchnorm"
        x = bf16(tensors, f"{p}/x", True)
        gamma = torch.tensor(np.array(tensors[f"{p}/gamma"]), requires_grad=True)
        beta = torch.tensor(np.array(tensors[f"{p}/beta"]), requires_grad=True)
        grad_y = torch.tensor(np.array(tensors[f"{p}/grad_y"]), dtype=torch.float32)
        y = torch.nn.functional.batch_norm(x, None, None, gamma, beta, training=True, eps=1e-3)
        grad_x, grad_gamma, grad_beta = torch.autograd.grad(y, [x, gamma, beta],
                                                            grad_y.bfloat16())
        xd = x.detach().double()
        mean = xd.mean((0, 2, 3), keepdim=True)
        rstd = 1 / torch.sqrt(xd.var((0, 2, 3), unbiased=False, keepdim=True) + 1e-3)
        xhat, g = (xd - mean) * rstd, grad_y.double().abs()
        gx = (g * xhat.abs()).mean((0, 2, 3), keepdim=True)
        factor = gamma.detach().double().view(1, -1, 1, 1).abs() * rstd
        bounds = {"y": half_ulp_bf16(y) + 1e-6 * (xhat.abs() + 1).numpy(),
                  "grad_x": half_ulp_bf16(grad_x) + 2.0**-8 * (
                      factor * (g + g.mean((0, 2, 3), keepdim=True) + xhat.abs() * gx)).numpy(),
                  "grad_gamma": 2.0**-8 * (g * xhat.abs()).sum((0, 2, 3)).numpy(),
                  "grad_beta": 2.0**-8 * g.sum((0, 2, 3)).numpy()}
        for what, expected in (("y", y), ("grad_x", grad_x), ("grad_gamma", grad_gamma),
                               ("grad_beta", grad_beta)):
            compare("bf16", f"{p}/{what}", tensors[f"{p}/{what}"], expected, "float32",
                    scale=bounds[what])
        check_batchnorm_bf16(tensors, f"{prefix}/batchnorm_bf16")


def check_batchnorm_bf16(tensors, p):
    """Batch norm on bfloat16 activations (kernels/batchnorm.h) against torch's batch_norm
    on bfloat16 tensors with float32 gamma and beta: y is bfloat16 on both sides, grad_x
    bfloat16 in torch and float32 in towerlab (the policy's gradients, from a float32
    grad_y holding torch's bfloat16 values), each computed in float32 and rounded at
    most once, so they may differ by both roundings, an ulp of torch's value, plus the float32 sums' error (the statistics'
    1e-6 of the normalized value's size for y, 2^-16 of the terms grad_y enters with
    for grad_x); grad_gamma and grad_beta are float32 on both sides, within both
    float32 sums' error, 2 (M + 2) u of their terms each. The control: y from the
    statistics rounded to bfloat16 (what a batch norm that kept them in the activations'
    dtype would give) falls outside the bound."""
    x = bf16(tensors, f"{p}/x", True)
    gamma = torch.tensor(np.array(tensors[f"{p}/gamma"]), requires_grad=True)
    beta = torch.tensor(np.array(tensors[f"{p}/beta"]), requires_grad=True)
    grad_y = bf16(tensors, f"{p}/grad_y")
    y = torch.nn.functional.batch_norm(x, None, None, gamma, beta, training=True, eps=1e-3)
    assert y.dtype == torch.bfloat16
    grad_x, grad_gamma, grad_beta = torch.autograd.grad(y, [x, gamma, beta], grad_y)
    xd = x.detach().double()
    count = xd.numel() // xd.shape[1]
    mean = xd.mean((0, 2, 3), keepdim=True)
    rstd = 1 / torch.sqrt(xd.var((0, 2, 3), unbiased=False, keepdim=True) + 1e-3)
    xhat, g = (xd - mean) * rstd, grad_y.double().abs()
    gx = (g * xhat.abs()).mean((0, 2, 3), keepdim=True)
    factor = gamma.detach().double().view(1, -1, 1, 1).abs() * rstd
    bounds = {"y": 2 * half_ulp_bf16(y) + 1e-6 * (xhat.abs() + 1).numpy(),
              "grad_x": 2 * half_ulp_bf16(grad_x) + 2.0**-16 * (
                  factor * (g + g.mean((0, 2, 3), keepdim=True) + xhat.abs() * gx)).numpy(),
              "grad_gamma": 4 * (count + 2) * 2.0**-24 * (g * xhat.abs()).sum((0, 2, 3)).numpy(),
              "grad_beta": 4 * (count + 2) * 2.0**-24 * g.sum((0, 2, 3)).numpy()}
    for what, expected in (("y", y), ("grad_x", grad_x), ("grad_gamma", grad_gamma),
                           ("grad_beta", grad_beta)):
        compare("bf16", f"{p}/{what}", tensors[f"{p}/{what}"], expected, "float32",
                scale=bounds[what])
    shift = beta.detach().double().view(1, -1, 1, 1)
    scale = gamma.detach().double().view(1, -1, 1, 1)
    control = ((xd - mean.bfloat16().double()) * rstd.bfloat16().double() * scale + shift).bfloat16()
    try:
        compare("bf16", f"{p}/control", control.float().numpy(), y, "float32",
                scale=bounds["y"])
    except AssertionError:
        print(f"ok {p}/control: y from bfloat16 statistics is caught")
        return
    raise AssertionError(f"{p}/control: y from bfloat16 statistics passed the comparison")


def check_bf16_control(tensors, p, nt, expected, bound):
    """The bound can fail: the float32 product of the unrounded operands (a policy that
    forgot to round them) falls outside it."""
    a = torch.tensor(np.array(tensors[f"{p}/a"]), dtype=torch.float64)
    b = torch.tensor(np.array(tensors[f"{p}/b"]), dtype=torch.float64)
    unrounded = (a @ (b.t() if nt else b)).numpy()
    try:
        compare("bf16", f"{p}/control", unrounded, expected, "float32", scale=bound)
    except AssertionError:
        print(f"ok {p}/control: the product of unrounded operands is caught")
        return
    raise AssertionError(f"{p}/control: the product of unrounded operands passed the comparison")


CHECKS = {
    "softmax": check_softmax,
    "layer_norm": check_layer_norm,
    "embedding": check_embedding,
    "broadcast": check_broadcast,
    "permute": check_permute,
    "slice_copy": check_slice_copy,
    "batched_matmul": check_batched_matmul,
    "bf16": check_bf16,
    "conv2d_grouped": check_conv2d_grouped,
    "label_smoothing": check_label_smoothing,
}


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as directory:
        run_cases(argv[1], directory)
        written = sorted(name[:-len(".safetensors")] for name in os.listdir(directory))
        unchecked = [family for family in written if family not in CHECKS]
        if unchecked:
            raise AssertionError(f"no check for the cases of {', '.join(unchecked)}")
        missing = [family for family in CHECKS if family not in written]
        if missing:
            raise AssertionError(f"no cases written for {', '.join(missing)}")
        cases = {family: torch_convert.read_safetensors(
            os.path.join(directory, family + ".safetensors"))[0] for family in written}
    for family, check in CHECKS.items():
        check(cases[family])
    check_control(cases["softmax"])
    check_bound_control(cases["batched_matmul"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
