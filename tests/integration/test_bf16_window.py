"""The bf16 recent window on the real server: it starts with the tail pool reported, serves a
streaming request while /metrics shows the tail in use, gives every ring back afterwards, and
n > 1 choices (forked rings) equal the single greedy output. Small KV budgets start: the rings
get a capped share, every sequence runs with one (the others wait), so 16 greedy requests at
once answer what each answers alone; generate sizes for one."""
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import openai

from conftest import DEFAULT_MODEL, TINY_QWEN3, Server, binary


def test_window_tail_in_use_while_streaming_and_released_after(tmp_path):
    s = Server(TINY_QWEN3, "--kv-cache-memory", 8_000_000, "--served-model-name", "tiny", "--kv-bf16-window", 32,
               "--kv-bf16-window-tensors", "k", "--max-num-seqs", 8, tmp_path=tmp_path)
    try:
        log = s.log_text()
        assert "bf16 window 32 tokens (K only): 8 rings x 3 blocks" in log, log
        client = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=120)
        stream = client.completions.create(model="tiny", prompt="count the colours of the rainbow " * 6,
                                           max_tokens=2000, temperature=0, stream=True, extra_body={"ignore_eos": True})
        # The engine's snapshot for /metrics is taken after each step, and a chunk can reach the
        # client before its step's snapshot: read until a decode step shows in it.
        seen = None
        for chunk in stream:
            if seen is None or seen[0] == 0:
                m = s.metrics()
                seen = (m["fp8serve:kv_bf16_tail_usage_perc"], m["fp8serve:kv_bf16_tail_tokens"])
        assert seen[0] == 1 / 8 and 32 <= seen[1] < 48, seen  # one ring of 8; 32-47 tokens in it
        s.wait_kv_idle()
        m = s.metrics()
        assert m["fp8serve:kv_bf16_tail_usage_perc"] == 0 and m["fp8serve:kv_bf16_tail_tokens"] == 0

        single = client.completions.create(model="tiny", prompt="the weather today", max_tokens=60, temperature=0,
                                           extra_body={"ignore_eos": True})
        many = client.completions.create(model="tiny", prompt="the weather today", max_tokens=60, temperature=0, n=3,
                                         extra_body={"ignore_eos": True})
        assert [c.text for c in many.choices] == [single.choices[0].text] * 3
        s.wait_kv_idle()
        assert s.metrics()["fp8serve:kv_bf16_tail_usage_perc"] == 0
    finally:
        assert s.stop() == 0, s.log_text()


def small_budget_server(tmp_path, budget, max_num_seqs):
    """The default model (its window on, K only) on a small KV budget, and a client for it."""
    s = Server(DEFAULT_MODEL, "--kv-cache-memory", budget, "--served-model-name", "m", "--max-num-seqs", max_num_seqs,
               "--max-model-len", 512, tmp_path=tmp_path)
    return s, openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_small_budgets_start_with_capped_rings_and_sequences_wait_for_one(tmp_path):
    # 12 MiB on the default model: 4 K-only rings of 96 tokens would take 4.9 MiB. The rings get
    # at most an eighth of the budget (1.5 MiB: one ring of 1.23 MiB), the FP8 pool the rest; a
    # sequence runs only with a ring, so one runs at a time and the others wait (counted).
    s, client = small_budget_server(tmp_path, "12MiB", 4)
    try:
        log = s.startup_log()
        assert "bf16 window 96 tokens (K only): 1 rings x 7 blocks" in log, log
        assert "rings for 1 of --max-num-seqs 4 sequences" in log and "at most 1 run at once" in log, log
        # The split: the FP8 pool holds twice the tokens bf16 KV would in its bytes.
        split = re.search(r"KV split: FP8 pool [\d.]+ MiB = (\d+) tokens \(bf16 KV would hold (\d+) in those bytes\)",
                          log)
        assert split and int(split[1]) >= 2 * int(split[2]) > 0, log
        prompts = ["the weather today", "count the colours of the rainbow", "a story about a ship", "hello"]
        before = s.metrics()["fp8serve:kv_bf16_window_ring_waits_total"]
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda p: client.completions.create(
                model="m", prompt=p, max_tokens=40, temperature=0, extra_body={"ignore_eos": True}), prompts))
        assert all(a.usage.completion_tokens == 40 for a in answers)
        assert s.metrics()["fp8serve:kv_bf16_window_ring_waits_total"] - before >= 1
        assert s.wait_kv_idle() == 0
        assert s.metrics()["fp8serve:kv_bf16_tail_usage_perc"] == 0
        # n larger than the rings could never run at once: a 400 naming the rings.
        try:
            client.completions.create(model="m", prompt="hi", max_tokens=2, n=2)
            raise AssertionError("n = 2 with one ring was accepted")
        except openai.BadRequestError as e:
            assert "bf16 window's rings" in str(e), e
    finally:
        assert s.stop() == 0, s.log_text()


