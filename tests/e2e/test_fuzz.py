"""Malformed and hostile bodies on the JSON endpoints: the server stays up and answers 4xx with an
OpenAI-style error object."""
import json
import random

try:  # the openai client of 2026 ships on httpx2, earlier ones on httpx
    import httpx2 as httpx
except ImportError:
    import httpx

ENDPOINTS = ["/v1/chat/completions", "/v1/completions"]


def hostile_bodies():
    rng = random.Random(1)
    yield b""
    yield b"null"
    yield b"[]"
    yield b"42"
    yield b"{"
    yield b'{"messages": "hi"'
    yield b"[" * 200000 + b"]" * 200000          # deeply nested
    yield b'{"a":' * 50000 + b"1" + b"}" * 50000
    yield b'{"prompt": "\xff\xfe bad utf8", "messages": [{"role": "user", "content": "\xc3\x28"}]}'
    yield b'{"prompt": "\\ud800", "messages": [{"role":"user","content":"\\udc00 lone surrogate"}]}'
    yield b'{"max_tokens": 1e400, "prompt": "x", "messages": [{"role": "user", "content": "x"}]}'
    yield b'{"max_tokens": NaN, "prompt": "x"}'
    yield b'{"prompt": "x", "max_tokens": 18446744073709551616}'
    yield b'{"prompt": [1, 2, -5], "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}'
    yield b'{"prompt": [99999999], "messages": [{"role": "user"}]}'
    yield b'{"prompt": {"a": 1}, "messages": {"role": "user", "content": "x"}}'
    yield b'{"prompt": "x", "messages": [{"role":"user","content":"x"}], "stream": "yes"}'
    yield b'{"prompt": "x", "messages": [{"role":"user","content":"x"}], "stop": "", "max_tokens": 2}'
    yield b'{"prompt": "x", "messages": [{"role":"user","content":"x"}], "seed": 1.5}'
    yield b'{"prompt": "x", "messages": [{"role":"user","content":"x"}], "temperature": true}'
    yield b'{"prompt": "x", "messages": [{"role":"user","content":"x"}], "stream_options": {"include_usage": 1}}'
    for _ in range(60):  # random bytes and mutated JSON
        if rng.random() < 0.5:
            yield bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
        else:
            good = bytearray(json.dumps({"prompt": "hello", "messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": 3, "temperature": 0}).encode())
            for _ in range(rng.randrange(1, 6)):
                good[rng.randrange(len(good))] = rng.randrange(256)
            yield bytes(good)


def test_fuzz_json_endpoints(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        n = 0
        for body in hostile_bodies():
            for ep in ENDPOINTS:
                r = c.post(ep, content=body, headers={"Content-Type": "application/json"})
                n += 1
                if r.status_code == 200:  # a mutation that stayed valid JSON and valid fields
                    continue
                assert 400 <= r.status_code < 500, (ep, body[:80], r.status_code, r.text[:200])
                err = r.json()["error"]
                assert err["message"] and err["type"]
        # Oversized body: 413 (the limit is 4 MiB by default).
        r = c.post(ENDPOINTS[0], content=b"{" + b" " * (5 << 20) + b"}", headers={"Content-Type": "application/json"})
        assert r.status_code == 413, r.status_code
        # Unknown route and method.
        assert c.get("/v1/nothing").status_code == 404
        assert c.get("/health").json() == {"status": "ok"}
    assert n > 100
    assert server.proc.poll() is None
    assert server.wait_pool_empty()["escala_kv_blocks_used"] == 0
