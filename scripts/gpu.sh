#!/usr/bin/env bash
# Starts scripts/gpu.py, the GPU run (prepare here; verify, measure, lease, ... on the GPU
# machine: its opening comment and docs/gpu.md), with the GPU machine's Python: bare python3
# may not be on its PATH, and its Python lives in /opt/torch/.venv.
for python in "${TOWERLAB_GPU_PYTHON:-}" /opt/torch/.venv/bin/python3 "$(command -v python3)"; do
  [ -n "$python" ] && [ -x "$python" ] && exec "$python" "$(dirname "$0")/gpu.py" "$@"
done
echo "gpu.sh: FAILED: no Python: neither /opt/torch/.venv/bin/python3 nor python3 on the PATH (set TOWERLAB_GPU_PYTHON)" >&2
exit 1
