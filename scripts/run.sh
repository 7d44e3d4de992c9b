#!/usr/bin/env bash
# Builds towerlab and runs its main program: today towerlab_devices, which lists
# the devices and checks a computation on each. Extra arguments are passed on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target towerlab_devices
exec build/release/samples/towerlab_devices "$@"
