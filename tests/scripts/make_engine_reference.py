#!/usr/bin/env python3
"""transformers references for fp8serve's bf16 KV pool: the same models, prompts and fp32 math
as tests/fixtures/reference/, but with keys and values rounded to bf16 where attention reads
them (after RoPE), which is exactly what the bf16 pool stores. The engine tests compare
fp8serve with the bf16 pool to these bit-for-bit in tokens and to ~1e-5 in logits; the fp32-KV
references differ from them by the bf16 rounding of K/V (up to ~0.05 on a logit of the
large-scale random tiny models, enough to flip a near-tied greedy step).

    /work/refvenv/venv/bin/python tests/scripts/make_engine_reference.py

Writes tests/fixtures/engine/{tiny-llama,tiny-qwen2,tiny-qwen3,smollm2-135m-q4_1}.kv-bf16.json
(the last only when .models/SmolLM2-135M-Instruct.Q4_1.gguf is present). Prompts are read from
the fp32-KV reference files, so both references cover the same ids. Deterministic (one torch
thread, no sampling); package versions are stored in each file.
"""

import json
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "scripts"))

from model_fixtures import reference  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "engine"
DEFAULT_MODEL = ROOT / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def patch_attention_to_bf16_kv():
    """Rounds key/value states to bf16 in every eager attention call (the cache they come from
    is fp32, so rounding at read time is rounding at write time: rounding is idempotent)."""
    import transformers.models.llama.modeling_llama as llama
    import transformers.models.qwen2.modeling_qwen2 as qwen2
    import transformers.models.qwen3.modeling_qwen3 as qwen3

    for mod in (llama, qwen2, qwen3):
        original = mod.eager_attention_forward

        def rounded(module, query, key, value, *args, _original=original, **kwargs):
            key = key.to(torch.bfloat16).float()
            value = value.to(torch.bfloat16).float()
            return _original(module, query, key, value, *args, **kwargs)

        mod.eager_attention_forward = rounded


def load(name):
    from transformers import AutoModelForCausalLM

    if name == "smollm2-135m-q4_1":
        model = AutoModelForCausalLM.from_pretrained(str(DEFAULT_MODEL.parent), gguf_file=DEFAULT_MODEL.name,
                                                     dtype=torch.float32, attn_implementation="eager")
    else:
        model = AutoModelForCausalLM.from_pretrained(str(ROOT / "tests" / "fixtures" / "models" / name),
                                                     dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model


def main():
    import transformers

    torch.manual_seed(0)
    torch.set_num_threads(1)
    patch_attention_to_bf16_kv()
    OUT.mkdir(parents=True, exist_ok=True)
    names = ["tiny-llama", "tiny-qwen2", "tiny-qwen3"]
    if DEFAULT_MODEL.exists():
        names.append("smollm2-135m-q4_1")
    else:
        print(f"{DEFAULT_MODEL} absent: its bf16-KV reference is not regenerated")
    for name in names:
        fp32_ref = json.loads((ROOT / "tests" / "fixtures" / "reference" / f"{name}.json").read_text())
        model = load(name)
        out = {
            "model": name,
            "computed_with": "transformers, fp32 activations, eager attention, bf16-rounded parameters, "
                             "keys and values rounded to bf16 after RoPE (fp8serve's bf16 KV pool)",
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "prompts_from": f"tests/fixtures/reference/{name}.json",
            "prompts": [],
        }
        for prompt in fp32_ref["prompts"]:
            result = reference.run_prompt(model, prompt["prompt_ids"])
            out["prompts"].append({"name": prompt["name"], "prompt_ids": prompt["prompt_ids"], **result})
            print(name, prompt["name"], "greedy equal to the fp32-KV reference for",
                  next((i for i, (a, b) in enumerate(zip(result["greedy_ids"], prompt["greedy_ids"])) if a != b), 32),
                  "tokens")
        (OUT / f"{name}.kv-bf16.json").write_text(reference.dump_json(out) + "\n")


if __name__ == "__main__":
    main()
