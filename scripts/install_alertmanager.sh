#!/usr/bin/env bash
# Make `alertmanager` available for the local stack's alert delivery test (tests/e2e).
# Order: a binary already in $MYCROFT_BIN_DIR or on PATH (alertmanager, or Debian's name
# prometheus-alertmanager) -> Debian's `prometheus-alertmanager` package (apt-get, as root).
# Linked into $MYCROFT_BIN_DIR as `alertmanager`. Idempotent. Prints the bin dir.
set -euo pipefail
. "$(dirname "$0")/_build_common.sh"

build_lock alertmanager
mkdir -p "$MYCROFT_BIN_DIR"

found() {
  for b in "$MYCROFT_BIN_DIR/alertmanager" "$(command -v alertmanager || true)" \
           "$(command -v prometheus-alertmanager || true)"; do
    [ -n "$b" ] && [ -x "$b" ] && { echo "$b"; return 0; }
  done
  return 1
}

if ! bin=$(found); then
  [ "$(id -u)" = "0" ] || die "alertmanager not found and not root: sudo apt-get install -y --no-install-recommends prometheus-alertmanager, or put an alertmanager binary in $MYCROFT_BIN_DIR"
  command -v apt-get >/dev/null 2>&1 || die "alertmanager not found and no apt-get: put an alertmanager binary in $MYCROFT_BIN_DIR"
  log "installing Debian package 'prometheus-alertmanager'"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y --no-install-recommends prometheus-alertmanager >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    apt-get install -y --no-install-recommends prometheus-alertmanager >/dev/null
  fi
  # the package starts a system service on :9093; the stack runs its own on a free port
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus-alertmanager 2>/dev/null; then
    systemctl stop prometheus-alertmanager || true
  elif [ -x /etc/init.d/prometheus-alertmanager ]; then
    /etc/init.d/prometheus-alertmanager stop >/dev/null 2>&1 || true
  fi
  bin=$(found) || die "prometheus-alertmanager installed but no binary found"
fi
[ -x "$MYCROFT_BIN_DIR/alertmanager" ] || ln -sf "$bin" "$MYCROFT_BIN_DIR/alertmanager"
log "$("$MYCROFT_BIN_DIR/alertmanager" --version 2>&1 | head -1)"
echo "$MYCROFT_BIN_DIR"
