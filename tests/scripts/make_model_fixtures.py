#!/usr/bin/env python3
"""Regenerates the model fixtures and the transformers reference outputs.

    /work/refvenv/venv/bin/python tests/scripts/make_model_fixtures.py [--skip-default-model]

Writes (paths relative to the repository root):
  tests/fixtures/models/tiny-llama/   LlamaForCausalLM, GQA 4/2, llama3 rope scaling, untied, BF16
  tests/fixtures/models/tiny-qwen2/   Qwen2ForCausalLM, QKV bias, tied embeddings, F32
  tests/fixtures/models/tiny-qwen3/   Qwen3ForCausalLM, q/k norm, head_dim 32 != 64/4, F16,
                                      two shards + model.safetensors.index.json
  tests/fixtures/models/tiny-llama.gguf   GGUF v3 twin of tiny-llama (Q/K rows permuted, rope_freqs)
  tests/fixtures/reference/{tiny-llama,tiny-qwen2,tiny-qwen3,tiny-llama-gguf,smollm2-135m-q4_1}.json

The reference model is the transformers one in fp32 with eager attention, after every parameter
was rounded to bf16 (p = p.to(bfloat16).float()) -- the weights fp8serve computes with. For the
default model transformers dequantizes the GGUF to f32 first; fp8serve does the same, then rounds.

Deterministic: fixed seeds, one torch thread, tokenizers trained on in-script text, no timestamps.
Running it twice gives byte-identical files on the same machine and package versions (the
versions are printed and stored in every reference file; pin them in requirements-reference.txt).
It needs torch, transformers, accelerate (transformers' GGUF loading), tokenizers, safetensors and
gguf; the C++ test suite that reads the outputs needs none of them.
"""

import argparse
import hashlib
import json
import pathlib
import sys
import warnings

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from model_fixtures import gguf_twin, models, reference, tokenizer  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
MODELS_DIR = REPO / "tests" / "fixtures" / "models"
REFERENCE_DIR = REPO / "tests" / "fixtures" / "reference"
DEFAULT_MODEL = REPO / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

MAX_MODEL_BYTES = 2 * 1024 * 1024
MAX_REFERENCE_BYTES = 200 * 1024

TINY_MODELS = {
    # name: (tokenizer flavour, chat template, weight seed, chat kwargs)
    "tiny-llama": ("llama3", tokenizer.LLAMA3_CHAT_TEMPLATE, 1001, {}),
    "tiny-qwen2": ("qwen2", tokenizer.CHATML_TEMPLATE, 1002, {}),
    "tiny-qwen3": ("qwen2", tokenizer.QWEN3_CHAT_TEMPLATE, 1003, {"enable_thinking": False}),
}

TINY_LONG_PROMPT = (
    "A lighthouse keeper counted the ships every evening. On calm nights there were seven, "
    "on stormy ones only two, and once, in 1987, none at all. He wrote each number in a "
    "green notebook, next to the weather and the time the lamp was lit."
)
TINY_UNICODE_PROMPT = "Caf\u00e9 na\u00efve \u2014 \u6771\u4eac\u30bf\u30ef\u30fc \U0001F642\U0001F44D\U0001F3FD cafe\u0301 \u03a9\u03bc\u03ad\u03b3\u03b1 \u2211x\u00b2 \u2260 \u221e"
TINY_CHAT = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name two prime numbers."},
]

DEFAULT_PROMPTS = [
    ("short", "The capital of France is"),
    (
        "long",
        "The printing press changed how ideas travelled. Before it, a book was copied by hand, "
        "one page at a time, and a single copy could take months. After Gutenberg's workshop in "
        "Mainz began printing in the 1450s, the same text could be produced in hundreds of copies "
        "within weeks. Prices fell, more people learned to read, and scholars in different "
        "countries could finally work from identical editions. Within fifty years, printing shops "
        "had opened in more than two hundred European cities, and",
    ),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("unicode", "Voici une recette simple : m\u00e9langez la farine, les \u0153ufs et le sucre, puis"),
]
DEFAULT_CHAT = [{"role": "user", "content": "What is the boiling point of water at sea level?"}]


def versions():
    import gguf  # noqa: F401
    import importlib.metadata as md

    import numpy
    import tokenizers
    import transformers

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "accelerate": md.version("accelerate"),
        "safetensors": md.version("safetensors"),
        "gguf": md.version("gguf"),
        "numpy": numpy.__version__,
    }


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rel(path):
    return str(pathlib.Path(path).resolve().relative_to(REPO))


