#!/usr/bin/env bash
# Real-NCCL check of the profiler plugin: 4 ranks on one GPU with PyTorch (see docs/gpu-check.md).
#   scripts/gpu_check.sh [--out DIR] [--iters N] [--sizes-mib 1,16] [--dry-run]
# Needs: this package built (pip install . or the dev build), PyTorch with CUDA, one GPU.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
# Bound the whole check (two runs of 4 ranks): it must finish in under 5 minutes.
exec timeout --kill-after=10 "${GPU_CHECK_TIMEOUT_S:-290}" "$PYTHON" "$here/gpu_check.py" "$@"
