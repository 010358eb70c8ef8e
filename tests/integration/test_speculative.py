"""Speculative decoding through the real server and the `openai` client: three servers on the
default model, one plain, one with --speculative-method ngram and one with --speculative-method
draft (the default model as its own draft), answer the same requests; greedy text, tokens and
every logprob are identical (bit for bit: JSON floats round-trip), also streamed, with concurrent
clients, n > 1 seeded sampling and stop strings; /metrics counts the drafts under vLLM's names,
and KV blocks all return (the draft's too). A draft with another vocabulary is refused at load."""
import subprocess
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from conftest import DEFAULT_MODEL, FIXTURES, TINY_LLAMA, Server, binary

DOCUMENT = (
    "The lighthouse keeper climbed the spiral stairs every evening at six. He wound the clockwork, trimmed "
    "the wick, polished the great lens and wrote the weather in a leather book: wind from the west, sea "
    "calm, three ships passing north. "
)
PROMPTS = [
    "Repeat the following text exactly.\n\n" + DOCUMENT * 2 + "\n\nRepeated text:\n",
    'Copy the fields into JSON.\nname: Ada Lovelace\ncity: London\nyear: 1843\n\nJSON: {"name": "Ada Lovelace", ',
    "Write a short poem about the sea.",
]


def complete(client, prompt, **kwargs):
    return client.completions.create(model="m", prompt=prompt, logprobs=0, **kwargs)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    if not DEFAULT_MODEL.exists():
        pytest.skip("default model not fetched")
    tmp = tmp_path_factory.mktemp("spec")
    common = ["--served-model-name", "m", "--max-model-len", 1024]
    plain = Server(DEFAULT_MODEL, *common, "--kv-cache-memory", "64MiB", tmp_path=tmp)
    ngram = Server(DEFAULT_MODEL, *common, "--kv-cache-memory", "64MiB", "--speculative-method", "ngram", "--num-speculative-tokens", 5,
                   "--speculative-disable-by-batch-size", 8, tmp_path=tmp)
    # The draft's pool takes half the budget (the same bytes per token): twice the budget leaves the
    # target the plain server's 64 MiB, so the same bf16 window rings and no extra preemption, which
    # would change the numerics of plain and speculative runs alike but not in the same places.
    draft = Server(DEFAULT_MODEL, *common, "--kv-cache-memory", "128MiB", "--speculative-method", "draft",
                   "--speculative-model", DEFAULT_MODEL,
                   "--num-speculative-tokens", 5, "--speculative-disable-by-batch-size", 8, tmp_path=tmp)
    yield {"plain": plain, "ngram": ngram, "draft": draft}
    for server in (plain, ngram, draft):
        assert server.stop() == 0, server.log_text()


def clients(servers):
    return [openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=300) for s in servers]


