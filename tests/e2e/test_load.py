#!/usr/bin/env python3
"""Load: C concurrent clients x R requests. Mixed prompt lengths (a few long enough to be prefilled
over several steps while others decode), some sharing a system prompt, some cancelled: streams hung
up mid-stream, non-streaming requests abandoned by a client-side timeout. Checks that

  - every request completes or is cancelled as asked (no errors, no other outcome),
  - no token is lost or duplicated in any stream: a completed request's text, finish reason and
    token count equal those of the same request sent alone first (greedy: batch-invariant), a
    cancelled stream's text is a prefix of it,
  - the server's counters agree: finished + cancelled == requests sent, cancelled <= cancels asked,
    no failures,
  - the block pool returns to empty (/metrics: no KV block used, nothing running or waiting).

CI runs it at 16 clients x 10 requests (pytest, ctest label e2e). The issue's full size by hand:

  tests/e2e/test_load.py --clients 64 --requests 50            # starts build/escala serve itself
  tests/e2e/test_load.py --clients 64 --requests 50 --url http://127.0.0.1:8080   # a running server

(or ESCALA_LOAD_CLIENTS=64 ESCALA_LOAD_REQUESTS=50 under pytest). The script prints the wall time
and the counts; it exits non-zero when a check fails. With --server-args '--kv-budget 12000000' the
pool holds ~30 blocks, so sequences are preempted and recomputed under load, and the same checks
hold (greedy outputs included)."""
import os
import random
import sys
import threading
import time

try:  # the openai client of 2026 ships on httpx2, earlier ones on httpx
    import httpx2 as httpx
except ImportError:
    import httpx
import openai

CLIENTS = int(os.environ.get("ESCALA_LOAD_CLIENTS", "16"))
REQUESTS = int(os.environ.get("ESCALA_LOAD_REQUESTS", "10"))
SYSTEM = "You are Escala's test assistant. Answer briefly and plainly. " * 3
TOPICS = ["rivers", "mountains", "the moon", "bread", "cats", "rain", "trains", "music", "tea", "winter",
          "chess", "honey", "bridges", "clocks", "maps", "owls"]
LONG = ("Here are some notes I took while reading about the history of everyday things, in no particular "
        "order, with my own remarks mixed in. ") * 6  # ~150 tokens: prefilled in chunks over several steps
STREAM_SHARE = 0.7      # of the requests, streamed
CANCEL_STREAM = 0.1     # of the streams, hung up after 2 content chunks
CANCEL_BLOCKING = 0.1   # of the non-streaming ones, abandoned after a short timeout


def request_set():
    """A fixed set of distinct requests (both endpoints, mixed lengths, some with a shared prefix)."""
    out = []
    for i, t in enumerate(TOPICS):
        q = f"Tell me one fact about {t}." + (" Please keep it short and simple." * (i % 4))
        if i % 8 == 3:
            q = LONG + q
        msgs = ([{"role": "system", "content": SYSTEM}] if i % 2 == 0 else []) + [{"role": "user", "content": q}]
        out.append(("chat", {"messages": msgs, "max_tokens": 8 + (i * 5) % 24}))
        out.append(("completion", {"prompt": (LONG if i % 8 == 5 else "") + f"A short note on {t}:" +
                                   " and more" * (i % 5), "max_tokens": 6 + (i * 7) % 20}))
    return out


def run(client, model, kind, args, stream, cancel_after=None, timeout=None):
    """Returns (text, finish_reason, completion_tokens) — finish 'cancelled' when we hung up."""
    common = dict(model=model, temperature=0, **args)
    if not stream:
        c = client if timeout is None else client.with_options(timeout=timeout)
        try:
            if kind == "chat":
                r = c.chat.completions.create(**common)
                return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens
            r = c.completions.create(**common)
            return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens
        except openai.APITimeoutError:
            if timeout is None:
                raise
            return "", "cancelled", None  # we hung up: the server must see it and free the blocks
    create = client.chat.completions.create if kind == "chat" else client.completions.create
    s = create(stream=True, stream_options={"include_usage": True}, **common)
    text, finish, usage, chunks = "", None, None, 0
    for chunk in s:
        if chunk.usage:
            usage = chunk.usage.completion_tokens
        for ch in chunk.choices:
            piece = (ch.delta.content or "") if kind == "chat" else ch.text
            text += piece
            chunks += 1 if piece else 0
            finish = ch.finish_reason or finish
        if cancel_after is not None and chunks >= cancel_after:
            s.close()  # hang up mid-stream: the server must cancel and free the blocks
            return text, "cancelled", None
    return text, finish, usage


