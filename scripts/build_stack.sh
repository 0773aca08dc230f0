#!/usr/bin/env bash
# Build or reuse every binary of the local stack, cached in $MYCROFT_BIN_DIR
# (default ${XDG_CACHE_HOME:-$HOME/.cache}/mycroft-otel/bin):
#   otelcol-mycroft   scripts/build_collector.sh  (ocb + collector_config/builder.yaml)
#   jaeger            scripts/build_jaeger.sh     (trace store of the local stack; Tempo is
#                                                   AGPL and is not built here, see that script)
#   prometheus, promtool  scripts/install_prometheus.sh (Debian package)
# Idempotent; a second run takes a second. Prints one "build_time_s NAME SECONDS" line per
# binary on stderr and the bin dir on stdout.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/_build_common.sh"
start=$(date +%s)
bash "$here/install_prometheus.sh" >/dev/null
bash "$here/build_collector.sh" >/dev/null
bash "$here/build_jaeger.sh" >/dev/null
log "stack ready in $MYCROFT_BIN_DIR ($(( $(date +%s) - start )) s in all)"
echo "$MYCROFT_BIN_DIR"
