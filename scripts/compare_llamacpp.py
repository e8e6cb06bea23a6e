#!/usr/bin/env python3
"""Greedy generation and first-position logits: Escala against llama.cpp (llama-cpp-python).

For each prompt, Escala runs `escala generate --json --temp 0` and llama.cpp evaluates the same
prompt token ids greedily. The token streams must be identical; a divergence is accepted only right
after a near-tie in llama.cpp's logits (top-2 gap below --tie), and is reported either way. The
first generated position's logits are compared on Escala's top 20 ids.

Both runtimes quantize the activations of every matrix product to 8 bits on the fly (llama.cpp:
q8_1/q8_0 with f16 scales; Escala: int8 with f32 scales), and that rounding makes each land some
tenths of a logit away from the exact result, in different directions (a level that rounds one way
in one runtime rounds the other way after an f32 difference in the last bit upstream). So
|Escala - llama.cpp| measures two noises, not an error of either. --reference also runs a float64
forward pass (scripts/reference_forward.py, no activation quantization) and reports how far each
runtime is from it; the logit check then asks that Escala be no further from the reference than
llama.cpp (mean over prompts of the top-20 max difference, within --ref-margin). --f32-activations
runs Escala with ESCALA_F32_ACTIVATIONS=1 (no activation quantization): it should then match the
reference to a few hundredths.

    python3 scripts/compare_llamacpp.py [--escala build/escala] [--model models/...gguf] [-n 64]

Exit status 0 when every prompt matches (or diverges only at a near-tie), 1 otherwise, 77 when
llama_cpp is not installed (skipped).
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three laws of thermodynamics are",
    "Water boils at",
    "A haiku about the sea:",
    "The quick brown fox",
    "In 1969, the first humans",
    "import numpy as np\n",
    "Photosynthesis is the process by which",
    "The largest planet in the solar system is",
    "To make a cup of tea, first",
    "List of prime numbers: 2, 3, 5,",
    "Shakespeare wrote",
    "The meaning of life is",
    "SELECT name FROM users WHERE",
    "The human heart has four chambers:",
    "Machine learning is a field of",
    "My favourite food is",
    "Translate to French: Good morning ->",
    "Le chat est",
    "1 + 1 = 2, 2 + 2 =",
]


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--escala", default=str(root / "build" / "escala"))
    ap.add_argument("--model", default=str(root / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--tie", type=float, default=0.05, help="top-2 logit gap counted as a near-tie")
    ap.add_argument("--logit-tol", type=float, default=0.15, help="max |logit difference| on the top 20")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-type", default="f16", help="Escala's KV cache type (llama.cpp's default cache is f16)")
    ap.add_argument("--reference", action="store_true", help="also compare both with a float64 forward pass")
    ap.add_argument("--ref-margin", type=float, default=1.25,
                    help="with --reference: Escala's mean distance to it may be this many times llama.cpp's")
    ap.add_argument("--f32-activations", action="store_true", help="run Escala without activation quantization")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="use the first N prompts")
    args = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
        from llama_cpp import Llama
    except ImportError:
        print("compare_llamacpp: llama_cpp not installed (pip install llama-cpp-python); skipped")
        return 77
    from llamacpp_greedy import divergence, greedy  # after the check: it needs numpy

    import os

    ref = None
    if args.reference:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from reference_forward import Reference
        ref = Reference(args.model)
    env = dict(os.environ)
    if args.f32_activations:
        env["ESCALA_F32_ACTIVATIONS"] = "1"
    llm = Llama(model_path=args.model, n_ctx=1024, n_threads=args.threads, logits_all=True, verbose=False)
    failures = 0         # failed checks (a prompt can fail two)
    failed_prompts = 0
    logit_failures = 0
    max_logit_diff = 0.0
    ref_esc, ref_lcpp = [], []
    prompts = PROMPTS[:args.prompts]
    for prompt in prompts:
        out = subprocess.run([args.escala, "generate", "--model", args.model, "--prompt", prompt, "-n", str(args.n),
                              "--temp", "0", "--json", "--threads", str(args.threads), "--kv-type", args.kv_type],
                             capture_output=True, text=True, check=True, env=env)
        ours = json.loads(out.stdout)
        ids = ours["prompt_tokens"]
        steps = len(ours["tokens"]) if ours["finish_reason"] == "stop" else args.n
        ref_tokens, gaps, first_logits = greedy(llm, ids, steps)
        diffs = [abs(first_logits[i] - v) for i, v in ours["first_logits_top"]]
        max_logit_diff = max(max_logit_diff, max(diffs))
        failures_before = failures
        at, gap, near_tie = divergence(ref_tokens, ours["tokens"], gaps, args.tie)
        status = "identical"
        if at is not None:
            if near_tie:
                status = f"diverges at {at} after a near-tie (gap {gap:.3f})"
            else:
                status = f"DIVERGES at {at} (gap {gap:.3f})"
                failures += 1
        if max(diffs) > args.logit_tol:
            status += f"; first logits differ by {max(diffs):.3f}"
            if ref is None:
                failures += 1
            else:
                logit_failures += 1  # judged against the reference below
        failed_prompts += failures > failures_before
        refs = ""
        if ref is not None:
            r = ref.logits(ids)
            e = max(abs(r[i] - v) for i, v in ours["first_logits_top"])
            l = max(abs(r[i] - first_logits[i]) for i, _ in ours["first_logits_top"])
            ref_esc.append(e)
            ref_lcpp.append(l)
            refs = f"  vs float64: Escala {e:.4f} llama.cpp {l:.4f}"
        print(f"{prompt[:40]!r:44} {len(ours['tokens']):3} tokens  max|dlogit| {max(diffs):.4f}{refs}  {status}",
              flush=True)
    print(f"\n{len(prompts)} prompts x {args.n} tokens: {len(prompts) - failed_prompts} pass, max first-position "
          f"logit difference {max_logit_diff:.4f} (tolerance {args.logit_tol})")
    if ref is not None:
        me, ml = sum(ref_esc) / len(ref_esc), sum(ref_lcpp) / len(ref_lcpp)
        ok = me <= args.ref_margin * ml
        print(f"distance to the float64 reference (top-20 max |dlogit|): Escala mean {me:.4f} max {max(ref_esc):.4f}, "
              f"llama.cpp mean {ml:.4f} max {max(ref_lcpp):.4f} -> "
              f"{'ok' if ok else 'ESCALA FURTHER'} (margin {args.ref_margin}x; {logit_failures} prompts beyond "
              f"--logit-tol against llama.cpp)")
        if not ok:
            failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