def run_load(server, clients, requests, log=lambda *a: None):
    """The load test against `server` (conftest.Server or Remote). Returns a summary dict."""
    reqs = request_set()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=1800,
                           http_client=httpx.Client(limits=httpx.Limits(max_connections=clients + 8)))
    model = client.models.list().data[0].id
    # The same requests sent alone first: the greedy reference.
    t0 = time.time()
    ref = [run(client, model, k, a, stream=False) for k, a in reqs]
    log(f"reference: {len(reqs)} requests one at a time in {time.time() - t0:.1f} s")
    base = server.metrics()

    results, errors = [], []
    lock = threading.Lock()

    def worker(c):
        rng = random.Random(c)
        for _ in range(requests):
            i = rng.randrange(len(reqs))
            stream = rng.random() < STREAM_SHARE
            cancel = 2 if stream and rng.random() < CANCEL_STREAM else None
            timeout = rng.uniform(0.1, 1.0) if not stream and rng.random() < CANCEL_BLOCKING else None
            try:
                out = run(client, model, *reqs[i], stream=stream, cancel_after=cancel, timeout=timeout)
                with lock:
                    results.append((i, stream, cancel is not None or timeout is not None, out))
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(repr(e))

    t0 = time.time()
    threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    assert not errors, (len(errors), errors[:3])
    assert len(results) == clients * requests

    completed = cancelled = asked = 0
    gen_tokens = 0
    for i, stream, cancel, (text, finish, usage) in results:
        rtext, rfinish, rusage = ref[i]
        asked += cancel
        if cancel and finish == "cancelled":  # what came before the hang-up: a prefix of the answer
            assert rtext.startswith(text), (i, stream, text, rtext)
            cancelled += 1
            continue
        assert finish == rfinish, (i, stream, finish, rfinish)
        assert text == rtext, (i, stream, text, rtext)
        assert usage == rusage, (i, stream, usage, rusage)
        completed += 1
        gen_tokens += usage

    m = server.wait_pool_empty(timeout=60)
    delta = {k: m[k] - base[k] for k in ("escala_requests_finished_total", "escala_requests_cancelled_total",
                                         "escala_requests_failed_total", "escala_generation_tokens_total",
                                         "escala_preemptions_total", "escala_prefix_cache_hit_tokens_total",
                                         "escala_prompt_tokens_total", "escala_engine_steps_total")}
    summary = {"clients": clients, "requests": len(results), "wall_s": wall, "completed": completed,
               "cancelled_by_client": cancelled, "cancels_asked": asked,
               "server_finished": int(delta["escala_requests_finished_total"]),
               "server_cancelled": int(delta["escala_requests_cancelled_total"]),
               "server_failed": int(delta["escala_requests_failed_total"]),
               "completed_tokens": gen_tokens, "server_generated_tokens": int(delta["escala_generation_tokens_total"]),
               "prompt_tokens": int(delta["escala_prompt_tokens_total"]),
               "prefix_hit_tokens": int(delta["escala_prefix_cache_hit_tokens_total"]),
               "preemptions": int(delta["escala_preemptions_total"]), "steps": int(delta["escala_engine_steps_total"]),
               "kv_blocks_used_after": int(m["escala_kv_blocks_used"]),
               "running_after": int(m["escala_requests_running"]), "waiting_after": int(m["escala_requests_waiting"])}
    log(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items()))
    assert m["escala_kv_blocks_used"] == 0, summary
    assert m["escala_requests_running"] == 0 and m["escala_requests_waiting"] == 0, summary
    assert summary["server_failed"] == 0, summary
    # Every request sent ended on the server as finished or cancelled, and only a request we hung
    # up on was cancelled (one we hung up on may have finished first).
    assert summary["server_finished"] + summary["server_cancelled"] == len(results), summary
    assert summary["server_cancelled"] <= cancelled <= asked, summary
    return summary


def test_load(server):
    run_load(server, CLIENTS, REQUESTS, log=lambda *a: sys.stderr.write(" ".join(map(str, a)) + "\n"))


def main():
    import argparse
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from conftest import Server

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=50, help="requests per client")
    ap.add_argument("--url", help="a running server (default: start build/escala serve --max-batch 64)")
    ap.add_argument("--server-args", default="", help="more flags for the server started here, e.g. "
                    "'--kv-budget 12000000' (a pool of ~30 blocks: preemption under load)")
    args = ap.parse_args()

    class Remote(Server):
        def __init__(self, url):  # noqa: D401 - only the url; metrics() and wait_pool_empty() need no more
            self.url = url.rstrip("/")

    server = Remote(args.url) if args.url else Server("--max-batch", "64", *args.server_args.split())
    try:
        run_load(server, args.clients, args.requests, log=print)
        print("PASS")
    finally:
        if not args.url:
            rc = server.stop()
            print(f"server exit code {rc}")
            if rc != 0:
                sys.exit(1)


if __name__ == "__main__":
    main()
