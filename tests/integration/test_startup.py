"""Start-up: flag validation, --config files, the port already taken, /health while loading,
and the start-up log's summary."""
import json
import socket
import subprocess
import time
import urllib.request

import pytest

from conftest import DEFAULT_MODEL, TINY_QWEN3, Server, binary, free_port


def run(*args, timeout=60):
    return subprocess.run([str(binary()), *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("flag,value,needle", [
    ("--max-body-bytes", "5", "--max-body-bytes: must be in [1024, "),
    ("--max-header-bytes", "abc", "--max-header-bytes: expected an integer"),
    ("--request-timeout", "0", "--request-timeout: must be in [0.1, 3600]"),
    ("--port", "70000", "--port: must be in [1, 65535]"),
    ("--max-waiting-requests", "0", "--max-waiting-requests: must be in [1, "),
    ("--kv-cache-dtype", "fp4", "--kv-cache-dtype: must be one of fp8_e4m3, bf16"),
    ("--kv-bf16-window", "20", "--kv-bf16-window: must be a multiple of --block-size (16), got 20"),
])
def test_invalid_flag_stops_startup_naming_the_flag(flag, value, needle):
    r = run("serve", TINY_QWEN3, flag, value)
    assert r.returncode == 2 and needle in r.stderr, r.stderr


def test_config_file_and_command_line_override(tmp_path):
    cfg = tmp_path / "serve.json"
    cfg.write_text(json.dumps({"served-model-name": "from-file", "max-model-len": 256, "kv-cache-memory": 4000000}))
    s = Server(TINY_QWEN3, "--config", cfg, "--max-model-len", 512, tmp_path=tmp_path)
    try:
        models = json.loads(s.get("/v1/models")[2])["data"]
        assert models[0]["id"] == "from-file" and models[0]["max_model_len"] == 512
        log = s.log_text()
        for needle in ["listening on http://127.0.0.1:", "device: cpu", "model: ", "KV cache: ", "fp8_e4m3", "margin",
                       "bf16 window", "pool + tail"]:
            assert needle in log, needle
    finally:
        assert s.stop() == 0


def test_port_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = run("serve", TINY_QWEN3, "--port", taken.getsockname()[1])
    assert r.returncode == 2 and "cannot listen on 127.0.0.1:" in r.stderr, r.stderr


@pytest.mark.skipif(not DEFAULT_MODEL.exists(), reason="default model absent")
def test_health_is_503_while_the_model_loads(tmp_path):
    port = free_port()
    proc = subprocess.Popen([str(binary()), "serve", str(DEFAULT_MODEL), "--port", str(port), "--kv-cache-memory", "64000000",
                             "--max-num-seqs", "8"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and 200 not in seen:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    seen.append(r.status)
            except urllib.error.HTTPError as e:
                seen.append(e.code)
            except OSError:
                pass
            time.sleep(0.01)
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    assert 503 in seen and seen[-1] == 200 and seen.index(200) > seen.index(503)
