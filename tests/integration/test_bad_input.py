"""The bad-input suite: malformed and hostile requests, each answered with the expected status
and an OpenAI error object; afterwards the server is up and the KV cache is empty again."""
import json
import socket
import time

import pytest

from conftest import TINY_QWEN3, Server

C = "/v1/completions"
H = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]

# (name, route, body (dict / str / bytes), expected status, expected param or None)
JSON_CASES = [
    ("malformed", C, "{", 400, None),
    ("truncated", C, '{"prompt": "x"', 400, None),
    ("empty body", C, "", 400, None),
    ("array body", C, "[1, 2]", 400, None),
    ("string body", C, '"prompt"', 400, None),
    ("null body", C, "null", 400, None),
    ("missing prompt", C, {}, 400, "prompt"),
    ("empty prompt", C, {"prompt": ""}, 400, "prompt"),
    ("empty prompt list", C, {"prompt": []}, 400, "prompt"),
    ("prompt number", C, {"prompt": 5}, 400, "prompt"),
    ("prompt object", C, {"prompt": {"a": 1}}, 400, "prompt"),
    ("prompt mixed list", C, {"prompt": [1, "a"]}, 400, "prompt"),
    ("negative token", C, {"prompt": [-1]}, 400, "prompt"),
    ("token out of vocab", C, {"prompt": [999999]}, 400, "prompt"),
    ("float token", C, {"prompt": [1.5]}, 400, "prompt"),
    ("empty token list in list", C, {"prompt": [[]]}, 400, "prompt"),
    ("max_tokens 0", C, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", C, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("max_tokens string", C, {"prompt": "x", "max_tokens": "8"}, 400, "max_tokens"),
    ("max_tokens fraction", C, {"prompt": "x", "max_tokens": 1.5}, 400, "max_tokens"),
    ("temperature negative", C, {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("temperature huge", C, {"prompt": "x", "temperature": 3}, 400, "temperature"),
    ("temperature string", C, {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ("top_p zero", C, {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("top_p above one", C, {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("top_k below -1", C, {"prompt": "x", "top_k": -5}, 400, "top_k"),
    ("min_p above one", C, {"prompt": "x", "min_p": 2}, 400, "min_p"),
    ("presence_penalty", C, {"prompt": "x", "presence_penalty": 5}, 400, "presence_penalty"),
    ("frequency_penalty", C, {"prompt": "x", "frequency_penalty": -5}, 400, "frequency_penalty"),
    ("repetition_penalty zero", C, {"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("n zero", C, {"prompt": "x", "n": 0}, 400, "n"),
    ("huge n", C, {"prompt": "x", "n": 1000000}, 400, "n"),
    ("logprobs above cap", C, {"prompt": "x", "logprobs": 100}, 400, "logprobs"),
    ("stop number", C, {"prompt": "x", "stop": 5}, 400, "stop"),
    ("huge stop list", C, {"prompt": "x", "stop": [f"s{i}" for i in range(10000)]}, 400, "stop"),
    ("empty stop string", C, {"prompt": "x", "stop": [""]}, 400, "stop"),
    ("stream not bool", C, {"prompt": "x", "stream": "yes"}, 400, "stream"),
    ("stream_options without stream", C, {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("seed string", C, {"prompt": "x", "seed": "abc"}, 400, "seed"),
    ("prompt_logprobs above 20", C, {"prompt": "x", "prompt_logprobs": 21}, 400, "prompt_logprobs"),
    ("min_tokens above max_tokens", C, {"prompt": "x", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
    ("suffix", C, {"prompt": "x", "suffix": "tail"}, 400, "suffix"),
    ("stop_token_ids out of vocab", C, {"prompt": "x", "stop_token_ids": [999999]}, 400, "stop_token_ids"),
    ("unknown model", C, {"prompt": "x", "model": "gpt-17"}, 404, None),
    ("context exceeded", C, {"prompt": "x", "max_tokens": 100000}, 400, "prompt"),
    ("1 MB prompt", C, {"prompt": "word " * 200000}, 400, "prompt"),
    ("deeply nested JSON", C, '{"prompt": "x", "a": ' + "[" * 100000 + "]" * 100000 + "}", 400, None),
    ("raw NUL in string", C, b'{"prompt": "a\x00b"}', 400, None),
    ("invalid UTF-8", C, b'{"prompt": "\xff\xfe\xfd"}', 400, None),
    ("lone high surrogate", C, '{"prompt": "\\ud800"}', 400, None),
    ("lone low surrogate", C, '{"prompt": "x\\udc00"}', 400, None),
    ("messages missing", H, {}, 400, "messages"),
    ("messages empty", H, {"messages": []}, 400, "messages"),
    ("messages not a list", H, {"messages": "hi"}, 400, "messages"),
    ("message without role", H, {"messages": [{"content": "x"}]}, 400, "messages[0].role"),
    ("content number", H, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("image content", H, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages[0].content"),
    ("top_logprobs without logprobs", H, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs"),
    ("max_completion_tokens 0", H, {"messages": USER, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("chat context exceeded", H, {"messages": [{"role": "user", "content": "word " * 3000}]}, 400, "messages"),
    ("chat huge n", H, {"messages": USER, "n": 4096}, 400, "n"),
    ("tokenize prompt number", "/tokenize", {"prompt": 5}, 400, "prompt"),
    ("tokenize bad messages", "/tokenize", {"messages": []}, 400, "messages"),
    ("detokenize bad ids", "/detokenize", {"tokens": [-5]}, 400, "tokens"),
    ("detokenize not a list", "/detokenize", {"tokens": "abc"}, 400, "tokens"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(TINY_QWEN3, "--kv-cache-memory", 4_000_000, "--max-model-len", 1024, "--request-timeout", 2,
               tmp_path=tmp_path_factory.mktemp("bad"))
    yield s
    assert s.stop() == 0, s.log_text()


def check_error(status, body, want_status, want_param=None):
    assert status == want_status, body[:300]
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if want_param is not None:
        assert err["param"] == want_param, err
    return err


@pytest.mark.parametrize("name,route,body,status,param", JSON_CASES, ids=[c[0] for c in JSON_CASES])
def test_json_case(server, name, route, body, status, param):
    got, headers, text = server.post(route, body)
    err = check_error(got, text, status, param)
    if "exceeded" in name or name == "1 MB prompt":
        assert err["code"] == "context_length_exceeded" and "maximum context length is 1024 tokens" in err["message"]
    assert len(headers.get("X-Request-Id", "")) == 16


def raw(server, data, read_timeout=5.0, half_close=False):
    """Sends raw bytes; returns what the server answered before closing (or b'' on timeout)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=read_timeout) as s:
        head, sep, body = data.partition(b"\r\n\r\n")
        s.sendall(head + sep)
        try:
            s.sendall(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered early (413) and stopped reading
        if half_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
                if b"\r\n\r\n" in out and b'"}}' in out:
                    break
        except (socket.timeout, ConnectionResetError):
            pass
        return out


def status_and_body(response):
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


PROTOCOL_CASES = [
    ("GET on a POST route", b"GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", 405),
    ("PUT on chat", b"PUT /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405),
    ("POST on models", b"POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405),
    ("unknown route", b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", 404),
    ("wrong content type", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 15\r\n\r\n"
     b'{"prompt": "x"}', 415),
    ("form content type", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
     b"Content-Length: 3\r\n\r\na=b", 415),
    ("no content type", b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n\r\n{"prompt": "x"}', 415),
    ("malformed request line", b"HELLO\r\n\r\n", 400),
    ("bad Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
    ("headers over the limit", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 40000 + b"\r\n\r\n", 431),
    ("body over the limit", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
     b"Content-Length: 5000000\r\n\r\n" + b"a" * 5_000_000, 413),
]


@pytest.mark.parametrize("name,data,status", PROTOCOL_CASES, ids=[c[0] for c in PROTOCOL_CASES])
def test_protocol_case(server, name, data, status):
    got, body = status_and_body(raw(server, data))
    check_error(got, body, status)


def test_connection_closed_mid_body_and_slowloris(server):
    # Content-Length promises more than arrives; the client gives up: no answer, no harm.
    assert raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 1000\r\n\r\n{\"prompt\": \"ab", half_close=True) == b""
    # Slow headers: one line every 0.5 s; the 2 s request deadline closes the connection.
    start = time.time()
    closed = False
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\n")
        for _ in range(20):
            time.sleep(0.5)
            try:
                s.sendall(b"X-Slow: 1\r\n")
                s.settimeout(0.01)
                if s.recv(1) == b"":
                    closed = True
                    break
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
    assert closed and time.time() - start < 6


def test_server_survives_and_kv_returns_to_zero(server):
    assert server.alive()
    assert server.get("/health")[0] == 200
    status, _, body = server.post(C, {"prompt": "still alive?", "max_tokens": 3})
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
    assert server.wait_kv_idle() == 0
    m = server.metrics()
    assert m['fp8serve:http_responses_total{status="400"}'] >= 50


def test_api_key(tmp_path):
    s = Server(TINY_QWEN3, "--kv-cache-memory", 4_000_000, "--api-key", "sekrit", tmp_path=tmp_path)
    try:
        assert s.get("/health")[0] == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}, {"Authorization": "Bearer sekri"}):
            status, _, body = s.get("/v1/models", headers=headers)
            assert check_error(status, body, 401)["code"] == "invalid_api_key"
            assert s.post(C, {"prompt": "x"}, headers=headers)[0] == 401
        assert s.get("/metrics")[0] == 401
        assert s.get("/v1/models", headers={"Authorization": "Bearer sekrit"})[0] == 200
        assert s.post(C, {"prompt": "x", "max_tokens": 2}, headers={"Authorization": "Bearer sekrit"})[0] == 200
    finally:
        assert s.stop() == 0
