#!/usr/bin/env bash
# Builds escala_gpu_tests with measurement macros defined in the sm_90 prefill kernel files (e.g.
# ESCALA_SM90_LOOP_PAD) and keeps it xz-compressed for a device run's carry (`xz -dc` there);
# the sources are restored afterwards, also when the build fails.
#   scripts/sm90_variant.sh NAME [MACRO=VALUE ...]
#     BUILD_DIR   a configured CUDA build (default build-cuda)
#     FILES       the kernel files to define them in (default: every fwd_sm90_hd*.cu)
# Writes $BUILD_DIR/gpu_carry/NAME.xz (~6.7 MB; a device run carries at most 64 MiB).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 NAME [MACRO=VALUE ...]" >&2; exit 2; }
name="$1"; shift
[[ "$name" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "$0: NAME must be letters, digits, '.', '_' or '-'" >&2; exit 2; }
BUILD="${BUILD_DIR:-$ROOT/build-cuda}"
[ -f "$BUILD/CMakeCache.txt" ] || { echo "$0: $BUILD is not a configured build" >&2; exit 2; }
read -r -a files <<<"${FILES:-$(ls "$ROOT"/src/attention/cuda/sm90/fwd_sm90_hd*.cu | tr '\n' ' ')}"
defines=""
for def in "$@"; do
  [[ "$def" =~ ^[A-Z_][A-Z0-9_]*=[-0-9A-Za-z_]+$ ]] || { echo "$0: not MACRO=VALUE: $def" >&2; exit 2; }
  defines+="#define ${def%%=*} ${def#*=}"$'\n'
done

backup="$(mktemp -d)"
# Restored with a new time stamp, so that the next plain build recompiles them (ccache has them).
restore() {
  for f in "${files[@]}"; do cp "$backup/$(basename "$f")" "$f"; done
  rm -rf "$backup"
}
for f in "${files[@]}"; do cp -p "$f" "$backup/"; done
trap restore EXIT
for f in "${files[@]}"; do printf '%s' "$defines" | cat - "$backup/$(basename "$f")" >"$f"; done

CCACHE_DEPEND=1 cmake --build "$BUILD" -j"$(nproc)" --target escala_gpu_tests >"$BUILD/variant_$name.log" 2>&1 ||
  { tail -20 "$BUILD/variant_$name.log"; echo "$0: build failed (log: $BUILD/variant_$name.log)" >&2; exit 1; }
mkdir -p "$BUILD/gpu_carry"
xz -T0 -6 -c "$BUILD/tests/escala_gpu_tests" >"$BUILD/gpu_carry/$name.xz.tmp"
mv "$BUILD/gpu_carry/$name.xz.tmp" "$BUILD/gpu_carry/$name.xz"
echo "$BUILD/gpu_carry/$name.xz ($(du -h "$BUILD/gpu_carry/$name.xz" | cut -f1)):${defines:+ }$(printf '%s' "$defines" | tr '\n' ';')"
