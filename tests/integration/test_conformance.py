"""API and HTTP conformance on the wire (issue 13): what outside testing found, each checked
against the real server with curl-like raw sockets and the official `openai` client, and
against independent references where there is one (transformers' logits for logit_bias, HF
tokenizers and Python's UTF-8 codec for streamed text, jinja2's renderings for templates)."""
import json
import re
import socket
import subprocess
import sys

import openai
import pytest
from tokenizers import Tokenizer

from conftest import FIXTURES, ROOT, TINY_LLAMA, TINY_QWEN3, Server, binary

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from byte_level import byte_decoder, stream_text, token_bytes  # noqa: E402

C = "/v1/completions"
H = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
EMOJI_PROMPT = "Emoji list: 😀 😃 😄"
SMOL_TOKENIZER = FIXTURES / "tokenizer" / "smollm2" / "tokenizer.json"


def error_of(status, body, want_status):
    assert status == want_status, body[:500]
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def raw_exchange(port, data, until, timeout=10):
    """Sends raw bytes on one connection; reads until `until` (bytes) has arrived or the peer closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while until not in out:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


def smol_client(smol):
    return openai.OpenAI(base_url=smol.base + "/v1", api_key="unused", max_retries=0, timeout=120)


def smol_model_name(smol):
    return json.loads(smol.get("/v1/models")[2])["data"][0]["id"]


# ---------------------------------------------------------------------------------------------
# logit_bias, against transformers' logits of the default model (tests/fixtures/engine)

def reference_prompts():
    path = FIXTURES / "engine" / "smollm2-135m-q4_1.kv-bf16.json"
    return json.loads(path.read_text())["prompts"]


def first_token(client, model, prompt_ids, **extra):
    r = client.completions.create(model=model, prompt=prompt_ids, max_tokens=1, temperature=0, logprobs=0,
                                  extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True, **extra})
    token = r.choices[0].logprobs.tokens[0]
    assert token.startswith("token_id:")
    return int(token.split(":")[1])


def test_logit_bias_moves_greedy_tokens_as_transformers_logits_say(smol):
    client, model = smol_client(smol), smol_model_name(smol)
    checked = 0
    for prompt in reference_prompts():
        top, values = prompt["last_logits"]["top_ids"], prompt["last_logits"]["top_values"]
        # Only ranks clear of bf16 noise (the reference rounds K/V as our bf16 pool does).
        if values[0] - values[1] < 0.1 or values[1] - values[2] < 0.1:
            continue
        ids = prompt["prompt_ids"]
        assert first_token(client, model, ids) == top[0]
        assert first_token(client, model, ids, logit_bias={str(top[0]): -100}) == top[1]
        if values[2] - values[3] >= 0.1:
            assert first_token(client, model, ids, logit_bias={str(top[0]): -100, str(top[1]): -100}) == top[2]
        assert first_token(client, model, ids, logit_bias={str(top[15]): 100}) == top[15]
        # Through the openai client's own parameter, ints as OpenAI types them.
        r = client.completions.create(model=model, prompt=ids, max_tokens=1, temperature=0, logprobs=0,
                                      logit_bias={str(top[0]): -100},
                                      extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True})
        assert r.choices[0].logprobs.tokens[0] == f"token_id:{top[1]}"
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("bias,fragment", [
    ({"abc": 1}, "decimal integers"), ({"1.5": 1}, "decimal integers"), ({"-3": 1}, "decimal integers"),
    ({"49152": 1}, "out of vocabulary"), ({"99999999": 1}, "out of vocabulary"), ({"5": "high"}, "numbers"),
    ({"5": 101}, "[-100, 100]"), ({"5": -100.5}, "[-100, 100]"), ({"5": None}, "numbers"), ([5], "object"),
])
def test_logit_bias_bad_input_is_a_400(smol, bias, fragment):
    status, _, body = smol.post(C, {"prompt": "x", "max_tokens": 1, "logit_bias": bias})
    err = error_of(status, body, 400)
    assert err["param"] == "logit_bias" and fragment in err["message"], err


# ---------------------------------------------------------------------------------------------
# best_of

def test_best_of_returns_the_candidate_of_highest_cumulative_logprob(openai_client):
    # Choice i samples with seed + i in both requests, so n=4 shows the four candidates that
    # best_of=4 chose among.
    args = dict(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=1.0, seed=11,
                extra_body={"ignore_eos": True})
    all4 = openai_client.completions.create(n=4, logprobs=0, **args)
    sums = [sum(c.logprobs.token_logprobs) for c in all4.choices]
    texts = [c.text for c in all4.choices]
    assert len(set(texts)) > 1  # the candidates differ
    best = openai_client.completions.create(n=1, best_of=4, **args)
    assert len(best.choices) == 1 and best.choices[0].index == 0
    assert best.choices[0].text == texts[max(range(4), key=lambda i: sums[i])]
    assert best.choices[0].logprobs is None  # not asked for
    assert best.usage.completion_tokens == 24  # every candidate's tokens
    two = openai_client.completions.create(n=2, best_of=4, logprobs=0, **args)
    ranked = sorted(range(4), key=lambda i: -sums[i])
    assert [c.text for c in two.choices] == [texts[ranked[0]], texts[ranked[1]]]
    assert [c.index for c in two.choices] == [0, 1]


@pytest.mark.parametrize("body,fragment", [
    ({"n": 3, "best_of": 2}, "at least 'n'"), ({"best_of": 1.5}, "integer"), ({"best_of": "2"}, "integer"),
    ({"best_of": 3, "stream": True}, "streamed"), ({"best_of": 100}, "[1, 16]"),
])
def test_best_of_bad_input_is_a_400(tiny, body, fragment):
    status, _, text = tiny.post(C, {"prompt": "x", "max_tokens": 2, **body})
    err = error_of(status, text, 400)
    assert err["param"] == "best_of" and fragment in err["message"], err


# ---------------------------------------------------------------------------------------------
# response_format / tools / tool_choice, unknown and ignored fields

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_structured_output_and_tool_calls_through_the_openai_client(openai_client):
    # The tiny fixture model has random weights: the grammar alone makes these answers valid
    # (test_structured_outputs.py runs the real model and checks them with jsonschema).
    m = [{"role": "user", "content": "Weather in Paris?"}]
    for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}):
        r = openai_client.chat.completions.create(model="tiny", messages=m, max_tokens=40, response_format=fmt)
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = openai_client.chat.completions.create(model="tiny", messages=m, max_tokens=60, tools=[WEATHER], tool_choice=choice)
        [call] = r.choices[0].message.tool_calls[:1]
        assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict)
    r = openai_client.chat.completions.create(model="tiny", messages=m, max_tokens=4, tools=[WEATHER])  # auto
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")
    r = openai_client.chat.completions.create(model="tiny", messages=m, max_tokens=4, response_format={"type": "text"})
    assert r.choices[0].message.tool_calls is None
    r = openai_client.chat.completions.create(model="tiny", messages=m, max_tokens=4, tools=[WEATHER], tool_choice="none")
    assert r.choices[0].finish_reason in ("length", "stop") and r.choices[0].message.tool_calls is None
    # tools with "none" are not shown to the model: the prompt is the one without tools.
    plain = openai_client.chat.completions.create(model="tiny", messages=m, max_tokens=1)
    assert r.usage.prompt_tokens == plain.usage.prompt_tokens


def test_unknown_response_format_type_is_always_a_400(tiny):
    for route, body in [(C, {"prompt": "x"}), (H, {"messages": USER})]:
        status, _, text = tiny.post(route, {**body, "response_format": {"type": "yaml"}})
        assert error_of(status, text, 400)["param"] == "response_format.type"


@pytest.mark.parametrize("route,field,value,status,code", [
    (C, "temprature", 0, 400, "unknown_parameter"),           # a typo is not silently the default
    (H, "max_token", 3, 400, "unknown_parameter"),
    (C, "use_beam_search", True, 400, "unsupported_parameter"),
    (C, "guided_json", {"type": "object"}, 400, "unsupported_parameter"),
    (H, "guided_choice", ["a"], 400, "unsupported_parameter"),
    (C, "min_tokens", 3, 400, None),                           # more than max_tokens (2)
    (C, "min_tokens", 1, 200, None),                           # implemented (test_prompt_logprobs.py)
    (H, "prompt_logprobs", 1, 200, None),
    (H, "cache_salt", "s", 400, "unsupported_parameter"),
    (H, "store", True, 400, "unsupported_parameter"),
    (H, "reasoning_effort", "low", 400, "unsupported_parameter"),
    (H, "functions", [{"name": "f"}], 400, "unsupported_parameter"),
    (H, "modalities", ["text", "audio"], 400, "unsupported_parameter"),
    (C, "suffix", "tail", 400, "unsupported_parameter"),
    (H, "user", "alice", 200, None),                           # accepted, documented as ignored
    (H, "metadata", {"k": "v"}, 200, None),
    (H, "store", False, 200, None),
    (H, "service_tier", "auto", 200, None),
    (H, "prompt_cache_key", "k", 200, None),
    (H, "parallel_tool_calls", False, 200, None),
    (C, "length_penalty", 1.0, 200, None),
    (C, "spaces_between_special_tokens", True, 200, None),
    (H, "metadata", 5, 400, None),                             # ignored fields are still type-checked
])
def test_every_field_is_supported_rejected_or_ignored_never_silently_dropped(tiny, route, field, value, status, code):
    body = {"prompt": "x"} if route == C else {"messages": USER}
    got, _, text = tiny.post(route, {**body, "max_tokens": 2, field: value})
    if status == 200:
        assert got == 200, text
        return
    err = error_of(got, text, status)
    assert err["param"] == field and (code is None or err["code"] == code), err


def test_vllm_extensions_work_on_the_wire(tiny):
    # include_stop_str_in_output keeps the stop string; truncate_prompt_tokens keeps the last N.
    status, _, text = tiny.post(C, {"prompt": "The quick brown fox jumps", "max_tokens": 30, "temperature": 0,
                                    "ignore_eos": True})
    full = json.loads(text)["choices"][0]["text"]
    stop = full[4:6]
    kept = json.loads(tiny.post(C, {"prompt": "The quick brown fox jumps", "max_tokens": 30, "temperature": 0,
                                    "ignore_eos": True, "stop": [stop], "include_stop_str_in_output": True})[2])
    cut = full[:full.find(stop)]
    assert kept["choices"][0]["text"] == cut + stop and kept["choices"][0]["finish_reason"] == "stop"
    ids = json.loads(tiny.post("/tokenize", {"prompt": "The quick brown fox jumps"})[2])["tokens"]
    t = json.loads(tiny.post(C, {"prompt": "The quick brown fox jumps", "max_tokens": 1, "truncate_prompt_tokens": 2})[2])
    assert t["usage"]["prompt_tokens"] == 2 and len(ids) > 2


# ---------------------------------------------------------------------------------------------
# GET /v1/models/{id}

def test_models_retrieve(openai_client):
    m = openai_client.models.retrieve("tiny")
    assert m.id == "tiny" and m.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        openai_client.models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found" and "gpt-4o" in e.value.body["message"]


# ---------------------------------------------------------------------------------------------
# HTTP: HEAD, Host, absolute form, SO_REUSEADDR

def test_head_then_get_on_one_keep_alive_connection(tiny):
    out = raw_exchange(tiny.port, b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                       b"\r\n\r\n{}")
    first_end = out.index(b"\r\n\r\n") + 4
    assert out.startswith(b"HTTP/1.1 200 OK\r\n")
    assert out[first_end:].startswith(b"HTTP/1.1 200 OK\r\n"), out  # no body between them
    assert out[first_end:].endswith(b"\r\n\r\n{}")
    out = raw_exchange(tiny.port, b"HEAD /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                       b"\r\n\r\n{}")
    assert out.startswith(b"HTTP/1.1 405 ") and b"Allow: POST\r\n" in out
    assert out[out.index(b"\r\n\r\n") + 4:].startswith(b"HTTP/1.1 200 OK\r\n"), out
    # curl -I: status and headers, the length a GET would have.
    head = subprocess.run(["curl", "-sI", tiny.base + "/v1/models"], capture_output=True, text=True, timeout=30)
    assert head.stdout.startswith("HTTP/1.1 200") and f"Content-Length: {len(tiny.get('/v1/models')[2])}" in head.stdout


@pytest.mark.parametrize("request_bytes,status", [
    (b"GET /health HTTP/1.1\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    (b"GET /health HTTP/1.0\r\n\r\n", 200),
    (b"GET http://127.0.0.1/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 200),
    (b"POST http://127.0.0.1/tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n"
     b'{"prompt": "x"}', 200),
])
def test_host_header_rules_and_absolute_form(tiny, request_bytes, status):
    out = raw_exchange(tiny.port, request_bytes, b"}")
    assert int(out.split(b" ")[1]) == status, out[:300]


def test_restart_on_the_same_port_with_connections_in_time_wait(tmp_path):
    s = Server(TINY_QWEN3, "--kv-cache-memory", 4_000_000, tmp_path=tmp_path)
    port = s.port
    for _ in range(5):  # the server closes first: the TIME_WAIT is on its side of the port
        out = raw_exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b"\x00")
        assert out.startswith(b"HTTP/1.1 200")
    assert s.stop() == 0
    again = Server(TINY_QWEN3, "--kv-cache-memory", 4_000_000, tmp_path=tmp_path, port=port)
    try:
        assert again.get("/health")[0] == 200
    finally:
        assert again.stop() == 0


# ---------------------------------------------------------------------------------------------
# Streaming text: no part of a character, ever

def test_emoji_prompt_streams_and_returns_whole_characters(smol):
    client, model = smol_client(smol), smol_model_name(smol)
    tok = Tokenizer.from_file(str(SMOL_TOKENIZER))
    dec = byte_decoder()
    long = client.completions.create(model=model, prompt=EMOJI_PROMPT, max_tokens=8, temperature=0, logprobs=0,
                                     extra_body={"return_tokens_as_token_ids": True})
    ids = [int(t.split(":")[1]) for t in long.choices[0].logprobs.tokens]
    pieces = [token_bytes(tok, i, dec) for i in ids]
    cut_inside = 0
    for k in range(1, 5):
        want = stream_text(b"".join(pieces[:k]))
        full = tok.decode(ids[:k], skip_special_tokens=False)  # HF's decode of the whole sequence
        assert full in (want, want + "\ufffd")
        cut_inside += full != want
        r = client.completions.create(model=model, prompt=EMOJI_PROMPT, max_tokens=k, temperature=0)
        assert r.choices[0].text == want and "\ufffd" not in want, (k, r.choices[0].text, want)
        chunks = [c.choices[0].text for c in client.completions.create(model=model, prompt=EMOJI_PROMPT, max_tokens=k,
                                                                       temperature=0, stream=True) if c.choices]
        assert "".join(chunks) == want and not any("\ufffd" in c for c in chunks), (k, chunks)
        chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": EMOJI_PROMPT}],
                                              max_tokens=k, temperature=0, stream=True)
        assert not any("\ufffd" in (c.choices[0].delta.content or "") for c in chat if c.choices)
    assert cut_inside >= 1  # the test does cut a character (max_tokens 1 ends inside the first emoji)


def test_stop_string_matches_completed_characters(smol):
    client, model = smol_client(smol), smol_model_name(smol)
    base = client.completions.create(model=model, prompt=EMOJI_PROMPT, max_tokens=8, temperature=0).choices[0].text
    emoji = next(ch for ch in base if ord(ch) > 0xFFFF)
    r = client.completions.create(model=model, prompt=EMOJI_PROMPT, max_tokens=8, temperature=0, stop=[emoji])
    assert r.choices[0].text == base[:base.index(emoji)] and r.choices[0].finish_reason == "stop"


# ---------------------------------------------------------------------------------------------
# Admission: a request that can never fit is a 400 that names the limits

def test_request_larger_than_the_server_is_a_400_not_a_503(tmp_path):
    s = Server(TINY_QWEN3, "--kv-cache-memory", 4_000_000, "--max-num-seqs", 2, "--max-waiting-requests", 2,
               tmp_path=tmp_path)
    try:
        status, headers, body = s.post(C, {"prompt": [f"p{i}" for i in range(8)], "max_tokens": 2})
        err = error_of(status, body, 400)
        assert "Retry-After" not in headers
        assert "--max-num-seqs 2" in err["message"] and "--max-waiting-requests 2" in err["message"], err
        assert s.post(C, {"prompt": [f"p{i}" for i in range(4)], "max_tokens": 2})[0] == 200
        assert s.wait_kv_idle() == 0
    finally:
        assert s.stop() == 0


def test_64_prompts_with_n_16_is_a_400_under_the_default_limits(tiny):
    status, headers, body = tiny.post(C, {"prompt": ["x"] * 64, "n": 16, "max_tokens": 1})
    err = error_of(status, body, 400)
    assert err["code"] == "request_too_large" and "--max-waiting-requests 256" in err["message"]


# ---------------------------------------------------------------------------------------------
# CLI

def test_generate_stdout_is_only_the_text(tiny):
    prompt = "The quick brown fox"
    run = subprocess.run([str(binary()), "generate", str(TINY_QWEN3), "--prompt", prompt, "--max-tokens", "12",
                          "--threads", "2", "--kv-cache-memory", "4000000"], capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    served = json.loads(tiny.post(C, {"prompt": prompt, "max_tokens": 12, "temperature": 0})[2])["choices"][0]["text"]
    assert run.stdout.decode() == served  # no log line, no trailing newline when not a terminal
    err = run.stderr.decode()
    assert "[info] model:" in err and "generated tokens" in err


def test_a_flag_the_command_does_not_use_is_refused():
    run = subprocess.run([str(binary()), "generate", str(TINY_QWEN3), "--prompt", "x", "--api-key", "k"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == ""
    assert "--api-key: generate does not use it (a flag of serve" in run.stderr


def test_each_command_has_its_own_help_and_the_binary_its_version():
    # The first thing a person types after the Quick start (`vllm serve --help` works too).
    for command, has, lacks in [("serve", "--port", "--prompt"), ("generate", "--prompt", "--port"),
                                ("inspect", "--log-level", "--port")]:
        run = subprocess.run([str(binary()), command, "--help"], capture_output=True, text=True, timeout=30)
        assert run.returncode == 0 and run.stderr == "", run.stderr
        assert run.stdout.startswith(f"usage: fp8serve {command} MODEL"), run.stdout
        flags = [l.split()[0] for l in run.stdout.splitlines() if l.startswith("  --")]
        assert has in flags and lacks not in flags, flags
    run = subprocess.run([str(binary()), "--version"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0
    assert re.fullmatch(r"fp8serve \d+\.\d+\.\d+ \((CPU only, built without CUDA|CPU and CUDA [\d.]+, SM targets [\da-z ]+), \w+ build\)\n",
                        run.stdout), run.stdout
    run = subprocess.run([str(binary()), "serve", str(TINY_QWEN3), "--bogus"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "see fp8serve serve --help" in run.stderr


def test_router_fields_are_a_400_unless_the_operator_names_them(tmp_path):
    # vllm-router adds SGLang-style fields such as no_stop_trim: OpenAI's rule (400) by default,
    # accepted and ignored when named in --ignore-request-fields; a field the server knows cannot be.
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0, "no_stop_trim": True}
    s = Server(TINY_QWEN3, "--kv-cache-memory", 4_000_000, "--served-model-name", "tiny", tmp_path=tmp_path)
    try:
        status, _, reply = s.post("/v1/completions", body)
        assert status == 400 and json.loads(reply)["error"]["code"] == "unknown_parameter"
    finally:
        assert s.stop() == 0
    s = Server(TINY_QWEN3, "--kv-cache-memory", 4_000_000, "--served-model-name", "tiny",
               "--ignore-request-fields", "no_stop_trim,rid", tmp_path=tmp_path)
    try:
        assert "request fields accepted and ignored (--ignore-request-fields): no_stop_trim, rid" in s.startup_log()
        status, _, reply = s.post("/v1/completions", {**body, "rid": "abc"})
        assert status == 200, reply
        without = s.post("/v1/completions", {k: v for k, v in body.items() if k != "no_stop_trim"})
        assert json.loads(reply)["choices"][0]["text"] == json.loads(without[2])["choices"][0]["text"]
        status, _, reply = s.post("/v1/chat/completions", {"model": "tiny", "max_tokens": 2, "no_stop_trim": False,
                                                           "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200, reply
    finally:
        assert s.stop() == 0
    run = subprocess.run([str(binary()), "serve", str(TINY_QWEN3), "--ignore-request-fields", "temperature"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--ignore-request-fields: 'temperature' is a request field this server knows" in run.stderr


def test_help_says_what_chat_template_does():
    out = subprocess.run([str(binary()), "--help"], capture_output=True, text=True, timeout=30).stdout
    line = next(l for l in out.splitlines() if "--chat-template" in l)
    assert "replaces the model's own template" in line


# ---------------------------------------------------------------------------------------------
# Chat templates no one here wrote, through the server, against jinja2

def test_functionary_template_through_the_server_matches_jinja2(tmp_path):
    template = FIXTURES / "chat_templates" / "functionary_v3_1.jinja"
    fixture = json.loads((FIXTURES / "chat_templates" / "functionary_v3_1.cases.json").read_text())
    tok = Tokenizer.from_file(str(TINY_LLAMA / "tokenizer.json"))
    s = Server(TINY_LLAMA, "--kv-cache-memory", 4_000_000, "--max-model-len", 8192, "--chat-template", template,
               tmp_path=tmp_path)
    try:
        checked = 0
        for case in fixture["cases"]:
            # tools none (the selectattr-on-none path); the API never renders tools; plain string content.
            if case["tools"] is not None or "expected" not in case or case.get("continue_final_message"):
                continue
            if not all(isinstance(m.get("content"), str) for m in case["messages"]) or not case["messages"]:
                continue
            body = {"messages": case["messages"], "add_generation_prompt": case["add_generation_prompt"]}
            status, _, text = s.post("/tokenize", body)
            assert status == 200, (case["name"], text)
            assert json.loads(text)["tokens"] == tok.encode(case["expected"], add_special_tokens=False).ids, case["name"]
            checked += 1
        assert checked >= 15
        r = s.post(H, {"messages": USER, "max_tokens": 2})
        assert r[0] == 200, r[2]
    finally:
        assert s.stop() == 0
