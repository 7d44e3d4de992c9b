#!/usr/bin/env python3
"""Turns the CUDA kernel files into C++ for the host simulator (scripts/sim_kernels.sh).

The rewrite is mechanical and the same for every file, so what is compiled is the
kernels' own text:
  - namespace towerlab::cuda (and cuda::) becomes towerlab::simcuda, in the .cu/.cuh
    files and in the cuda blocks of the families' headers, so the simulated
    launchers sit beside the library's CPU ones (and its real CUDA ones, if any);
  - kernel<<<grid, block, shared, stream>>>(args) becomes
    sim_launch(grid, block, [&](auto... a) { kernel(a...); }, args)
    (a lambda, so a kernel template whose arguments are deduced, or a kernel held
    in a variable, launches as it is written).
Everything else (the CUDA vocabulary, <cuda_runtime.h>, CUB) comes from the
headers in this folder, found first on the include path.

  rewrite.py ROOT OUT [--drop-block-sum-barrier]
writes OUT/kernels/cuda/<family>.cpp, OUT/kernels/cuda/*.cuh, OUT/kernels/cuda/*.h (the
families' internal CUDA headers) and OUT/kernels/<family>.h.
--drop-block-sum-barrier deletes the first __syncthreads() of launch.cuh's
block_sum: the control run that proves ThreadSanitizer reports a missing barrier.
"""
import os
import re
import sys

FAMILIES = ["batchnorm", "bias", "elementwise", "loss", "optimizer", "pool2d", "random",
            "reduce", "relu"]
LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^;()]*?>)?)\s*<<<(.*?)>>>\(\s*(\))?", re.S)


def split_top(s):
    """Splits at the commas outside parentheses and angle brackets."""
    out, depth, cur = [], 0, ""
    for ch in s:
        depth += ch in "(<"
        depth -= ch in ")>"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()]


def launch(m):
    config = split_top(m.group(2))
    head = "sim_launch(%s, %s, [&](auto... a) { %s(a...); }" % (config[0], config[1], m.group(1))
    return head + (")" if m.group(3) else ", ")


def rewrite_code(src):
    src = re.sub(r"\btowerlab::cuda\b", "towerlab::simcuda", src)
    src = re.sub(r"(?<![\w:])cuda::", "simcuda::", src)
    return LAUNCH.sub(launch, src)


def drop_block_sum_barrier(src):
    m = re.search(r"__device__ V block_sum\(V v\) \{(.*?)\n\}\n", src, re.S)
    if m is None or "__syncthreads();" not in m.group(1):
        sys.exit("rewrite.py: launch.cuh's block_sum(V v) with a __syncthreads() not found: "
                 "update the control mutation")
    body = m.group(1).replace("__syncthreads();", "/* control: barrier removed */", 1)
    return src[:m.start(1)] + body + src[m.end(1):]


def main():
    root, out = sys.argv[1], sys.argv[2]
    mutate = "--drop-block-sum-barrier" in sys.argv[3:]
    os.makedirs(os.path.join(out, "kernels", "cuda"), exist_ok=True)
    cuda_dir = os.path.join(root, "kernels", "cuda")
    for name in sorted(os.listdir(cuda_dir)):
        if not name.endswith((".cuh", ".h")):
            continue
        src = rewrite_code(open(os.path.join(cuda_dir, name)).read())
        if name == "launch.cuh" and mutate:
            src = drop_block_sum_barrier(src)
        open(os.path.join(out, "kernels", "cuda", name), "w").write(src)
    for family in FAMILIES:
        src = rewrite_code(open(os.path.join(cuda_dir, family + ".cu")).read())
        open(os.path.join(out, "kernels", "cuda", family + ".cpp"), "w").write(src)
        header = open(os.path.join(root, "kernels", family + ".h")).read()
        header = header.replace("namespace cuda {", "namespace simcuda {")
        header = header.replace("}  // namespace cuda", "}  // namespace simcuda")
        open(os.path.join(out, "kernels", family + ".h"), "w").write(header)


if __name__ == "__main__":
    main()
