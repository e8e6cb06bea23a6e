#!/usr/bin/env python3
"""Serving benchmark for `escala serve` (or any OpenAI-compatible server).

Replays a fixed set of chat requests at a given concurrency (each of C workers sends its share of the
requests one after another, streaming) and prints generated tokens/s, time to first token and
inter-token latency percentiles. Every request generates exactly --max-tokens tokens (ignore_eos), so
runs at different concurrencies do the same work.

  bench/serve_bench.py --url http://127.0.0.1:8080 --concurrency 1 16 --requests 32 --max-tokens 64
"""
import argparse
import json
import os
import statistics
import threading
import time

try:
    import httpx2 as httpx
except ImportError:
    import httpx

TOPICS = ["rivers", "mountains", "the moon", "bread", "cats", "rain", "trains", "music", "tea", "winter",
          "chess", "honey", "bridges", "clocks", "maps", "owls"]


def request_set(n, max_tokens):
    out = []
    for i in range(n):
        t = TOPICS[i % len(TOPICS)]
        msgs = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": f"Write a few sentences about {t}." + " Be specific." * (i % 3)}]
        out.append({"messages": msgs, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}})
    return out


def one(client, url, body):
    """(ttft, [inter-chunk gaps], completion tokens, latency)"""
    t0 = time.perf_counter()
    first, last, gaps, tokens = None, None, [], 0
    with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                tokens = d["usage"]["completion_tokens"]
            if any(c.get("delta", {}).get("content") for c in d.get("choices", [])):
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
    return (first - t0 if first else float("nan")), gaps, tokens, time.perf_counter() - t0


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run(url, concurrency, reqs):
    results, lock = [], threading.Lock()
    todo = list(range(len(reqs)))

    def worker():
        with httpx.Client(timeout=600) as client:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop(0)
                out = one(client, url, reqs[i])
                with lock:
                    results.append(out)

    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r[2] for r in results)
    ttft = [r[0] for r in results]
    itl = [g for r in results for g in r[1]]
    return {"concurrency": concurrency, "requests": len(results), "tokens": tokens, "wall_s": wall,
            "tok_s": tokens / wall, "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90), "ttft_p99": pct(ttft, 99),
            "itl_p50": pct(itl, 50), "itl_p90": pct(itl, 90), "itl_p99": pct(itl, 99),
            "latency_mean": statistics.mean(r[3] for r in results),
            "load": f"{load:.2f} → {os.getloadavg()[0]:.2f}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--requests", type=int, default=32, help="requests per run (the same set every run)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=1, help="requests sent before measuring")
    args = ap.parse_args()
    reqs = request_set(args.requests, args.max_tokens)
    if args.warmup:
        run(args.url, 1, reqs[:args.warmup])
    rows = [run(args.url, c, reqs) for c in args.concurrency]
    # The machine's 1-minute load average before and after each run: a benchmark on a shared machine
    # means something only when it is low (2 cores: well under 1).
    print("| streams | requests | gen tokens | wall s | gen tok/s | vs 1 | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms | load |")
    print("|---:|---:|---:|---:|---:|---:|---|---|---|")
    base = rows[0]["tok_s"]
    for r in rows:
        print(f"| {r['concurrency']} | {r['requests']} | {r['tokens']} | {r['wall_s']:.1f} | {r['tok_s']:.1f} | "
              f"{r['tok_s'] / base:.2f}x | {r['ttft_p50'] * 1e3:.0f} / {r['ttft_p90'] * 1e3:.0f} / "
              f"{r['ttft_p99'] * 1e3:.0f} | {r['itl_p50'] * 1e3:.0f} / {r['itl_p90'] * 1e3:.0f} / "
              f"{r['itl_p99'] * 1e3:.0f} | {r['load']} |")


if __name__ == "__main__":
    main()
