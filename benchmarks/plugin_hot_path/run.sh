#!/usr/bin/env bash
# Builds and runs the plugin hot-path benchmark (see README.md).
#   benchmarks/plugin_hot_path/run.sh [plugin.so] [ops_per_thread] [repeats]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${BENCH_BUILD_DIR:-$root/build/bench}"
mkdir -p "$out"
plugin="${1:-}"
if [[ -z "$plugin" ]]; then
  plugin="$root/mycroft_otel/lib/libnccl-profiler-mycroft.so"
  if [[ ! -f "$plugin" ]]; then
    cmake -S "$root" -B "$out/cmake" -G Ninja -DMYCROFT_BUILD_PYTHON=OFF -DMYCROFT_BUILD_TESTS=OFF >/dev/null
    nice cmake --build "$out/cmake" --target nccl-profiler-mycroft >/dev/null
    plugin="$out/cmake/native/libnccl-profiler-mycroft.so"
  fi
fi
CXX="${CXX:-g++}"
nice "$CXX" -std=c++17 -O2 -fPIC -shared -fvisibility=hidden -I"$root/native/include" \
  "$here/noop_plugin.cc" -o "$out/libnoop-profiler.so"
nice "$CXX" -std=c++17 -O2 -I"$root/native/include" "$here/bench.cc" -o "$out/plugin_hot_path" -ldl -lpthread
echo "plugin: $plugin"
"$out/plugin_hot_path" "$plugin" "$out/libnoop-profiler.so" "${2:-20000}" "${3:-15}"
