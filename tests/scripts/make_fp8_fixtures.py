#!/usr/bin/env python3
"""Tiny FP8 checkpoints and the references of the bf16-dot projections (issue 14), made with numpy.

    .venv/bin/python tests/scripts/make_fp8_fixtures.py [--default-model]
        (numpy, ml_dtypes and gguf: the test venv)

1. Checks tests/scripts/model_fixtures/numpy_model.py against the committed transformers
   references (tests/fixtures/engine/{tiny-llama,tiny-qwen2,tiny-qwen3}.kv-bf16.json): the same
   top-20 logits within 2e-3 (the default model: 0.06, as close as fp8serve's own fp32 forward
   pass gets to transformers on its 30 layers) and the same 32 greedy tokens up to a near-tie
   (reference margin < 0.01), or it stops. Everything below is computed by that model.
   With --default-model, also the default model (.models/, 30 layers: ~20 min), checked only:
   its logits move by ~0.1 under the bf16 roundings whichever side computes them, so a reference
   with them is no closer to fp8serve than transformers' (test_forward_logits.cpp).
2. Writes tests/fixtures/engine/NAME.kv-bf16.act-bf16.json for the three tiny models: bf16 K/V
   and every projection's input rounded to bf16, what fp8serve's AVX512-BF16 projections compute
   (kernels/cpu/linear.hpp).
3. Writes three FP8 E4M3 checkpoints of the tiny models' weights (tokenizer and generation config
   copied), each projection quantized here from the bf16 weights, embeddings / norms / biases /
   the LM head left bf16, as published FP8 checkpoints do:
     models/tiny-qwen3-fp8-block    quant_method "fp8", weight_block_size [128, 128],
                                    F32 weight_scale_inv per block (Qwen3-FP8's layout)
     models/tiny-llama-fp8-channel  compressed-tensors, strategy "channel", BF16 weight_scale
                                    [out, 1], dynamic per-token activations (no input_scale)
     models/tiny-qwen2-fp8-tensor   compressed-tensors, strategy "tensor", F32 weight_scale [1],
                                    static activations (an input_scale per projection, unused)
   and their references, engine/NAME.kv-bf16.json (fp32 projections) and
   engine/NAME.kv-bf16.act-bf16.json, over the dequantized weights (decode(q) * scale in fp32),
   plus formats/fp8_checkpoints.json: dequantized sample values of each, for the loader tests.
4. Prints what requantizing the block-scaled weights to one scale per row would cost (relative
   RMS error against the block-scaled weights): why the loader keeps block scales (docs/fp8-weights.md).

Deterministic (no randomness: the tiny models' weights are the inputs).
"""

import json
import pathlib
import shutil
import sys

import ml_dtypes
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "scripts"))

from model_fixtures import numpy_model as nm  # noqa: E402
from model_fixtures.json_dump import dump_json  # noqa: E402

FIX = ROOT / "tests" / "fixtures"
DEFAULT_MODEL = ROOT / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
F8 = ml_dtypes.float8_e4m3fn
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_MODEL_BYTES = 2 * 1024 * 1024


def is_projection(name):
    return name.startswith("model.layers.") and name.endswith(".weight") and name.split(".")[-2] in PROJECTIONS


def bf16_weights(tensors):
    """What fp8serve computes with for a bf16 model: every parameter rounded to bf16."""
    return {k: nm.bf16_round(a.astype(np.float32)) for k, (_, a) in tensors.items()}


def encode(x):
    return np.clip(x, -448.0, 448.0).astype(np.float32).astype(F8)


