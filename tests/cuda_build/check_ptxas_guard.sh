#!/bin/sh
# Checks scripts/ptxas_guard.sh against a probe kernel: the build guard must pass the clean probe
# and fail the one whose wgmma ptxas serialises. Usage: check_ptxas_guard.sh NVCC SOURCE_DIR
nvcc=$1
src=$2
out=$(mktemp -d) || exit 1
trap 'rm -rf "$out"' EXIT
compile() {
  "$src/scripts/ptxas_guard.sh" "$nvcc" -std=c++17 "--generate-code=arch=compute_90a,code=[sm_90a]" \
    -I"$src/src" "$@" -c "$src/tests/cuda_build/wgmma_guard_probe.cu" -o "$out/probe.o"
}
if ! compile >"$out/clean.log" 2>&1; then
  cat "$out/clean.log"
  echo "FAIL: the guard rejected the clean probe"
  exit 1
fi
if compile -DESCALA_PROBE_SERIALISED >"$out/serialised.log" 2>&1; then
  cat "$out/serialised.log"
  echo "FAIL: the guard passed a probe whose wgmma ptxas serialised"
  exit 1
fi
if ! grep -q "error: ptxas serialised wgmma" "$out/serialised.log"; then
  cat "$out/serialised.log"
  echo "FAIL: the serialised probe failed for another reason"
  exit 1
fi
echo "ok: clean probe compiles, serialised probe is rejected"
