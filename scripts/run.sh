#!/usr/bin/env bash
# Builds towerlab and runs its main program: samples/fashion_mnist, which trains
# FashionNet on Fashion-MNIST with tower parallelism. Arguments go to the sample
# (e.g. scripts/run.sh --epochs 1 --steps 50, or --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target fashion_mnist
exec build/release/samples/fashion_mnist "$@"
