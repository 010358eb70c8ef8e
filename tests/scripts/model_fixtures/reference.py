"""Reference outputs from transformers: last-position logits and 32 greedy tokens per prompt.

The model handed in has already had every parameter rounded to bf16 and runs in fp32 with eager
attention, which is what fp8serve computes with (bf16 weights, fp32 activations/accumulation).

Per prompt the JSON holds:
  prompt_ids            the ids fed to the model (bos handling recorded next to them)
  last_logits.top_ids / top_values
                        top-20 of the last prompt position, descending (float32 values, exact)
  last_logits.checksum  over the full row, accumulated in float64 from the float32 logits:
                          sum          = sum_i l[i]
                          sum_sq       = sum_i l[i]^2
                          weighted_sum = sum_i l[i] * ((i % 7) + 1)   (catches permuted ids)
  greedy_ids            32 tokens by argmax, EOS ignored (exactly 32 are generated)
  greedy_steps          per generated token (teacher-forced on the reference's own tokens):
                          top5_ids / top5_values of the distribution it was picked from and
                          margin = top1 - top2, so a test can tell a real mismatch from a near-tie
"""

import math  # noqa: F401

import torch

from .json_dump import dump_json  # noqa: F401  (re-exported: the fixture scripts call reference.dump_json)

NUM_GREEDY = 32
TOP_K = 20
STEP_TOP_K = 5

CHECKSUM_DOC = {
    "sum": "sum_i logits[i]",
    "sum_sq": "sum_i logits[i]^2",
    "weighted_sum": "sum_i logits[i] * ((i % 7) + 1)",
    "accumulation": "float64 over the float32 logits, i = token id 0..vocab-1",
}


def _f(x):
    """float32 -> the exact Python float (repr round-trips), so JSON holds the exact value."""
    return float(x)


def logits_checksum(row):
    r = row.double()
    idx = torch.arange(r.numel(), dtype=torch.float64)
    return {
        "sum": float(r.sum()),
        "sum_sq": float((r * r).sum()),
        "weighted_sum": float((r * (torch.remainder(idx, 7) + 1)).sum()),
    }


def _top(row, k):
    vals, ids = torch.topk(row, k)
    return [int(i) for i in ids], [_f(v) for v in vals]


@torch.no_grad()
def run_prompt(model, prompt_ids):
    """Prefill the prompt, then greedy-decode NUM_GREEDY tokens with transformers' KV cache."""
    out = model(torch.tensor([prompt_ids]), use_cache=True)
    last = out.logits[0, -1].float()
    if not torch.isfinite(last).all():
        raise RuntimeError("non-finite logits")
    top_ids, top_vals = _top(last, TOP_K)
    result = {
        "last_logits": {
            "top_ids": top_ids,
            "top_values": top_vals,
            "checksum": logits_checksum(last),
        }
    }
    past = out.past_key_values
    row = last
    greedy, steps = [], []
    for _ in range(NUM_GREEDY):
        ids5, vals5 = _top(row, STEP_TOP_K)
        token = ids5[0]
        greedy.append(token)
        steps.append({"top5_ids": ids5, "top5_values": vals5, "margin": vals5[0] - vals5[1]})
        out = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        row = out.logits[0, -1].float()
    result["greedy_ids"] = greedy
    result["greedy_steps"] = steps
    result["greedy_distinct"] = len(set(greedy))
    result["min_greedy_margin"] = min(s["margin"] for s in steps)
    return result


