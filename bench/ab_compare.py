#!/usr/bin/env python3
"""A/B comparison of escala_gpu_tests binaries on the same shapes, in one device run: each binary
runs the whole spec list in turn, in a mirrored order (a b c c b a, repeated), so that drift of the
machine's clocks over the run falls on every binary alike. Prints, per spec, each binary's median
time over its passes, its ratio to the first binary, the split count (decode) and every sample.

Usage (on the GPU machine):
  python3 bench/ab_compare.py --bin base=path/a --bin try=path/b --decode [--passes 2] SPEC...
  python3 bench/ab_compare.py --bin base=path/a --bin try=path/b --prefill --arch sm90 SPEC...
SPEC as for `escala_gpu_tests --bench-decode` / `--bench`. --eager, --warmup and --inner are passed
through (bench_timing.h).
"""
import argparse
import re
import statistics
import subprocess
import sys

from cuda_timing import add_timing_args, binary_flags


def run(binary, mode, specs, args):
    cmd = [binary, "--bench-decode" if mode == "decode" else "--bench", "--reps", str(args.reps)]
    if mode == "prefill":
        cmd += ["--arch", args.arch]
    cmd += binary_flags(args)
    out = subprocess.run(cmd + specs, capture_output=True, text=True).stdout
    res = {}
    for line in out.splitlines():
        m = re.match(r"BENCH name=(\S+) ms=([\d.]+)(?:.*splits=(\d+))?", line)
        if m:
            res[m.group(1)] = (float(m.group(2)), m.group(3) or "-")
        elif line.startswith("BENCH") and "error" in line:
            sys.stderr.write(f"{binary}: {line}\n")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", action="append", required=True, help="label=path; the first is the reference")
    kind = ap.add_mutually_exclusive_group(required=True)
    kind.add_argument("--decode", action="store_true")
    kind.add_argument("--prefill", action="store_true")
    ap.add_argument("--passes", type=int, default=2, help="mirrored passes (each runs every binary twice)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--arch", default="auto")
    add_timing_args(ap)
    ap.add_argument("specs", nargs="+")
    args = ap.parse_args()
    bins = [b.split("=", 1) for b in args.bin]
    if any(len(b) != 2 for b in bins):
        sys.exit("--bin takes label=path")
    labels = [label for label, _ in bins]
    order = (bins + bins[::-1]) * max(1, args.passes)
    samples = {}  # spec name -> label -> [(ms, splits)]
    for label, path in order:
        for name, val in run(path, "decode" if args.decode else "prefill", args.specs, args).items():
            samples.setdefault(name, {}).setdefault(label, []).append(val)
            # Each sample as it comes, so that a run cut short by a time limit still reports.
            print(f"SAMPLE {label} {name} {val[0] * 1000:.1f} us", file=sys.stderr, flush=True)
    ref = labels[0]
    for name, per in samples.items():
        med = {lb: statistics.median(ms for ms, _ in per[lb]) for lb in labels if per.get(lb)}
        cells = []
        for lb in labels:
            if lb not in med:
                cells.append(f"{lb} n/a")
                continue
            ratio = f" ({med[lb] / med[ref]:.3f})" if ref in med and lb != ref else ""
            cells.append(f"{lb} {med[lb] * 1000:.1f} us{ratio} s={per[lb][0][1]}")
        raw = "  ".join(lb + ":" + ",".join(f"{ms * 1000:.1f}" for ms, _ in per.get(lb, [])) for lb in labels)
        print(f"{name:32s} " + " | ".join(cells) + "   " + raw, flush=True)


if __name__ == "__main__":
    main()