def pair(servers, method):
    return [servers["plain"], servers[method]]


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_greedy_is_identical_with_logprobs_and_drafts_are_counted(servers, method):
    servers = pair(servers, method)
    plain, spec = clients(servers)
    log = servers[1].log_text()
    assert ("speculative decoding: ngram, up to 5 tokens" in log if method == "ngram"
            else "speculative decoding: draft model" in log)
    for prompt in PROMPTS:
        a = complete(plain, prompt, max_tokens=80, temperature=0)
        b = complete(spec, prompt, max_tokens=80, temperature=0)
        assert b.choices[0].text == a.choices[0].text
        assert b.choices[0].logprobs.tokens == a.choices[0].logprobs.tokens
        assert b.choices[0].logprobs.token_logprobs == a.choices[0].logprobs.token_logprobs
        assert b.choices[0].finish_reason == a.choices[0].finish_reason
        assert b.usage.completion_tokens == a.usage.completion_tokens
    m = servers[1].metrics()
    drafts = m["fp8serve:spec_decode_num_drafts_total"]
    accepted = m["fp8serve:spec_decode_num_accepted_tokens_total"]
    proposed = m["fp8serve:spec_decode_num_draft_tokens_total"]
    assert drafts > 0 and 0 < accepted <= proposed
    per_pos = [v for k, v in m.items() if k.startswith("fp8serve:spec_decode_num_accepted_tokens_per_pos_total")]
    assert sum(per_pos) == accepted
    if method == "draft":  # the default model drafting for itself: its own tokens, nearly all accepted
        print(f"[spec] default model drafting for itself: {accepted:.0f} of {proposed:.0f} proposals accepted")
        assert accepted >= 0.9 * proposed
    assert "fp8serve:spec_decode_num_drafts_total" not in servers[0].metrics()
    assert servers[1].wait_kv_idle() == 0
    if method == "draft":
        assert servers[1].metrics()["fp8serve:spec_decode_draft_kv_cache_usage_perc"] == 0


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_streaming_concurrent_clients_sampling_n_and_stop_strings(servers, method):
    servers = pair(servers, method)
    plain, spec = clients(servers)

    def streamed(client, prompt):
        text = ""
        for chunk in client.completions.create(model="m", prompt=prompt, max_tokens=60, temperature=0, stream=True):
            text += chunk.choices[0].text
        return text

    # Six different prompts: two copies of one prompt would make the output depend on timing (a
    # copy admitted after the other's prefill maps its blocks from the prefix cache, and those
    # tokens are FP8 from the start rather than in the bf16 window), in either server. New to both
    # servers too (the plain one also served the other method's run).
    prompts = [f"{method} {i + 1}. {p}" for i, p in enumerate(PROMPTS * 2)]
    with ThreadPoolExecutor(6) as pool:
        want = list(pool.map(lambda p: streamed(plain, p), prompts))
        got = list(pool.map(lambda p: streamed(spec, p), prompts))
    assert got == want

    # Seeded sampling draws the same tokens (server/engine/speculation.hpp); n > 1 choices each theirs.
    for prompt in PROMPTS[:2]:
        a = complete(plain, prompt, max_tokens=40, temperature=0.8, seed=7, n=3)
        b = complete(spec, prompt, max_tokens=40, temperature=0.8, seed=7, n=3)
        assert [c.text for c in b.choices] == [c.text for c in a.choices]
        assert [c.logprobs.token_logprobs for c in b.choices] == [c.logprobs.token_logprobs for c in a.choices]

    # A stop string met inside an accepted run ends the text where plain decoding ends it.
    full = complete(plain, PROMPTS[0], max_tokens=60, temperature=0).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 4]
    a = complete(plain, PROMPTS[0], max_tokens=60, temperature=0, stop=[stop])
    b = complete(spec, PROMPTS[0], max_tokens=60, temperature=0, stop=[stop])
    assert b.choices[0].text == a.choices[0].text and b.choices[0].finish_reason == "stop"
    assert b.usage.completion_tokens == a.usage.completion_tokens
    assert servers[1].wait_kv_idle() == 0
    if method == "draft":
        assert servers[1].metrics()["fp8serve:spec_decode_draft_kv_cache_usage_perc"] == 0


def test_foreign_draft_and_bad_speculation_flags_are_refused(tmp_path):
    for flags, message in [
        (["--speculative-method", "draft", "--speculative-model", str(FIXTURES / "models" / "tiny-qwen2")],
         "vocabulary differs"),
        (["--speculative-method", "draft"], "draft needs --speculative-model"),
        (["--speculative-model", str(TINY_LLAMA)], "needs --speculative-method draft"),
        (["--speculative-method", "ngram", "--prompt-lookup-min", 5, "--prompt-lookup-max", 3], "must be <= --prompt-lookup-max"),
    ]:
        r = subprocess.run([str(binary()), "serve", str(TINY_LLAMA), *map(str, flags)], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode != 0
        assert message in r.stderr + r.stdout, r.stderr + r.stdout
