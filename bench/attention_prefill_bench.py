#!/usr/bin/env python3
"""CUDA prefill benchmark: Escala's kernel next to PyTorch's scaled_dot_product_attention with its
cuDNN and FlashAttention-2 backends, and FlexAttention for the window and sink masks.

Every implementation runs the same shapes on fresh random bf16 inputs (normal, never zeros), timed
alike (bench/cuda_timing.py): a warm-up of --warmup seconds, then --reps samples of 10 calls replayed
from a CUDA graph (--eager: launched from the host), median. FLOPs are counted over the
(query, key) pairs the mask lets through: 2 * (d + dv) * pairs * h * B (so a causal square is about half
of the dense one); the same count divides every implementation's time.

Escala computes O only (`lse=0`), as the peers do here: PyTorch asks cuDNN for the log-sum-exp only
when an input needs a gradient, and FlexAttention stores it only for a gradient or when asked
for it (FA2 always writes it).
--lse times Escala writing its LSE too (one float per row and head, [tokens, heads] layout).

With --rounds N (4 by default) the whole set (Escala, then the peers) is timed N times in turn,
after one pass of the peers that is discarded (--no-pre-round skips it), and each figure is the
median over the rounds; the geometric mean of each round and each round's own figures are
printed too, so that a table shows how far one call of the benchmark moves on the machine it ran on,
and on whose side.

Usage: python3 bench/attention_prefill_bench.py --bin build/tests/escala_gpu_tests [--reps 30] [--rounds 4]
"""
import argparse
import math
import re
import statistics
import subprocess
import sys

from cuda_timing import add_timing_args, binary_flags, describe, last_mode, time_cuda, timing_kwargs

# name, B, S, h, hk, d, causal, window_left, sinks, dv   (window_left -1: none; window right is 0
# when set)
TOKENS = 32768


