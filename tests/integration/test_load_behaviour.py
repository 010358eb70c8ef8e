"""Concurrency, preemption, client disconnects and the SIGTERM drain, on the real server."""
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai

from conftest import TINY_QWEN3, Server, read_then_drop

PROMPTS = [f"Request number {i}: tell me about the number {i * 7 % 13} and the colour {c}"
           for i, c in enumerate(["red", "green", "blue", "black"] * 8)]


def stream_text(client, prompt, max_tokens):
    chunks = client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    text, finish = "", None
    for c in chunks:
        if c.choices:
            text += c.choices[0].text
            finish = c.choices[0].finish_reason or finish
    return text, finish


def tokens_and_margins(client, prompt, max_tokens):
    """The greedy tokens, and at each the gap between the two best logprobs (a near-tie when small)."""
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    margins = []
    for top in lp.top_logprobs:
        best = sorted(top.values(), reverse=True) + [float("-inf")]
        margins.append(best[0] - best[1])
    return lp.tokens, margins


def test_32_concurrent_streams_equal_sequential_outputs(tiny, openai_client):
    alone = [stream_text(openai_client, p, 24) for p in PROMPTS]
    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda p: stream_text(openai_client, p, 24), PROMPTS))
    assert len(set(PROMPTS)) == 32
    assert together == alone
    assert all(f == "length" for _, f in together)


def test_preemption_with_a_pool_of_a_few_blocks(tmp_path):
    # tiny-qwen3 with FP8 K/V: 3 layers x 2 KV heads x 32 dims x 2 (K, V) = 384 bytes per token,
    # 6144 per 16-token block; 12 blocks hold two of these 70-token requests at a time. The bf16
    # window of 32 tokens takes its tail pool off the budget first: 16 rings of 3 blocks of 16
    # tokens of 768 bytes (K and V in bf16: the window's tensors named, since the default is K only)
    # - 89% of this budget, so the rings' share is raised from its default 1/8: every sequence,
    # alone or together, then has a ring (one without would differ by more than rounding).
    tail = 16 * 3 * 16 * 768
    s = Server(TINY_QWEN3, "--kv-cache-memory", 12 * 6144 + tail, "--kv-bf16-window", 32, "--kv-bf16-window-tensors", "kv",
               "--kv-bf16-window-share", 0.9, "--max-num-seqs", 16, "--served-model-name", "tiny", tmp_path=tmp_path)
    try:
        client = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=120)
        prompts = PROMPTS[:16]
        alone = [tokens_and_margins(client, p, 60) for p in prompts]
        with ThreadPoolExecutor(16) as pool:
            together = list(pool.map(lambda p: tokens_and_margins(client, p, 60), prompts))
        # A recompute after preemption rebuilds the KV with prefill's arithmetic where decode made
        # it (the bf16 window's rows and the attention's summation order): equal up to rounding,
        # so a greedy token may flip only where its two best candidates were nearly tied.
        for (tokens, margins), (got, _) in zip(alone, together):
            first = next((i for i, (a, b) in enumerate(zip(tokens, got)) if a != b), None)
            assert len(got) == len(tokens) == 60
            if first is not None:
                assert margins[first] < 0.01, (first, margins[first])
        m = s.metrics()
        print(f"[preemption] {m['fp8serve:num_preemptions_total']:.0f} preemptions for 16 concurrent requests")
        assert m["fp8serve:num_preemptions_total"] > 0
        assert s.wait_kv_idle() == 0
    finally:
        assert s.stop() == 0


