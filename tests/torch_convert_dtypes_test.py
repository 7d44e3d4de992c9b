#!/usr/bin/env python3
"""tools/torch_convert.py with bfloat16 and float16, without PyTorch: the bfloat16
rounding it writes (engine/half.h's rule) on crafted values, and the round trip of a
FashionNet checkpoint through a BF16 and an F16 state_dict in .safetensors files.
Exits non-zero on the first failure."""

import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
import torch_convert  # noqa: E402  (after the path)

CONVERT = [sys.executable, os.path.join(REPO, "tools", "torch_convert.py")]


def bits(values):
    return np.array(values, dtype="<u4").view("<f4")


def test_bfloat16_rounding():
    cases = {  # float32 bits -> bfloat16 bits
        0x3F800000: 0x3F80,  # 1.0, exact
        0x3F808000: 0x3F80,  # the tie between 1.0 and its successor: to the even 0x3F80
        0x3F818000: 0x3F82,  # the tie above an odd pattern: up, to the even 0x3F82
        0x3F808001: 0x3F81,  # just above the tie: up
        0x7F7FFFFF: 0x7F80,  # the largest float rounds past bfloat16's range: infinity
        0xFF800000: 0xFF80,  # -infinity stays
        0x7F800001: 0x7FC0,  # a signalling NaN with a low payload stays a (quiet) NaN
        0xFFC00000: 0xFFC0,  # a negative NaN keeps its sign
        0x80000000: 0x8000,  # -0
    }
    got = torch_convert.bfloat16_bits(bits(list(cases)))
    assert list(got) == list(cases.values()), [hex(g) for g in got]


def test_checkpoint_round_trip(work):
    rng = np.random.default_rng(1)
    state = {tl: rng.standard_normal(shape).astype(np.float32)
             for _, tl, shape in torch_convert.name_table()}
    for bn in ("bn1", "bn2"):
        state[f"{bn}/moving_variance"] = np.abs(state[f"{bn}/moving_variance"]) + 0.5
    checkpoint = os.path.join(work, "fp32.safetensors")
    torch_convert.write_safetensors(checkpoint, state, {"format": "towerlab-checkpoint-1",
                                                       "step": "3"})
    for dtype, name, widen in (
            ("bfloat16", "BF16",
             lambda a: (torch_convert.bfloat16_bits(a).astype(np.uint32) << 16).view(np.float32)),
            ("float16", "F16", lambda a: a.astype(np.float16).astype(np.float32))):
        narrow = os.path.join(work, f"{dtype}.safetensors")
        subprocess.run(CONVERT + ["to-torch", checkpoint, narrow, "--dtype", dtype], check=True,
                       capture_output=True)
        with open(narrow, "rb") as f:
            assert f'"dtype": "{name}"'.encode() in f.read(4096), f"{dtype}: no {name} header"
        back = os.path.join(work, f"{dtype}_back.safetensors")
        subprocess.run(CONVERT + ["to-towerlab", narrow, back], check=True, capture_output=True)
        tensors, _ = torch_convert.read_safetensors(back)
        for _, tl, _ in torch_convert.name_table():
            expected = widen(state[tl])
            assert tensors[tl].dtype == np.float32, f"{tl}: {tensors[tl].dtype}"
            assert np.array_equal(tensors[tl], expected), f"{dtype}: {tl} differs"
            # Control: the comparison sees the rounding (float32 values are not kept).
            assert not np.array_equal(tensors[tl], state[tl]) or state[tl].size < 4, tl
        print(f"ok   {dtype}: to-torch --dtype {dtype} and back gives the rounded weights")


def main():
    test_bfloat16_rounding()
    print("ok   bfloat16 rounding: ties to even, NaN, infinity, overflow")
    with tempfile.TemporaryDirectory() as work:
        test_checkpoint_round_trip(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
