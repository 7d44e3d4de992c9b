#!/usr/bin/env bash
# Installs the Debian packages towerlab needs to build and test. Safe to run
# again: apt-get skips what is already there. The CUDA toolkit is not a Debian
# package here; it is found in /usr/local/cuda when present.
set -euo pipefail

packages=(
  cmake ninja-build g++ ccache pkg-config
  googletest libgtest-dev libbenchmark-dev
  zlib1g-dev nlohmann-json3-dev libcli11-dev libyaml-cpp-dev
  libboost-context-dev  # the emulated GPUs' fiber switches
  libopenblas-dev python3-numpy dataset-fashion-mnist
  clang libclang-rt-dev
  openmpi-bin libopenmpi-dev
  # PyTorch, for the test that FashionNet crosses between PyTorch and towerlab
  # (tests/torch_convert_test.py): about 140 MB to download, 600 MB installed.
  python3-torch
)

missing=()
for p in "${packages[@]}"; do
  grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" || missing+=("$p")
done

if [ "${#missing[@]}" -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