def shapes(extra):
    out = []
    for d in (64, 128, 256):
        for s in (1024, 4096, 16384):
            for causal in (0, 1):
                out.append((f"d{d}_S{s//1024}k_{'causal' if causal else 'full'}", TOKENS // s, s, 16, 16, d, causal, -1, 0))
    out.append(("gqa32/8_d128_S8k_full", TOKENS // 8192, 8192, 32, 8, 128, 0, -1, 0))
    out.append(("gqa32/8_d128_S8k_causal", TOKENS // 8192, 8192, 32, 8, 128, 1, -1, 0))
    # A window of 4096 keys including the query itself: window_left = 4095, causal.
    out.append(("window4096_d128_S16k", TOKENS // 16384, 16384, 16, 16, 128, 1, 4095, 0))
    out.append(("sinks4+window4096_d128_S16k", TOKENS // 16384, 16384, 16, 16, 128, 1, 4095, 4))
    out = [s + (s[5],) for s in out]
    if extra:  # head dims outside the grid (not in the geometric mean)
        for d, dv in ((96, 96), (192, 192), (192, 128)):
            for causal in (0, 1):
                tag = f"d{d}" if d == dv else f"d{d}v{dv}"
                out.append((f"x_{tag}_S4k_{'causal' if causal else 'full'}", 8, 4096, 16, 16, d, causal, -1, 0, dv))
    return out


def in_dense_grid(shape):
    """A shape of the issue's dense grid (the geometric mean's): no window, no sinks, not an extra."""
    return shape[7] < 0 and shape[8] == 0 and not shape[0].startswith("x_")


def visible_pairs(S, causal, wl, sinks):
    """Visible (query, key) pairs of one S x S sequence (same rule as the C++ bench)."""
    total = 0
    for qp in range(S):
        end = qp + 1 if causal else S
        wb = max(0, qp - wl) if wl >= 0 else 0
        total += max(0, end - wb) + max(0, min(sinks, end, wb))
    return total


def flops(shape):
    _, B, S, h, _, d, causal, wl, sinks, dv = shape
    return 2.0 * (d + dv) * visible_pairs(S, causal, wl, sinks) * h * B


def run_escala(binary, shape_list, reps, arch, timing, lse):
    specs = []
    for name, B, S, h, hk, d, causal, wl, sinks, dv in shape_list:
        spec = f"{name},B={B},S={S},h={h},hk={hk},d={d},dv={dv},causal={causal},sinks={sinks},lse={int(lse)}"
        if wl >= 0:
            spec += f",wl={wl},wr=0"
        specs.append(spec)
    proc = subprocess.run([binary, "--bench", "--reps", str(reps), "--arch", arch] + timing + specs, capture_output=True, text=True)
    sys.stderr.write(proc.stdout + proc.stderr)
    res = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"BENCH name=(\S+) ms=([\d.]+) tflops=([\d.]+)", line)
        if m:
            res[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return res


def run_peers(shape, reps, flex_cache, args, modes):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    name, B, S, h, hk, d, causal, wl, sinks, dv = shape
    torch.manual_seed(hash(name) % 1000)
    q = torch.randn(B, h, S, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, hk, S, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, hk, S, dv, device="cuda", dtype=torch.bfloat16)
    fl = flops(shape)
    out = {}
    if wl < 0 and sinks == 0:
        for label, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("FA2", SDPBackend.FLASH_ATTENTION)):
            try:
                def fn():
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=hk != h)
                ms = time_cuda(fn, reps, **timing_kwargs(args))
                modes.add(f"{label} {last_mode()}")
                out[label] = fl / (ms * 1e-3) / 1e12
            except Exception as e:  # backend refuses this shape
                sys.stderr.write(f"{name} {label}: {type(e).__name__}: {str(e)[:200]}\n")
                out[label] = None
    else:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            if "fn" not in flex_cache:
                flex_cache["fn"] = torch.compile(flex_attention, dynamic=False)
            flex = flex_cache["fn"]

            def mask_mod(b, hh, qi, ki):
                vis = (ki <= qi) & ((qi - ki <= wl) | (ki < sinks))
                return vis

            bm = create_block_mask(mask_mod, B=None, H=None, Q_LEN=S, KV_LEN=S, device="cuda")
            ms = time_cuda(lambda: flex(q, k, v, block_mask=bm, enable_gqa=hk != h), reps,
                           **timing_kwargs(args))
            modes.add(f"Flex {last_mode()}")
            out["Flex"] = fl / (ms * 1e-3) / 1e12
        except Exception as e:
            sys.stderr.write(f"{name} Flex: {type(e).__name__}: {str(e)[:300]}\n")
            out["Flex"] = None
    del q, k, v
    torch.cuda.empty_cache()
    return out


def best_peer(peers):
    """The fastest peer's TFLOP/s among those that ran the shape (None where none did)."""
    return max([v for v in peers.values() if v], default=None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="escala_gpu_tests binary")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--filter", default="", help="only shapes whose name contains this")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--sm80", action="store_true", help="also time the portable sm_80 kernel")
    ap.add_argument("--extra", action="store_true", help="also head dims 96, 192 and 192/128 (outside the grid)")
    ap.add_argument("--lse", action="store_true", help="Escala writes its LSE too (the peers do not)")
    # Four rounds by default, after a discarded pre-round of the peers. In every table without the
    # pre-round the peers' first round read 3-4% faster (geomean) than their later ones, most at
    # S = 1k, while Escala's rounds agree within 1%: in that round PyTorch builds each shape's graphs
    # and compiles FlexAttention, so the GPU idles before each shape's warm-up. With the pre-round
    # (session 35) the first round read as the others (geomeans 1.076 / 1.077 / 1.080 / 1.082).
    ap.add_argument("--rounds", type=int, default=4,
                    help="time Escala and the peers this many times, alternating; each figure is the median over "
                         "the rounds (the machines lent move by several percent from one call to the next)")
    ap.add_argument("--pre-round", action=argparse.BooleanOptionalAction, default=True,
                    help="time the peers once before the rounds and discard it (their graphs built and "
                         "FlexAttention compiled before any figure is kept; default on)")
    add_timing_args(ap)
    args = ap.parse_args()

    shape_list = [s for s in shapes(args.extra) if args.filter in s[0]]
    flex_cache = {}
    modes = set()  # how each peer's samples were launched
    rounds = []  # per round: (Escala, Escala sm80, peers by shape)
    pre_round = args.pre_round and not args.no_peers
    if pre_round:
        for s in shape_list:
            run_peers(s, args.reps, flex_cache, args, set())
    for _ in range(max(1, args.rounds)):
        esc = run_escala(args.bin, shape_list, args.reps, "auto", binary_flags(args), args.lse)
        esc80 = run_escala(args.bin, shape_list, args.reps, "sm80", binary_flags(args), args.lse) if args.sm80 else {}
        peers = {s[0]: ({} if args.no_peers else run_peers(s, args.reps, flex_cache, args, modes)) for s in shape_list}
        rounds.append((esc, esc80, peers))

    def median_tflops(results, name):
        vals = [r[name][1] for r in results if r.get(name)]
        return (None, statistics.median(vals)) if vals else None

    def median_peers(name):
        out = {}
        for label in {k for _, _, p in rounds for k in p[name]}:
            vals = [p[name][label] for _, _, p in rounds if p[name].get(label)]
            out[label] = statistics.median(vals) if vals else None
        return out

    rows = [(s, median_tflops([r[0] for r in rounds], s[0]), median_peers(s[0]),
             median_tflops([r[1] for r in rounds], s[0])) for s in shape_list]

    try:
        import torch
        gpu = torch.cuda.get_device_name(0) + f", torch {torch.__version__}"
    except Exception:
        gpu = "?"
    over = f"; median over {len(rounds)} rounds" if len(rounds) > 1 else ""
    if pre_round:
        over += " after a discarded pre-round of the peers"
    print(f"\n# CUDA prefill, bf16, TFLOP/s over visible pairs (2*(d+dv)*pairs*h*B); {gpu}; "
          f"Escala {'with' if args.lse else 'without'} LSE; median of {args.reps} "
          f"{describe(args)}{over}; peers timed as: {', '.join(sorted(modes)) or '-'}")
    print("| shape | B | Escala | Escala sm80 | cuDNN | FA2 | Flex | best peer | Escala / best |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios_dense = []
    f = lambda x: f"{x:.0f}" if x else "n/a"
    for s, e, peers, e80 in rows:
        et = e[1] if e else None
        best = best_peer(peers)
        ratio = et / best if (et and best) else None
        if ratio and in_dense_grid(s):
            ratios_dense.append(ratio)
        rs = f"{ratio:.3f}" if ratio else "n/a"  # three places: a tie at 1.0 must not round either way
        print(f"| {s[0]} | {s[1]} | {f(et)} | {f(e80[1] if e80 else None)} | {f(peers.get('cuDNN'))} | "
              f"{f(peers.get('FA2'))} | {f(peers.get('Flex'))} | {f(best)} | {rs} |")
    if ratios_dense:
        gm = math.exp(sum(math.log(r) for r in ratios_dense) / len(ratios_dense))
        print(f"\ngeometric mean Escala / best peer over {len(ratios_dense)} dense shapes: {gm:.3f}; "
              f"{sum(r >= 1.0 for r in ratios_dense)} of them >= 1.0")
    if len(rounds) > 1 and not args.no_peers:
        per_round = []
        for esc, _, peers in rounds:
            logs = []
            for s in shape_list:
                best = best_peer(peers[s[0]])
                if esc.get(s[0]) and best and in_dense_grid(s):
                    logs.append(math.log(esc[s[0]][1] / best))
            if logs:
                per_round.append(math.exp(sum(logs) / len(logs)))
        if per_round:  # (none where --filter leaves no dense shape)
            print("geometric mean per round: " + ", ".join(f"{g:.3f}" for g in per_round))
        # Each round's own figures, so that a move between rounds shows whose it was.
        print("\nper round, Escala / best peer (TFLOP/s):")
        print("| shape | " + " | ".join(f"round {i + 1}" for i in range(len(rounds))) + " |")
        print("|---|" + "---|" * len(rounds))
        for s in shape_list:
            cells = []
            for esc, _, peers in rounds:
                best = best_peer(peers[s[0]])
                cells.append(f"{f(esc[s[0]][1] if esc.get(s[0]) else None)} / {f(best)}")
            print(f"| {s[0]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
