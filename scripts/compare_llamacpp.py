#!/usr/bin/env python3
"""Greedy generation and first-position logits: Escala against llama.cpp (llama-cpp-python).

For each prompt, Escala runs `escala generate --json --temp 0` and llama.cpp evaluates the same
prompt token ids greedily. The token streams must be identical; a divergence is accepted only right
after a near-tie in llama.cpp's logits (top-2 gap below --tie), and is reported either way. The
first generated position's logits are compared on Escala's top 20 ids.

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
    args = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
        from llama_cpp import Llama
    except ImportError:
        print("compare_llamacpp: llama_cpp not installed (pip install llama-cpp-python); skipped")
        return 77
    import numpy as np

    llm = Llama(model_path=args.model, n_ctx=1024, n_threads=args.threads, logits_all=True, verbose=False)
    failures = 0
    max_logit_diff = 0.0
    for prompt in PROMPTS:
        out = subprocess.run([args.escala, "generate", "--model", args.model, "--prompt", prompt, "-n", str(args.n),
                              "--temp", "0", "--json", "--threads", str(args.threads), "--kv-type", args.kv_type],
                             capture_output=True, text=True, check=True)
        ours = json.loads(out.stdout)
        ids = ours["prompt_tokens"]
        llm.reset()
        llm.eval(ids)
        ref_tokens, gaps = [], []
        first_logits = None
        for _ in range(len(ours["tokens"]) if ours["finish_reason"] == "stop" else args.n):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            if first_logits is None:
                first_logits = logits
            order = np.argsort(-logits)
            gaps.append(float(logits[order[0]] - logits[order[1]]))
            tok = int(order[0])
            if tok == llm.token_eos():
                break
            ref_tokens.append(tok)
            llm.eval([tok])
        diffs = [abs(first_logits[i] - v) for i, v in ours["first_logits_top"]]
        max_logit_diff = max(max_logit_diff, max(diffs))
        n_same = 0
        while n_same < min(len(ref_tokens), len(ours["tokens"])) and ref_tokens[n_same] == ours["tokens"][n_same]:
            n_same += 1
        same = ref_tokens == ours["tokens"]
        status = "identical"
        if not same:
            gap = gaps[n_same] if n_same < len(gaps) else float("inf")
            if gap < args.tie:
                status = f"diverges at {n_same} after a near-tie (gap {gap:.3f})"
            else:
                status = f"DIVERGES at {n_same} (gap {gap:.3f})"
                failures += 1
        if max(diffs) > args.logit_tol:
            status += f"; first logits differ by {max(diffs):.3f}"
            failures += 1
        print(f"{prompt[:40]!r:44} {len(ours['tokens']):3} tokens  max|dlogit| {max(diffs):.4f}  {status}")
    print(f"\n{len(PROMPTS)} prompts x {args.n} tokens: {len(PROMPTS) - failures} pass, max first-position "
          f"logit difference {max_logit_diff:.4f} (tolerance {args.logit_tol})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
