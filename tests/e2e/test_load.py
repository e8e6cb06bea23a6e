"""Load: C concurrent clients x R requests (CI: 16 x 10; the issue's 64 x 50 by hand with
ESCALA_LOAD_CLIENTS=64 ESCALA_LOAD_REQUESTS=50). Mixed prompt lengths, some sharing a system prompt,
some cancelled mid-stream. Every request completes or is cancelled as asked, no token is lost or
duplicated in a stream, greedy outputs equal the same request sent alone, and the block pool returns
to empty."""
import os
import random
import threading

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


def request_set():
    """A fixed set of distinct requests (both endpoints, mixed lengths, some with a shared prefix)."""
    out = []
    for i, t in enumerate(TOPICS):
        q = f"Tell me one fact about {t}." + (" Please keep it short and simple." * (i % 4))
        msgs = ([{"role": "system", "content": SYSTEM}] if i % 2 == 0 else []) + [{"role": "user", "content": q}]
        out.append(("chat", {"messages": msgs, "max_tokens": 8 + (i * 5) % 24}))
        out.append(("completion", {"prompt": f"A short note on {t}:" + " and more" * (i % 5),
                                   "max_tokens": 6 + (i * 7) % 20}))
    return out


def run(client, model, kind, args, stream, cancel_after=None):
    """Returns (text, finish_reason, completion_tokens) — finish 'cancelled' when we hung up."""
    common = dict(model=model, temperature=0, **args)
    if not stream:
        if kind == "chat":
            r = client.chat.completions.create(**common)
            return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens
        r = client.completions.create(**common)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens
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


def test_load(server, model_id):
    reqs = request_set()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600,
                           http_client=httpx.Client(limits=httpx.Limits(max_connections=CLIENTS + 8)))
    # The same requests sent alone first: the greedy reference.
    ref = [run(client, model_id, k, a, stream=False) for k, a in reqs]
    base = server.metrics()

    results, errors = [], []
    lock = threading.Lock()

    def worker(c):
        rng = random.Random(c)
        for j in range(REQUESTS):
            i = rng.randrange(len(reqs))
            stream = rng.random() < 0.7
            cancel = 2 if stream and rng.random() < 0.1 else None
            try:
                out = run(client, model_id, *reqs[i], stream=stream, cancel_after=cancel)
                with lock:
                    results.append((i, stream, cancel, out))
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(results) == CLIENTS * REQUESTS
    for i, stream, cancel, (text, finish, usage) in results:
        rtext, rfinish, rusage = ref[i]
        if cancel is not None:
            if finish == "cancelled":  # a prefix of the full answer
                assert rtext.startswith(text), (i, text, rtext)
                continue
        assert finish == rfinish, (i, stream, finish, rfinish)
        assert text == rtext, (i, stream, text, rtext)
        assert usage == rusage, (i, stream, usage, rusage)

    m = server.wait_pool_empty()
    assert m["escala_kv_blocks_used"] == 0
    assert m["escala_requests_running"] == 0 and m["escala_requests_waiting"] == 0
    cancelled = sum(1 for r in results if r[3][1] == "cancelled")
    assert m["escala_requests_cancelled_total"] - base["escala_requests_cancelled_total"] >= cancelled - 2
