"""Graceful shutdown: SIGTERM / SIGINT with streams in flight stops the server with exit code 0."""
import signal
import threading
import time

try:  # the openai client of 2026 ships on httpx2, earlier ones on httpx
    import httpx2 as httpx
except ImportError:
    import httpx

from conftest import Server


def _stream(url, out):
    try:
        with httpx.stream("POST", url + "/v1/completions", timeout=60,
                          json={"prompt": "Count: 1, 2, 3,", "max_tokens": 400, "stream": True,
                                "temperature": 0, "ignore_eos": True}) as r:
            for line in r.iter_lines():
                out.append(line)
    except httpx.HTTPError as e:
        out.append(repr(e))


def test_sigterm_and_sigint_exit_zero():
    for sig in (signal.SIGTERM, signal.SIGINT):
        s = Server("--max-batch", "4")
        out = []
        t = threading.Thread(target=_stream, args=(s.url, out))
        t.start()
        deadline = time.time() + 30
        while len(out) < 3 and time.time() < deadline:
            time.sleep(0.05)
        assert s.stop(sig) == 0, "".join(s.log)
        t.join(30)
        assert not t.is_alive()
        assert out  # the stream had started; it ends cut short or with an error event
