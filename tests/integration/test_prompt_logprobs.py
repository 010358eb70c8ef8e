"""Prompt logprobs on the real server against transformers: completions' echo with logprobs
(OpenAI's legacy format, max_tokens 0 for scoring only), vLLM's prompt_logprobs (completions
and chat), computed in chunked prefill through the FP8 cache; min_tokens.

The reference is tests/fixtures/reference/prompt_logprobs.json (tests/scripts/
make_prompt_logprobs_reference.py): transformers in float32 on the bf16-rounded weights, with the
K/V the server's pool holds - rounded to bf16, or through the FP8 cache (per-layer scales
calibrated on the first chunk, the bf16 K window, chunks of 32 tokens reading the earlier ones as
stored) - and, on a CPU whose projections use the bf16 dot (the start-up log says "linear
avx512bf16"), the projections' inputs rounded to bf16 as well. Measured against it (docs/api.md,
"Prompt logprobs"): most positions agree to 1e-6; the worst, where a rounding lands on the other
side of a boundary in one of the two implementations, by 0.013-0.056 over the three fixtures, and
the mean over all positions by at most 0.005. TOL and MEAN_TOL are about three and two times
that. A scoring that missed the FP8 cache or read it wrongly (no window, one scale per chunk, the
chunk's own K/V taken unquantized) is off by 0.03-0.15 on average and up to 1.1: the same
comparison without the FP8 simulation measures that."""
import json
import statistics

import openai
import pytest

from conftest import FIXTURES, TINY_LLAMA, Server

REFERENCE = json.loads((FIXTURES / "reference" / "prompt_logprobs.json").read_text())
TOL = 0.15       # max |logprob - reference| at one position
MEAN_TOL = 0.01  # mean over a prompt's positions
# The FP8 cache the reference simulates (make_prompt_logprobs_reference.py: MARGIN, WINDOW), pinned
# rather than left to the defaults: the default 96-token window would keep all but the first block
# of the fixtures' longest (125-token) prompts' K in bf16, and test little of the FP8 part.
REFERENCE_CACHE = ("--kv-scale-margin", 2, "--kv-bf16-window", 64)


def start(model, tmp_path, *flags):
    # 32-token steps and 4-row score groups: a long prompt spans several prefill chunks (later
    # chunks read the earlier ones from the pool) and each chunk's rows several LM-head groups.
    return Server(model, "--served-model-name", "tiny", "--max-num-batched-tokens", 32, "--max-num-seqs", 4,
                  "--kv-cache-memory", 16_000_000, *REFERENCE_CACHE, *flags, tmp_path=tmp_path)


def client(s):
    return openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=120)


def reference_key(server, kv):
    """The reference variant that computes what this server does ("_kv_bf16" or "_kv_fp8_chunk32"...):
    FP8 KV with --kv-rotation hadamard (the default, in the start-up log) reads the rotated variant."""
    log = server.startup_log()
    if kv.startswith("_kv_fp8") and "rotation hadamard" in log:
        kv = "_kv_fp8_rot" + kv[len("_kv_fp8"):]
    return kv + ("_act_bf16" if "linear avx512bf16" in log else "")


def check_close(got, want, what):
    errors = [abs(g - w) for g, w in zip(got, want)]
    assert len(got) == len(want) and max(errors) <= TOL and statistics.mean(errors) <= MEAN_TOL, \
        (what, max(errors), statistics.mean(errors))
    return max(errors), statistics.mean(errors)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
