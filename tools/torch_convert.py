#!/usr/bin/env python3
"""Converts the weights of towerlab's models (models/) between PyTorch and towerlab.

  torch_convert.py to-towerlab model.pt model.safetensors        # PyTorch state_dict -> towerlab
  torch_convert.py to-torch model.safetensors model.pt           # towerlab checkpoint -> PyTorch
  torch_convert.py to-torch --model resnet resnet.safetensors resnet.pt

--model names the model as the fashion_mnist sample does: fashion_net (the default),
mlp, resnet or vit. IN and OUT are safetensors files (numpy only) or torch.save files
(.pt, .pth; these need PyTorch). The PyTorch side is the model's twin in tools/
(fashion_net_torch.py's FashionNet, mlp_torch.py's Mlp, resnet_torch.py's ResNet,
vit_torch.py's ViT), or
any module whose state_dict has the same names (a "module." prefix, as
nn.DataParallel adds, is accepted). A PyTorch name is towerlab's with '.' for '/'
(stage2.block1.conv1.weight is stage2/block1/conv1/weight), batch norm's entries
renamed as below. FashionNet's names and conversions:

  PyTorch                   towerlab               shape        notes
  conv1.weight              conv1/weight           [32,1,3,3]   same layout [K,C,R,S]
  conv1.bias                (none)                 [32]         folded into bn1/moving_mean
  bn1.weight                bn1/gamma              [32]
  bn1.bias                  bn1/beta               [32]
  bn1.running_mean          bn1/moving_mean        [32]         minus conv1.bias
  bn1.running_var           bn1/moving_variance    [32]
  bn1.num_batches_tracked   metadata "step"        [] int64     dropped in, recreated out
  conv2.*, bn2.*            conv2/*, bn2/*         64 channels  as conv1, bn1
  fc1.weight, fc1.bias      fc1/weight, fc1/bias   [128,3136]   same layout [out,in]
  fc2.weight, fc2.bias      fc2/weight, fc2/bias   [10,128]

No kernel is transposed: both store convolutions as [out,in,kh,kw], dense layers as
[out,in], and flatten NCHW in C,H,W order. A convolution bias b before batch norm
is folded exactly: y = gamma*(x + b - mean)/sqrt(var + eps) + beta equals the same
with no bias and mean - b, and in training batch norm subtracts the batch mean,
which cancels b. Going out, the convolutions get no bias (FashionNet(conv_bias=False)).

The MLP's are fc1..fc3 .weight and .bias ([512,784], [256,512], [10,256]); the
ResNet's are stem.conv, stem.bn, stage<s>.block<b>.{conv1,bn1,conv2,bn2} and the
projections stage<s>.block1.shortcut.{conv,bn} of stages 2 and 3, and fc (ResNet-20,
models/resnet.h). A convolution's bias, when the state_dict has one, is folded into
the batch norm that follows it, as FashionNet's. The ViT's are patch.{weight,bias,
position}, block<b>.ln1, block<b>.attn.{q,k,v,out}, block<b>.ln2, block<b>.mlp.{fc1,fc2},
ln and head (models/vit.h); a layer norm's weight and bias are towerlab's gamma and beta.

Batch norm eps is not in a state_dict. towerlab uses 1e-3 (TensorFlow's), PyTorch
defaults to 1e-5; tools/fashion_net_torch.py uses 1e-3. --bn-eps says which eps the
PyTorch model used: another value than 1e-3 is refused, unless --fold-eps rescales
gamma by sqrt((var + 1e-3) / (var + eps)), which is exact for inference (moving
statistics) but not for further training (batch statistics).

Dtypes: a state_dict in bfloat16 or float16 (torch tensors, or BF16 and F16 in a
safetensors file) is widened exactly to the checkpoint's float32; to-torch --dtype
bfloat16|float16 writes the state_dict in that dtype, rounded to nearest even (NaN and
infinities kept), as towerlab's cast does.

The towerlab file is a checkpoint (format "towerlab-checkpoint-1", optimizer
"none", step = num_batches_tracked); going out, optimizer slots are dropped and
num_batches_tracked is the checkpoint's step (the step comes from the first batch
norm's; the MLP has none, and its step is 0 in and dropped out). Bad input exits 2
with one line.
"""

import argparse
import collections
import json
import os
import struct
import sys

import numpy as np

TOWERLAB_EPS = 1e-3
TOWERLAB_FORMAT = "towerlab-checkpoint-1"