def quantize(w, strategy, block=(128, 128)):
    """(codes, scales) with scale = max(amax / 448, FLT_MIN) per tensor, row or block."""
    w = w.astype(np.float32)
    tiny = np.float32(np.finfo(np.float32).tiny)
    if strategy == "tensor":
        scale = np.maximum(np.float32(np.abs(w).max()) / np.float32(448), tiny).reshape(1)
        return encode(w / scale[0]), scale.astype(np.float32)
    if strategy == "channel":
        scale = np.maximum(np.abs(w).max(axis=1, keepdims=True) / np.float32(448), tiny).astype(np.float32)
        return encode(w / scale), scale
    rows, cols = w.shape
    br, bc = block
    grid = np.zeros(((rows + br - 1) // br, (cols + bc - 1) // bc), dtype=np.float32)
    codes = np.zeros(w.shape, dtype=F8)
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            blk = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            grid[i, j] = max(np.float32(np.abs(blk).max()) / np.float32(448), tiny)
            codes[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = encode(blk / grid[i, j])
    return codes, grid


def dequantize(codes, scales, strategy, block=(128, 128)):
    q = codes.astype(np.float32)
    if strategy == "tensor":
        return (q * scales[0]).astype(np.float32)
    if strategy == "channel":
        return (q * scales.astype(np.float32)).astype(np.float32)
    expanded = np.repeat(np.repeat(scales, block[0], axis=0), block[1], axis=1)[:q.shape[0], :q.shape[1]]
    return (q * expanded).astype(np.float32)


def load_model(name):
    """The numpy model of a fixture (or of the default model), parameters rounded to bf16."""
    if name == "smollm2-135m-q4_1":
        config, weights = nm.load_gguf_llama(DEFAULT_MODEL)
        return nm.Model(config, {k: nm.bf16_round(w) for k, w in weights.items()})
    config, tensors = nm.load_folder(FIX / "models" / name)
    return nm.Model(config, bf16_weights(tensors))


TINY = ["tiny-llama", "tiny-qwen2", "tiny-qwen3"]


def check_numpy_model(names):
    for name in names:
        model = load_model(name)
        ref = json.loads((FIX / "engine" / f"{name}.kv-bf16.json").read_text())
        for prompt in ref["prompts"]:
            r = nm.run_prompt(model, prompt["prompt_ids"], kv_bf16=True, keep_last=True)
            # The reference's top-20 logits against ours for the same ids, and the same argmax.
            last = r.pop("last_row")
            ids, values = prompt["last_logits"]["top_ids"], prompt["last_logits"]["top_values"]
            diff = max(abs(float(last[i]) - v) for i, v in zip(ids, values))
            agree = next((i for i, (a, b) in enumerate(zip(r["greedy_ids"], prompt["greedy_ids"])) if a != b), 32)
            print(f"numpy vs transformers: {name} {prompt['name']}: top-20 logits within {diff:.1e}, greedy {agree}/32")
            tolerance = 0.06 if name == "smollm2-135m-q4_1" else 2e-3
            if diff > tolerance or int(np.argmax(last)) != ids[0]:
                sys.exit("the numpy model does not reproduce transformers' logits")
            if agree < 32 and prompt["greedy_steps"][agree]["margin"] >= 0.01:
                sys.exit("the numpy model diverges from transformers at a step that is not a near-tie")


def write_reference(model, prompts, name, suffix, computed_with, act_bf16):
    out = {"model": name, "computed_with": computed_with,
           "versions": {"numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__}, "prompts": []}
    for prompt in prompts:
        result = nm.run_prompt(model, prompt["prompt_ids"], kv_bf16=True, act_bf16=act_bf16)
        out["prompts"].append({"name": prompt["name"], "prompt_ids": prompt["prompt_ids"], **result})
    (FIX / "engine" / f"{name}{suffix}").write_text(dump_json(out) + "\n")
    print("wrote", f"engine/{name}{suffix}")


def write_references(model, prompts, name, base_note):
    for act_bf16, suffix, note in ((False, ".kv-bf16.json", "fp32 projections"),
                                   (True, ".kv-bf16.act-bf16.json", "every projection's input rounded to bf16")):
        write_reference(model, prompts, name, suffix,
                        f"tests/scripts/model_fixtures/numpy_model.py, fp32, {base_note}, keys and values rounded to "
                        f"bf16 after RoPE, {note}", act_bf16)


FP8_FIXTURES = {
    # name: (base model, strategy, quantization_config, scale name, scale dtype, input_scale)
    "tiny-qwen3-fp8-block": ("tiny-qwen3", "block",
                             {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                              "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]},
                             "weight_scale_inv", np.float32, False),
    "tiny-llama-fp8-channel": ("tiny-llama", "channel",
                               {"quant_method": "compressed-tensors", "format": "float-quantized",
                                "quantization_status": "compressed", "ignore": ["lm_head"],
                                "config_groups": {"group_0": {
                                    "targets": ["Linear"],
                                    "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                                "symmetric": True, "dynamic": False, "group_size": None,
                                                "observer": "minmax"},
                                    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                                          "symmetric": True, "dynamic": True}}}},
                               "weight_scale", ml_dtypes.bfloat16, False),
    "tiny-qwen2-fp8-tensor": ("tiny-qwen2", "tensor",
                              {"quant_method": "compressed-tensors", "format": "float-quantized",
                               "quantization_status": "compressed", "ignore": ["lm_head"],
                               "config_groups": {"group_0": {
                                   "targets": ["Linear"],
                                   "weights": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                               "symmetric": True, "dynamic": False},
                                   "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                                         "symmetric": True, "dynamic": False}}}},
                              "weight_scale", np.float32, True),
}


def make_fp8_fixture(name, samples):
    base, strategy, qconfig, scale_name, scale_dtype, input_scale = FP8_FIXTURES[name]
    src = FIX / "models" / base
    dst = FIX / "models" / name
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(src / f, dst / f)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = qconfig
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    _, tensors = nm.load_folder(src)
    weights = bf16_weights(tensors)
    stored, computed = {}, {}
    for tname, w in weights.items():
        if not is_projection(tname):
            stored[tname] = w.astype(ml_dtypes.bfloat16)
            computed[tname] = w
            continue
        codes, scales = quantize(w, strategy)
        scales = scales.astype(scale_dtype)
        stored[tname] = codes
        stored[tname[:-len("weight")] + scale_name] = scales
        if input_scale:
            stored[tname[:-len("weight")] + "input_scale"] = np.array([0.0123], dtype=np.float32)
        computed[tname] = dequantize(codes, scales.astype(np.float32), strategy)
        if tname.endswith("layers.0.self_attn.q_proj.weight") or tname.endswith("layers.1.mlp.down_proj.weight"):
            rows = computed[tname]
            samples[name][tname] = {"shape": list(rows.shape),
                                    "rows": {str(r): [float(v) for v in rows[r, :24]] for r in (0, rows.shape[0] - 1)},
                                    "sum": float(rows.astype(np.float64).sum())}
    nm.write_safetensors(dst / "model.safetensors", stored)
    size = sum(p.stat().st_size for p in dst.iterdir())
    if size > MAX_MODEL_BYTES:
        sys.exit(f"{name} takes {size} bytes, over the 2 MB fixture limit")
    print(f"wrote models/{name} ({size} bytes)")
    prompts = json.loads((FIX / "reference" / f"{base}.json").read_text())["prompts"]
    write_references(nm.Model(config, computed), prompts, name,
                     f"FP8 weights dequantized (decode(q) * scale, {strategy} scales)")
    return weights, computed


def requantization_cost(bf16, block_dequantized):
    """Block-scaled FP8 requantized to one scale per row: its error against the block-scaled values."""
    added = base = total = 0.0
    for tname, w in bf16.items():
        if not is_projection(tname):
            continue
        b = block_dequantized[tname].astype(np.float64)
        codes, scales = quantize(block_dequantized[tname], "channel")
        per_row = dequantize(codes, scales, "channel").astype(np.float64)
        added += ((per_row - b) ** 2).sum()
        base += ((b - w.astype(np.float64)) ** 2).sum()
        norm = (w.astype(np.float64) ** 2).sum()
        total += norm
    print(f"block-scaled FP8 weights: relative RMS error {np.sqrt(base / total):.4f}; requantized to one scale "
          f"per row: + {np.sqrt(added / total):.4f} more ({np.sqrt(added / base):.2f}x the block FP8 error)")


def main():
    if "--default-model" in sys.argv[1:]:
        if not DEFAULT_MODEL.exists():
            sys.exit(f"{DEFAULT_MODEL} absent: run .ci/fetch-model")
        check_numpy_model(["smollm2-135m-q4_1"])
    check_numpy_model(TINY)
    for name in TINY:
        prompts = json.loads((FIX / "reference" / f"{name}.json").read_text())["prompts"]
        write_reference(load_model(name), prompts, name, ".kv-bf16.act-bf16.json",
                        "tests/scripts/model_fixtures/numpy_model.py (checked against transformers), fp32, "
                        "bf16-rounded parameters, keys and values rounded to bf16 after RoPE, every projection's "
                        "input rounded to bf16", True)
    samples = {name: {} for name in FP8_FIXTURES}
    block_bf16 = block_deq = None
    for name in FP8_FIXTURES:
        bf16, computed = make_fp8_fixture(name, samples)
        if name == "tiny-qwen3-fp8-block":
            block_bf16, block_deq = bf16, computed
    (FIX / "formats" / "fp8_checkpoints.json").write_text(dump_json(samples) + "\n")
    print("wrote formats/fp8_checkpoints.json")
    requantization_cost(block_bf16, block_deq)


if __name__ == "__main__":
    main()
