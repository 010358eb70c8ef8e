#!/usr/bin/env python3
"""Generates the committed fixtures of tests/unit/formats (tests/fixtures/formats/).

Every expected value comes from an independent implementation: GGUF files are written with the
`gguf` package and their expected contents read back with its own GGUFReader and dequantize;
bf16 rounding comes from ml_dtypes; configs and their parsed facts from `transformers`' config
classes; safetensors files from the `safetensors` package; the default model's un-permuted Q/K
rows from transformers' GGUF loader.

Run with the reference venv (versions used, pinned in requirements-reference.txt):
    gguf 0.19.0, numpy 2.4.6, ml_dtypes 0.6.0, safetensors 0.8.0, transformers 5.24.0,
    torch 2.15.0
    python tests/scripts/make_format_fixtures.py [--model .models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import argparse
import json
import os
import struct

import gguf
import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from safetensors.numpy import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "formats")
rng = np.random.default_rng(20261130)

# Offsets of f16 scale fields inside each block type (d, and dmin/m where present), so random
# blocks can be given finite scales (random bytes there would be mostly harmless, but NaN
# payload propagation is not something two implementations need to agree on).
SCALE_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
}
UNSUPPORTED = Q.Q2_K  # a type we do not dequantize: the loader must say so


def random_f16_scales(n):
    # Mostly ordinary magnitudes, some subnormal, some zero, some negative.
    v = (rng.standard_normal(n) * 0.05).astype(np.float16)
    v[rng.random(n) < 0.05] = np.float16(0.0)
    sub = rng.random(n) < 0.05
    v[sub] = np.frombuffer(rng.integers(1, 0x3FF, sub.sum(), dtype=np.uint16).tobytes(), np.float16)
    return v


def random_blocks(qtype, num_blocks):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (num_blocks, size), dtype=np.uint8)
    for off in SCALE_FIELDS[qtype]:
        raw[:, off:off + 2] = random_f16_scales(num_blocks).view(np.uint8).reshape(num_blocks, 2)
    return raw


def write_all_types():
    """all_types.gguf: metadata of every value type and one tensor of every supported type."""
    path = os.path.join(OUT, "all_types.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_custom_alignment(64)  # not the default 32: the reader must honour it
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 3.14159)
    w.add_bool("t.bool_true", True)
    w.add_bool("t.bool_false", False)
    w.add_string("t.str", "héllo \u4e16\u754c \U0001F600")
    w.add_string("t.str_empty", "")
    w.add_uint64("t.u64", 9000000000000000000)
    w.add_int64("t.i64", -9000000000000000000)
    w.add_float64("t.f64", -2.718281828459045)
    w.add_array("t.arr_str", ["a", "", "\u00e9\u00e8", "<|im_start|>"])
    w.add_array("t.arr_empty", [])
    w.add_key_value("t.arr_i32", [1, -2, 2147483647, -2147483648], V.ARRAY, sub_type=V.INT32)
    w.add_key_value("t.arr_u8", [0, 1, 255], V.ARRAY, sub_type=V.UINT8)
    w.add_key_value("t.arr_i64", [-(2**62), 2**62], V.ARRAY, sub_type=V.INT64)
    w.add_key_value("t.arr_f32", [0.5, -1.25, 1e-3], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("t.arr_f64", [1e300, -1e-300], V.ARRAY, sub_type=V.FLOAT64)
    w.add_key_value("t.arr_bool", [True, False, True], V.ARRAY, sub_type=V.BOOL)

    tensors = {}
    f32 = rng.standard_normal((3, 40)).astype(np.float32)
    w.add_tensor("f32", f32)
    f16_all = np.arange(65536, dtype=np.uint16).view(np.float16)  # every f16 code
    w.add_tensor("f16_all", f16_all)
    bf16 = rng.standard_normal((2, 64)).astype(ml_dtypes.bfloat16).view(np.uint16)
    w.add_tensor("bf16", bf16.view(np.uint8), raw_dtype=Q.BF16)  # byte shape (2, 128)
    for qtype, num_blocks in [(Q.Q4_0, 64), (Q.Q4_1, 64), (Q.Q5_0, 64), (Q.Q5_1, 64),
                              (Q.Q8_0, 64), (Q.Q4_K, 16), (Q.Q5_K, 16), (Q.Q6_K, 16)]:
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        raw = random_blocks(qtype, num_blocks)
        cols = 256
        rows = num_blocks * block // cols
        # gguf-py takes the byte shape of quantized data: (rows, bytes per row)
        w.add_tensor(qtype.name.lower(), raw.reshape(rows, -1), raw_dtype=qtype)
    q2k = rng.integers(0, 256, (1, gguf.GGML_QUANT_SIZES[UNSUPPORTED][1]), dtype=np.uint8)
    w.add_tensor("q2_k", q2k, raw_dtype=UNSUPPORTED)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # Expected contents, read back with gguf-py's own reader and dequantizer.
    r = gguf.GGUFReader(path)
    meta = {}
    for name, field in r.fields.items():
        if name.startswith("GGUF."):
            continue
        types = [V(t).name for t in field.types]
        value = field.contents()
        if types[0] == "FLOAT32":
            value = float(np.float32(value))
        elif types == ["ARRAY", "FLOAT32"]:
            value = [float(np.float32(x)) for x in value]
        meta[name] = {"types": types, "value": value}
    blob = bytearray()
    tensor_list = []
    for t in r.tensors:
        entry = {"name": t.name, "type": t.tensor_type.name, "ne": [int(x) for x in t.shape],
                 "offset": int(t.data_offset), "nbytes": int(t.n_bytes)}
        if t.tensor_type != UNSUPPORTED:
            deq = gguf.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
            entry["expected_offset"] = len(blob)
            entry["expected_count"] = int(deq.size)
            blob += deq.tobytes()
        tensor_list.append(entry)
    with open(os.path.join(OUT, "all_types.expected.bin"), "wb") as f:
        f.write(blob)
    with open(os.path.join(OUT, "all_types.expected.json"), "w") as f:
        json.dump({"version": 3, "alignment": 64, "metadata": meta, "tensors": tensor_list},
                  f, indent=1, ensure_ascii=False)


def write_small():
    """small.gguf: a few hundred bytes, for every-truncation and bit-flip tests."""
    path = os.path.join(OUT, "small.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_uint32("llama.block_count", 1)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ab"])
    w.add_key_value("tokenizer.ggml.token_type", [1, 1, 1], V.ARRAY, sub_type=V.INT32)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_tensor("a", np.arange(8, dtype=np.float32))
    raw = random_blocks(Q.Q8_0, 1)
    w.add_tensor("b", raw, raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_bf16_rounding():
    """bf16_rounding.bin: (f32 bits, bf16 bits) pairs, bf16 from ml_dtypes."""
    bits = rng.integers(0, 2**32, 8192, dtype=np.uint64).astype(np.uint32)
    # Ties and near-ties at random exponents, both signs; specials; largest finite values.
    ties = (rng.integers(0, 2**16, 1024, dtype=np.uint32) << 16) | np.uint32(0x8000)
    near = ties + rng.choice(np.array([-1, 1], dtype=np.int64), 1024).astype(np.uint32)
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                        0x7F800001, 0xFF800001, 0x7F80FFFF, 0x7FFFFFFF, 0x00000001, 0x807FFFFF,
                        0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x3F808000, 0x3F818000],
                       dtype=np.uint32)
    f32_bits = np.concatenate([bits, ties, near, special]).astype(np.uint32)
    bf16_bits = f32_bits.view(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    with open(os.path.join(OUT, "bf16_rounding.bin"), "wb") as f:
        for a, b in zip(f32_bits.tolist(), bf16_bits.tolist()):
            f.write(struct.pack("<IH", a, b))


def write_safetensors():
    """tiny.safetensors (+ a sharded copy) and the values they hold."""
    tensors = {
        "w_f32": rng.standard_normal((4, 6)).astype(np.float32),
        "w_f16": rng.standard_normal((3, 5)).astype(np.float16),
        "w_bf16": rng.standard_normal((2, 7)).astype(ml_dtypes.bfloat16),
        "w_i64": np.arange(3, dtype=np.int64),
        "scalar": np.array(1.5, dtype=np.float32),
    }
    save_file(tensors, os.path.join(OUT, "tiny.safetensors"), metadata={"format": "pt"})
    shard_dir = os.path.join(OUT, "sharded")
    os.makedirs(shard_dir, exist_ok=True)
    names = ["w_f32", "w_f16", "w_bf16"]
    save_file({n: tensors[n] for n in names[:2]}, os.path.join(shard_dir, "model-00001-of-00002.safetensors"))
    save_file({n: tensors[n] for n in names[2:]}, os.path.join(shard_dir, "model-00002-of-00002.safetensors"))
    index = {"metadata": {"total_size": 0}, "weight_map": {
        "w_f32": "model-00001-of-00002.safetensors", "w_f16": "model-00001-of-00002.safetensors",
        "w_bf16": "model-00002-of-00002.safetensors"}}
    with open(os.path.join(shard_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)
    expected = {}
    for n in names:
        t = tensors[n]
        expected[n] = {"shape": list(t.shape), "dtype": str(t.dtype),
                       # what fp8serve must hold: bf16 of the value (f16 -> f32 exactly first)
                       "bf16": t.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
                       .reshape(-1).tolist()}
    with open(os.path.join(OUT, "tiny.safetensors.json"), "w") as f:
        json.dump(expected, f, indent=1)


def write_configs():
    """HF configs of each family as transformers writes them, and the facts it derives."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config
    cases = {
        "llama3": LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                              num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
                              max_position_embeddings=16384, rms_norm_eps=1e-5,
                              rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                               "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 8192},
                              tie_word_embeddings=True, bos_token_id=1, eos_token_id=[2, 3],
                              architectures=["LlamaForCausalLM"]),
        "qwen2": Qwen2Config(hidden_size=128, intermediate_size=320, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=500,
                             max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                             tie_word_embeddings=False, bos_token_id=None, eos_token_id=7,
                             architectures=["Qwen2ForCausalLM"]),
        "qwen3": Qwen3Config(hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=1, head_dim=48,
                             vocab_size=600, max_position_embeddings=40960,
                             rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=5,
                             architectures=["Qwen3ForCausalLM"]),
    }
    os.makedirs(os.path.join(OUT, "configs"), exist_ok=True)
    expected = {}
    for name, cfg in cases.items():
        cfg.save_pretrained(os.path.join(OUT, "configs", name))
        rp = cfg.rope_parameters
        expected[name] = {
            "architecture": cfg.architectures[0], "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_layers": cfg.num_hidden_layers,
            "num_heads": cfg.num_attention_heads, "num_kv_heads": cfg.num_key_value_heads,
            "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
            "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_position_embeddings,
            "rope_theta": rp["rope_theta"], "rms_norm_eps": cfg.rms_norm_eps,
            "rope_type": rp["rope_type"], "rope": rp,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "bos_token_id": cfg.bos_token_id if cfg.bos_token_id is not None else -1,
            "eos_token_ids": ([] if cfg.eos_token_id is None else
                              cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id]),
        }
        # Parameter count as torch counts it on the instantiated model (tiny, random weights).
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_config(cfg)
        expected[name]["num_parameters"] = sum(p.numel() for p in model.parameters())
    with open(os.path.join(OUT, "configs", "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)


def write_default_model_reference(model_path):
    """Facts of the default GGUF from gguf-py, and sample HF-layout rows from transformers."""
    import torch
    from transformers import AutoModelForCausalLM
    r = gguf.GGUFReader(model_path)
    types = {}
    for t in r.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(model_path),
                                                 gguf_file=os.path.basename(model_path),
                                                 dtype=torch.float32)
    state = model.state_dict()
    samples = {}
    for name in ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                 "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                 "model.layers.29.self_attn.q_proj.weight", "model.layers.7.mlp.down_proj.weight",
                 "model.norm.weight"]:
        t = state[name]
        t = t.float().numpy() if hasattr(t, "numpy") else np.asarray(t, dtype=np.float32)
        flat = t.reshape(t.shape[0], -1)
        rows = sorted({0, 1, 31, 32, 33, 63, 64, 100, flat.shape[0] - 1} & set(range(flat.shape[0])))
        samples[name] = {
            "shape": list(t.shape),
            "rows": {str(i): flat[i, :16].astype(ml_dtypes.bfloat16).view(np.uint16).tolist()
                     for i in rows},
            "bf16_sum": float(t.astype(ml_dtypes.bfloat16).astype(np.float64).sum()),
        }
    out = {"tensor_types": types, "num_tensors": len(r.tensors),
           "num_parameters": sum(p.numel() for p in model.parameters()), "samples": samples}
    with open(os.path.join(OUT, "smollm2_reference.json"), "w") as f:
        json.dump(out, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, ".models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    write_all_types()
    write_small()
    write_bf16_rounding()
    write_safetensors()
    write_configs()
    if os.path.exists(args.model):
        write_default_model_reference(args.model)
    else:
        print("default model absent: smollm2_reference.json not regenerated")


if __name__ == "__main__":
    main()
    for dirpath, _, files in os.walk(OUT):  # safetensors writes 0600 files
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o644)
