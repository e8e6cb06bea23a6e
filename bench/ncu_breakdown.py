#!/usr/bin/env python3
"""Per-kernel breakdown of one benchmark call with Nsight Compute: for every kernel launch of an
`escala_gpu_tests --bench` / `--bench-decode` run, one line with its grid, duration, DRAM bytes read
and written, and the SM and L2 throughput (% of peak), so that a call made of several kernels
(the cascade: prefix pass, merges, own-token decode) shows where its time goes in one device run.

Usage (on the GPU machine; ncu is on its PATH):
  python3 bench/ncu_breakdown.py --bin B --decode "casc,B=128,T=128,h=32,hk=8,d=128,prefix=32768"
  python3 bench/ncu_breakdown.py --bin B --prefill "d128,B=8,S=4096,h=16,hk=16,d=128,causal=1"
  [--skip N] [--count N] [--kernel REGEX]

The clocks are left as they are (--clock-control none: the machine's note says so), and ncu
flushes the caches before each kernel, so a kernel that reads what the previous one left in L2
reads it from HBM here: compare durations between variants, not against the event-timed benches.
"""
import argparse
import re
import subprocess
import sys

METRICS = {
    "gpu__time_duration.sum": "us",
    "dram__bytes_read.sum": "MB read",
    "dram__bytes_write.sum": "MB written",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM %",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2 %",
}
SCALE = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6,
         "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "%": 1.0}


def parse(out):
    """(kernel, grid, {metric: value in the unit of METRICS}) per launch, in launch order."""
    launches, cur = [], None
    for line in out.splitlines():
        m = re.match(r"\s{2}(?:void )?(.+?)\s+\((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\)", line)
        if m:
            name = re.sub(r"[<(].*", "", m.group(1).replace("<unnamed>::", "")).split("::")[-1]
            cur = (name, f"{m.group(2)}x{m.group(3)}x{m.group(4)}", {})
            launches.append(cur)
            continue
        m = re.match(r"\s+(\S+)\s+(\S+)\s+([\d.,]+)\s*$", line)
        if m and cur and m.group(1) in METRICS:
            cur[2][m.group(1)] = float(m.group(3).replace(",", "")) * SCALE.get(m.group(2), 1.0)
    return launches


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="escala_gpu_tests binary")
    kind = ap.add_mutually_exclusive_group(required=True)
    kind.add_argument("--decode", help="a --bench-decode SPEC")
    kind.add_argument("--prefill", help="a --bench SPEC")
    ap.add_argument("--skip", type=int, default=0, help="launches to skip (warm-ups, other calls)")
    ap.add_argument("--count", type=int, default=40, help="launches to profile")
    ap.add_argument("--kernel", default="", help="only kernels whose name matches this regex")
    args = ap.parse_args()
    # Host-launched calls without the time-based warm-up, so that launch numbers are the same every run.
    timing = ["--eager", "--warmup", "0"]
    bench = (["--bench-decode", "--reps", "1"] + timing + [args.decode] if args.decode else
             ["--bench", "--reps", "1"] + timing + [args.prefill])
    cmd = ["ncu", "--clock-control", "none", "--metrics", ",".join(METRICS), "--launch-skip", str(args.skip),
           "--launch-count", str(args.count)]
    if args.kernel:
        cmd += ["-k", f"regex:{args.kernel}"]
    proc = subprocess.run(cmd + [args.bin] + bench, capture_output=True, text=True)
    launches = parse(proc.stdout)
    if proc.returncode != 0 or not launches:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        sys.exit(proc.returncode or 1)
    print("| # | kernel | grid | " + " | ".join(METRICS.values()) + " |")
    print("|---|---|---|" + "---|" * len(METRICS))
    for i, (name, grid, vals) in enumerate(launches):
        cells = " | ".join(f"{vals[k]:.2f}" if k in vals else "n/a" for k in METRICS)
        print(f"| {args.skip + i} | {name} | {grid} | {cells} |")


if __name__ == "__main__":
    main()
