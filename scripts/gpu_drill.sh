#!/usr/bin/env bash
# Fault drill on real NCCL: 4 ranks on one GPU as 4 hosts, one fresh job per fault, each verdict of the
# processor scored against the injected truth; then the plugin's overhead per NCCL wheel (docs/gpu-check.md).
#   scripts/gpu_drill.sh [--out DIR] [--only FAULT ...] [--wheels DIR] [--pairs N]
#   scripts/gpu_drill.sh --dry-run     # no GPU: the same faults and scoring on the simulator
# Results (table, drill.json, logs) go to --out, default $OUT.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
# One command, bounded: the whole drill ends within 9 minutes (DRILL_TIMEOUT_S to change it).
exec timeout --kill-after=10 "${DRILL_TIMEOUT_S:-540}" "$PYTHON" "$here/gpu_drill.py" "$@"