# A model's layers in state_dict order: (towerlab name, kind, weight shape), and the
# batch norm after each convolution, which takes its bias when there is one. Kinds:
# conv (weight only), conv_bias and linear (weight and bias), bn, ln (layer norm) and
# param (a single tensor, e.g. the ViT's positions).
class Model:
    def __init__(self, title, layers, bn_after):
        self.title, self.layers, self.bn_after = title, layers, bn_after


def fashion_net():
    return Model("FashionNet", [
        ("conv1", "conv", (32, 1, 3, 3)),
        ("bn1", "bn", (32,)),
        ("conv2", "conv", (64, 32, 3, 3)),
        ("bn2", "bn", (64,)),
        ("fc1", "linear", (128, 3136)),
        ("fc2", "linear", (10, 128)),
    ], {"conv1": "bn1", "conv2": "bn2"})


def mlp(sizes=(784, 512, 256, 10)):
    return Model("MLP", [(f"fc{i}", "linear", (n_out, n_in)) for i, (n_in, n_out) in
                         enumerate(zip(sizes, sizes[1:]), start=1)], {})


def resnet(width=16, blocks_per_stage=3, in_channels=1, classes=10):
    """models::resnet()'s layers (models/resnet.cpp builds them in this order)."""
    layers = [("stem/conv", "conv", (width, in_channels, 3, 3)), ("stem/bn", "bn", (width,))]
    bn_after = {"stem/conv": "stem/bn"}
    channels = width
    for s in range(1, 4):
        out = width << (s - 1)
        for b in range(1, blocks_per_stage + 1):
            block = f"stage{s}/block{b}"
            stride = 2 if s > 1 and b == 1 else 1
            layers += [(f"{block}/conv1", "conv", (out, channels, 3, 3)),
                       (f"{block}/bn1", "bn", (out,)),
                       (f"{block}/conv2", "conv", (out, out, 3, 3)),
                       (f"{block}/bn2", "bn", (out,))]
            bn_after.update({f"{block}/conv1": f"{block}/bn1", f"{block}/conv2": f"{block}/bn2"})
            if stride != 1 or channels != out:
                layers += [(f"{block}/shortcut/conv", "conv", (out, channels, 1, 1)),
                           (f"{block}/shortcut/bn", "bn", (out,))]
                bn_after[f"{block}/shortcut/conv"] = f"{block}/shortcut/bn"
            channels = out
    layers.append(("fc", "linear", (classes, channels)))
    return Model("ResNet-20", layers, bn_after)


