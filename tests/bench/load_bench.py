#!/usr/bin/env python3
"""Load benchmark (not a test): streaming clients against a real `fp8serve serve`.

For each weight dtype (--quantization none, fp8) and KV dtype (fp8_e4m3, bf16) it starts the
server on the default model, then runs 1, 8, 32 and 64 concurrent streaming clients through the
official openai client, each level a fixed mix of prompts and lengths (or every request
--max-tokens long), and prints requests/s, output tokens/s, TTFT and inter-token latency
percentiles and the error count (which must be 0). Bounded: every level sends max(8, 2 x clients)
requests (--requests-per-client changes the 2).

Next to the single-client figures it prints the bandwidth bound measured in the same run by
bench_engine --bound-only: weight bytes read per token / streaming read bandwidth, as tokens/s,
and the median inter-token time as a percentage of it. Usage:

    .venv/bin/python tests/bench/load_bench.py [--bin build/server/fp8serve] [--model .models/...gguf]
        [--levels 1,8,32,64] [--dtypes fp8_e4m3,bf16] [--quantization none,fp8] [--max-tokens N]
        [--requests-per-client K] [--bench-engine build/tests/bench/bench_engine]
        [--base-url URL (use a running server)] [--server-flags "FLAGS" (added to every server started)]

Issue 14's runs: --quantization none,fp8 --dtypes fp8_e4m3 --levels 1,16 --max-tokens 128
Issue 23's: the same levels with and without --server-flags "--speculative-method ngram".
"""
import argparse
import os
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


def workload(n, max_tokens=None):
    """n requests: prompt i about TOPICS[i % 8], max_tokens LENGTHS[i % 3] or the fixed max_tokens
    (ignore_eos: fixed length)."""
    return [(f"Write a short story about {TOPICS[i % len(TOPICS)]}. " * (1 + i % 4),
             max_tokens or LENGTHS[i % len(LENGTHS)]) for i in range(n)]


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


def run_level(client, model, clients, max_tokens=None, per_client=2):
    jobs = workload(max(8, per_client * clients), max_tokens)
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


def process_cpu_seconds(pid):
    """user + system CPU seconds of a process and its threads (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bandwidth_bound(bench_engine, model):
    """{"none": tok/s, "fp8": tok/s}: measured read bandwidth / weight bytes per decode token
    (bench_engine --bound-only), or {} when the benchmark binary is absent."""
    import subprocess

    if not Path(bench_engine).exists():
        print(f"({bench_engine} absent: no bandwidth bound printed)")
        return {}
    out = subprocess.run([bench_engine, model, "--bound-only"], capture_output=True, text=True, check=True).stdout
    values = dict(line.split("=", 1) for line in out.split() if "=" in line)
    bandwidth = float(values["bandwidth_gbs"]) * 1e9
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s; weights per token: bf16 {float(values['bf16_mb']):.1f} MB, "
          f"fp8 {float(values['fp8_mb']):.1f} MB, fp8 with the LM head {float(values['fp8_head_mb']):.1f} MB")
    return {"none": bandwidth / (float(values["bf16_mb"]) * 1e6), "fp8": bandwidth / (float(values["fp8_mb"]) * 1e6),
            "fp8head": bandwidth / (float(values["fp8_head_mb"]) * 1e6)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "build" / "server" / "fp8serve"))
    ap.add_argument("--model", default=str(ROOT / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--levels", default="1,8,32,64")
    ap.add_argument("--dtypes", default="fp8_e4m3,bf16")
    ap.add_argument("--kv-cache-memory", default="256000000")
    ap.add_argument("--quantization", default="none",
                    help="weights: none,fp8,fp8head (fp8head: --quantization fp8 --fp8-lm-head; one server per value)")
    ap.add_argument("--max-tokens", type=int, help="every request this long (default: a 32/64/128 mix)")
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--bench-engine", default=str(ROOT / "build" / "tests" / "bench" / "bench_engine"))
    ap.add_argument("--base-url", help="benchmark a server that is already running (one dtype: whatever it uses)")
    ap.add_argument("--server-flags", default="", help="more flags for every server started, e.g. "
                    "\"--speculative-method ngram\"")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    os.environ["FP8SERVE_BIN"] = args.bin

    bound = bandwidth_bound(args.bench_engine, args.model)
    print(f"{'weights':7} {'kv':9} {'clients':>7} {'reqs':>5} {'req/s':>7} {'out tok/s':>10} {'TTFT p50':>9} "
          f"{'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'errors':>6}  bound (1 client)")
    runs = [("(running)", "(running)")] if args.base_url else [
        (q, d) for q in args.quantization.split(",") for d in args.dtypes.split(",")]
    for quantization, dtype in runs:
        server = None
        if args.base_url:
            base = args.base_url
        else:
            weights = ["--quantization", "fp8", "--fp8-lm-head"] if quantization == "fp8head" else \
                ["--quantization", quantization]
            server = Server(args.model, "--kv-cache-dtype", dtype, "--kv-cache-memory", args.kv_cache_memory,
                            "--max-num-seqs", max(levels), "--max-model-len", 2048, *weights, *args.server_flags.split())
            base = server.base
        try:
            client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
            model = client.models.list().data[0].id
            one_request(client, model, "warm up", 4)
            for clients in levels:
                cpu0 = process_cpu_seconds(server.proc.pid) if server else None
                r = run_level(client, model, clients, args.max_tokens, args.requests_per_client)
                note = ""
                if server:
                    # The server's CPU time over the level: on a machine shared with others, the
                    # wall clock measures the neighbours too; 2 busy threads per step (the engine's
                    # and the pool's, which spins between calls) make CPU seconds / 2 what the wall
                    # time would be on an idle 2-core machine (an estimate, printed as such).
                    cpu = process_cpu_seconds(server.proc.pid) - cpu0
                    note = f"  [server CPU {cpu:.1f} s: {r['tok_s'] * r['wall'] / (cpu / 2):.0f} tok/s at CPU/2]"
                if clients == 1 and bound and quantization in bound:
                    tok_s = bound[quantization]
                    note += (f"  bound {tok_s:.0f} tok/s ({1e3 / tok_s:.2f} ms/token): median ITL at "
                             f"{100 * (1 / tok_s) / r['itl_p50']:.0f}% of it, {1 / r['itl_p50']:.1f} tok/s")
                print(f"{quantization:7} {dtype:9} {r['clients']:>7} {r['requests']:>5} {r['req_s']:>7.2f} "
                      f"{r['tok_s']:>10.1f} {r['ttft_p50'] * 1e3:>7.0f}ms {r['ttft_p99'] * 1e3:>7.0f}ms "
                      f"{r['itl_p50'] * 1e3:>6.1f}ms {r['itl_p99'] * 1e3:>6.1f}ms {r['errors']:>6}{note}", flush=True)
        finally:
            if server:
                server.stop()


if __name__ == "__main__":
    main()
