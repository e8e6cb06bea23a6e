#!/usr/bin/env bash
# Builds Escala with warnings as errors and runs the whole test suite (ctest), then rebuilds the
# tests with AddressSanitizer + UndefinedBehaviorSanitizer and runs the parsers, the KV cache and
# the command line under them, and fuzzes the parsers (GGUF, .npy, the tokenizers, the OpenAI
# request) for a bounded time with clang's libFuzzer.
# GPU tests carry the ctest label `gpu` and skip without a GPU.
#
#   scripts/test.sh                                  everything
#   ESCALA_SKIP_SANITIZE=1 scripts/test.sh           skip the sanitizer run
#   ESCALA_SANITIZE_FILTER='^Npy' scripts/test.sh    another ctest -R filter for the sanitizer run
#   ESCALA_FUZZ_SECONDS=0 scripts/test.sh            skip the fuzzers (default 120 s in all)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

JOBS="${ESCALA_JOBS:-$(nproc)}"
# Test names are GoogleTest suite.test; these suites are the npy reader, the KV planner, block
# manager, streaming and paged attention, the CLI end-to-end tests, corrupt model files, and the
# structured-output schemas and recogniser.
SANITIZE_FILTER="${ESCALA_SANITIZE_FILTER:-^(Npy|Kv|Cli|ModelLoad|Json)}"

# The end-to-end server tests run the default model: fetch it if this checkout lacks it.
scripts/fetch_model.sh

start=$(date +%s)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DESCALA_WERROR=ON
cmake --build build -j "$JOBS"
ctest --test-dir build --output-on-failure -j 2
echo "test.sh: main suite passed in $(($(date +%s) - start)) s"

if [ "${ESCALA_SKIP_SANITIZE:-0}" = 0 ]; then
  start=$(date +%s)
  # CUDA off: nvcc does not take the sanitizer flags, and nothing here runs on a GPU. Warnings are
  # not errors here: GCC's flow warnings give false positives under -fsanitize (the Werror build
  # above already holds the code to them). -O1 with asserts on: half the compile time of -O3
  # under instrumentation, and the tests still run in seconds.
  cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-O1 \
    -DESCALA_WERROR=OFF -DESCALA_SANITIZE=ON -DESCALA_CUDA=OFF
  cmake --build build-sanitize -j "$JOBS" --target escala_tests
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    ctest --test-dir build-sanitize --output-on-failure -j 2 -R "$SANITIZE_FILTER"
  echo "test.sh: sanitizer run (${SANITIZE_FILTER}) passed in $(($(date +%s) - start)) s"
fi

fuzz_seconds="${ESCALA_FUZZ_SECONDS:-120}"
if [ "$fuzz_seconds" != 0 ]; then
  if command -v clang++ >/dev/null; then
    tests/fuzz/run_fuzz.sh "$fuzz_seconds" build-fuzz
  else
    echo "test.sh: clang++ not found, fuzzers skipped (scripts/setup.sh --deps-only installs it)" >&2
  fi
fi
