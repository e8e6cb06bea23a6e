"""Fixtures for the `escala serve` end-to-end tests: a server on a loopback port with the default model."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

try:  # the openai client of 2026 ships on httpx2, earlier ones on httpx
    import httpx2 as httpx
except ImportError:
    import httpx
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def escala_bin():
    b = os.environ.get("ESCALA_BIN")
    if b:
        return b
    for d in ("build-serve", "build"):
        p = os.path.join(REPO, d, "escala")
        if os.path.exists(p):
            return p
    pytest.skip("no escala binary (set ESCALA_BIN)")


class Server:
    def __init__(self, *args):
        self.proc = subprocess.Popen([escala_bin(), "serve", "--port", "0", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("escala serve did not start:\n" + "".join(self.log))
        # Keep draining stderr so the server never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def metrics(self):
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0] if "_bucket" not in name else name] = float(value)
        return out

    def wait_pool_empty(self, timeout=30):
        deadline = time.time() + timeout
        m = self.metrics()
        while time.time() < deadline:
            m = self.metrics()
            if m["escala_kv_blocks_used"] == 0 and m["escala_requests_running"] == 0 \
                    and m["escala_requests_waiting"] == 0:
                return m
            time.sleep(0.2)
        return m

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    s = Server("--max-batch", "64")
    yield s
    rc = s.stop()
    sys.stderr.write("".join(s.log[-5:]))
    assert rc == 0, "escala serve exited with %s" % rc


@pytest.fixture(scope="session")
def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def model_id(client):
    return client.models.list().data[0].id