def test_priority_preempts_for_an_urgent_request_and_fcfs_refuses_the_field(tiny, openai_client, tmp_path):
    # The default policy: priority 0 is accepted, anything else is a 400 naming the flag.
    assert openai_client.completions.create(model="tiny", prompt="hi", max_tokens=2,
                                            extra_body={"priority": 0}).usage.completion_tokens == 2
    try:
        openai_client.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body={"priority": 1})
        raise AssertionError("priority 1 accepted under fcfs")
    except openai.BadRequestError as e:
        assert "--scheduling-policy priority" in str(e) and e.body["param"] == "priority", e
    # --scheduling-policy priority, two seats: two long low-priority streams hold them; an urgent
    # request preempts one, finishes first, and the preempted one still ends with all its tokens.
    s = Server(TINY_QWEN3, "--kv-cache-memory", 8_000_000, "--served-model-name", "tiny", "--max-num-seqs", 2,
               "--max-model-len", 4096, "--scheduling-policy", "priority", tmp_path=tmp_path)
    try:
        assert "scheduler: priority" in s.startup_log()
        client = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=120)
        finished = []
        started = threading.Event()

        def low(i):
            stream = client.completions.create(model="tiny", prompt=PROMPTS[i], max_tokens=3000, temperature=0, stream=True,
                                               extra_body={"ignore_eos": True, "priority": 5})
            n = 0
            for chunk in stream:
                n += 1
                if n == 8:
                    started.set()
            finished.append(f"low{i}")
            return n

        with ThreadPoolExecutor(2) as pool:
            lows = [pool.submit(low, i) for i in range(2)]
            assert started.wait(60)
            deadline = time.time() + 30
            while s.metrics().get('fp8serve:num_requests_running_by_priority{priority="5"}') != 2:
                assert time.time() < deadline
                time.sleep(0.01)
            urgent = client.completions.create(model="tiny", prompt=PROMPTS[5], max_tokens=8, temperature=0,
                                               extra_body={"ignore_eos": True, "priority": -2})
            finished.append("urgent")
            assert urgent.usage.completion_tokens == 8
            assert [f.result() for f in lows]  # both complete
        assert finished[0] == "urgent", finished
        # A stream's last chunk can reach the client before the step that sent it publishes its
        # gauges: read them once the server is idle.
        assert s.wait_kv_idle() == 0
        m = s.metrics()
        assert m['fp8serve:num_preemptions_by_priority_total{priority="5"}'] >= 1, m
        assert m['fp8serve:num_requests_running_by_priority{priority="5"}'] == 0, m
    finally:
        assert s.stop() == 0, s.log_text()


def drop_mid_stream(port, prompt):
    # Closed long before 960 tokens.
    read_then_drop(port, "/v1/completions", {"prompt": prompt, "max_tokens": 960, "stream": True, "ignore_eos": True},
                   b"data: {", 3, timeout=30)


def test_20_clients_drop_mid_stream(tiny, openai_client):
    before = tiny.metrics().get('fp8serve:request_success_total{finished_reason="abort"}', 0)
    threads = [threading.Thread(target=drop_mid_stream, args=(tiny.port, p)) for p in PROMPTS[:20]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tiny.wait_kv_idle(timeout=20) == 0
    m = tiny.metrics()
    assert m['fp8serve:request_success_total{finished_reason="abort"}'] - before == 20
    assert m["fp8serve:num_requests_running"] == 0
    r = openai_client.completions.create(model="tiny", prompt="after the storm", max_tokens=4, temperature=0)
    assert r.usage.completion_tokens == 4


def test_sigterm_drains_running_requests_and_refuses_new_ones(tmp_path):
    s = Server(TINY_QWEN3, "--kv-cache-memory", 8_000_000, "--served-model-name", "tiny", "--shutdown-timeout", 60,
               tmp_path=tmp_path)
    client = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=120)
    results = [None] * 4
    started = threading.Barrier(5)

    def run(i):
        chunks = client.completions.create(model="tiny", prompt=PROMPTS[i], max_tokens=3000, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        text, finish, n = "", None, 0
        for c in chunks:
            n += 1
            if n == 2:
                started.wait()
            if c.choices:
                text += c.choices[0].text
                finish = c.choices[0].finish_reason or finish
        results[i] = (len(text) > 0, finish)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    started.wait()  # all four are streaming
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    status, headers, body = s.post("/v1/completions", {"prompt": "too late", "max_tokens": 2})
    assert status == 503 and "Retry-After" in headers
    assert json.loads(body)["error"]["code"] == "service_unavailable"
    assert s.get("/health")[0] == 503
    for t in threads:
        t.join()
    assert results == [(True, "length")] * 4  # every running request finished normally
    assert s.proc.wait(timeout=60) == 0
    s.stop()
