#!/usr/bin/env bash
# Build otelcol-mycroft with the OpenTelemetry Collector Builder (ocb) from
# collector_config/builder.yaml. Idempotent: the binary is cached in
# $MYCROFT_BIN_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/mycroft-otel/bin) and
# rebuilt only when builder.yaml or OCB_VERSION change. Prints the binary path.
set -euo pipefail
. "$(dirname "$0")/_build_common.sh"

OCB_VERSION="${OCB_VERSION:-v0.161.0}"   # keep equal to the versions in builder.yaml
MANIFEST="$REPO_ROOT/collector_config/builder.yaml"
BIN="$MYCROFT_BIN_DIR/otelcol-mycroft"
build_lock otelcol-mycroft
STAMP="ocb=$OCB_VERSION manifest=$(sha256sum "$MANIFEST" | cut -c1-16)"

if up_to_date "$BIN" "$STAMP"; then
  log "up to date: $BIN ($STAMP)"; echo "$BIN"; exit 0
fi

require_go "go.opentelemetry.io/collector/cmd/builder@$OCB_VERSION"
mkdir -p "$MYCROFT_BIN_DIR" "$MYCROFT_BUILD_DIR"
start=$(date +%s)

OCB="$MYCROFT_BIN_DIR/ocb-$OCB_VERSION"
if [ ! -x "$OCB" ]; then
  log "installing ocb $OCB_VERSION"
  GOBIN="$MYCROFT_BUILD_DIR/gobin" nice_build go install "go.opentelemetry.io/collector/cmd/builder@$OCB_VERSION"
  mv "$MYCROFT_BUILD_DIR/gobin/builder" "$OCB"
fi

WORK="$MYCROFT_BUILD_DIR/otelcol-mycroft"
rm -rf "$WORK"; mkdir -p "$WORK"
# Same manifest, output redirected into the cache build dir.
sed "s#^\(\s*output_path:\).*#\1 $WORK/src#" "$MANIFEST" > "$WORK/builder.yaml"
log "building otelcol-mycroft (this takes several minutes on 2 cores)"
(cd "$WORK" && nice_build "$OCB" --config "$WORK/builder.yaml")
install -m 0755 "$WORK/src/otelcol-mycroft" "$BIN"
echo "$STAMP" > "$BIN.stamp"
end=$(date +%s)
log "built $BIN in $((end - start)) s"
echo "build_time_s otelcol-mycroft $((end - start))" >&2
echo "$BIN"
