#!/usr/bin/env bash
# The real-NCCL fault drill as one command (docs/gpu-check.md, "The fault drill"): on a bare GPU machine it
# installs the carried wheels (.gpu-wheels, scripts/gpu_wheels.py), builds the plugin and bindings in place with
# /usr/bin/g++, injects each fault into a fresh 4-rank job, scores the verdicts, then measures the plugin's
# overhead while its 8-minute budget lasts; table and evidence to $OUT (or --out).
#   scripts/gpu_drill.sh                    # the device call's command
#   scripts/gpu_drill.sh --plan             # the steps and their time budget; needs no GPU
#   scripts/gpu_drill.sh --dry-run --out D  # no GPU: the same faults and scoring on the simulator (CI)
# Other options go to gpu_drill.py (--only FAULT..., --skip-overhead, --nccl-lib PATH, --pairs N, ...).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
# The drill plans for 480 s; whatever is left at 500 s is killed (DRILL_TIMEOUT_S to change it). Rows and
# evidence are written after every job, so a drill cut short still leaves what it measured.
exec timeout --kill-after=10 "${DRILL_TIMEOUT_S:-500}" "$PYTHON" "$here/gpu_drill.py" "$@"
