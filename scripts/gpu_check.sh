#!/usr/bin/env bash
# One command on a CUDA (Hopper) machine: build the CUDA library and GPU tests, run the tests,
# compute-sanitizer memcheck + racecheck on small shapes, then the prefill and decode benchmark
# tables.
# Logs go to $OUT (default build-gpu/gpu_check, ignored by git).
#   ESCALA_GPU_BIN=path   use an already built escala_gpu_tests instead of building (e.g. on a GPU
#                         machine without the CPU library's dependencies: build it elsewhere; it
#                         needs only libcudart.so.13 at run time)
#   SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_DECODE_BENCH=1   leave steps out
#   BENCH_ARGS="--reps 30 --filter d128"           passed to bench/attention_prefill_bench.py
#   GTEST_ARGS="--gtest_filter=..."                passed to the test run
#   TEST_TIMEOUT / SANITIZER_TIMEOUT / BENCH_TIMEOUT  seconds per step (a hung kernel fails its step)
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-$ROOT/build-gpu/gpu_check}"
mkdir -p "$OUT"
status=0
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>&1 | tee "$OUT/device.log"
(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null) | tee -a "$OUT/device.log"

BIN="${ESCALA_GPU_BIN:-}"
if [ -z "$BIN" ]; then
  step "build"
  BUILD="${BUILD_DIR:-$ROOT/build-gpu}"
  if cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="80;90a" >"$OUT/build.log" 2>&1 &&
     cmake --build "$BUILD" --target escala_gpu_tests -j16 >>"$OUT/build.log" 2>&1; then
    BIN="$BUILD/tests/escala_gpu_tests"
    grep -E "registers|spill" "$OUT/build.log" | head -40
  else
    tail -30 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
  fi
fi
echo "binary: $BIN"

if [ -z "${SKIP_TESTS:-}" ]; then
  step "gpu tests"
  timeout "${TEST_TIMEOUT:-600}" "$BIN" ${GTEST_ARGS:-} >"$OUT/gpu_tests.log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED)|^\[       OK|^\[  FAILED|Failure|error" "$OUT/gpu_tests.log" | head -60
  echo "gpu tests rc=$rc"; [ $rc -eq 0 ] || status=1
fi

if [ -z "${SKIP_SANITIZER:-}" ]; then
  for tool in memcheck racecheck; do
    step "compute-sanitizer $tool"
    timeout "${SANITIZER_TIMEOUT:-300}" compute-sanitizer --tool $tool --error-exitcode 9 "$BIN" --gtest_filter='AttentionCudaSmall.*:DecodeCudaSmall.*' >"$OUT/sanitizer_$tool.log" 2>&1
    rc=$?
    tail -4 "$OUT/sanitizer_$tool.log"
    echo "$tool rc=$rc"; [ $rc -eq 0 ] || status=1
  done
fi

if [ -z "${SKIP_BENCH:-}" ]; then
  step "benchmark"
  PYTHONUNBUFFERED=1 timeout "${BENCH_TIMEOUT:-900}" python3 "$ROOT/bench/attention_prefill_bench.py" --bin "$BIN" ${BENCH_ARGS:-} \
    >"$OUT/bench.log" 2>"$OUT/bench_err.log"
  rc=$?
  grep -E "BENCH|Error|error" "$OUT/bench_err.log" | head -40
  cat "$OUT/bench.log"
  echo "bench rc=$rc"; [ $rc -eq 0 ] || status=1
fi
if [ -z "${SKIP_DECODE_BENCH:-}" ]; then
  step "decode benchmark"
  PYTHONUNBUFFERED=1 timeout "${BENCH_TIMEOUT:-900}" python3 "$ROOT/bench/attention_decode_bench.py" --bin "$BIN" \
    >"$OUT/decode_bench.log" 2>"$OUT/decode_bench_err.log"
  rc=$?
  grep -E "Error|error" "$OUT/decode_bench_err.log" | head -20
  cat "$OUT/decode_bench.log"
  echo "decode bench rc=$rc"; [ $rc -eq 0 ] || status=1
fi
step "done, status=$status"
exit $status
