"""GGUF v3 twin of tiny-llama, laid out the way llama.cpp's convert_hf_to_gguf.py writes a Llama.

What the converter does and this file reproduces (so the loader under test must undo/understand it):
  - tensor names token_embd / blk.N.attn_{q,k,v,output,norm} / blk.N.ffn_{gate,up,down,norm} /
    output_norm / output;
  - Q and K rows permuted from HF's rotate-half order to GGML's interleaved-pair order:
    w.reshape(n_head, 2, rows / n_head / 2, cols).swapaxes(1, 2).reshape(rows, cols), with
    n_head = num_key_value_heads for K;
  - llama3 rope scaling is NOT stored as metadata: it becomes a `rope_freqs.weight` F32 tensor of
    head_dim/2 divisors (1 for high frequencies, `factor` for low ones, interpolated in between),
    computed with the converter's formula (note: it reads original_max_position_embeddings from
    the top level of config.json with default 8192; ours is 8192 in rope_scaling too, so both
    readings agree);
  - 2-D weights in BF16 (the HF file's own dtype), 1-D norms in F32, file type MOSTLY_BF16;
  - tokenizer.ggml.model "gpt2", pre "llama-bpe", tokens / token_type (1 normal, 3 control,
    4 user-defined) / merges "a b", bos/eos ids, add_bos_token, chat_template.
"""

import math

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType


def permute_rows(w, n_head):
    """HF q/k rows -> GGUF rows (convert_hf_to_gguf.py's LlamaModel.permute)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_divisors(config):
    """The `rope_freqs.weight` values llama.cpp writes: inv_freq is divided by these."""
    rs = config["rope_scaling"]
    base = config["rope_theta"]
    dim = config["head_dim"]
    factor = rs["factor"]
    low_freq_factor = rs["low_freq_factor"]
    high_freq_factor = rs["high_freq_factor"]
    old_context_len = config.get("original_max_position_embeddings", 8192)  # converter's reading
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    divisors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            divisors.append(1.0)
        elif wavelen > low_freq_wavelen:
            divisors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            divisors.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return np.asarray(divisors, dtype=np.float32)


def _bf16_bits(t):
    return t.to(torch.bfloat16).contiguous().view(torch.uint16).numpy()


def _gguf_tensors(config, state):
    """(gguf name, HF tensor, permute n_head or None) in the converter's naming."""
    out = [("token_embd.weight", state["model.embed_tokens.weight"], None)]
    n_head = config["num_attention_heads"]
    n_kv = config["num_key_value_heads"]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (f"blk.{i}.attn_norm.weight", state[p + "input_layernorm.weight"], None),
            (f"blk.{i}.attn_q.weight", state[p + "self_attn.q_proj.weight"], n_head),
            (f"blk.{i}.attn_k.weight", state[p + "self_attn.k_proj.weight"], n_kv),
            (f"blk.{i}.attn_v.weight", state[p + "self_attn.v_proj.weight"], None),
            (f"blk.{i}.attn_output.weight", state[p + "self_attn.o_proj.weight"], None),
            (f"blk.{i}.ffn_norm.weight", state[p + "post_attention_layernorm.weight"], None),
            (f"blk.{i}.ffn_gate.weight", state[p + "mlp.gate_proj.weight"], None),
            (f"blk.{i}.ffn_up.weight", state[p + "mlp.up_proj.weight"], None),
            (f"blk.{i}.ffn_down.weight", state[p + "mlp.down_proj.weight"], None),
        ]
    out.append(("output_norm.weight", state["model.norm.weight"], None))
    out.append(("output.weight", state["lm_head.weight"], None))
    return out


def _vocab(tok):
    """Token strings in id order (byte-level spelling, as in vocab.json), types, merges."""
    import json

    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    if any(t is None for t in tokens):
        raise RuntimeError("vocabulary ids are not dense")
    added = {a.content: a for a in tok.get_added_tokens_decoder().values()}
    types = []
    for t in tokens:
        if t in added:
            types.append(int(TokenType.CONTROL if added[t].special else TokenType.USER_DEFINED))
        else:
            types.append(int(TokenType.NORMAL))
    merges = [" ".join(m) if isinstance(m, list) else m for m in json.loads(tok.to_str())["model"]["merges"]]
    return tokens, types, merges


def write_gguf_twin(path, config, state, tok, tokenizer_cfg):
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_type("model")
    w.add_file_type(int(LlamaFileType.MOSTLY_BF16))
    w.add_quantization_version(2)
    w.add_vocab_size(config["vocab_size"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_key_length(config["head_dim"])
    w.add_value_length(config["head_dim"])
    w.add_rope_dimension_count(config["head_dim"])
    w.add_rope_freq_base(config["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])

    tokens, types, merges = _vocab(tok)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tok.token_to_id(tokenizer_cfg["bos_token"]))
    w.add_eos_token_id(tok.token_to_id(tokenizer_cfg["eos_token"]))
    w.add_add_bos_token(True)
    w.add_chat_template(tokenizer_cfg["chat_template"])

    for name, t, n_head in _gguf_tensors(config, state):
        if n_head is not None:
            t = permute_rows(t, n_head)
        if t.dim() == 1:
            w.add_tensor(name, t.float().numpy().astype(np.float32))
        else:
            w.add_tensor(name, _bf16_bits(t), raw_dtype=GGMLQuantizationType.BF16)
        if name == "token_embd.weight":
            w.add_tensor("rope_freqs.weight", llama3_rope_divisors(config))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_gguf_weights(gguf_model, hf_model, gguf_path, config):
    """The transformers-loaded GGUF (its reader undoes the permutation) must hold exactly the HF
    weights, and rope_freqs must reproduce transformers' own llama3 inv_freq."""
    from gguf import GGUFReader

    hf = hf_model.state_dict()
    for n, t in gguf_model.state_dict().items():
        if n in hf and not torch.equal(t.float(), hf[n].float()):
            raise RuntimeError(f"GGUF twin: {n} differs from the HF folder")
    missing = set(hf) - set(gguf_model.state_dict())
    if missing:
        raise RuntimeError(f"GGUF twin: tensors missing after load: {sorted(missing)}")
    reader = GGUFReader(str(gguf_path))
    divisors = next(np.array(t.data, dtype=np.float64) for t in reader.tensors if t.name == "rope_freqs.weight")
    dim = config["head_dim"]
    base_inv = 1.0 / (config["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    hf_inv = hf_model.model.rotary_emb.inv_freq.double().numpy()
    rel = np.max(np.abs(base_inv / divisors - hf_inv) / hf_inv)
    if rel > 1e-6:
        raise RuntimeError(f"rope_freqs does not reproduce transformers' llama3 inv_freq (rel err {rel})")
    return float(rel)
