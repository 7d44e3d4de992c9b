#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/): small valid
inputs of each format plus a few near misses, so that the fuzzers start from the
interesting shapes instead of random bytes. Run from anywhere; it overwrites the
seeds it owns and leaves inputs the fuzzers added alone. Python 3, no packages."""
import gzip
import json
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent / "corpus"


def write(target, name, data):
    path = HERE / target / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape, bytes)."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    if pad:
        text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + data


def f32(*values):
    return struct.pack(f"<{len(values)}f", *values)


def f64(*values):
    return struct.pack(f"<{len(values)}d", *values)


write("safetensors", "two_tensors", safetensors(
    [("conv1/weight", "F32", [2, 2], f32(1, 2, 3, 4)), ("conv1/bias", "F32", [2], f32(0.5, -0.5))],
    {"step": "7", "model": "FashionNet"}))
write("safetensors", "float64_and_scalar", safetensors(
    [("x", "F64", [3], f64(1, 2, 3)), ("s", "F32", [], f32(2))]))
write("safetensors", "bfloat16_and_float16", safetensors(
    [("b", "BF16", [2, 2], struct.pack("<4H", 0x3F80, 0x7FC0, 0xFF80, 0x0001)),
     ("h", "F16", [3], struct.pack("<3H", 0x3C00, 0x7E00, 0x8001))]))
write("safetensors", "empty_tensor", safetensors([("e", "F32", [0, 4], b"")]))
write("safetensors", "empty_header", safetensors([]))
write("safetensors", "unpadded", safetensors([("w", "F32", [1], f32(1))], pad=False))
write("safetensors", "truncated", safetensors([("w", "F32", [4], f32(1, 2, 3, 4))])[:-3])
write("safetensors", "wrong_dtype", safetensors([("w", "I64", [1], b"\0" * 8)]))


def idx(dims, values):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(values)


images = idx([2, 3, 3], range(18))
labels = idx([4], [0, 9, 3, 1])
write("idx", "images", images)
write("idx", "labels", labels)
write("idx", "images.gz", gzip.compress(images, mtime=0))
write("idx", "labels.gz", gzip.compress(labels, mtime=0))
write("idx", "zero_dims", idx([], [7]))
write("idx", "float_type", bytes([0, 0, 0x0D, 1, 0, 0, 0, 1]) + f32(1.0)[::-1])
write("idx", "trailing_bytes", labels + b"\1")

write("config", "full.yaml", """\
devices: [cpu, cpu]
master: cpu
batchnorm: sync
batchnorm_stats: average
epochs: 5
batch: 128
optimizer: adam
lr: 0.001
schedule: cosine
weight_decay: 0.0005
seed: 7
steps: 10
data: /usr/share/datasets/fashion-mnist
progress_every: 50
""")
write("config", "n_gpus.yaml", "n_gpus: 4\nmaster: cuda:0\nlog_placement: true\n")
write("config", "devices_string.yaml", "devices: 'cuda:0,cuda:1'\nsoft_placement: yes\n")
write("config", "unknown_key.yaml", "epochs: 1\nlearning_rate: 3\n")
write("config", "bad_value.yaml", "batch: -1\n")
write("config", "not_a_map.yaml", "- a\n- b\n")

for i, text in enumerate(["cpu", "cuda:1", "/device:GPU:2", "/cpu:0", "gpu", "cpu,cpu",
                          "cuda:0, cuda:1,/gpu:3", "CUDA:12", "cpu:1", "cuda:-1", ",", ""]):
    write("device", f"seed_{i:02d}", text)
