#!/usr/bin/env python3
"""CUDA decode benchmark: Escala's split-KV decode kernel next to PyTorch's
scaled_dot_product_attention (cuDNN backend, enable_gqa=True, contiguous bf16; FlashAttention-2
too, for reference), and the device's own read ceiling, all in the same run.

Effective bandwidth = bytes of K and V (and scales) the call must read / time per call. Both sides
are timed alike (bench/cuda_timing.py): a warm-up of --warmup seconds, then --reps samples of 10
calls replayed from a CUDA graph (--eager: launched from the host), median. Escala runs each shape
contiguous bf16 (token-major [T, h_kv, d], and head-major [h_kv, T, d], the peers' layout), paged
bf16 (16-token pages, randomly permuted) and paged fp8; the table gives paged/contiguous time,
head-major/token-major time and fp8/bf16 tokens/s.

With --rounds N, Escala and the peers are timed N times in turn and each figure is the median over
the rounds.

Usage: python3 bench/attention_decode_bench.py --bin build/tests/escala_gpu_tests [--reps 30] [--rounds 2]
"""
import argparse
import re
import statistics
import subprocess
import sys

from cuda_timing import add_timing_args, binary_flags, describe, last_mode, time_cuda, timing_kwargs

# name, B, T, h, hk, d
SHAPES = [
    ("gqa32/8_d128_B1_T32k", 1, 32768, 32, 8, 128),
    ("gqa32/8_d128_B16_T8k", 16, 8192, 32, 8, 128),
    ("gqa32/8_d128_B64_T4k", 64, 4096, 32, 8, 128),
    ("gqa32/8_d128_B128_T32k", 128, 32768, 32, 8, 128),
    ("smollm2_9/3_d64_B64_T4k", 64, 4096, 9, 3, 64),
]


def run_bin(binary, args):
    proc = subprocess.run([binary] + args, capture_output=True, text=True)
    sys.stderr.write(proc.stdout + proc.stderr)
    return proc.stdout


def run_escala(binary, shapes, reps, timing):
    specs = []
    for name, B, T, h, hk, d in shapes:
        base = f"B={B},T={T},h={h},hk={hk},d={d}"
        specs += [f"{name}|bf16,{base},kv=bf16", f"{name}|paged,{base},kv=bf16,page=16", f"{name}|fp8,{base},kv=fp8,page=16",
                  f"{name}|hnd,{base},kv=bf16,page=16,hnd=1", f"{name}|fp8hnd,{base},kv=fp8,page=16,hnd=1",
                  f"{name}|hndc,{base},kv=bf16,hnd=1"]
    out = run_bin(binary, ["--bench-decode", "--reps", str(reps)] + timing + specs)
    res = {}
    for line in out.splitlines():
        m = re.match(r"BENCH name=(\S+) ms=([\d.]+) gbps=([\d.]+) splits=(\d+) tokens_per_s=([\d.]+)", line)
        if m:
            res[m.group(1)] = (float(m.group(2)), float(m.group(3)), int(m.group(4)))
    return res


def run_cascade(binary, reps, timing):
    spec = "cascade_32k_prefix_B128,B=128,T=128,h=32,hk=8,d=128,prefix=32768"
    out = run_bin(binary, ["--bench-decode", "--reps", str(reps)] + timing + [spec])
    m = re.search(r"CASCADE name=\S+ plain_ms=([\d.]+) cascade_ms=([\d.]+) speedup=([\d.]+)", out)
    return (float(m.group(1)), float(m.group(2)), float(m.group(3))) if m else None


