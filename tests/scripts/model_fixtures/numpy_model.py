"""A numpy forward pass of LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM, written after
transformers' modeling code (eager attention, fp32), for references where torch is not at hand:
the FP8 fixtures (dequantized weights) and the "activations rounded to bf16 at every projection's
input" variant that fp8serve's AVX512-BF16 projections compute (kernels/cpu/linear.hpp).

make_fp8_fixtures.py first checks this model against the committed transformers references
(tests/fixtures/engine/*.kv-bf16.json: same logits to ~1e-4, same greedy tokens up to near-ties)
before it writes anything made with it.

Options of forward():
  kv_bf16   keys (after RoPE) and values rounded to bf16, as fp8serve's bf16 KV pool stores them
  act_bf16  the input of every projection (q/k/v, o, gate/up, down, LM head) rounded to bf16
"""

import json
import math
import pathlib
import struct

import ml_dtypes
import numpy as np

F32 = np.float32

SAFETENSORS_DTYPES = {
    "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
}


def bf16_round(x):
    return np.asarray(x, dtype=F32).astype(ml_dtypes.bfloat16).astype(F32)


def read_safetensors(path):
    """name -> (dtype name, numpy array) of one .safetensors file."""
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        array = np.frombuffer(body[begin:end], dtype=SAFETENSORS_DTYPES[entry["dtype"]]).reshape(entry["shape"])
        out[name] = (entry["dtype"], array)
    return out


def write_safetensors(path, tensors):
    """tensors: name -> numpy array (float32, float16, bfloat16 or float8_e4m3fn), sorted by name."""
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(ml_dtypes.bfloat16): "BF16",
             np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        raw = a.tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def load_folder(folder):
    """config dict and name -> (dtype, array) over every shard of a HF folder."""
    folder = pathlib.Path(folder)
    config = json.loads((folder / "config.json").read_text())
    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors.update(read_safetensors(shard))
    return config, tensors


GGUF_NAMES = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
              "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
              "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
              "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
              "ffn_down.weight": "mlp.down_proj.weight"}


def load_gguf_llama(path):
    """config dict and name -> float32 array of a llama-architecture GGUF, dequantized by gguf-py
    and with llama.cpp's Q/K row permutation undone, as transformers' GGUF loader does."""
    import gguf

    reader = gguf.GGUFReader(str(path))

    def field(name):
        f = reader.fields[name]
        return f.parts[f.data[0]].tolist()[0]

    heads, kv_heads = field("llama.attention.head_count"), field("llama.attention.head_count_kv")
    weights = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        else:
            _, layer, rest = t.name.split(".", 2)
            name = f"model.layers.{layer}.{GGUF_NAMES[rest]}"
            if rest in ("attn_q.weight", "attn_k.weight"):
                n = heads if rest == "attn_q.weight" else kv_heads
                w = w.reshape(n, w.shape[0] // n // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
        weights[name] = w
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": field("llama.embedding_length"),
              "intermediate_size": field("llama.feed_forward_length"), "num_hidden_layers": field("llama.block_count"),
              "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "rope_theta": field("llama.rope.freq_base"), "rms_norm_eps": field("llama.attention.layer_norm_rms_epsilon"),
              "tie_word_embeddings": "lm_head.weight" not in weights}
    return config, weights


def inv_freq(config):
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    base = config.get("rope_theta", 10000.0)
    inv = (1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(F32) / head_dim))).astype(F32)
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = (2 * math.pi / inv).astype(F32)
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv).astype(F32)
        smooth = ((old / wavelen - low) / (high - low)).astype(F32)
        smoothed = ((1 - smooth) * scaled / factor + smooth * scaled).astype(F32)
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, scaled).astype(F32)
    return inv