def tiny_prompts(hf_tok, chat_kwargs):
    """(name, text, add_special_tokens, extra) for the four tiny-model prompts."""
    chat_text = hf_tok.apply_chat_template(TINY_CHAT, tokenize=False, add_generation_prompt=True, **chat_kwargs)
    return [
        ("short", "Hello world", True, {}),
        ("long", TINY_LONG_PROMPT, True, {}),
        # A rendered chat template already holds its special tokens (and bos, where the template
        # writes it), so it is tokenized without adding any: what an OpenAI-style server does.
        ("special_tokens", chat_text, False, {"messages": TINY_CHAT, "chat_template_kwargs": chat_kwargs}),
        ("unicode", TINY_UNICODE_PROMPT, True, {}),
    ]


def run_prompts(model, hf_tok, prompts, check_tok=None):
    out = []
    for name, text, add_special, extra in prompts:
        ids = hf_tok(text, add_special_tokens=add_special)["input_ids"]
        if check_tok is not None:
            other = check_tok.encode(text, add_special_tokens=add_special).ids
            if other != ids:
                raise RuntimeError(f"{name}: AutoTokenizer and tokenizers disagree: {ids} != {other}")
        entry = {"name": name, "text": text, **extra, "add_special_tokens": add_special, "prompt_ids": ids}
        entry.update(reference.run_prompt(model, ids))
        out.append(entry)
        print(f"    {name:15s} {len(ids):4d} prompt ids, greedy distinct {entry['greedy_distinct']:2d}/32, "
              f"min margin {entry['min_greedy_margin']:.4f}")
    return out


def reference_header(model_name, sources, hf_tok, config_facts, vers, notes):
    bos = hf_tok.bos_token
    return {
        "model": model_name,
        "sources": sources,
        "computed_with": "transformers, float32 activations, eager attention, every parameter rounded to bf16 "
                         "(round-to-nearest-even) after loading",
        "versions": vers,
        "config": config_facts,
        "bos": {
            "bos_token": bos,
            "bos_token_id": hf_tok.convert_tokens_to_ids(bos) if bos is not None else None,
            "policy": "prompt_ids come from the tokenizer with add_special_tokens as recorded per prompt; "
                      "whether that prepends bos is the tokenizer's own post-processor / add_bos_token",
        },
        "checksum_definition": reference.CHECKSUM_DOC,
        "num_greedy": reference.NUM_GREEDY,
        "eos_ignored": True,
        "notes": notes,
    }


def config_facts(cfg):
    keys = ["architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "intermediate_size", "vocab_size", "rope_theta", "rope_scaling", "rms_norm_eps",
            "tie_word_embeddings", "torch_dtype"]
    return {k: cfg[k] for k in keys if k in cfg}


def write_reference(name, obj):
    path = REFERENCE_DIR / f"{name}.json"
    text = reference.dump_json(obj) + "\n"
    if len(text.encode()) > MAX_REFERENCE_BYTES:
        raise RuntimeError(f"{path} would be {len(text)} bytes")
    path.write_text(text)
    print(f"  wrote {rel(path)} ({len(text.encode())} bytes)")


def make_tiny(name, vers):
    from transformers import AutoTokenizer

    flavour, template, seed, chat_kwargs = TINY_MODELS[name]
    out_dir = MODELS_DIR / name
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*"):
        old.unlink()
    tok = tokenizer.train_tokenizer(flavour, models.VOCAB_SIZE)
    tokenizer.check_round_trip(tok, flavour)
    tokenizer.write_tokenizer(tok, flavour, template, out_dir)
    cfg, state = models.write_hf_model(name, out_dir, tok, seed)
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    if size > MAX_MODEL_BYTES:
        raise RuntimeError(f"{name} is {size} bytes")
    print(f"  wrote {rel(out_dir)}/ ({size} bytes)")
    model = models.load_hf_model_bf16(out_dir, state)
    want_rope = (cfg.get("rope_scaling") or {}).get("rope_type", "default")
    if model.config.rope_parameters["rope_type"] != want_rope:
        raise RuntimeError(f"{name}: transformers read rope type {model.config.rope_parameters['rope_type']}")
    hf_tok = AutoTokenizer.from_pretrained(str(out_dir))
    prompts = tiny_prompts(hf_tok, chat_kwargs)
    sources = {rel(p): sha256(p) for p in sorted(out_dir.iterdir())}
    header = reference_header(name, sources, hf_tok, config_facts(cfg), vers,
                              [f"random weights, torch.Generator seed {seed}",
                               f"tokenizer: byte-level BPE ({flavour} flavour) trained on in-script text"])
    header["prompts"] = run_prompts(model, hf_tok, prompts, check_tok=tok)
    write_reference(name, header)
    return cfg, state, tok, model, header


