#!/usr/bin/env python3
"""qwen2, gemma2 and llama's RoPE scalings against llama.cpp on small random-weight GGUF files
written by Escala's writer.

No real qwen2 or gemma2 model ships with the project, so this writes one of each with
build/escala_random_gguf (tools/escala_random_gguf.cpp, Escala's own GgufWriter): f32 weights,
4 layers, hidden 128, 4 query heads over 2 KV heads of dimension 32, ffn 256; qwen2 with Q/K/V
biases, gemma2 with alternating sliding-window (window 8, even layers) and global layers, attention
and final logit soft-capping (50, 30), post-attention and post-FFN norms, tied output; llama with
linear RoPE scaling (factor 4), YaRN (factor 4, original context 16) and Llama 3's rope_freqs
tensor, and qwen2 (NeoX pairs) with YaRN. The prompts
run 3 to 25 tokens, so the first-position logits of the longer ones already go through the window. The
tokenizer.ggml.* keys are copied from the SmolLM2 GGUF (GPT-2 BPE, 49152 tokens) so llama.cpp
accepts the vocabulary.

Each file is loaded by llama.cpp (llama-cpp-python) and by `escala generate --json --temp 0`. For
every prompt (token ids from Escala's tokenizer, evaluated as ids by llama.cpp) it compares:
  - the first generated position's logits on Escala's top 20 ids: max |Escala - llama.cpp|, within
    --logit-tol (f32 weights: neither runtime quantizes activations, so only the f32 summation order
    and, with --kv-type f16, the f16 rounding of K/V (and of Q in llama.cpp) differ; for gemma2 also
    ggml's CPU GELU, which rounds its f32 input to f16 and reads a table (GGML_GELU_FP16 in
    ggml-cpu/vec.h): about 2e-3 on logits near 7, where qwen2's SiLU model agrees to 1e-5);
  - greedy generation of -n tokens (longer than gemma2's window, so the local layers slide): identical,
    or diverging only right after a near-tie in llama.cpp's logits (top-2 gap below --tie), reported.

    python3 scripts/compare_random_archs.py [--escala build/escala] [--tool build/escala_random_gguf]
        [--archs qwen2,gemma2,llama:linear,llama:yarn,llama:rope_freqs,qwen2:yarn] [--kv-types f32,f16] [-n 32]

Exit status 0 when everything passes, 1 on a failure, 77 when llama_cpp is not installed (skipped).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The quick brown fox jumps over the lazy dog because",
    "1 + 1 = 2, 2 + 2 =",
    "Le chat est",
    "SELECT name FROM users WHERE",
    "Photosynthesis is the process by which plants turn light into",
    "In the beginning of the twentieth century, physicists in Europe argued for years about the nature of light, "
    "and about whether",
]

GGML_TYPE = {"f32": 0, "f16": 1}  # llama.cpp's type_k / type_v

# Model variants, ARCH:VARIANT: one kind of RoPE scaling. The YaRN models' original context (16) is
# shorter than the prompts plus the generated tokens, so their interpolation is used.
VARIANTS = {
    "linear": ["--rope-scaling", "linear", "--rope-factor", "4"],
    "yarn": ["--rope-scaling", "yarn", "--rope-factor", "4", "--rope-orig-ctx", "16"],
    "rope_freqs": ["--rope-freqs"],
}


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--escala", default=str(root / "build" / "escala"))
    ap.add_argument("--tool", default=str(root / "build" / "escala_random_gguf"))
    ap.add_argument("--tokenizer-from", default=str(root / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--archs", default="qwen2,gemma2,llama:linear,llama:yarn,llama:rope_freqs,qwen2:yarn",
                    help="architectures (llama, qwen2, gemma2), each optionally :VARIANT (" + ", ".join(VARIANTS) + ")")
    ap.add_argument("--kv-types", default="f32,f16", help="KV cache types to run (the same in both runtimes)")
    ap.add_argument("--weight-type", default="f32", choices=["f32", "f16"])
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--tie", type=float, default=0.02, help="top-2 logit gap counted as a near-tie")
    ap.add_argument("--logit-tol", default="f32=0.01,f16=0.05",
                    help="max |first-position logit difference| on Escala's top 20, per KV type")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", help="write the models into this folder and keep them")
    args = ap.parse_args()
    try:
        from llama_cpp import Llama
    except ImportError:
        print("compare_random_archs: llama_cpp not installed (pip install llama-cpp-python); skipped")
        return 77
    from llamacpp_greedy import divergence, greedy  # after the check: it needs numpy

    tols = dict(kv.split("=") for kv in args.logit_tol.split(","))
    tols = {k: float(v) for k, v in tols.items()}
    for exe in (args.escala, args.tool):
        if not Path(exe).exists():
            print(f"compare_random_archs: {exe} not found (cmake --build build --target escala_cli escala_random_gguf)")
            return 1
    tmp = None
    if args.keep:
        out_dir = Path(args.keep)
        out_dir.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="escala_random_archs_")
        out_dir = Path(tmp.name)
    env = dict(os.environ)
    rows = []
    failures = 0
    for arch in args.archs.split(","):
        path = out_dir / f"random-{arch.replace(':', '-')}-{args.weight_type}.gguf"
        subprocess.run([args.tool, "--arch", arch.split(":")[0], "--tokenizer-from", args.tokenizer_from,
                        "--out", str(path), "--type", args.weight_type, "--seed", str(args.seed)]
                       + (VARIANTS[arch.split(":")[1]] if ":" in arch else []), check=True)
        for kv in args.kv_types.split(","):
            tol = tols[kv]
            try:
                llm = Llama(model_path=str(path), n_ctx=512, n_threads=args.threads, logits_all=True,
                            verbose=False, type_k=GGML_TYPE[kv], type_v=GGML_TYPE[kv])
            except Exception as e:  # noqa: BLE001 - report llama.cpp's refusal and go on
                print(f"{arch} kv {kv}: llama.cpp refused {path}: {e}")
                rows.append((arch, kv, "-", "-", "-", "-", "LOAD FAILED"))
                failures += 1
                continue
            worst, n_identical, n_tie, n_fail, distinct = 0.0, 0, 0, 0, []
            for prompt in PROMPTS:
                out = subprocess.run([args.escala, "generate", "--model", str(path), "--prompt", prompt,
                                      "-n", str(args.n), "--temp", "0", "--json", "--threads", str(args.threads),
                                      "--kv-type", kv, "--context", "512"],
                                     capture_output=True, text=True, env=env)
                if out.returncode != 0:
                    print(f"{arch} kv {kv}: escala failed: {out.stderr.strip()}")
                    n_fail += 1
                    continue
                ours = json.loads(out.stdout)
                ids = ours["prompt_tokens"]
                distinct.append(len(set(ours["tokens"])))
                steps = len(ours["tokens"]) if ours["finish_reason"] == "stop" else args.n
                ref_tokens, gaps, first = greedy(llm, ids, steps)
                d = max(abs(first[i] - v) for i, v in ours["first_logits_top"])
                worst = max(worst, d)
                at, gap, near_tie = divergence(ref_tokens, ours["tokens"], gaps, args.tie)
                status = "identical"
                if at is not None:
                    if near_tie:
                        status = f"diverges at {at} after a near-tie (gap {gap:.4f})"
                        n_tie += 1
                    else:
                        status = f"DIVERGES at {at} (gap {gap:.4f})"
                        n_fail += 1
                else:
                    n_identical += 1
                if d > tol:
                    status += f"; LOGITS differ by {d:.5f} > {tol}"
                    n_fail += 1
                print(f"{arch:16} kv {kv}  {prompt[:40]!r:44} {len(ids):2}+{len(ours['tokens']):2} tokens  "
                      f"{distinct[-1]:2} distinct  max|dlogit| {d:.6f}  {status}", flush=True)
            del llm
            failures += n_fail
            rows.append((arch, kv, f"{worst:.6f}", f"{tol}", f"{n_identical}+{n_tie}/{len(PROMPTS)}",
                         f"{min(distinct, default=0)}-{max(distinct, default=0)}",
                         "PASS" if n_fail == 0 else "FAIL"))
    print(f"\nrandom-weight models ({args.weight_type} weights), {len(PROMPTS)} prompts x {args.n} greedy tokens; "
          f"logits: first generated position, Escala's top 20 ids")
    head = ("arch", "kv", "max|dlogit|", "tolerance", "greedy identical+near-tie", "distinct tokens", "result")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    print("PASS" if failures == 0 else f"FAIL ({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
