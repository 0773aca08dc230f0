#!/usr/bin/env bash
# Build the Jaeger v2 binary (github.com/jaegertracing/jaeger/cmd/jaeger), the trace
# store of the LOCAL stack (tests, `mycroft_otel.stack`). It takes OTLP like Tempo and
# answers trace queries over HTTP (/api/v3/traces).
#
# Why not Tempo here: Tempo is AGPL-licensed and the Go module proxy of our build
# machines refuses to serve it, so it cannot be built from source in CI. Production
# and docker-compose use the official grafana/tempo image with collector_config/tempo.yaml;
# the gateway's `otlp/traces_backend` exporter speaks plain OTLP, so either backend fits.
#
# Jaeger's go.mod has replace directives, so `go install ...@version` refuses it; the
# wrapper module scripts/jaeger-wrapper/ requires it and repeats them.
# Idempotent: cached in $MYCROFT_BIN_DIR, rebuilt when the wrapper's go.mod/go.sum change.
set -euo pipefail
. "$(dirname "$0")/_build_common.sh"

WRAPPER="$REPO_ROOT/scripts/jaeger-wrapper"
JAEGER_VERSION="$(awk '$1=="require" && $2=="github.com/jaegertracing/jaeger" {print $3}' "$WRAPPER/go.mod")"
[ -n "$JAEGER_VERSION" ] || die "cannot read the Jaeger version from $WRAPPER/go.mod"
BIN="$MYCROFT_BIN_DIR/jaeger"
build_lock jaeger
STAMP="jaeger=$JAEGER_VERSION wrapper=$(cat "$WRAPPER/go.mod" "$WRAPPER/go.sum" | sha256sum | cut -c1-16)"

if up_to_date "$BIN" "$STAMP"; then
  log "up to date: $BIN ($STAMP)"; echo "$BIN"; exit 0
fi

require_go "github.com/jaegertracing/jaeger@$JAEGER_VERSION"
mkdir -p "$MYCROFT_BIN_DIR"
start=$(date +%s)
log "building jaeger $JAEGER_VERSION (several minutes on 2 cores)"
(cd "$WRAPPER" && GOFLAGS="-mod=mod -buildvcs=false" nice_build go build -trimpath -ldflags="-s -w" \
    -o "$BIN.tmp" github.com/jaegertracing/jaeger/cmd/jaeger)
mv "$BIN.tmp" "$BIN"
echo "$STAMP" > "$BIN.stamp"
end=$(date +%s)
log "built $BIN in $((end - start)) s"
echo "build_time_s jaeger $((end - start))" >&2
echo "$BIN"