def vit(image=28, in_channels=1, patch=4, dim=64, blocks=4, mlp_ratio=2, classes=10):
    """models::vit()'s variables (models/vit.cpp declares them in this order)."""
    layers = [("patch", "conv_bias", (dim, in_channels, patch, patch)),
              ("patch/position", "param", ((image // patch) ** 2, dim))]
    for b in range(1, blocks + 1):
        layers += [(f"block{b}/ln1", "ln", (dim,))]
        layers += [(f"block{b}/attn/{p}", "linear", (dim, dim)) for p in ("q", "k", "v", "out")]
        layers += [(f"block{b}/ln2", "ln", (dim,)),
                   (f"block{b}/mlp/fc1", "linear", (mlp_ratio * dim, dim)),
                   (f"block{b}/mlp/fc2", "linear", (dim, mlp_ratio * dim))]
    layers += [("ln", "ln", (dim,)), ("head", "linear", (classes, dim))]
    return Model("ViT", layers, {})


MODELS = {"fashion_net": fashion_net, "mlp": mlp, "resnet": resnet, "vit": vit}
# PyTorch's batch-norm entries and towerlab's names for them.
BN_NAMES = [("weight", "gamma"), ("bias", "beta"), ("running_mean", "moving_mean"),
            ("running_var", "moving_variance")]


class ConvertError(Exception):
    """Bad input: the message is the one line printed before exit code 2."""


def torch_name(layer):
    return layer.replace("/", ".")


def name_table(model=None):
    """[(pytorch name, towerlab name, shape)] for every float tensor both sides have
    (FashionNet's when no model is given)."""
    model = model or fashion_net()
    table = []
    for layer, kind, shape in model.layers:
        t = torch_name(layer)
        if kind == "bn":
            table += [(f"{t}.{n}", f"{layer}/{tl}", shape) for n, tl in BN_NAMES]
        elif kind == "conv":
            table.append((f"{t}.weight", f"{layer}/weight", shape))
        elif kind == "ln":  # layer norm: PyTorch's weight and bias are gamma and beta
            table += [(f"{t}.weight", f"{layer}/gamma", shape), (f"{t}.bias", f"{layer}/beta", shape)]
        elif kind == "param":  # one tensor, named as it is
            table.append((t, layer, shape))
        else:  # linear, conv_bias: a weight and a bias
            table.append((f"{t}.weight", f"{layer}/weight", shape))
            table.append((f"{t}.bias", f"{layer}/bias", shape[:1]))
    return table


def first_bn(model):
    return next((layer for layer, kind, _ in model.layers if kind == "bn"), None)


# ---- safetensors files, with numpy (the format: engine/safetensors.h) ----

DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
          "I8": "i1", "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    """(OrderedDict name -> array, metadata dict). BF16 is widened to float32."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ConvertError(f"{path}: {len(raw)} bytes, too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ConvertError(f"{path}: header length {n} runs past the end of the file; "
                           "not a safetensors file, or truncated")
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise ConvertError(f"{path}: the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path}: the header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    data = memoryview(raw)[8 + n:]
    tensors = collections.OrderedDict()
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            count = int(np.prod(shape, dtype=np.int64))
            if not 0 <= begin <= end <= len(data):
                raise ValueError("data_offsets outside the data section")
            if dtype == "BF16":
                bits = np.frombuffer(data[begin:end], dtype="<u2", count=count)
                array = (bits.astype(np.uint32) << 16).view(np.float32)
            elif dtype in DTYPES:
                array = np.frombuffer(data[begin:end], dtype=DTYPES[dtype], count=count)
            else:
                raise ValueError(f"unsupported dtype {dtype}")
            tensors[name] = array.reshape(shape)
        except (KeyError, TypeError, ValueError) as e:
            raise ConvertError(f"{path}: tensor '{name}' is malformed ({e})") from None
    return tensors, metadata


def bfloat16_bits(array):
    """float32 values rounded to bfloat16 (to nearest, ties to even; a NaN stays a quiet
    NaN of its sign; past the range, an infinity), as uint16 bit patterns: the rule of
    towerlab's engine/half.h and PyTorch's."""
    bits = np.ascontiguousarray(array, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x0040, rounded).astype("<u2")


class BFloat16Array:
    """bfloat16 values for write_safetensors (numpy has no bfloat16): their bit patterns."""

    def __init__(self, array):
        self.bits = bfloat16_bits(array)
        self.shape, self.nbytes = self.bits.shape, self.bits.nbytes


def write_safetensors(path, tensors, metadata):
    """Writes float32, float16, BFloat16Array and int64 arrays, in the given order, data
    8-byte aligned."""
    names = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64"}
    header = {"__metadata__": metadata}
    offset = 0
    for name, array in tensors.items():
        dtype = "BF16" if isinstance(array, BFloat16Array) else names[array.dtype]
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)

    def write(f):
        f.write(struct.pack("<Q", len(text)) + text)
        for array in tensors.values():
            bits = array.bits if isinstance(array, BFloat16Array) else array
            f.write(np.ascontiguousarray(bits).tobytes())
    write_atomically(path, write)


def write_atomically(path, write):
    """write(file) into a file beside `path`, renamed over it: no half-written output."""
    temporary = os.path.join(os.path.dirname(os.path.abspath(path)),
                             f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(temporary, "wb") as f:
            write(f)
        os.replace(temporary, path)
    except OSError as e:
        raise ConvertError(f"{path}: cannot write it ({e.strerror})") from None
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


# ---- torch.save files ----

def import_torch(path):
    try:
        import torch
    except ImportError:
        raise ConvertError(f"{path}: .pt/.pth files need PyTorch (Debian: python3-torch); "
                           "use .safetensors files to convert without it") from None
    return torch


def read_torch(path):
    torch = import_torch(path)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as e:  # torch raises many kinds; any of them means unreadable here
        # torch's first line, from its unpickler's own reason on when it gives one
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
        detail = detail.split("WeightsUnpickler error:")[-1].strip()
        raise ConvertError(f"{path}: not a weights-only torch.save file ({detail}); save "
                           "model.state_dict(), not the model") from None
    if isinstance(loaded, dict) and not all(torch.is_tensor(v) for v in loaded.values()):
        nested = [k for k in ("state_dict", "model_state_dict", "model") if
                  isinstance(loaded.get(k), dict)]
        if not nested:
            raise ConvertError(f"{path}: holds a dict that is not a state_dict (keys: "
                               f"{', '.join(map(str, loaded))})")
        loaded = loaded[nested[0]]
    if not isinstance(loaded, dict) or not all(torch.is_tensor(v) for v in loaded.values()):
        raise ConvertError(f"{path}: holds a {type(loaded).__name__}, not a state_dict")
    out = collections.OrderedDict()
    for name, t in loaded.items():
        t = t.detach().cpu()
        out[name] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    return out


def write_torch(path, tensors, dtype="float32"):
    """torch.save of the arrays; floating ones in `dtype` (torch rounds to nearest even)."""
    torch = import_torch(path)

    def tensor(v):
        t = torch.from_numpy(v.copy())
        return t.to(getattr(torch, dtype)) if t.is_floating_point() else t
    state = collections.OrderedDict((k, tensor(v)) for k, v in tensors.items())
    write_atomically(path, lambda f: torch.save(state, f))


def is_torch_file(path):
    return path.endswith((".pt", ".pth"))


def read_any(path):
    if is_torch_file(path):
        return read_torch(path), {}
    return read_safetensors(path)


# ---- the conversions ----

def shape_text(shape):
    return "[" + ",".join(str(d) for d in shape) + "]"


def check_names(path, have, expected, optional, side, model):
    missing = [n for n in expected if n not in have]
    unknown = [n for n in have if n not in expected and n not in optional]
    if missing or unknown:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if unknown:
            parts.append("unknown " + ", ".join(unknown))
        raise ConvertError(f"{path}: not a {side} of {model.title}: {'; '.join(parts)}")


def as_float32(path, name, array, shape, model):
    if tuple(array.shape) != tuple(shape):
        raise ConvertError(f"{path}: {name} has shape {shape_text(array.shape)}, {model.title}'s "
                           f"is {shape_text(shape)}")
    if array.dtype.kind != "f":
        raise ConvertError(f"{path}: {name} is {array.dtype}, expected floating point")
    return array.astype(np.float32)


def to_towerlab(path, state, bn_eps, fold_eps, model=None):
    """(tensors, metadata, notes) of a towerlab checkpoint from a PyTorch state_dict."""
    model = model or fashion_net()
    if state and all(n.startswith("module.") for n in state):
        state = collections.OrderedDict((n[len("module."):], v) for n, v in state.items())
    table = name_table(model)
    optional = ({f"{torch_name(c)}.bias" for c in model.bn_after} |
                {f"{torch_name(bn)}.num_batches_tracked" for bn in model.bn_after.values()})
    check_names(path, state, [t for t, _, _ in table], optional, "PyTorch state_dict", model)
    if first_bn(model) and bn_eps != TOWERLAB_EPS and not fold_eps:
        raise ConvertError(f"batch norm eps {bn_eps:g} is not towerlab's {TOWERLAB_EPS:g}: the "
                           "predictions would differ; train with the model's twin in tools/ "
                           "(eps=1e-3), or pass --fold-eps to rescale gamma (exact for "
                           "inference only)")
    tensors = collections.OrderedDict(
        (tl, as_float32(path, t, state[t], shape, model)) for t, tl, shape in table)
    notes = []
    for conv, bn in model.bn_after.items():
        bias = state.get(f"{torch_name(conv)}.bias")
        if bias is not None:
            bias = as_float32(path, f"{torch_name(conv)}.bias", bias,
                              tensors[f"{bn}/moving_mean"].shape, model)
            tensors[f"{bn}/moving_mean"] = tensors[f"{bn}/moving_mean"] - bias
            notes.append(f"folded {torch_name(conv)}.bias into {bn}/moving_mean")
        if fold_eps and bn_eps != TOWERLAB_EPS:
            var = tensors[f"{bn}/moving_variance"].astype(np.float64)
            scale = np.sqrt((var + TOWERLAB_EPS) / (var + bn_eps))
            tensors[f"{bn}/gamma"] = (tensors[f"{bn}/gamma"] * scale).astype(np.float32)
            notes.append(f"rescaled {bn}/gamma for eps {bn_eps:g} (inference only)")
    bn = first_bn(model)
    tracked = state.get(f"{torch_name(bn)}.num_batches_tracked") if bn else None
    step = int(np.asarray(tracked).reshape(-1)[0]) if tracked is not None else 0
    if tracked is not None:
        notes.append(f"step from {torch_name(bn)}.num_batches_tracked")
    metadata = {"format": TOWERLAB_FORMAT, "optimizer": "none", "step": str(step),
                "optimizer_slots": "0", "model": model.title, "source": "pytorch"}
    return tensors, metadata, notes


def to_torch(path, tensors, metadata, model=None):
    """(state_dict, notes) of the model's PyTorch twin (tools/) from towerlab's file."""
    model = model or fashion_net()
    table = name_table(model)
    slots = [n for n in tensors if n.startswith("optimizer/")]
    check_names(path, tensors, [tl for _, tl, _ in table], set(slots), "towerlab checkpoint",
                model)
    step_text = metadata.get("step", "0")
    if not step_text.isdigit():
        raise ConvertError(f"{path}: malformed step count '{step_text}' in the metadata")
    step = np.array(int(step_text), dtype=np.int64)
    state = collections.OrderedDict()
    for t, tl, shape in table:
        state[t] = as_float32(path, tl, tensors[tl], shape, model)
        if t.endswith(".running_var"):
            state[t.replace("running_var", "num_batches_tracked")] = step
    notes = [f"num_batches_tracked = step {int(step)}"] if first_bn(model) else []
    if slots:
        notes.append(f"dropped the {metadata.get('optimizer', 'optimizer')} state "
                     f"({len(slots)} slot tensors)")
    return state, notes


def narrow(state, dtype):
    """The float32 arrays of `state` in `dtype` for a safetensors file; the rest as is."""
    def one(array):
        if array.dtype != np.float32 or dtype == "float32":
            return array
        return BFloat16Array(array) if dtype == "bfloat16" else array.astype("<f2")
    return collections.OrderedDict((name, one(a)) for name, a in state.items())


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments also exit 2 with one line, rather than argparse's usage block."""

    def error(self, message):
        print(f"torch_convert: {message} (--help for usage)", file=sys.stderr)
        sys.exit(2)


def main(argv):
    parser = OneLineParser(
        description="Converts the weights of towerlab's models between PyTorch and towerlab.",
        epilog="See the docstring of this file for the name mapping.")
    sub = parser.add_subparsers(dest="direction", required=True)
    into = sub.add_parser("to-towerlab", help="PyTorch state_dict -> towerlab checkpoint")
    model_help = "the model: fashion_net (default), mlp, resnet or vit (models/)"
    into.add_argument("--model", choices=list(MODELS), default="fashion_net", help=model_help)
    into.add_argument("input", help="state_dict: .pt/.pth (torch.save) or .safetensors")
    into.add_argument("output", help="towerlab checkpoint (.safetensors)")
    into.add_argument("--bn-eps", type=float, default=TOWERLAB_EPS,
                      help="batch norm eps the PyTorch model used (default 1e-3, as "
                           "tools/fashion_net_torch.py)")
    into.add_argument("--fold-eps", action="store_true",
                      help="accept another --bn-eps by rescaling gamma (exact for inference)")
    out = sub.add_parser("to-torch", help="towerlab checkpoint -> PyTorch state_dict")
    out.add_argument("--model", choices=list(MODELS), default="fashion_net", help=model_help)
    out.add_argument("input", help="towerlab checkpoint or plain weights (.safetensors)")
    out.add_argument("output", help="state_dict: .pt/.pth (torch.save) or .safetensors")
    out.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                     help="the state_dict's floating-point dtype (default float32, the "
                          "checkpoint's own; the others round to nearest even)")
    args = parser.parse_args(argv)

    model = MODELS[args.model]()
    try:
        if args.direction == "to-towerlab":
            if is_torch_file(args.output):
                raise ConvertError(f"{args.output}: a towerlab checkpoint is a .safetensors file")
            if not args.bn_eps > 0:
                raise ConvertError(f"--bn-eps must be positive, got {args.bn_eps:g}")
            state, _ = read_any(args.input)
            tensors, metadata, notes = to_towerlab(args.input, state, args.bn_eps,
                                                   args.fold_eps, model)
            write_safetensors(args.output, tensors, metadata)
        else:
            if is_torch_file(args.input):
                raise ConvertError(f"{args.input}: a towerlab checkpoint is a .safetensors file")
            tensors, metadata = read_safetensors(args.input)
            state, notes = to_torch(args.input, tensors, metadata, model)
            if is_torch_file(args.output):
                write_torch(args.output, state, args.dtype)
            else:
                write_safetensors(args.output, narrow(state, args.dtype), {"format": "pt"})
            if args.dtype != "float32":
                notes.append(f"weights rounded to {args.dtype}")
    except ConvertError as e:
        print(f"torch_convert: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"torch_convert: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {len(tensors if args.direction == 'to-towerlab' else state)} "
          f"tensors; {'; '.join(notes) if notes else 'no changes'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
