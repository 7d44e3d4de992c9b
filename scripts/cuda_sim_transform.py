#!/usr/bin/env python3
"""Turns a CUDA kernel file into C++ for the host simulators (scripts/sim_*.sh).

  cuda_sim_transform.py IN OUT [--stop-at MARKER]

towerlab::cuda becomes towerlab::simcuda; launch.cuh becomes the simulator's
shim (scripts/cuda_sim_shim.h) and split_reduce.cuh its transformed copy
(split_reduce.sim.h, which the caller produces with this script too);
kernel<<<grid, block, ...>>>(args) becomes sim_launch(kernel, grid, block, args).
--stop-at cuts the file at MARKER (host-library code the simulator cannot
build, such as cuBLAS) and closes the anonymous and towerlab::simcuda namespaces.
"""
import os
import re
import sys

# One parser of launch configurations for both simulators.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_sim"))
from rewrite import split_top  # noqa: E402


def launch(m):
    args = split_top(m.group(2))
    return "sim_launch(%s, %s, %s, " % (m.group(1), args[0], args[1])


def main():
    src_path, out_path = sys.argv[1], sys.argv[2]
    src = open(src_path).read()
    if len(sys.argv) > 3:
        assert sys.argv[3] == "--stop-at", sys.argv[3]
        marker = sys.argv[4]
        src = src[: src.index(marker)] + "}  // namespace\n}  // namespace towerlab::simcuda\n"
    src = re.sub(r"#include <cublas[^>]*>\n", "", src)
    src = src.replace("namespace towerlab::cuda", "namespace towerlab::simcuda")
    src = src.replace('"kernels/cuda/launch.cuh"', '"cuda_sim_shim.h"')
    src = src.replace('"kernels/cuda/split_reduce.cuh"', '"split_reduce.sim.h"')
    src = re.sub(r"([A-Za-z_]\w*(?:<[^;()]*?>)?)\s*<<<(.*?)>>>\(", launch, src, flags=re.S)
    open(out_path, "w").write(src)


main()