def test_a_budget_with_no_room_for_a_ring_starts_without_the_window(tmp_path):
    # 8 MiB: an eighth is 1 MiB, less than one ring (1.23 MiB). The server starts, says why every
    # sequence runs as pure FP8, and serves with the whole budget in the FP8 pool.
    s, client = small_budget_server(tmp_path, "8MiB", 4)
    try:
        log = s.startup_log()
        assert "one ring takes 1.2 MiB, more than the window's share of this budget: every sequence runs as " \
               "pure FP8" in log, log
        answer = client.completions.create(model="m", prompt="hello", max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True})
        assert answer.usage.completion_tokens == 8
        assert s.wait_kv_idle() == 0
    finally:
        assert s.stop() == 0, s.log_text()


def test_output_never_depends_on_load_with_the_window_on(tmp_path):
    # The storm a new user tries: a small budget, 16 greedy requests at once. Every sequence runs
    # with its ring (the others wait), so each answer - text and every logprob - is the one the
    # same request gets alone. Short raw prompts (< one block) never hit the prefix cache, so the
    # solo runs on the same server compute everything again.
    s, client = small_budget_server(tmp_path, "24MiB", 16)
    try:
        rings = int(re.search(r"rings for (\d+) of --max-num-seqs 16", s.startup_log())[1])
        assert 1 <= rings < 16
        prompts = ["Water boils at", "The capital of France is", "Two plus two equals", "My favourite colour is",
                   "The sun rises in the", "A week has seven", "Cats like to", "The ocean is",
                   "In the morning I", "The best way to learn is", "Rain falls from", "A good book",
                   "The train left the", "Bread is made from", "Music makes people", "The mountain was"]
        ask = lambda p: client.completions.create(model="m", prompt=p, max_tokens=32, temperature=0, logprobs=1,
                                                  extra_body={"ignore_eos": True})
        before = s.metrics()
        with ThreadPoolExecutor(16) as pool:
            loaded = list(pool.map(ask, prompts))
        after = s.metrics()
        assert after["fp8serve:kv_bf16_window_ring_waits_total"] > before["fp8serve:kv_bf16_window_ring_waits_total"]
        alone = [ask(p) for p in prompts]
        for p, a, b in zip(prompts, loaded, alone):
            assert a.choices[0].text == b.choices[0].text, p
            assert a.choices[0].logprobs.token_logprobs == b.choices[0].logprobs.token_logprobs, p
            assert b.usage.prompt_tokens_details is None or not b.usage.prompt_tokens_details.cached_tokens
        assert s.wait_kv_idle() == 0
    finally:
        assert s.stop() == 0, s.log_text()


def test_k_and_v_window_starts_on_64_mib_and_generate_sizes_rings_for_one(tmp_path):
    s = Server(DEFAULT_MODEL, "--kv-cache-memory", "64MiB", "--kv-bf16-window-tensors", "kv", "--served-model-name", "m",
               tmp_path=tmp_path)
    try:
        log = s.startup_log()
        assert "bf16 window 96 tokens (K+V): 3 rings x 7 blocks" in log, log
        status, _, body = s.post("/v1/completions", {"prompt": "hello", "max_tokens": 4})
        assert status == 200, body
    finally:
        assert s.stop() == 0, s.log_text()
    # generate runs one sequence: one ring, whatever --max-num-seqs serve would use.
    run = subprocess.run([str(binary()), "generate", str(DEFAULT_MODEL), "--prompt", "hello", "--max-tokens", "4",
                          "--kv-cache-memory", "12MiB"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "1 rings x 7 blocks" in run.stderr and "a ring for each of --max-num-seqs 1 sequences" in run.stderr, run.stderr
