"""llama.cpp's greedy continuation and the divergence check, shared by the scripts that compare
Escala with llama.cpp (compare_llamacpp.py, compare_random_archs.py)."""
import numpy as np


def greedy(llm, ids, steps, is_end=None, top=None):
    """Evaluates prompt `ids` in llama-cpp-python's `llm` (made with logits_all=True) and continues
    greedily for up to `steps` tokens, stopping at end-of-text (or where `is_end(token)` is true, when
    given). Returns (tokens, top-2 logit gap at each step, logits of the first generated position as
    float64); the end token is not in the tokens but its step's gap is. When `top` is a list, each
    step's argmax token (the end token included) is appended to it."""
    llm.reset()
    llm.eval(ids)
    tokens, gaps, first = [], [], None
    for _ in range(steps):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        if first is None:
            first = logits
        order = np.argsort(-logits)
        gaps.append(float(logits[order[0]] - logits[order[1]]))
        tok = int(order[0])
        if top is not None:
            top.append(tok)
        if (is_end(tok) if is_end is not None else tok == llm.token_eos()):
            break
        tokens.append(tok)
        llm.eval([tok])
    return tokens, gaps, first


def divergence(ref_tokens, ours, gaps, tie):
    """Compares two token streams: (index of the first difference or None, top-2 gap there, whether
    that gap is a near-tie, i.e. below `tie`)."""
    n = 0
    while n < min(len(ref_tokens), len(ours)) and ref_tokens[n] == ours[n]:
        n += 1
    if ref_tokens == ours:
        return None, None, False
    gap = gaps[n] if n < len(gaps) else float("inf")
    return n, gap, gap < tie
