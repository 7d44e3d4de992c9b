#!/usr/bin/env python3
"""How much accuracy Winograd loses when its transformed tiles are bfloat16.

The question behind conv2d's bfloat16 path on the CPU (kernels/cpu/conv2d.cpp): could a
bfloat16 layer keep Winograd's savings by running the 36 (F(4x4,3x3)) or 16 (F(2x2,3x3))
matrix products of the transformed tiles on the vdpbf16ps GEMM, V = Bt d B and
U = G g Gt rounded to bfloat16? The lowering towerlab takes instead multiplies the
bfloat16 values themselves, products exact and summed in float32: its error is float32's.

For each layer shape, random 6x6 (or 4x4) input tiles of bfloat16 values (standard
normal, and the same through a ReLU) and He-initialized bfloat16 3x3 kernels give one
output tile per input tile, computed
  - exactly, in float64 from the bfloat16 values (the definition);
  - by Winograd with float32 transforms (towerlab's float32 path on widened operands);
  - by Winograd with U, V or both rounded to bfloat16 (products exact, sums in float64:
    a float32 sum over C <= 64 terms adds about 1e-7, nothing beside these errors);
  - exactly, then the output rounded to bfloat16 (the rounding every bfloat16 y has).
Errors are relative to the root mean square of the exact outputs: their rms and their
99.9th percentile.

Decided (bench/results/winograd_bf16_error_6e8f5f5.md): F(4x4,3x3) on bfloat16 tiles is
12 to 14 times as far from the definition as a bfloat16 y's own rounding (rms); F(2x2,3x3)
about twice, with 4 multiplications an output at twice the rate where float32 F(4x4) does
2.25 at the float rate (no saving). The bfloat16 layers take the lowering.

Run: python3 bench/experiments/decided/winograd_bf16_error.py  (numpy; about a minute)
"""

import numpy as np


def bf16(x):
    """x rounded to bfloat16 (to nearest, ties to even), as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


# F(2x2,3x3) and F(4x4,3x3) as kernels/cpu/winograd.cpp and winograd4.cpp have them.
F2 = dict(
    tile=4, out=2,
    BT=np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float),
    G=np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
    AT=np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float),
)
F4 = dict(
    tile=6, out=4,
    BT=np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                 [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], float),
    G=np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
    AT=np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                 [0, 1, -1, 8, -8, 1]], float),
)

LAYERS = [("FashionNet conv2", 32, 64), ("ResNet-20 16->16", 16, 16),
          ("ResNet-20 32->32", 32, 32), ("ResNet-20 64->64", 64, 64)]
TILES = 1500


def winograd(f, d, g, round_u, round_v):
    """Output tiles [T,K,out,out] of input tiles d [T,C,t,t] and kernels g [K,C,3,3]."""
    V = np.einsum("ij,tcjk,lk->tcil", f["BT"], d, f["BT"]).astype(np.float32)
    U = np.einsum("ij,kcjl,ml->kcim", f["G"], g, f["G"]).astype(np.float32)
    V = bf16(V) if round_v else V
    U = bf16(U) if round_u else U
    M = np.einsum("tcij,kcij->tkij", V.astype(float), U.astype(float)).astype(np.float32)
    return np.einsum("ij,tkjl,ml->tkim", f["AT"], M.astype(float), f["AT"])


def direct(f, d, g):
    out = f["out"]
    y = np.zeros((d.shape[0], g.shape[0], out, out))
    for r in range(3):
        for s in range(3):
            y += np.einsum("tchw,kc->tkhw", d[:, :, r:r + out, s:s + out], g[:, :, r, s])
    return y


def main():
    rng = np.random.default_rng(1)
    print("errors relative to the rms of the exact outputs: rms / 99.9th percentile")
    header = ["layer", "inputs", "tile", "float32 transforms", "U, V bfloat16",
              "U bfloat16", "V bfloat16", "y rounded to bfloat16"]
    print(" | ".join(header))
    for name, C, K in LAYERS:
        g = bf16(rng.standard_normal((K, C, 3, 3)) * np.sqrt(2.0 / (9 * C))).astype(float)
        for inputs in ("normal", "relu"):
            for label, f in (("F(2x2)", F2), ("F(4x4)", F4)):
                d = rng.standard_normal((TILES, C, f["tile"], f["tile"]))
                if inputs == "relu":
                    d = np.maximum(d, 0)
                d = bf16(d).astype(float)
                exact = direct(f, d, g)
                scale = np.sqrt(np.mean(exact**2))
                cells = []
                for got in (winograd(f, d, g, False, False), winograd(f, d, g, True, True),
                            winograd(f, d, g, True, False), winograd(f, d, g, False, True),
                            bf16(exact).astype(float)):
                    e = np.abs(got - exact) / scale
                    cells.append(f"{np.sqrt(np.mean(e**2)):.1e} / {np.quantile(e, 0.999):.1e}")
                print(" | ".join([name, inputs, label] + cells))


if __name__ == "__main__":
    main()
