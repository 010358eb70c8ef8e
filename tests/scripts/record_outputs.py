#!/usr/bin/env python3
"""Records what the real server answers, bit for bit, so that a refactor can show it changed
nothing: greedy (and seeded) completions and chats with their logprobs, prompt logprobs, a
structured output, n > 1 and a few concurrent streams, through `fp8serve serve` on loopback, for
FP8 and bf16 KV, with and without speculation (n-gram and a self-draft).

    record_outputs.py record OUT.json [--bin build/server/fp8serve]
    record_outputs.py compare BEFORE.json AFTER.json

Logprobs are compared as the JSON text the server wrote (its float formatting), so "identical"
means every digit. Concurrent streams use distinct prompts (two copies of one prompt make the
output depend on timing through the prefix cache), and each server is fresh per configuration.
"""
import argparse
import concurrent.futures
import json
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from conftest import DEFAULT_MODEL, TINY_QWEN3, Server  # noqa: E402

CONFIGS = {
    "fp8": [],
    "bf16": ["--kv-cache-dtype", "bf16"],
    "fp8_kv_window": ["--kv-bf16-window-tensors", "kv"],
    "fp8_ngram": ["--speculative-method", "ngram", "--num-speculative-tokens", "5",
                  "--speculative-disable-by-batch-size", "8"],
    "bf16_ngram": ["--kv-cache-dtype", "bf16", "--speculative-method", "ngram"],
    "fp8_draft": ["--speculative-method", "draft", "--speculative-model", str(DEFAULT_MODEL),
                  "--num-speculative-tokens", "4", "--speculative-disable-by-batch-size", "8"],
}

REPORT = ("The quarterly report shows revenue of 4.2 million, up 12 percent. Costs rose 5 percent. "
          "The board approved a new plan for the northern region. ")

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def requests_for(model):
    """(name, path, body) in the order they are sent one at a time."""
    out = [
        ("completion_greedy", "/v1/completions",
         {"prompt": "The capital of France is", "max_tokens": 40, "temperature": 0, "logprobs": 3}),
        ("completion_repeat", "/v1/completions",
         {"prompt": REPORT * 3 + "Repeat the report: " + REPORT[:60], "max_tokens": 48, "temperature": 0,
          "logprobs": 2}),
        ("completion_prompt_logprobs", "/v1/completions",
         {"prompt": "One, two, three, four, five", "max_tokens": 8, "temperature": 0, "echo": True, "logprobs": 2}),
        ("completion_seeded_n2", "/v1/completions",
         {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0.8, "top_p": 0.9, "seed": 7, "n": 2,
          "logprobs": 1}),
        ("completion_stop_penalty", "/v1/completions",
         {"prompt": "List of fruits: apple, banana,", "max_tokens": 40, "temperature": 0, "stop": [" kiwi", "\n\n"],
          "frequency_penalty": 0.5, "presence_penalty": 0.3, "logprobs": 1}),
        ("chat_greedy", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "Write two sentences about the sea."}], "max_tokens": 48,
          "temperature": 0, "logprobs": True, "top_logprobs": 3}),
        ("chat_repeat", "/v1/chat/completions",
         {"messages": [{"role": "system", "content": "You repeat text exactly."},
                       {"role": "user", "content": "Repeat: " + REPORT * 2}], "max_tokens": 60, "temperature": 0,
          "logprobs": True, "top_logprobs": 1}),
        ("chat_json_schema", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "Give a person as JSON."}], "max_tokens": 40, "temperature": 0,
          "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
          "logprobs": True}),
        ("chat_seeded", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 40, "temperature": 1.0,
          "top_k": 40, "min_p": 0.05, "seed": 1234, "logprobs": True}),
    ]
    for _, _, body in out:
        body["model"] = model
    return out


CONCURRENT = ["Explain photosynthesis in one paragraph.", "Name five rivers in Europe.",
              "What is a prime number?", "Describe a cat to a child.", "Why is the sky blue?",
              "Give three tips for sleeping well."]


def post(base, path, body):
    data = json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def strip(text):
    """The answer without what differs run to run (ids, timestamps, timing)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text
    for key in ("id", "created", "system_fingerprint"):
        obj.pop(key, None)
    return obj


def stream_text(base, model, content):
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 40,
            "temperature": 0, "stream": True, "logprobs": True}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    events.append([choice.get("delta"), choice.get("logprobs"), choice.get("finish_reason")])
    return events


def record(args):
    results = {}
    models = [("smollm2", DEFAULT_MODEL), ("tiny_qwen3", TINY_QWEN3)]
    for model_name, model in models:
        for config, flags in CONFIGS.items():
            if model_name == "tiny_qwen3" and config not in ("fp8", "bf16", "fp8_ngram"):
                continue
            if config == "fp8_draft" and model_name != "smollm2":
                continue
            server = Server(model, "--kv-cache-memory", "128MiB", "--served-model-name", "m", *flags)
            try:
                out = {}
                for name, path, body in requests_for("m"):
                    status, text = post(server.base, path, body)
                    out[name] = [status, strip(text)]
                with concurrent.futures.ThreadPoolExecutor(len(CONCURRENT)) as pool:
                    streams = list(pool.map(lambda c: stream_text(server.base, "m", c), CONCURRENT))
                out["concurrent_streams"] = streams
                results[f"{model_name}/{config}"] = out
                print(f"recorded {model_name}/{config}", file=sys.stderr)
            finally:
                server.stop()
    Path(args.out).write_text(json.dumps(results, indent=1, sort_keys=True))


def compare(args):
    before = json.loads(Path(args.before).read_text())
    after = json.loads(Path(args.after).read_text())
    bad = 0
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        if b is None or a is None:
            print(f"{key}: only in {'after' if b is None else 'before'}")
            bad += 1
            continue
        for name in sorted(set(b) | set(a)):
            if b.get(name) != a.get(name):
                print(f"{key} {name}: differs")
                bad += 1
    total = sum(len(v) for v in before.values())
    print(f"{total - bad} identical, {bad} different")
    return 1 if bad else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    args = parser.parse_args()
    if args.cmd == "record":
        return record(args)
    return compare(args)


if __name__ == "__main__":
    sys.exit(main() or 0)