def make_gguf_twin(cfg, state, tok, hf_model, llama_ref, vers):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = MODELS_DIR / "tiny-llama.gguf"
    tok_cfg = json.loads((MODELS_DIR / "tiny-llama" / "tokenizer_config.json").read_text())
    gguf_twin.write_gguf_twin(path, cfg, state, tok, tok_cfg)
    if path.stat().st_size > MAX_MODEL_BYTES:
        raise RuntimeError(f"{path} is too large")
    print(f"  wrote {rel(path)} ({path.stat().st_size} bytes)")
    model = AutoModelForCausalLM.from_pretrained(str(MODELS_DIR), gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    models.round_params_to_bf16(model)
    rel_err = gguf_twin.check_gguf_weights(model, hf_model, path, cfg)
    # transformers' GGUF reader ignores rope_freqs.weight (it builds rope_type "default"); the check
    # above proved rope_freqs reproduces the HF llama3 inv_freq, so use the HF rotary module.
    model.model.rotary_emb = hf_model.model.rotary_emb
    gguf_tok = AutoTokenizer.from_pretrained(str(MODELS_DIR), gguf_file=path.name)
    prompts = tiny_prompts(gguf_tok, {})
    header = reference_header("tiny-llama-gguf", {rel(path): sha256(path)}, gguf_tok, config_facts(cfg), vers,
                              ["GGUF twin of tiny-llama: same bf16 weights, Q/K rows permuted as llama.cpp does, "
                               "llama3 rope scaling stored as rope_freqs.weight",
                               "transformers' GGUF loader ignores rope_freqs: its rotary module was replaced by the "
                               f"HF folder's llama3 one after checking base_inv_freq / rope_freqs against it "
                               f"(max rel err {rel_err:.2e})",
                               "weights checked tensor-by-tensor equal to the HF folder after transformers undid "
                               "the permutation"])
    header["prompts"] = run_prompts(model, gguf_tok, prompts)
    for mine, theirs in zip(header["prompts"], llama_ref["prompts"]):
        for key in ("prompt_ids", "greedy_ids"):
            if mine[key] != theirs[key]:
                raise RuntimeError(f"GGUF twin {mine['name']}: {key} differ from the HF folder")
        diff = max(abs(a - b) for a, b in zip(mine["last_logits"]["top_values"], theirs["last_logits"]["top_values"]))
        print(f"    {mine['name']:15s} max |top-20 logit diff| vs HF folder: {diff:.3g}")
    write_reference("tiny-llama-gguf", header)


def make_default(vers):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not DEFAULT_MODEL.exists():
        print(f"  {rel(DEFAULT_MODEL)} absent: default-model reference NOT regenerated")
        return
    d, f = str(DEFAULT_MODEL.parent), DEFAULT_MODEL.name
    hf_tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    models.round_params_to_bf16(model)
    chat_text = hf_tok.apply_chat_template(DEFAULT_CHAT, tokenize=False, add_generation_prompt=True)
    prompts = [(n, t, True, {}) for n, t in DEFAULT_PROMPTS]
    prompts.insert(2, ("chat", chat_text, False, {"messages": DEFAULT_CHAT}))
    c = model.config
    facts = {"architectures": ["LlamaForCausalLM"], "hidden_size": c.hidden_size,
             "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
             "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "vocab_size": c.vocab_size,
             "rope_theta": c.rope_parameters["rope_theta"], "rms_norm_eps": c.rms_norm_eps,
             "tie_word_embeddings": c.tie_word_embeddings}
    header = reference_header("smollm2-135m-q4_1", {rel(DEFAULT_MODEL): sha256(DEFAULT_MODEL)}, hf_tok, facts, vers,
                              ["transformers dequantized the GGUF (Q4_1 / Q8_0 / F32 tensors) to f32 with the gguf "
                               "package, then every parameter was rounded to bf16",
                               "the GGUF says add_bos_token=false, so no bos is prepended with add_special_tokens"])
    header["prompts"] = run_prompts(model, hf_tok, prompts)
    write_reference("smollm2-135m-q4_1", header)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-default-model", action="store_true", help="do not regenerate the SmolLM2 reference")
    args = parser.parse_args()

    # transformers 5.24 deprecates past_key_values in favour of `cache`; the old name works in 4.x too.
    warnings.filterwarnings("ignore", message=".*past_key_values.*")
    torch.manual_seed(0)
    torch.set_num_threads(1)  # summation order, hence every logit bit, depends on the thread count
    torch.use_deterministic_algorithms(True)
    vers = versions()
    print("versions:", json.dumps(vers))
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    REFERENCE_DIR.mkdir(parents=True, exist_ok=True)

    made = {}
    for name in TINY_MODELS:
        print(f"{name}:")
        made[name] = make_tiny(name, vers)
    print("tiny-llama.gguf:")
    cfg, state, tok, hf_model, llama_ref = made["tiny-llama"]
    make_gguf_twin(cfg, state, tok, hf_model, llama_ref, vers)
    if not args.skip_default_model:
        print("default model:")
        make_default(vers)


if __name__ == "__main__":
    main()
