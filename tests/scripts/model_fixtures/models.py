"""Tiny random-weight Llama / Qwen2 / Qwen3 models in Hugging Face format.

config.json is written by hand in the shape the Hub files have (`rope_scaling` + `rope_theta`,
`torch_dtype`), not in the `rope_parameters` shape transformers >= 5 would write, because the
loader under test must read real checkpoints. transformers then loads each folder back, which
checks that it understands the config the same way.

Weights: one seeded torch.Generator per model, tensors drawn in sorted-name order. Scales are
chosen so that attention is far from uniform and the logits are far from flat (see SCALES).
"""

import copy
import json
import os

import torch
from safetensors.torch import save_file

VOCAB_SIZE = 512

# Standard deviations per tensor kind. Small dims (hidden 64) need larger weights than the usual
# 0.02 init, or q.k/sqrt(d) stays ~0.05 and every head averages uniformly.
SCALES = {
    "embed_tokens": 0.2,
    "lm_head": 0.25,
    "q_proj": 0.2,
    "k_proj": 0.2,
    "v_proj": 0.12,
    "o_proj": 0.25,
    "gate_proj": 0.12,
    "up_proj": 0.12,
    "down_proj": 0.25,
    "bias": 0.1,
    "norm_jitter": 0.1,  # norms are 1 + jitter * N(0, 1), so a dropped norm weight shows
    "qk_norm_gain": 2.0,
}


def _model_spec(name, tok):
    """(config.json dict, generation_config.json dict, storage dtype, shards) for one model."""
    sid = tok.token_to_id
    if name == "tiny-llama":
        config = {
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": sid("<|begin_of_text|>"),
            "eos_token_id": [sid("<|end_of_text|>"), sid("<|eot_id|>")],
            "head_dim": 16,
            "hidden_act": "silu",
            "hidden_size": 64,
            "initializer_range": 0.02,
            "intermediate_size": 160,
            "max_position_embeddings": 131072,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-05,
            # Llama 3.2's real values; with head_dim 16 and theta 5e5, frequency pairs 0-3 are kept,
            # pair 4 is interpolated and pairs 5-7 are divided by 32: all three llama3 regimes.
            "rope_scaling": {
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "vocab_size": VOCAB_SIZE,
        }
        gen = {
            "bos_token_id": sid("<|begin_of_text|>"),
            "do_sample": True,
            "eos_token_id": [sid("<|end_of_text|>"), sid("<|eot_id|>")],
            "temperature": 0.6,
            "top_p": 0.9,
        }
        return config, gen, torch.bfloat16, None
    qwen_gen = {
        "bos_token_id": sid("<|endoftext|>"),
        "do_sample": True,
        "eos_token_id": [sid("<|im_end|>"), sid("<|endoftext|>")],
        "pad_token_id": sid("<|endoftext|>"),
        "repetition_penalty": 1.05,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.8,
    }
    if name == "tiny-qwen2":
        config = {
            "architectures": ["Qwen2ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": sid("<|endoftext|>"),
            "eos_token_id": sid("<|im_end|>"),
            "hidden_act": "silu",
            "hidden_size": 64,
            "initializer_range": 0.02,
            "intermediate_size": 128,
            "max_position_embeddings": 4096,
            # Real Qwen2.5 configs carry a sliding_window value with use_sliding_window false:
            # the loader must look at the flag, not at the presence of the number.
            "max_window_layers": 2,
            "model_type": "qwen2",
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "sliding_window": 4096,
            "tie_word_embeddings": True,
            "torch_dtype": "float32",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": VOCAB_SIZE,
        }
        return config, qwen_gen, torch.float32, None
    if name == "tiny-qwen3":
        config = {
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": sid("<|endoftext|>"),
            "eos_token_id": sid("<|im_end|>"),
            "head_dim": 32,  # != hidden_size / num_attention_heads (16): q_proj is [128, 64]
            "hidden_act": "silu",
            "hidden_size": 64,
            "initializer_range": 0.02,
            "intermediate_size": 192,
            "max_position_embeddings": 4096,
            "max_window_layers": 3,
            "model_type": "qwen3",
            "num_attention_heads": 4,
            "num_hidden_layers": 3,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "torch_dtype": "float16",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": VOCAB_SIZE,
        }
        # Shard 1: embeddings and layer 0; shard 2: everything else (as save_pretrained would cut).
        shards = [lambda n: n.startswith("model.embed_tokens") or n.startswith("model.layers.0."), lambda n: True]
        return config, qwen_gen, torch.float16, shards
    raise ValueError(name)


def _init_tensor(name, shape, gen):
    if name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
        # q/k are normalized to RMS 1 per head: a gain of ~2 makes q.k/sqrt(d) std ~4, so the
        # attention is peaked rather than near-uniform (real Qwen3 q/k norm gains are large too).
        return SCALES["qk_norm_gain"] + SCALES["norm_jitter"] * torch.randn(shape, generator=gen)
    if name.endswith("norm.weight"):
        return 1.0 + SCALES["norm_jitter"] * torch.randn(shape, generator=gen)
    if name.endswith(".bias"):
        return SCALES["bias"] * torch.randn(shape, generator=gen)
    for kind, std in SCALES.items():
        if f"{kind}." in name or name.startswith(kind):
            return std * torch.randn(shape, generator=gen)
    raise ValueError(f"no init rule for {name}")


def make_state_dict(config, seed):
    """Random tensors keyed by HF names, shapes taken from the transformers model class."""
    from transformers import AutoConfig, AutoModelForCausalLM

    # deepcopy: transformers >= 5 writes rope_theta into the rope_scaling dict it is handed.
    kwargs = copy.deepcopy({k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    hf_config = AutoConfig.for_model(**kwargs)
    hf_config.architectures = config["architectures"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    shapes = {n: tuple(p.shape) for n, p in model.state_dict().items()}
    if config["tie_word_embeddings"]:
        shapes.pop("lm_head.weight", None)  # tied checkpoints on the Hub do not store it
    gen = torch.Generator().manual_seed(seed)
    return {n: _init_tensor(n, shapes[n], gen) for n in sorted(shapes)}


def write_hf_model(name, out_dir, tok, seed):
    """Writes config, generation config and safetensors; returns (config, stored state dict)."""
    config, gen_config, dtype, shards = _model_spec(name, tok)
    state = {n: t.to(dtype).contiguous() for n, t in make_state_dict(config, seed).items()}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "generation_config.json").write_text(json.dumps(gen_config, indent=2) + "\n")
    meta = {"format": "pt"}
    if shards is None:
        save_file(state, str(out_dir / "model.safetensors"), metadata=meta)
        os.chmod(out_dir / "model.safetensors", 0o644)
        return config, state
    remaining = dict(state)
    weight_map = {}
    for i, belongs in enumerate(shards):
        file_name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        part = {n: t for n, t in remaining.items() if belongs(n)}
        for n in part:
            del remaining[n]
            weight_map[n] = file_name
        save_file(part, str(out_dir / file_name), metadata=meta)
        os.chmod(out_dir / file_name, 0o644)
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return config, state


def load_hf_model_bf16(model_dir, expected_state):
    """Loads the folder with transformers in fp32, checks the weights are the stored ones, and
    rounds every parameter to bf16 (what fp8serve computes with). Eager attention."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    model.eval()
    loaded = model.state_dict()
    for n, t in expected_state.items():
        if not torch.equal(loaded[n], t.float()):
            raise RuntimeError(f"{model_dir.name}: {n} differs after loading with transformers")
    round_params_to_bf16(model)
    return model


def round_params_to_bf16(model):
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16).float()
