#!/usr/bin/env python3
"""Priority scheduling benchmark (not a test): interactive requests while a flood of long batch
requests fills the KV pool, on the real server, under --scheduling-policy priority and fcfs.

For each policy it starts `fp8serve serve` on the default model with a small KV budget, measures
the time to first token (TTFT) of the interactive requests alone on the idle server, then starts
the flood (batch requests: long prompts, long outputs, priority 10 under the priority policy)
and, once the pool is full, sends the same interactive requests one at a time, 0-500 ms apart
(priority 0), and measures their TTFT again. A request cannot start before the step in flight
ends, so its TTFT under load is at least that step's remainder: on a CPU a step that recomputes
or prefills a batch request's chunk takes ~2 ms per token. It prints, per policy: the interactive TTFT alone and under the
flood (median, max, and their ratio), the batch requests' output tokens/s, the preemptions, and
the load average. The issue's target: interactive TTFT within 1.5x of solo while the pool is full.

    .venv/bin/python tests/bench/priority_bench.py [--bin build/server/fp8serve] [--model ...gguf]
        [--kv-cache-memory 64MiB] [--batch 16] [--interactive 8]
"""
import argparse
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from conftest import Server  # noqa: E402

BATCH_PROMPT = ("Write a long, careful report on the history of {topic}, covering its origins, the people "
                "involved, the main events of each century, and what remains of it today. ") * 12
TOPICS = ["the sea", "a mountain", "the city at night", "an old library", "a train journey", "the first snow",
          "a garden in spring", "the desert"]
QUESTIONS = ["What is the capital of France?", "Name three colours.", "How many days are in a week?",
             "What do bees make?", "Say hello in Spanish.", "What is two plus two?", "Where does rain come from?",
             "What is the largest ocean?"]


def ttft(client, prompt, priority):
    extra = {"ignore_eos": True}
    if priority is not None:
        extra["priority"] = priority
    start = time.perf_counter()
    stream = client.completions.create(model="m", prompt=prompt, max_tokens=16, temperature=0, stream=True,
                                       extra_body=extra)
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() - start
    return first


def run_policy(args, policy):
    s = Server(args.model, "--kv-cache-memory", args.kv_cache_memory, "--max-num-seqs", 16, "--served-model-name", "m",
               "--scheduling-policy", policy, *args.server_flags.split())
    try:
        client = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=600)
        urgent = 0 if policy == "priority" else None
        low = 10 if policy == "priority" else None
        alone = [ttft(client, q, urgent) for q in QUESTIONS[:args.interactive]]

        done_tokens = []
        flood_start = time.perf_counter()

        def batch(i):
            extra = {"ignore_eos": True}
            if low is not None:
                extra["priority"] = low
            r = client.completions.create(model="m", prompt=BATCH_PROMPT.format(topic=TOPICS[i % len(TOPICS)]),
                                          max_tokens=args.batch_tokens, temperature=0, extra_body=extra)
            done_tokens.append(r.usage.completion_tokens)

        with ThreadPoolExecutor(args.batch) as pool:
            futures = [pool.submit(batch, i) for i in range(args.batch)]
            deadline = time.time() + 120
            while True:  # the pool full: requests wait, or the KV cache is nearly used up
                m = s.metrics()
                if m["fp8serve:num_requests_waiting"] > 0 or m["fp8serve:kv_cache_usage_perc"] > 0.9:
                    break
                assert time.time() < deadline, "the flood never filled the pool"
                time.sleep(0.05)
            # Arrivals a random 0-500 ms apart (the same for both policies), not in step with
            # completions: a request sent as another ends would always meet the step that re-admits
            # a batch request into the freed seat.
            gaps = random.Random(1).choices(range(500), k=args.interactive)
            loaded = []
            for q, gap in zip(QUESTIONS[:args.interactive], gaps):
                time.sleep(gap / 1000)
                loaded.append(ttft(client, q, urgent))
            for f in futures:
                f.result()
        flood_s = time.perf_counter() - flood_start
        m = s.metrics()
        return {"alone": alone, "loaded": loaded, "batch_tok_s": sum(done_tokens) / flood_s,
                "preemptions": m["fp8serve:num_preemptions_total"], "load": os.getloadavg()[0]}
    finally:
        s.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", help="the fp8serve binary (default: build/server/fp8serve)")
    ap.add_argument("--model", default=str(ROOT / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--kv-cache-memory", default="64MiB")
    ap.add_argument("--batch", type=int, default=16, help="batch requests in the flood")
    ap.add_argument("--batch-tokens", type=int, default=384, help="output tokens of each batch request")
    ap.add_argument("--interactive", type=int, default=8)
    ap.add_argument("--server-flags", default="", help="more flags for both servers, e.g. \"--max-num-batched-tokens 256\"")
    args = ap.parse_args()
    if args.bin:
        os.environ["FP8SERVE_BIN"] = args.bin
    print(f"load average before: {os.getloadavg()[0]:.2f}; KV budget {args.kv_cache_memory}, --max-num-seqs 16, "
          f"{args.batch} batch requests of {args.batch_tokens} tokens, {args.interactive} interactive of 16 {args.server_flags}")
    print("policy    TTFT alone p50  under flood p50   mean    max     ratio p50  batch tok/s  preemptions  load")
    for policy in ["priority", "fcfs"]:
        r = run_policy(args, policy)
        a, b = statistics.median(r["alone"]), statistics.median(r["loaded"])
        mean = statistics.mean(r["loaded"])
        print(f"{policy:9} {a * 1e3:10.0f} ms  {b * 1e3:12.0f} ms  {mean * 1e3:5.0f} ms  {max(r['loaded']) * 1e3:5.0f} ms  {b / a:8.2f}x  "
              f"{r['batch_tok_s']:11.1f}  {r['preemptions']:11.0f}  {r['load']:.2f}")


if __name__ == "__main__":
    main()
