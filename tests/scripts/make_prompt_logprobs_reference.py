#!/usr/bin/env python3
"""Prompt logprobs of the tiny fixtures from transformers, and the lm-evaluation-harness task
that scores the server against them.

    /tmp/refvenv/bin/python tests/scripts/make_prompt_logprobs_reference.py

Writes (relative to the repository root):
  tests/fixtures/reference/prompt_logprobs.json
      per tiny model and prompt (the prompt_ids of tests/fixtures/reference/<model>.json), for
      every prompt token after the first: its logprob, rank (1 + tokens with a higher logit) and
      the top-3 ids and logprobs at that position, five times over: K/V in fp32 (transformers as
      it is; no suffix), K/V rounded to bf16 (fp8serve's bf16 pool, as make_engine_reference.py
      does it; _kv_bf16), K/V through fp8serve's FP8 cache as one prefill step reads it (below;
      _kv_fp8), and those two again with the input of every projection rounded to bf16 (the CPU
      backend's bf16 dot, on a CPU with AVX512-BF16; _act_bf16); and the logprob alone of the FP8
      cache prefilled in chunks of 32 tokens (_kv_fp8_chunk32, _kv_fp8_chunk32_act_bf16: each
      chunk reads the earlier ones as the pool stores them); every FP8 variant again with
      --kv-rotation hadamard (the server's default; _kv_fp8_rot...: below); and the lm-eval
      task's expected results (per-choice loglikelihoods, the accuracy, the greedy continuations).
  tests/integration/lm_eval_task/tiny_mc.jsonl, tiny_gen.jsonl
      the task's documents: multiple choice (context, choices, gold) and generation (context,
      target). The generation targets are half transformers' own greedy continuation of the
      context and half a string it does not produce, so the expected accuracy is exactly 0.5.

The model is the transformers one in float32 with eager attention after every parameter was
rounded to bf16 (what fp8serve computes with), one torch thread; log_softmax in float64 over
the float32 logits.

The FP8 cache, simulated in eager attention (the contract of kernels/paged_kv.hpp for a prompt
prefilled in one step, with --kv-scale-margin 2, --kv-bf16-window 64, K only, which the tests pin):
per layer one K and one V scale, max(amax(the prompt's K or V after RoPE) * 2 / 448, FLT_MIN);
every value rounded to bf16, divided by its scale, rounded to E4M3 (nearest even; nothing
saturates under a margin of 2) and multiplied back; the positions of the window - all but the
first floor((n - 64) / 16) * 16 of an n-token prompt - keep their bf16 K exact; V is FP8 at
every position. In chunks (transformers' KV cache holds the fp32 K/V, quantized again as they are
read, which is what reading the stored FP8 bytes gives): the scales are calibrated on the first
chunk and frozen (a later value beyond 448 * scale saturates), and a chunk ending at position e
reads K from FP8 below max(the previous chunk's FP8 length, floor((e - 64) / 16) * 16).
With rotation (_kv_fp8_rot): each head's q, K and V (after RoPE) go through the normalized
Walsh-Hadamard transform in fp32 with the arithmetic kernels/forward_ops.hpp defines for every
backend (butterfly stages len = 1, 2, .., n / 2, then one product with fp32(1 / sqrt(n));
tests/unit/ops/test_hadamard.cpp holds fp8serve's to Sylvester's matrix), K and V are calibrated,
rounded and windowed as above in that space, eager attention runs on them, and its output goes
back through the transform (its own inverse). Tokenization follows lm-eval 0.4.13 (lm_eval/api/model.py _encode_pair with
the huggingface tokenizer backend, add_special_tokens False; a multiple_choice continuation is
target_delimiter " " + choice; generate_until encodes the context alone).
"""

import json
import math
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from model_fixtures import models, reference  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
MODELS_DIR = REPO / "tests" / "fixtures" / "models"
REFERENCE_DIR = REPO / "tests" / "fixtures" / "reference"
TASK_DIR = REPO / "tests" / "integration" / "lm_eval_task"
TOP = 3
LM_EVAL_MODEL = "tiny-llama"
GEN_TOKENS = 4  # max_gen_toks of tiny_gen.yaml

