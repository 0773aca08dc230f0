# shellcheck shell=bash
# Shared helpers for the stack build scripts (sourced, not executed).
#
# MYCROFT_BIN_DIR   where built binaries are cached
#                   (default ${XDG_CACHE_HOME:-$HOME/.cache}/mycroft-otel/bin)
# MYCROFT_FORCE_BUILD=1  rebuild even when the cached binary is up to date

MYCROFT_CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/mycroft-otel"
MYCROFT_BIN_DIR="${MYCROFT_BIN_DIR:-$MYCROFT_CACHE_DIR/bin}"
MYCROFT_BUILD_DIR="$MYCROFT_CACHE_DIR/build"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

die() { echo "error: $*" >&2; exit 1; }
log() { echo "[$(basename "$0")] $*" >&2; }

# require_go: Go toolchain present and a module proxy reachable, or a clear error.
# $1: a module@version the build needs, used to probe the proxy.
require_go() {
  command -v go >/dev/null 2>&1 || die "Go is not installed (need Go >= 1.24 on PATH to build $1). Install it, or put a prebuilt binary in $MYCROFT_BIN_DIR."
  local proxy first mod ver
  proxy="$(go env GOPROXY)"
  first="${proxy%%[,|]*}"
  if [ "$first" = "off" ]; then
    die "GOPROXY=off: the Go module proxy is disabled, cannot fetch $1"
  fi
  if [ "$first" != "direct" ] && command -v curl >/dev/null 2>&1; then
    mod="${1%@*}"; ver="${1#*@}"
    if ! curl -fsS -m 30 -o /dev/null "$first/$mod/@v/$ver.info" 2>/dev/null; then
      die "the Go module proxy $first does not serve $1 (unreachable, or the version is refused). Check GOPROXY / network."
    fi
  fi
}

# up_to_date BIN STAMP_CONTENT: true when BIN exists and its stamp matches.
up_to_date() {
  [ "${MYCROFT_FORCE_BUILD:-0}" != "1" ] && [ -x "$1" ] && [ -f "$1.stamp" ] && [ "$(cat "$1.stamp")" = "$2" ]
}

# nice_build: run a command with low CPU priority (other work shares the cores).
nice_build() { nice -n "${MYCROFT_BUILD_NICE:-10}" "$@"; }

# build_lock NAME: serialise concurrent builds of the same binary (CI + test fixture).
build_lock() {
  mkdir -p "$MYCROFT_CACHE_DIR"
  exec 9>"$MYCROFT_CACHE_DIR/.build-$1.lock"
  if command -v flock >/dev/null 2>&1; then flock 9; fi
}
