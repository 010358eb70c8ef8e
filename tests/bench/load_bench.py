#!/usr/bin/env python3
"""Load benchmark (not a test): streaming clients against a real `fp8serve serve`.

For each KV dtype (fp8_e4m3, bf16) it starts the server on the default model, then runs 1, 8,
32 and 64 concurrent streaming clients through the official openai client, each level a fixed
mix of prompts and lengths, and prints requests/s, output tokens/s, TTFT and inter-token latency
percentiles and the error count (which must be 0). Bounded: every level sends max(8, 2 x clients)
requests. Usage:

    .venv/bin/python tests/bench/load_bench.py [--bin build/server/fp8serve] [--model .models/...gguf]
        [--levels 1,8,32,64] [--dtypes fp8_e4m3,bf16] [--base-url URL (use a running server)]
"""
import argparse
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from conftest import Server  # noqa: E402  (the integration tests' process wrapper)

TOPICS = ["the sea", "a mountain", "the city at night", "an old library", "a train journey", "the first snow",
          "a garden in spring", "the desert"]
LENGTHS = [32, 64, 128]  # max_tokens mix


def workload(n):
    """n requests: prompt i about TOPICS[i % 8], max_tokens LENGTHS[i % 3] (ignore_eos: fixed length)."""
    return [(f"Write a short story about {TOPICS[i % len(TOPICS)]}. " * (1 + i % 4), LENGTHS[i % len(LENGTHS)])
            for i in range(n)]


def one_request(client, model, prompt, max_tokens):
    start = time.perf_counter()
    times, tokens = [], 0
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            times.append(time.perf_counter())
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    ttft = times[0] - start if times else float("nan")
    itl = [b - a for a, b in zip(times, times[1:])]
    return ttft, itl, tokens


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def run_level(client, model, clients):
    jobs = workload(max(8, 2 * clients))
    ttfts, itls, tokens, errors = [], [], 0, 0
    lock = threading.Lock()

    def run(job):
        nonlocal tokens, errors
        try:
            ttft, itl, n = one_request(client, model, *job)
            with lock:
                ttfts.append(ttft)
                itls.extend(itl)
                tokens += n
        except Exception as e:  # counted, printed once per kind
            with lock:
                errors += 1
            print(f"    error: {type(e).__name__}: {e}", file=sys.stderr)

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(run, jobs))
    wall = time.perf_counter() - start
    return {"clients": clients, "requests": len(jobs), "req_s": len(jobs) / wall, "tok_s": tokens / wall,
            "ttft_p50": percentile(ttfts, 50), "ttft_p99": percentile(ttfts, 99), "itl_p50": percentile(itl := itls, 50),
            "itl_p99": percentile(itl, 99), "errors": errors, "wall": wall}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "build" / "server" / "fp8serve"))
    ap.add_argument("--model", default=str(ROOT / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--levels", default="1,8,32,64")
    ap.add_argument("--dtypes", default="fp8_e4m3,bf16")
    ap.add_argument("--kv-cache-memory", default="256000000")
    ap.add_argument("--base-url", help="benchmark a server that is already running (one dtype: whatever it uses)")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    import os
    os.environ["FP8SERVE_BIN"] = args.bin

    print(f"{'kv':9} {'clients':>7} {'reqs':>5} {'req/s':>7} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'ITL p50':>8} {'ITL p99':>8} {'errors':>6}")
    for dtype in (["(running)"] if args.base_url else args.dtypes.split(",")):
        server = None
        if args.base_url:
            base = args.base_url
        else:
            server = Server(args.model, "--kv-cache-dtype", dtype, "--kv-cache-memory", args.kv_cache_memory,
                            "--max-num-seqs", max(levels), "--max-model-len", 2048)
            base = server.base
        try:
            client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
            model = client.models.list().data[0].id
            one_request(client, model, "warm up", 4)
            for clients in levels:
                r = run_level(client, model, clients)
                print(f"{dtype:9} {r['clients']:>7} {r['requests']:>5} {r['req_s']:>7.2f} {r['tok_s']:>10.1f} "
                      f"{r['ttft_p50'] * 1e3:>7.0f}ms {r['ttft_p99'] * 1e3:>7.0f}ms {r['itl_p50'] * 1e3:>6.0f}ms "
                      f"{r['itl_p99'] * 1e3:>6.0f}ms {r['errors']:>6}", flush=True)
        finally:
            if server:
                server.stop()


if __name__ == "__main__":
    main()