MC_DOCS = [
    ("The lighthouse keeper counted the", ["ships", "stars", "apples", "notebooks"]),
    ("On calm nights there were", ["seven", "two", "none", "many"]),
    ("He wrote each number in a green", ["notebook", "house", "river", "letter"]),
    ("The weather today is", ["sunny", "cold", "quiet", "green"]),
    ("Hello", ["world", "there", "friend", "again"]),
    ("Once upon a time there was a", ["king", "ship", "lamp", "storm"]),
    ("The capital of France is", ["Paris", "Rome", "Oslo", "Lima"]),
    ("Two plus two equals", ["four", "five", "three", "twenty"]),
    ("She opened the door and saw a", ["cat", "dog", "light", "stranger"]),
    ("The time the lamp was", ["lit", "out", "late", "new"]),
]
# Candidate contexts for tiny_gen: the first NUM_GEN whose greedy continuation is the same text
# in every variant, with no near-tie (logit margin > MIN_GEN_MARGIN), are kept - the random tiny
# model's text is arbitrary (byte tokens; U+FFFD where bytes are no UTF-8, as in the server's
# text), and a near-tie would make the target depend on rounding. A text that ends inside a
# character is left out: the server drops such a tail where a decode writes U+FFFD.
GEN_CANDIDATES = [
    "A lighthouse keeper", "Every evening he", "On stormy nights", "The green notebook", "Hello world",
    "In 1987 there were", "He wrote each number", "The lamp was lit", "Seven ships", "On calm nights",
    "The weather and the time", "Once, in 1987", "A green notebook", "The keeper counted", "Two ships",
    "Every evening", "The time the lamp", "Calm nights", "Stormy ones", "None at all", "Hello", "The ships",
    "He wrote", "The number", "In the evening", "A lighthouse", "On stormy ones", "Next to the weather",
]
NUM_GEN, MIN_GEN_MARGIN = 6, 0.05


# How eager attention sees the cached K and V, and the projections' inputs. fp8 state: the frozen
# scales per layer (None: calibrate on this call) and the FP8 length of the chunk (None: the rule
# applied to the keys it is handed, one step).
KV_MODE = {"mode": "fp32", "act_bf16": False, "scales": {}, "fp8_len": None}
MARGIN, WINDOW, BLOCK = 2.0, 64, 16


