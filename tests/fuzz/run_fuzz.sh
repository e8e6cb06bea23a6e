#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan), seeds their corpora, and fuzzes each
# for SECONDS (default 60, split over the targets: gguf and protocol two sevenths each, npy,
# tokenizer and json a seventh each). Prints each target's run count; exits non-zero on any crash or broken property,
# leaving the input as BUILD_DIR/crash-*. CI uses a bounded time; run longer by hand.
#
#   tests/fuzz/run_fuzz.sh [SECONDS] [BUILD_DIR] [TARGET...]    TARGET: gguf npy tokenizer protocol json
set -euo pipefail
seconds="${1:-60}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${2:-$root/build-fuzz}"
shift $(($# > 2 ? 2 : $#))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf npy tokenizer protocol json)
cmake -S "$root/tests/fuzz" -B "$build" -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null
"$build/escala_fuzz_seeds" "$build/corpus" >/dev/null
for t in "${targets[@]}"; do
  case "$t" in
    gguf | protocol) share=2 ;;
    npy | tokenizer | json) share=1 ;;
    *) echo "run_fuzz.sh: unknown target '$t' (gguf, npy, tokenizer, protocol, json)" >&2; exit 2 ;;
  esac
  t_seconds=$((seconds * share / 7 > 0 ? seconds * share / 7 : 1))
  [ ${#targets[@]} -gt 1 ] || t_seconds="$seconds"
  dict=()
  [ -f "$root/tests/fuzz/$t.dict" ] && dict=(-dict="$root/tests/fuzz/$t.dict")
  log="$build/$t.log"
  "$build/escala_${t}_fuzz" -max_total_time="$t_seconds" -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" \
    -artifact_prefix="$build/" "$build/corpus/$t" >"$log" 2>&1 || true
  if ! grep -q "^Done" "$log"; then
    tail -30 "$log" >&2
    echo "run_fuzz.sh: the $t fuzzer stopped early: see $log and $build/crash-*" >&2
    exit 1
  fi
  echo "run_fuzz.sh: $t: $(grep -o 'Done [0-9]* runs' "$log") in $t_seconds s, no crash"
done