@pytest.mark.parametrize("kv_dtype,rotation", [("bf16", "hadamard"), ("fp8_e4m3", "hadamard"), ("fp8_e4m3", "none")])
def test_echo_logprobs_and_prompt_logprobs_match_transformers(model, kv_dtype, rotation, tmp_path):
    s = start(FIXTURES / "models" / model, tmp_path, "--kv-cache-dtype", kv_dtype, "--kv-rotation", rotation)
    try:
        c = client(s)
        # bf16 KV: the chunks do not matter (every position exact in the pool); FP8 KV: 32-token chunks.
        key = reference_key(s, "_kv_bf16" if kv_dtype == "bf16" else "_kv_fp8_chunk32")
        for prompt in REFERENCE["models"][model]:
            ids, ref = prompt["prompt_ids"], prompt["positions"]
            r = c.completions.create(model="tiny", prompt=ids, max_tokens=0, echo=True, logprobs=3,
                                     extra_body={"prompt_logprobs": 3, "return_tokens_as_token_ids": True})
            choice = r.choices[0]
            assert choice.finish_reason == "length" and r.usage.completion_tokens == 0
            assert r.usage.prompt_tokens == len(ids)
            lp = choice.logprobs
            assert lp.tokens == [f"token_id:{t}" for t in ids]  # the prompt's own tokens, nothing generated
            assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
            assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
            worst, mean = check_close(lp.token_logprobs[1:], [w["logprob" + key] for w in ref], (model, prompt["name"]))
            print(f"{model} {kv_dtype} {prompt['name']}: max |diff| {worst:.4f}, mean {mean:.5f}")
            vllm = choice.model_extra["prompt_logprobs"]
            assert len(vllm) == len(ids) and vllm[0] is None
            for p, want in enumerate(ref, start=1):
                # vLLM's shape: the prompt token first (logprob, rank, decoded_token), then the top 3.
                entry = vllm[p]
                first = next(iter(entry))
                assert int(first) == ids[p] and entry[first]["logprob"] == pytest.approx(lp.token_logprobs[p], abs=1e-6)
                assert entry[first]["decoded_token"] == f"token_id:{ids[p]}"
                assert len(entry) in (3, 4) and {1, 2, 3} <= {v["rank"] for v in entry.values()}
                top = lp.top_logprobs[p]
                assert len(top) == 3 and max(top.values()) == max(v["logprob"] for v in entry.values())
                if kv_dtype == "bf16":  # the reference's top 3 (the chunked FP8 one has no top list)
                    ref_top = {f"token_id:{t}": v for t, v in zip(want["top_ids" + key], want["top_logprobs" + key])}
                    for token, value in top.items():
                        if token in ref_top:
                            assert abs(value - ref_top[token]) <= TOL
                    if want["margin" + key] > 2 * TOL:  # not a near-tie: the same best token, rank 1
                        assert max(top, key=top.get) == f"token_id:{want['top_ids' + key][0]}"
                        assert (entry[first]["rank"] == 1) == (want["rank" + key] == 1)
        assert s.wait_kv_idle() == 0
    finally:
        assert s.stop() == 0, s.log_text()


def test_prefix_cache_hits_do_not_change_prompt_logprobs_and_generation_follows(tmp_path):
    s = start(TINY_LLAMA, tmp_path)
    try:
        c = client(s)
        ids = REFERENCE["models"]["tiny-llama"][1]["prompt_ids"]  # the long prompt: several blocks
        # The prompt's blocks go into the prefix cache ...
        warm = c.completions.create(model="tiny", prompt=ids, max_tokens=3, temperature=0, logprobs=0,
                                    extra_body={"return_tokens_as_token_ids": True})
        again = c.completions.create(model="tiny", prompt=ids, max_tokens=1, temperature=0)
        assert again.usage.prompt_tokens_details.cached_tokens > 0, "the prompt was not cached"
        # ... but a request for prompt logprobs maps none of them: every position is computed.
        scored = c.completions.create(model="tiny", prompt=ids, max_tokens=0, echo=True, logprobs=0)
        assert scored.usage.prompt_tokens_details.cached_tokens == 0
        fresh = scored.choices[0].logprobs.token_logprobs
        assert fresh[0] is None and all(isinstance(x, float) for x in fresh[1:])
        assert scored.choices[0].logprobs.top_logprobs[1] is None  # logprobs 0: no top list
        rescored = c.completions.create(model="tiny", prompt=ids, max_tokens=0, echo=True, logprobs=0)
        assert rescored.choices[0].logprobs.token_logprobs == fresh
        ref = REFERENCE["models"]["tiny-llama"][1]["positions"]
        check_close(fresh[1:], [w["logprob" + reference_key(s, "_kv_fp8_chunk32")] for w in ref], "after a cache hit")

        # echo + logprobs with generation: the prompt's entries, then the generated tokens'.
        gen = c.completions.create(model="tiny", prompt=ids, max_tokens=3, temperature=0, echo=True, logprobs=2,
                                   extra_body={"return_tokens_as_token_ids": True})  # byte tokens print alike
        lp = gen.choices[0].logprobs
        assert len(lp.tokens) == len(ids) + 3 and lp.token_logprobs[:len(ids)] == fresh
        # The same tokens and logprobs as the first plain request's, which computed the prompt in
        # the same chunks (compared as ids: where the prompt ends inside a UTF-8 character, the
        # echoed text joins it with the first generated byte). Not a request that maps cached
        # blocks: its chunks start at the cached length, and with the bf16 window a chunk's end
        # decides what it reads from FP8, so its numbers differ (docs/fp8-kv-cache.md).
        assert lp.tokens[len(ids):] == warm.choices[0].logprobs.tokens
        assert lp.token_logprobs[len(ids):] == warm.choices[0].logprobs.token_logprobs
        assert len(gen.choices[0].text) > len(warm.choices[0].text)
        assert lp.tokens[:len(ids)] == [f"token_id:{t}" for t in ids]
        assert lp.text_offset == sorted(lp.text_offset)
        assert all(len(t) == 2 for t in lp.top_logprobs[1:])

        # n > 1: every choice carries the prompt's logprobs once.
        many = c.completions.create(model="tiny", prompt=ids[:20], max_tokens=2, temperature=0, n=2, echo=True,
                                    logprobs=0)
        first = many.choices[0].logprobs.token_logprobs[:20]
        for choice in many.choices:  # computed once, in the prefill both choices share
            assert choice.logprobs.token_logprobs[:20] == first and len(choice.logprobs.tokens) == 22
        assert first[0] is None and all(isinstance(x, float) for x in first[1:])
        assert s.wait_kv_idle() == 0
    finally:
        assert s.stop() == 0, s.log_text()


