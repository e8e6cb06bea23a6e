#!/bin/sh
# Compiler launcher for the CUDA library (CUDA_COMPILER_LAUNCHER in CMakeLists.txt): runs the command and
# fails it when ptxas reports that it serialised wgmma instructions or injected a wait for them
# (its "C75xx" notes, printed as info, not as warnings). Such a kernel is correct but runs 25-35%
# slower (docs/cuda_notes.md, step 29), which only a GPU would otherwise show.
# ccache (when the user launches through it) in depend mode: its default preprocessed mode hashes
# nvcc's host-side preprocessing only when several -gencode targets are given, so an edit inside
# an `#if __CUDA_ARCH__` block (every sm_90 kernel body) returned the stale object (ccache 4.7).
export CCACHE_DEPEND=1
log=$(mktemp) || exit 1
"$@" 2>"$log"
rc=$?
cat "$log" >&2
if [ "$rc" -eq 0 ] && grep -Eq 'wgmma[^ ]* instructions are serialized|warpgroup\.(wait|arrive) is injected' "$log"; then
  echo "error: ptxas serialised wgmma in this file (see its notes above): the kernel would lose its overlap" >&2
  rc=1
fi
rm -f "$log"
exit "$rc"
