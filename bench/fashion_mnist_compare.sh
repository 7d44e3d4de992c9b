#!/usr/bin/env bash
# FashionNet training throughput on this machine's CPU: towerlab's fashion_mnist
# sample against PyTorch (Debian's python3-torch with OpenBLAS set for the CPU's best
# kernel, 2 threads: the peer at its best, ../shared/PEERS.md), measured one after the other
# in one call, with the same model, batch, optimizer and data.
# Usage: bench/fashion_mnist_compare.sh [steps] [batch]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-100}
batch=${2:-128}
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    python3-torch libopenblas0-pthread dataset-fashion-mnist
fi
cmake --preset release >/dev/null
cmake --build --preset release --target fashion_mnist >/dev/null

# SkylakeX where the CPU has AVX-512 (PEERS.md); on CPUs without it that kernel dies
# with an illegal instruction, and Haswell (AVX2 + FMA) is OpenBLAS's best.
coretype=Haswell
grep -q avx512f /proc/cpuinfo && coretype=SkylakeX
export OPENBLAS_CORETYPE=$coretype OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2
echo "peer configuration: PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'), OpenBLAS $coretype, 2 threads"
peer=$(/usr/bin/python3 bench/fashion_mnist_torch.py --steps "$steps" --batch "$batch")
echo "peer:     $peer"

out=$(mktemp -d)
for devices in cpu cpu,cpu; do
  build/release/samples/fashion_mnist --devices "$devices" --epochs 1 --steps "$((steps + 10))" \
    --batch "$batch" --progress-every 0 --metrics "$out/m.json" >/dev/null
  ours=$(cat "$out/m.json")
  echo "towerlab ($devices): $ours" | tr -d '\n'; echo
  /usr/bin/python3 - "$out/m.json" "$peer" "$devices" <<'PY'
import json, sys
ours = json.load(open(sys.argv[1]))["images_per_second"]
peer = json.loads(sys.argv[2])["images_per_second"]
print(f"towerlab {sys.argv[3]}: {ours:.0f} images/s, PyTorch: {peer:.0f} images/s, ratio {ours / peer:.2f}")
PY
done
rm -rf "$out"
