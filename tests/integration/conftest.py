"""Integration tests: the real `fp8serve serve` process on 127.0.0.1, driven by curl, raw
sockets and the official `openai` package. The binary comes from $FP8SERVE_BIN (CTest sets
it); models are the tiny fixtures and, where present, the default SmolLM2 GGUF."""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
TINY_QWEN3 = FIXTURES / "models" / "tiny-qwen3"
TINY_LLAMA = FIXTURES / "models" / "tiny-llama"
DEFAULT_MODEL = ROOT / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def binary():
    path = Path(os.environ.get("FP8SERVE_BIN", ROOT / "build" / "server" / "fp8serve"))
    if not path.exists():
        pytest.fail(f"fp8serve binary not found at {path}: build it or set FP8SERVE_BIN")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_then_drop(port, path, body, marker, count, timeout=60):
    """Posts `body` (a streaming request) on a raw socket, reads until `marker` has come `count`
    times, then closes the connection mid-stream; returns the bytes read. The server must notice
    and abort the request."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        seen = b""
        while seen.count(marker) < count:
            chunk = sock.recv(4096)
            assert chunk, "server closed the stream early: " + seen.decode(errors="replace")[-500:]
            seen += chunk
    return seen


class Server:
    """One `fp8serve serve` process; stop() sends SIGTERM and returns the exit code. `command`
    runs another server instead (llama.cpp's, in tests/bench/compare_llama_spec.py): its argv, to
    which `--port PORT` is appended; it too must answer /health with 200 once ready."""

    def __init__(self, model, *flags, tmp_path=None, port=None, command=None, timeout=120):
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        name = Path(command[0]).name if command else "fp8serve"
        self.log_path = Path(tmp_path or "/tmp") / f"{name}-{self.port}.log"
        self.log = open(self.log_path, "w")
        if command:
            args = [*map(str, command), "--port", str(self.port)]
        else:
            args = [str(binary()), "serve", str(model), "--port", str(self.port), "--threads", "2", *map(str, flags)]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.proc.kill()
        raise RuntimeError(f"{name} did not become healthy:\n{self.log_text()}")

    def log_text(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-5000:]

    def startup_log(self):
        """The log's beginning: the start-up lines, which a long-lived server's request lines push
        out of log_text()."""
        self.log.flush()
        return self.log_path.read_text(errors="replace")[:5000]

    def alive(self):
        return self.proc.poll() is None

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    # Small helpers shared by the tests.
    def post(self, path, body, headers=None, timeout=60):
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        if isinstance(data, str):
            data = data.encode()
        req = urllib.request.Request(self.base + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def get(self, path, headers=None, timeout=30):
        req = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def metrics(self):
        status, _, body = self.get("/metrics")
        assert status == 200
        values = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def wait_kv_idle(self, timeout=10):
        """Waits until no sequence runs or waits; returns the KV usage gauge then."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            idle = m["fp8serve:num_requests_running"] == 0 and m["fp8serve:num_requests_waiting"] == 0
            if (idle and m["fp8serve:kv_cache_usage_perc"] == 0) or time.time() > deadline:
                return m["fp8serve:kv_cache_usage_perc"]
            time.sleep(0.05)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    server = Server(TINY_QWEN3, "--kv-cache-memory", 8_000_000, "--served-model-name", "tiny",
                    "--max-model-len", 1024, tmp_path=tmp_path_factory.mktemp("tiny"))
    yield server
    assert server.stop() == 0, server.log_text()


@pytest.fixture(scope="session")
def smol(tmp_path_factory):
    if not DEFAULT_MODEL.exists():
        pytest.skip(f"default model absent ({DEFAULT_MODEL}): run .ci/fetch-model")
    # bf16 KV so that greedy outputs compare exactly with the transformers reference.
    server = Server(DEFAULT_MODEL, "--kv-cache-memory", 64_000_000, "--max-model-len", 2048, "--kv-cache-dtype", "bf16",
                    tmp_path=tmp_path_factory.mktemp("smol"))
    yield server
    assert server.stop() == 0, server.log_text()


@pytest.fixture(scope="session")
def structured_server(tmp_path_factory):
    """The default model with room for 16 sequences, shared by the structured-output tests."""
    if not DEFAULT_MODEL.exists():
        pytest.skip(f"default model absent ({DEFAULT_MODEL}): run .ci/fetch-model")
    server = Server(DEFAULT_MODEL, "--kv-cache-memory", 256_000_000, "--max-model-len", 2048, "--max-num-seqs", 16,
                    tmp_path=tmp_path_factory.mktemp("structured"))
    yield server
    assert server.wait_kv_idle() == 0, "KV blocks leaked"
    assert server.stop() == 0, server.log_text()


@pytest.fixture(scope="session")
def structured_client(structured_server):
    import openai
    return openai.OpenAI(base_url=structured_server.base + "/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="session")
def openai_client(tiny):
    import openai
    return openai.OpenAI(base_url=tiny.base + "/v1", api_key="unused", max_retries=0, timeout=60)