class Model:
    """weights: name -> float32 array (the values fp8serve computes with)."""

    def __init__(self, config, weights):
        self.c = config
        self.w = weights
        arch = config["architectures"][0]
        self.qk_norm = arch == "Qwen3ForCausalLM"
        self.bias = arch == "Qwen2ForCausalLM"
        self.heads = config["num_attention_heads"]
        self.kv_heads = config.get("num_key_value_heads", self.heads)
        self.head_dim = config.get("head_dim") or config["hidden_size"] // self.heads
        self.eps = F32(config.get("rms_norm_eps", 1e-6))
        self.inv_freq = inv_freq(config)
        self.tied = config.get("tie_word_embeddings", False)

    def norm(self, x, weight):
        x = x.astype(F32)
        var = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
        return (weight * (x * (1.0 / np.sqrt(var + self.eps)).astype(F32))).astype(F32)

    def linear(self, x, name, act_bf16, bias=None):
        if act_bf16:
            x = bf16_round(x)
        y = (x @ self.w[name].T).astype(F32)
        if bias is not None:
            y = y + self.w[bias]
        return y.astype(F32)

    def rope(self, x, positions):
        freqs = (positions.astype(F32)[:, None] * self.inv_freq[None, :]).astype(F32)
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb).astype(F32)[:, None, :], np.sin(emb).astype(F32)[:, None, :]
        half = x.shape[-1] // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return (x * cos + rotated * sin).astype(F32)

    def forward(self, ids, kv_bf16=False, act_bf16=False, cache=None):
        """Logits [len(ids), vocab] of the tokens ids, which follow the len(cache[0][0]) tokens
        cached in `cache` (a list, one (K, V) per layer; empty for a fresh sequence: filled and
        extended in place). Causal attention over the cached and the new tokens."""
        ids = np.asarray(ids)
        n = len(ids)
        if cache is None:
            cache = []
        past = len(cache[0][0]) if cache else 0
        positions = np.arange(past, past + n)
        x = self.w["model.embed_tokens.weight"][ids].astype(F32)
        group = self.heads // self.kv_heads
        mask = np.triu(np.full((n, past + n), -np.inf, dtype=F32), past + 1)
        for layer in range(self.c["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            h = self.norm(x, self.w[p + "input_layernorm.weight"])
            bias = (lambda s: p + f"self_attn.{s}_proj.bias") if self.bias else (lambda s: None)
            q = self.linear(h, p + "self_attn.q_proj.weight", act_bf16, bias("q")).reshape(n, self.heads, self.head_dim)
            k = self.linear(h, p + "self_attn.k_proj.weight", act_bf16, bias("k")).reshape(n, self.kv_heads, self.head_dim)
            v = self.linear(h, p + "self_attn.v_proj.weight", act_bf16, bias("v")).reshape(n, self.kv_heads, self.head_dim)
            if self.qk_norm:
                q = self.norm(q, self.w[p + "self_attn.q_norm.weight"])
                k = self.norm(k, self.w[p + "self_attn.k_norm.weight"])
            q, k = self.rope(q, positions), self.rope(k, positions)
            if kv_bf16:
                k, v = bf16_round(k), bf16_round(v)
            if len(cache) <= layer:
                cache.append((k, v))
            else:
                cache[layer] = (np.concatenate([cache[layer][0], k]), np.concatenate([cache[layer][1], v]))
            k_all, v_all = cache[layer]
            out = np.empty((n, self.heads, self.head_dim), dtype=F32)
            scale = F32(1.0 / math.sqrt(self.head_dim))
            for head in range(self.heads):
                kh, vh = k_all[:, head // group], v_all[:, head // group]
                scores = ((q[:, head] @ kh.T).astype(F32) * scale + mask).astype(F32)
                scores = np.exp(scores - scores.max(axis=-1, keepdims=True)).astype(F32)
                probs = (scores / scores.sum(axis=-1, keepdims=True, dtype=F32)).astype(F32)
                out[:, head] = (probs @ vh).astype(F32)
            x = (x + self.linear(out.reshape(n, -1), p + "self_attn.o_proj.weight", act_bf16)).astype(F32)
            h = self.norm(x, self.w[p + "post_attention_layernorm.weight"])
            gate = self.linear(h, p + "mlp.gate_proj.weight", act_bf16)
            up = self.linear(h, p + "mlp.up_proj.weight", act_bf16)
            act = (gate / (1.0 + np.exp(-gate)).astype(F32)).astype(F32) * up
            x = (x + self.linear(act.astype(F32), p + "mlp.down_proj.weight", act_bf16)).astype(F32)
        x = self.norm(x, self.w["model.norm.weight"])
        head = "model.embed_tokens.weight" if self.tied else "lm_head.weight"
        return self.linear(x, head, act_bf16)


def top(row, k):
    ids = np.argsort(-row, kind="stable")[:k]
    return [int(i) for i in ids], [float(row[i]) for i in ids]


def run_prompt(model, prompt_ids, num_greedy=32, keep_last=False, **options):
    """The reference.py record (last_logits, greedy_ids, greedy_steps, ...) for one prompt; with
    keep_last, also the whole last-position row under "last_row"."""
    cache = []
    last = model.forward(list(prompt_ids), cache=cache, **options)[-1]
    top_ids, top_vals = top(last, 20)
    r = last.astype(np.float64)
    idx = np.arange(r.size)
    result = {"last_logits": {"top_ids": top_ids, "top_values": top_vals,
                              "checksum": {"sum": float(r.sum()), "sum_sq": float((r * r).sum()),
                                           "weighted_sum": float((r * (idx % 7 + 1)).sum())}}}
    greedy, steps, row = [], [], last
    for _ in range(num_greedy):
        ids5, vals5 = top(row, 5)
        greedy.append(ids5[0])
        steps.append({"top5_ids": ids5, "top5_values": vals5, "margin": vals5[0] - vals5[1]})
        row = model.forward([ids5[0]], cache=cache, **options)[-1]
    result["greedy_ids"] = greedy
    result["greedy_steps"] = steps
    result["greedy_distinct"] = len(set(greedy))
    result["min_greedy_margin"] = min(s["margin"] for s in steps)
    if keep_last:
        result["last_row"] = last
    return result