def patch_attention():
    import transformers.models.llama.modeling_llama as llama
    import transformers.models.qwen2.modeling_qwen2 as qwen2
    import transformers.models.qwen3.modeling_qwen3 as qwen3

    def cached(layer, key, value):
        mode = KV_MODE["mode"]
        if mode == "fp32":
            return key, value
        if mode == "fp8rot":
            key, value = fwht(key), fwht(value)
        kb, vb = key.to(torch.bfloat16).float(), value.to(torch.bfloat16).float()
        if mode == "bf16":
            return kb, vb
        n = key.shape[-2]  # [batch, kv_heads, n, head_dim]
        fp8_len = KV_MODE["fp8_len"] if KV_MODE["fp8_len"] is not None else fp8_rule(n)
        if layer not in KV_MODE["scales"]:  # the first chunk calibrates, on its own tokens
            KV_MODE["scales"][layer] = [max(float(x.abs().max()) * MARGIN / 448.0, torch.finfo(torch.float32).tiny)
                                        for x in (key, value)]
        out = []
        for x, xb, windowed, scale in ((key, kb, True, KV_MODE["scales"][layer][0]),
                                       (value, vb, False, KV_MODE["scales"][layer][1])):
            q = (xb / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * scale
            if windowed:
                q[..., fp8_len:, :] = xb[..., fp8_len:, :]
            out.append(q)
        return out[0], out[1]

    for mod in (llama, qwen2, qwen3):
        original = mod.eager_attention_forward

        def patched(module, query, key, value, *args, _original=original, **kwargs):
            key, value = cached(module.layer_idx, key, value)
            if KV_MODE["mode"] != "fp8rot":
                return _original(module, query, key, value, *args, **kwargs)
            out, weights = _original(module, fwht(query), key, value, *args, **kwargs)
            return fwht(out), weights

        mod.eager_attention_forward = patched


def fwht(x):
    """The normalized Walsh-Hadamard transform of the last dimension (a power of two), in fp32:
    for len = 1, 2, .., n / 2, every pair (i, i + len) with i & len == 0 becomes (a + b, a - b);
    then one product with fp32(1 / sqrt(n))."""
    n = x.shape[-1]
    assert n > 0 and n & (n - 1) == 0, n
    x = x.float()
    length = 1
    while length < n:
        y = x.reshape(*x.shape[:-1], n // (2 * length), 2, length)
        a, b = y[..., 0, :], y[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2).reshape(*x.shape[:-1], n)
        length *= 2
    return x * torch.tensor(1.0 / math.sqrt(n), dtype=torch.float32)


def fp8_rule(context_len):
    """KvWindow::fp8_len: the positions that have left the window."""
    return 0 if context_len <= WINDOW else (context_len - WINDOW) // BLOCK * BLOCK


def round_projection_inputs(model):
    """The bf16 dot of fp8serve's CPU projections: every nn.Linear's input rounded to bf16 when
    KV_MODE["act_bf16"] is set (numpy_model.py's act_bf16)."""
    def hook(_module, args):
        return (args[0].to(torch.bfloat16).float(),) if KV_MODE["act_bf16"] else None

    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(hook)


def load(name):
    from transformers import AutoTokenizer

    d = MODELS_DIR / name
    from safetensors.torch import load_file

    state = {}
    for f in sorted(d.glob("*.safetensors")):
        state.update(load_file(str(f)))
    model = models.load_hf_model_bf16(d, state)
    round_projection_inputs(model)
    return model, AutoTokenizer.from_pretrained(str(d))


@torch.no_grad()
def prompt_logprobs(model, ids):
    """Per position p >= 1: the five variants' results (module docstring)."""
    out = [{"token": ids[p + 1]} for p in range(len(ids) - 1)]
    variants = [("fp32", False, ""), ("bf16", False, "_kv_bf16"), ("fp8", False, "_kv_fp8"),
                ("bf16", True, "_kv_bf16_act_bf16"), ("fp8", True, "_kv_fp8_act_bf16"),
                ("fp8rot", False, "_kv_fp8_rot"), ("fp8rot", True, "_kv_fp8_rot_act_bf16")]
    for mode, act_bf16, suffix in variants:
        KV_MODE["mode"], KV_MODE["act_bf16"], KV_MODE["scales"] = mode, act_bf16, {}
        logits = model(torch.tensor([ids])).logits[0].float()  # [n, vocab]
        logprobs = torch.log_softmax(logits.double(), dim=-1)
        for p, entry in enumerate(out):
            row, lrow = logits[p], logprobs[p]
            token = entry["token"]
            top_vals, top_ids = torch.topk(lrow, TOP)
            entry["logprob" + suffix] = round(float(lrow[token]), 7)
            entry["rank" + suffix] = 1 + int((row > row[token]).sum())
            entry["top_ids" + suffix] = [int(i) for i in top_ids]
            entry["top_logprobs" + suffix] = [round(float(v), 7) for v in top_vals]
            # top1 - top2 of the logits: a test can tell a near-tie from a real mismatch
            entry["margin" + suffix] = round(float(row[top_ids[0]] - row[top_ids[1]]), 7)
    for mode, act_bf16, suffix in (("fp8", False, "_kv_fp8_chunk32"), ("fp8", True, "_kv_fp8_chunk32_act_bf16"),
                                   ("fp8rot", False, "_kv_fp8_rot_chunk32"),
                                   ("fp8rot", True, "_kv_fp8_rot_chunk32_act_bf16")):
        KV_MODE["mode"], KV_MODE["act_bf16"], KV_MODE["scales"] = mode, act_bf16, {}
        logprobs = chunked_logprobs(model, ids, 32)
        for p, entry in enumerate(out):
            entry["logprob" + suffix] = round(float(logprobs[p, entry["token"]]), 7)
    KV_MODE.update(mode="fp32", act_bf16=False, scales={}, fp8_len=None)
    return out


@torch.no_grad()
def chunked_logprobs(model, ids, chunk):
    """[n, vocab] float64 log_softmax of a prefill in chunks of `chunk` tokens through the cache."""
    from transformers import DynamicCache

    cache = DynamicCache()
    rows, fp8_len = [], 0
    for start in range(0, len(ids), chunk):
        end = min(start + chunk, len(ids))
        fp8_len = max(fp8_len, fp8_rule(end))
        KV_MODE["fp8_len"] = fp8_len
        logits = model(torch.tensor([ids[start:end]]), past_key_values=cache, use_cache=True).logits[0].float()
        rows.append(torch.log_softmax(logits.double(), dim=-1))
    KV_MODE["fp8_len"] = None
    return torch.cat(rows)


def encode_pair(tok, context, continuation):
    """lm-eval 0.4.13's _encode_pair for a causal model."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok(context + continuation, add_special_tokens=False)["input_ids"]
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    return ctx, whole[len(ctx):]


# The variants the lm-eval task is scored with: transformers as it is, and through the FP8 cache
# the server uses by default (one step each: the requests are short), without and with the bf16 dot.
LM_EVAL_VARIANTS = [("fp32", False, ""), ("fp8", False, "_kv_fp8"), ("fp8", True, "_kv_fp8_act_bf16"),
                    ("fp8rot", False, "_kv_fp8_rot"), ("fp8rot", True, "_kv_fp8_rot_act_bf16")]


def set_variant(mode, act_bf16):
    KV_MODE.update(mode=mode, act_bf16=act_bf16, scales={}, fp8_len=None)


@torch.no_grad()
def loglikelihood(model, ctx, cont):
    ids = ctx + cont
    logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
    total, greedy = 0.0, True
    for i, token in enumerate(cont):
        row = logprobs[len(ctx) - 1 + i]
        total += float(row[token])
        greedy = greedy and int(row.argmax()) == token
    return total, greedy


@torch.no_grad()
def greedy(model, tok, context):
    """GEN_TOKENS argmax tokens through transformers' cache (a prefill, then one token a step, as
    the server decodes), the smallest top1 - top2 logit margin on the way, the text up to "\n"."""
    from transformers import DynamicCache

    ids = tok(context, add_special_tokens=False)["input_ids"]
    cache, new, margins, step = DynamicCache(), [], [], ids
    for _ in range(GEN_TOKENS):
        logits = model(torch.tensor([step]), past_key_values=cache, use_cache=True).logits[0, -1].float()
        top = torch.topk(logits, 2)
        margins.append(float(top.values[0] - top.values[1]))
        new.append(int(top.indices[0]))
        step = [new[-1]]
    text = tok.decode(new, skip_special_tokens=True).split("\n")[0]  # until: ["\n"]
    return new, text, min(margins)


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    import transformers

    patch_attention()

    result = {
        "computed_with": "transformers " + transformers.__version__ + ", torch " + torch.__version__ +
                         ", float32 activations, eager attention, every parameter rounded to bf16; log_softmax in "
                         "float64 over the float32 logits",
        "script": "tests/scripts/make_prompt_logprobs_reference.py",
        "models": {},
    }
    for name in ["tiny-llama", "tiny-qwen2", "tiny-qwen3"]:
        model, _ = load(name)
        prompts = json.loads((REFERENCE_DIR / f"{name}.json").read_text())["prompts"]
        result["models"][name] = [
            {"name": p["name"], "prompt_ids": p["prompt_ids"], "positions": prompt_logprobs(model, p["prompt_ids"])}
            for p in prompts
        ]
        print(f"  {name}: {len(prompts)} prompts")

    model, tok = load(LM_EVAL_MODEL)
    mc, mc_expected, correct, min_gap = [], [], {}, float("inf")
    for i, (context, choices) in enumerate(MC_DOCS):
        gold = i % len(choices)
        lls = []
        for choice in choices:
            ctx, cont = encode_pair(tok, context, " " + choice)
            entry = {"context_ids": ctx, "continuation_ids": cont}
            for mode, act_bf16, suffix in LM_EVAL_VARIANTS:
                set_variant(mode, act_bf16)
                entry["loglikelihood" + suffix], entry["is_greedy" + suffix] = loglikelihood(model, ctx, cont)
            lls.append(entry)
        for _, _, suffix in LM_EVAL_VARIANTS:
            values = sorted((x["loglikelihood" + suffix] for x in lls), reverse=True)
            min_gap = min(min_gap, values[0] - values[1])
            best = max(range(len(lls)), key=lambda k: lls[k]["loglikelihood" + suffix])
            correct[suffix] = correct.get(suffix, 0) + (best == gold)
        mc.append({"context": context, "choices": choices, "gold": gold})
        mc_expected.append(lls)
    if len(set(correct.values())) != 1:
        raise RuntimeError(f"the variants disagree on tiny_mc's accuracy: {correct}")
    correct = correct[""]
    gen, gen_expected, gen_correct, min_margin = [], [], 0, float("inf")
    for context in GEN_CANDIDATES:
        runs = []
        for mode, act_bf16, _ in LM_EVAL_VARIANTS:
            set_variant(mode, act_bf16)
            runs.append(greedy(model, tok, context))
        new, text = runs[0][0], runs[0][1]
        margin = min(r[2] for r in runs)
        if len({r[1] for r in runs}) != 1 or margin <= MIN_GEN_MARGIN or not text.strip() or text[-1] == "\ufffd":
            continue
        if len(gen) == NUM_GEN:
            break
        min_margin = min(min_margin, margin)
        target = text if len(gen) % 2 == 0 else text + " (not this)"
        gen_correct += target == text
        gen.append({"context": context, "target": target})
        gen_expected.append({"greedy_ids": new, "greedy_text": text, "min_margin": margin})
    if len(gen) < NUM_GEN:
        raise RuntimeError(f"only {len(gen)} usable generation contexts")
    set_variant("fp32", False)
    result["lm_eval"] = {
        "model": LM_EVAL_MODEL,
        "variants": {suffix or "(none)": f"K/V {mode}, projection inputs {'bf16' if act else 'fp32'}"
                     for mode, act, suffix in LM_EVAL_VARIANTS},
        "tiny_mc": {"acc": correct / len(MC_DOCS), "min_best_gap": min_gap, "docs": mc_expected},
        "tiny_gen": {"exact_match": gen_correct / len(gen), "min_greedy_margin": min_margin,
                     "docs": gen_expected},
    }
    print(f"  lm-eval: tiny_mc acc {correct / len(MC_DOCS)} (smallest best-vs-second gap {min_gap:.4f}), "
          f"tiny_gen exact_match {gen_correct / len(gen)} (smallest greedy margin {min_margin:.4f})")

    path = REFERENCE_DIR / "prompt_logprobs.json"
    path.write_text(reference.dump_json(result) + "\n")
    print(f"  wrote {path.relative_to(REPO)} ({path.stat().st_size} bytes)")
    TASK_DIR.mkdir(parents=True, exist_ok=True)
    for name, docs in [("tiny_mc", mc), ("tiny_gen", gen)]:
        p = TASK_DIR / f"{name}.jsonl"
        p.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
        print(f"  wrote {p.relative_to(REPO)}")


if __name__ == "__main__":
    main()