def test_stream_chat_and_request_errors(tmp_path):
    s = start(TINY_LLAMA, tmp_path)
    try:
        c = client(s)
        ids = REFERENCE["models"]["tiny-llama"][0]["prompt_ids"]
        whole = c.completions.create(model="tiny", prompt=ids, max_tokens=2, temperature=0, echo=True, logprobs=1)
        # Streaming: the prompt's text and logprobs come in the first chunk, before any generated token's.
        chunks = list(c.completions.create(model="tiny", prompt=ids, max_tokens=2, temperature=0, echo=True,
                                           logprobs=1, stream=True))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        tokens = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
        assert text == whole.choices[0].text
        assert tokens == whole.choices[0].logprobs.tokens
        first = next(ch for ch in chunks if ch.choices and ch.choices[0].logprobs)
        assert first.choices[0].logprobs.token_logprobs[0] is None

        # Chat: vLLM puts prompt_logprobs at the top level.
        chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=2,
                                         temperature=0, extra_body={"prompt_logprobs": 1})
        pl = chat.model_extra["prompt_logprobs"]
        assert pl[0] is None and len(pl) == chat.usage.prompt_tokens
        assert all(1 <= len(entry) <= 2 for entry in pl[1:])

        # echo without logprobs, max_tokens 0: the prompt back, nothing generated.
        echo_only = c.completions.create(model="tiny", prompt="Hello world", max_tokens=0, echo=True)
        assert echo_only.choices[0].text == "Hello world" and echo_only.usage.completion_tokens == 0

        for body, param in [({"prompt": "x", "max_tokens": 0}, "max_tokens"),
                            ({"prompt": "x", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
                            ({"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
                            ({"prompt": "x", "min_tokens": 5, "max_tokens": 4}, "min_tokens"),
                            ({"prompt": "x", "min_tokens": 17}, "min_tokens"),  # the default max_tokens is 16
                            ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens")]:
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            status, _, raw = s.post(path, body)
            assert status == 400 and json.loads(raw)["error"]["param"] == param, (body, raw)
        assert s.alive() and s.wait_kv_idle() == 0
    finally:
        assert s.stop() == 0, s.log_text()


def test_min_tokens_masks_stop_ids_and_defers_stop_strings(tmp_path):
    s = start(TINY_LLAMA, tmp_path)
    try:
        c = client(s)
        kw = dict(model="tiny", prompt="Hello world", temperature=0, logprobs=0)
        free = c.completions.create(max_tokens=8, extra_body={"return_tokens_as_token_ids": True}, **kw)
        greedy = [int(t.split(":")[1]) for t in free.choices[0].logprobs.tokens]
        # A stop token id that greedy picks first ends the answer at once ...
        stopped = c.completions.create(max_tokens=8, extra_body={"stop_token_ids": [greedy[0]]}, **kw)
        assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].text == ""
        # ... unless min_tokens masks it: at least 3 tokens, none of the first 3 the stop id.
        held = c.completions.create(max_tokens=8, extra_body={"stop_token_ids": [greedy[0]], "min_tokens": 3,
                                                              "return_tokens_as_token_ids": True}, **kw)
        got = [int(t.split(":")[1]) for t in held.choices[0].logprobs.tokens]
        assert held.usage.completion_tokens >= 3 and greedy[0] not in got[:3] and got[0] != greedy[0]
        # A stop string is not looked for before min_tokens: the first token's own text stops a
        # plain request at once, but not one with min_tokens 4.
        first_text = c.completions.create(max_tokens=1, **kw).choices[0].text
        assert first_text.strip(), "need a first token with visible text"
        plain = c.completions.create(max_tokens=8, stop=[first_text], **kw)
        assert plain.choices[0].text == "" and plain.choices[0].finish_reason == "stop"
        late = c.completions.create(max_tokens=8, stop=[first_text], extra_body={"min_tokens": 4}, **kw)
        assert late.choices[0].text.startswith(first_text) and late.usage.completion_tokens >= 4
        assert s.wait_kv_idle() == 0
    finally:
        assert s.stop() == 0, s.log_text()
