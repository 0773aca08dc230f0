#!/usr/bin/env bash
# The full test suite on a fresh machine (README's second command; .ci/run calls it).
# Installs what the tests need, builds the native code (plus a ThreadSanitizer build),
# builds or reuses the Collector/Jaeger/Prometheus binaries, then runs ctest and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
step() { printf '\n=== %s (%s)\n' "$*" "$(date +%T)"; }

step "python dependencies"
python3 scripts/install_deps.py test

step "headless Chromium for the report's browser tests (installed once)"
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends chromium
fi

step "native build (in place) + GoogleTest"
# the bindings for the interpreter that install_deps.py filled and pytest runs (a venv's, when one is active)
cmake -S . -B build/dev -G Ninja -DMYCROFT_INPLACE=ON -DMYCROFT_BUILD_TESTS=ON \
  -DPython_EXECUTABLE="$(python3 -c 'import sys; print(sys.executable)')" >/dev/null
cmake --build build/dev
ctest --test-dir build/dev --output-on-failure

step "native build under ThreadSanitizer + GoogleTest"
cmake -S . -B build/tsan -G Ninja -DMYCROFT_TSAN=ON -DMYCROFT_BUILD_TESTS=ON -DMYCROFT_BUILD_PYTHON=OFF >/dev/null
cmake --build build/tsan
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest --test-dir build/tsan --output-on-failure -L tsan

step "collector, Jaeger, Prometheus (cached after the first run)"
bash scripts/build_stack.sh

step "Alertmanager (alert delivery in tests/e2e) and Grafana's TraceQL grammar (tests/grafana)"
bash scripts/install_alertmanager.sh
if [ ! -d tests/grafana/traceql/node_modules/@grafana/lezer-traceql ] \
   || [ tests/grafana/traceql/package-lock.json -nt tests/grafana/traceql/node_modules ]; then
  npm ci --prefix tests/grafana/traceql --no-audit --no-fund
fi

step "pytest"
export MYCROFT_ABI_FULL=1
python3 -m pytest -q -ra "$@"
