"""A client that goes away cancels its request and frees its blocks: a stream hung up mid-stream,
and a non-streaming request abandoned before its answer (nothing is written to that connection
until the answer is complete; the server watches the socket for the client's FIN)."""
try:  # the openai client of 2026 ships on httpx2, earlier ones on httpx
    import httpx2 as httpx
except ImportError:
    import httpx
import time

LONG = {"prompt": "Count: 1, 2, 3,", "max_tokens": 4000, "temperature": 0, "ignore_eos": True}


def _counts(server):
    m = server.metrics()
    return m["escala_requests_cancelled_total"], m["escala_requests_finished_total"]


def _check_cancelled(server, before):
    # The engine drops a cancelled request at the start of its next step (a step can take seconds
    # on a loaded machine).
    deadline = time.time() + 60
    while server.metrics()["escala_requests_cancelled_total"] == before[0] and time.time() < deadline:
        time.sleep(0.1)
    m = server.wait_pool_empty(timeout=30)
    assert m["escala_kv_blocks_used"] == 0 and m["escala_requests_running"] == 0
    assert m["escala_requests_waiting"] == 0
    assert m["escala_requests_cancelled_total"] == before[0] + 1
    assert m["escala_requests_finished_total"] == before[1]


def test_non_streaming_client_disconnect_cancels(server):
    before = _counts(server)
    try:
        httpx.post(server.url + "/v1/completions", json=LONG, timeout=1.5)
        raise AssertionError("4000 tokens in 1.5 s: the request was meant to be cut off")
    except httpx.TimeoutException:
        pass  # httpx closes the connection
    _check_cancelled(server, before)


def test_streaming_client_disconnect_cancels(server):
    before = _counts(server)
    with httpx.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break
    _check_cancelled(server, before)
