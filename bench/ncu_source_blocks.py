#!/usr/bin/env python3
"""Where one kernel's warp-stall samples fall, by block of SASS, from an `ncu` source page.

A block is a run of consecutive instructions executed the same number of times (straight-line code
of one loop level), so per-item and per-tile code separate by their counts: with I items of T key
tiles and W consumer warps, per-item code runs I*W times and the tile loop I*(T-1)*W times.

Make the input on the GPU machine (clocks left alone, as METHOD.md asks):
  ncu --clock-control none --set full --import-source yes -k regex:fwd_sm90 --launch-skip 3 \
      --launch-count 1 -o rep BINARY --bench --reps 1 --arch sm90 SPEC
  ncu -i rep.ncu-rep --page source --csv --print-source sass > src.csv      (gzip is fine)

Usage:
  python3 bench/ncu_source_blocks.py src.csv.gz [--min-share 0.004] [--detail]
      [--label 65536=item --label 458752=tile]
Prints the total samples, each block holding at least --min-share of them (first instruction
index, execution count, instructions, samples, share, top stall reasons), with --detail the
block's hottest instructions, and with --label the share per labelled execution count.
"""
import argparse
import collections
import csv
import gzip
import sys


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    # The page starts with the kernel's name on a line of its own, then the header.
    for i, row in enumerate(rows):
        if "Address" in row and "Source" in row:
            return row, rows[i + 1:]
    sys.exit(f"{path}: no 'Address,Source,...' header: not an ncu source page in CSV")


def to_int(text):
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--min-share", type=float, default=0.004, help="smallest block share printed")
    ap.add_argument("--detail", action="store_true", help="print each block's hottest instructions")
    ap.add_argument("--label", action="append", default=[], help="COUNT=NAME, a name for an execution count")
    args = ap.parse_args()
    labels = {}
    for item in args.label:
        count, _, name = item.partition("=")
        if not count.isdigit() or not name:
            sys.exit(f"--label takes COUNT=NAME, not {item!r}")
        labels[int(count)] = name

    header, data = read_rows(args.csv)
    col = {name: i for i, name in enumerate(header)}
    for need in ("Source", "Instructions Executed", "Warp Stall Sampling (All Samples)"):
        if need not in col:
            sys.exit(f"{args.csv}: column {need!r} missing (run ncu with --set full --import-source yes)")
    stall_cols = [(name[len("stall_"):], i) for name, i in col.items()
                  if name.startswith("stall_") and "Not Issued" not in name]

    blocks = []
    total = 0
    for index, row in enumerate(data):
        executed = to_int(row[col["Instructions Executed"]])
        samples = to_int(row[col["Warp Stall Sampling (All Samples)"]])
        total += samples
        if not blocks or blocks[-1]["executed"] != executed:
            blocks.append({"start": index, "executed": executed, "n": 0, "samples": 0,
                           "stalls": collections.Counter(), "hot": []})
        b = blocks[-1]
        b["n"] += 1
        b["samples"] += samples
        for name, i in stall_cols:
            b["stalls"][name] += to_int(row[i])
        b["hot"].append((samples, index, row[col["Source"]].strip()))
    if total == 0:
        sys.exit(f"{args.csv}: no stall samples")

    print(f"{len(data)} instructions, {total} samples")
    for b in blocks:
        share = b["samples"] / total
        if share < args.min_share:
            continue
        top = ", ".join(f"{k} {v}" for k, v in b["stalls"].most_common(4) if v)
        print(f"[{b['start']:5d}] executed {b['executed']:9d}  {b['n']:4d} instr  {b['samples']:7d} samples"
              f" ({100 * share:5.1f}%)  {top}")
        if args.detail:
            for samples, index, source in sorted(b["hot"], reverse=True)[:8]:
                if samples:
                    print(f"        {index:5d} {samples:6d}  {source[:100]}")
    if labels:
        per = collections.Counter()
        for b in blocks:
            per[labels.get(b["executed"], "other")] += b["samples"]
        print("by execution count: " + ", ".join(f"{name} {100 * s / total:.1f}%" for name, s in per.most_common()))


if __name__ == "__main__":
    main()
