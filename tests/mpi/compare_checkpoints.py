#!/usr/bin/env python3
"""Compares two towerlab checkpoints tensor by tensor.

    compare_checkpoints.py A B [--rtol R] [--atol A] [--exact]

Exits 0 when both hold the same tensors with the same shapes and every value of
A is within atol + rtol * |B| of B's (--exact: the same bits), else 1 with the
tensors that differ and their largest difference. Reads the safetensors format
directly (8-byte header length, JSON header, data), with the standard library only.
"""
import argparse
import array
import json
import struct
import sys

TYPECODES = {"F32": "f", "F64": "d"}


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n :]
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        values = array.array(TYPECODES[entry["dtype"]])
        values.frombytes(body[begin:end])
        if sys.byteorder != "little":
            values.byteswap()
        tensors[name] = (tuple(entry["shape"]), values)
    return tensors


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rtol", type=float, default=1e-5)
    parser.add_argument("--atol", type=float, default=1e-6)
    parser.add_argument("--exact", action="store_true")
    args = parser.parse_args()
    a, b = read(args.a), read(args.b)
    if sorted(a) != sorted(b):
        print("different tensors:", sorted(set(a) ^ set(b)))
        return 1
    bad = []
    for name in sorted(a):
        (x_shape, x), (y_shape, y) = a[name], b[name]
        if x_shape != y_shape:
            bad.append(f"{name}: shape {x_shape} vs {y_shape}")
            continue
        largest = max((abs(u - v) for u, v in zip(x, y)), default=0.0)
        if args.exact and x.tobytes() != y.tobytes():
            bad.append(f"{name}: bits differ, largest difference {largest:g}")
        elif any(abs(u - v) > args.atol + args.rtol * abs(v) for u, v in zip(x, y)):
            bad.append(f"{name}: largest difference {largest:g}")
    for line in bad:
        print(line)
    print(f"{len(a)} tensors compared, {len(bad)} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
