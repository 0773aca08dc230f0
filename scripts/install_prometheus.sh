#!/usr/bin/env bash
# Make `prometheus` and `promtool` available for the local stack and the rule tests.
# Order: binaries already on PATH or in $MYCROFT_BIN_DIR -> Debian's `prometheus`
# package (apt-get install, only when running as root). The binaries are linked
# into $MYCROFT_BIN_DIR so the stack runner finds everything in one place.
# Idempotent. Prints the bin dir.
set -euo pipefail
. "$(dirname "$0")/_build_common.sh"

build_lock prometheus
mkdir -p "$MYCROFT_BIN_DIR"
start=$(date +%s)
installed=0

have() { [ -x "$MYCROFT_BIN_DIR/$1" ] || command -v "$1" >/dev/null 2>&1; }

if ! have prometheus || ! have promtool; then
  if [ "$(id -u)" != "0" ]; then
    die "prometheus/promtool not found and not root: install Debian's 'prometheus' package (sudo apt-get install -y --no-install-recommends prometheus) or put both binaries in $MYCROFT_BIN_DIR"
  fi
  command -v apt-get >/dev/null 2>&1 || die "prometheus/promtool not found and no apt-get: put both binaries in $MYCROFT_BIN_DIR"
  log "installing Debian package 'prometheus' (prometheus + promtool)"
  installed=1
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    apt-get install -y --no-install-recommends prometheus >/dev/null
  fi
  # The package enables a system service on :9090; the stack runs its own
  # instance on a free port, so stop the packaged one where systemd/init runs it.
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    systemctl stop prometheus || true
  elif [ -x /etc/init.d/prometheus ]; then
    /etc/init.d/prometheus stop >/dev/null 2>&1 || true
  fi
fi

for b in prometheus promtool; do
  if [ ! -x "$MYCROFT_BIN_DIR/$b" ]; then
    ln -sf "$(command -v "$b")" "$MYCROFT_BIN_DIR/$b"
  fi
done
end=$(date +%s)
log "$("$MYCROFT_BIN_DIR/prometheus" --version 2>&1 | head -1)"
[ "$installed" = 1 ] && echo "build_time_s prometheus $((end - start))" >&2
echo "$MYCROFT_BIN_DIR"
