#!/usr/bin/env python3
"""Prompt and generation speed: Escala against llama.cpp (llama-cpp-python), one after the other.

For each context length T (default 128, 1024, 4096) the prompt is exactly T tokens (the start of
the repository's own documentation, tokenized once by llama.cpp and given to both runtimes as ids),
then -n tokens are generated greedily. Same GGUF, same thread count, f16 KV cache on both sides.
Escala runs as `escala generate --prompt-ids ... --json` (a fresh process per run, which reports
its own peak resident memory, VmHWM); llama.cpp runs in this process through llama-cpp-python.

Speeds: prompt tokens/s = T / prefill time; generation tokens/s = decode steps / decode time, where
the first generated token comes from the prompt's logits, so N generated tokens are N - 1 decode
steps on both sides. Each runtime generates the number of tokens Escala generated (Escala stops at
an end-of-generation token). With --repeats R the runtimes alternate R times per length and the
best run of each is kept (the machine's load only ever slows a run down).

Memory: Escala's peak RSS at each length against the bound model file + KV formula (`escala
kv-plan`, context T + n, the cache's format) + 64 MiB.

    python3 scripts/bench_vs_llamacpp.py [--escala build/escala] [--threads 2] [--lengths 128 1024 4096]

Exit status 0 when every target is met, 1 when one is not, 77 when llama_cpp is not installed.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MIB = 1 << 20


def corpus_text(root: Path) -> str:
    parts = []
    for name in ["README.md", "docs/ARCHITECTURE.md", "docs/PERFORMANCE.md"]:
        p = root / name
        if p.exists():
            parts.append(p.read_text(encoding="utf-8", errors="replace"))
    for p in sorted((root / "docs").glob("*.md")):
        if p.name not in ("ARCHITECTURE.md", "PERFORMANCE.md"):
            parts.append(p.read_text(encoding="utf-8", errors="replace"))
    return "\n\n".join(parts)


def run_escala(args, ids, n_gen, ctx):
    """Runs Escala; returns its JSON (timings, tokens, peak_rss_bytes: its own VmHWM)."""
    cmd = [args.escala, "generate", "--model", args.model, "--prompt-ids", ",".join(map(str, ids)),
           "-n", str(n_gen), "--temp", "0", "--json", "--threads", str(args.threads), "--kv-type", args.kv_type,
           "--context", str(ctx)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"escala exited with {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def run_llamacpp(llm, ids, n_gen):
    import numpy as np
    import llama_cpp

    n_vocab = llm.n_vocab()

    def argmax_last():  # llama-cpp-python keeps no scores without logits_all: read the last row directly
        row = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(row, shape=(n_vocab,))))

    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t_prompt = time.perf_counter() - t0
    tokens = []
    tok = argmax_last()
    tokens.append(tok)
    steps = []
    t1 = time.perf_counter()
    for _ in range(n_gen - 1):
        ts = time.perf_counter()
        llm.eval([tok])
        tok = argmax_last()
        tokens.append(tok)
        steps.append(time.perf_counter() - ts)
    t_gen = time.perf_counter() - t1
    return t_prompt, t_gen, tokens, steps


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def kv_formula_bytes(args, meta, ctx):
    arch = meta["general.architecture"]
    g = lambda k: meta[f"{arch}.{k}"]
    heads = int(g("attention.head_count"))
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = int(meta.get(f"{arch}.attention.key_length", int(g("embedding_length")) // heads))
    dtype = {"f16": "fp16", "f32": "fp32"}.get(args.kv_type, args.kv_type)
    out = subprocess.run([args.escala, "kv-plan", "--layers", str(g("block_count")), "--heads", str(heads),
                          "--kv-heads", str(kv_heads), "--head-dim", str(head_dim), "--context", str(ctx),
                          "--dtype", dtype, "--json"], capture_output=True, text=True, check=True)
    return int(json.loads(out.stdout)["bytes"])


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--escala", default=str(root / "build" / "escala"))
    ap.add_argument("--model", default=str(root / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 1024, 4096])
    ap.add_argument("-n", type=int, default=64, help="tokens to generate after the prompt")
    ap.add_argument("--repeats", type=int, default=1, help="alternate the runtimes this many times; keep the best")
    ap.add_argument("--kv-type", default="f16", help="Escala's KV cache type (llama.cpp's cache is f16)")
    ap.add_argument("--flash-attn", choices=["off", "on"], default="off",
                    help="llama.cpp's flash attention (llama-cpp-python's default is off)")
    ap.add_argument("--n-batch", type=int, default=512, help="llama.cpp's batch (prompt chunk) size")
    ap.add_argument("--omp-spin", default="",
                    help="GOMP_SPINCOUNT for both runtimes (this script re-executes itself with it, so llama.cpp's "
                         "OpenMP threads get it too; Escala's own default is 3000)")
    args = ap.parse_args()
    if args.omp_spin and os.environ.get("GOMP_SPINCOUNT") != args.omp_spin:
        os.environ["GOMP_SPINCOUNT"] = args.omp_spin
        os.execv(sys.executable, [sys.executable] + sys.argv)
    try:
        from llama_cpp import Llama
        import llama_cpp
    except ImportError:
        print("bench_vs_llamacpp: llama_cpp not installed (pip install llama-cpp-python); skipped")
        return 77

    model_bytes = os.path.getsize(args.model)
    vocab_llm = Llama(model_path=args.model, n_ctx=256, n_threads=args.threads, vocab_only=True, verbose=False)
    corpus = vocab_llm.tokenize(corpus_text(root).encode("utf-8"), add_bos=False, special=False)
    meta = vocab_llm.metadata
    del vocab_llm
    try:
        sysinfo = llama_cpp.llama_print_system_info().decode()
    except Exception:  # noqa: BLE001
        sysinfo = "?"
    print(f"model {Path(args.model).name} ({model_bytes / MIB:.1f} MiB), {args.threads} threads, KV {args.kv_type}, "
          f"llama.cpp {llama_cpp.__version__} flash_attn={args.flash_attn} n_batch={args.n_batch}")
    print(f"llama.cpp system info: {sysinfo.strip()}")
    print(f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', '(unset: libgomp default for llama.cpp; Escala 3000)')}")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")

    rows = []
    ok = True
    for T in args.lengths:
        ids = (corpus * (T // max(1, len(corpus)) + 1))[:T]
        ctx = T + args.n
        llm = Llama(model_path=args.model, n_ctx=ctx + 16, n_threads=args.threads, n_threads_batch=args.threads,
                    n_batch=args.n_batch, n_ubatch=args.n_batch, flash_attn=args.flash_attn == "on",
                    verbose=False)
        best_e = best_l = None
        rss = 0
        n_gen = args.n
        agree = None
        for _ in range(args.repeats):
            j = run_escala(args, ids, args.n, ctx)
            rss = max(rss, j["peak_rss_bytes"])
            n_gen = len(j["tokens"]) + (1 if j["finish_reason"] == "stop" else 0)  # the EOG token was sampled too
            e_steps = max(1, len(j["tokens"]) - 1)
            pt = j.get("piece_times", [])
            e_med = 1.0 / median([b - a for a, b in zip(pt, pt[1:])]) if len(pt) > 2 else float("nan")
            e = (T / j["prompt_seconds"], e_steps / j["generation_seconds"], e_med)
            tp, tg, ref, steps = run_llamacpp(llm, ids, max(2, len(j["tokens"])))
            l = (T / tp, (len(ref) - 1) / tg, 1.0 / median(steps))
            best_e = e if best_e is None else tuple(max(a, b) for a, b in zip(best_e, e))
            best_l = l if best_l is None else tuple(max(a, b) for a, b in zip(best_l, l))
            n_same = 0
            while n_same < min(len(ref), len(j["tokens"])) and ref[n_same] == j["tokens"][n_same]:
                n_same += 1
            agree = (n_same, len(j["tokens"]))
        del llm
        bound = model_bytes + kv_formula_bytes(args, meta, ctx) + 64 * MIB
        rows.append((T, n_gen, best_e, best_l, rss, bound, agree))
        print(f"T={T}: done (load {os.getloadavg()[0]:.2f})", flush=True)

    print()
    print(f"{'context':>7} {'gen':>4} | {'prompt tok/s':>25} | {'generation tok/s (mean)':>25} |"
          f" {'generation (median step)':>25} | {'peak RSS':>21}")
    print(f"{'':>7} {'':>4} |" + f" {'Escala':>8} {'llama':>8} {'ratio':>7} |" * 3 + f" {'MiB':>7} {'bound':>7} {'ok':>5}")
    for T, n_gen, e, l, rss, bound, agree in rows:
        gr = e[1] / l[1]
        target = 1.2 if T >= 4096 else 1.0
        met = gr >= target
        mem_ok = rss <= bound
        ok = ok and met and mem_ok
        print(f"{T:>7} {n_gen:>4} | {e[0]:8.1f} {l[0]:8.1f} {e[0] / l[0]:6.2f}x | {e[1]:8.1f} {l[1]:8.1f} {gr:6.2f}x |"
              f" {e[2]:8.1f} {l[2]:8.1f} {e[2] / l[2]:6.2f}x |"
              f" {rss / MIB:7.1f} {bound / MIB:7.1f} {'yes' if mem_ok else 'NO':>5}"
              f"   gen target >= {target:.1f}x: {'met' if met else 'NOT met'};"
              f" greedy tokens identical for {agree[0]}/{agree[1]}")
    print("\nmean: decode steps / decode time (the target's figure); median step: 1 / the median time of one"
          " step (Escala: between streamed pieces of text), which a busy machine's preemptions move less.")
    print(f"\nRSS bound = model file {model_bytes / MIB:.1f} MiB + KV formula (escala kv-plan, context T + {args.n}, "
          f"{args.kv_type}) + 64 MiB. Load average at end: {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
