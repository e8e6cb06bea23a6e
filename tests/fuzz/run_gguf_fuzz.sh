#!/usr/bin/env bash
# Builds the GGUF reader fuzzer with clang (ASan + UBSan + libFuzzer), seeds a corpus with
# writer-made files, and fuzzes for SECONDS (default 60; CI uses a bounded time, longer runs by
# hand). Prints the crash-free run count; exits non-zero on any crash.
#
#   tests/fuzz/run_gguf_fuzz.sh [SECONDS] [BUILD_DIR]
set -euo pipefail
seconds="${1:-60}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${2:-$root/build-fuzz}"
cmake -S "$root/tests/fuzz" -B "$build" -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null
mkdir -p "$build/corpus"
"$build/escala_gguf_fuzz_seed" "$build/corpus" >/dev/null
"$build/escala_gguf_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$build/" "$build/corpus" 2>&1 | tee "$build/fuzz.log" | grep -E "^(Done|stat::number_of_executed_units)" || true
if ! grep -q "^Done" "$build/fuzz.log"; then
  echo "fuzzer stopped early: see $build/fuzz.log and $build/crash-*" >&2
  exit 1
fi