def run_peers(shape, reps, args, modes):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    name, B, T, h, hk, d = shape
    q = torch.randn(B, h, 1, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, hk, T, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, hk, T, d, device="cuda", dtype=torch.bfloat16)
    nbytes = 2.0 * B * T * hk * d * 2
    out = {}
    for label, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("FA2", SDPBackend.FLASH_ATTENTION)):
        try:
            def fn():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=hk != h)
            ms = time_cuda(fn, reps, **timing_kwargs(args))
            modes.add(f"{label} {last_mode()}")
            out[label] = nbytes / (ms * 1e-3) / 1e9
        except Exception as e:  # backend refuses this shape
            sys.stderr.write(f"{name} {label}: {type(e).__name__}: {str(e)[:200]}\n")
            out[label] = None
    del q, k, v
    torch.cuda.empty_cache()
    return out


def fmt(x, spec="{:.0f}"):
    return spec.format(x) if x is not None else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="escala_gpu_tests binary")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--filter", default="")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-cascade", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time Escala and the peers this many times, alternating; each figure is the median over "
                         "the rounds")
    add_timing_args(ap)
    args = ap.parse_args()
    timing = binary_flags(args)
    modes = set()  # how each peer's samples were launched
    shapes = [s for s in SHAPES if args.filter in s[0]]

    ceiling = None
    m = re.search(r"READ gbps=([\d.]+)", run_bin(args.bin, ["--bench-read", "--mb", "8192"] + timing))
    if m:
        ceiling = float(m.group(1))
    rounds = []  # per round: (Escala's results, peers by shape)
    for _ in range(max(1, args.rounds)):
        esc_r = run_escala(args.bin, shapes, args.reps, timing)
        rounds.append((esc_r, {s[0]: ({} if args.no_peers else run_peers(s, args.reps, args, modes)) for s in shapes}))
    # Medians over the rounds: Escala's (ms, GB/s, splits) per spec, the peers' GB/s per label.
    esc = {}
    for key in {k for r, _ in rounds for k in r}:
        got = [r[key] for r, _ in rounds if key in r]
        esc[key] = (statistics.median(g[0] for g in got), statistics.median(g[1] for g in got), got[0][2])
    if len(rounds) > 1:
        print(f"(medians over {len(rounds)} rounds)")
    print(f"timing: median of {args.reps} {describe(args)} per shape; peers timed as: "
          f"{', '.join(sorted(modes)) or '-'}")
    print(f"read ceiling (16-byte streaming loads, 8 GiB): {fmt(ceiling)} GB/s\n")
    print("| shape | Escala bf16 GB/s | % ceiling | splits | paged/contig time | HND/NHD time | fp8/bf16 tok/s | cuDNN GB/s | "
          "FA2 GB/s | Escala / cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        name = shape[0]
        e = esc.get(f"{name}|bf16")
        pg = esc.get(f"{name}|paged")
        f8 = esc.get(f"{name}|fp8")
        hd = esc.get(f"{name}|hndc")
        peers = {}
        for label in {k for _, p in rounds for k in p[name]}:
            vals = [p[name][label] for _, p in rounds if p[name].get(label)]
            peers[label] = statistics.median(vals) if vals else None
        cud = peers.get("cuDNN")
        ratio = e[1] / cud if e and cud else None
        print(f"| {name} | {fmt(e and e[1])} | {fmt(e and ceiling and 100 * e[1] / ceiling, '{:.1f}%')} | "
              f"{fmt(e and e[2])} | {fmt(e and pg and pg[0] / e[0], '{:.3f}')} | {fmt(e and hd and hd[0] / e[0], '{:.3f}')} | "
              f"{fmt(e and f8 and e[0] / f8[0], '{:.2f}x')} | {fmt(cud)} | {fmt(peers.get('FA2'))} | "
              f"{fmt(ratio, '{:.2f}x')} |", flush=True)
    if not args.no_cascade:
        c = run_cascade(args.bin, args.reps, timing)
        if c:
            print(f"\ncascade, 128 sequences x (32k shared prefix + 128 own tokens), GQA 32/8, d=128, bf16 paged: "
                  f"plain decode {c[0]:.3f} ms, cascade {c[1]:.3f} ms, speedup {c[2]:.1f}x")
        else:
            print("\ncascade: no result (see stderr)")


if __name__ == "__main__":
    main()
