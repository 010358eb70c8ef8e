#!/usr/bin/env python3
"""Generates tests/fixtures/tokenizer/detokenizer_streams.json: token id sequences of the real
SmolLM2 byte-level BPE tokenizer whose tokens split UTF-8 characters, and the text a streaming
detokenizer must produce for each.

The reference for a sequence is the concatenation of its tokens' bytes, less an incomplete
character at the end (the sequence ended inside it: dropped, as vLLM's detokenizer never emits
it), decoded by Python with errors="replace" (invalid bytes become U+FFFD, one per maximal
invalid subpart). "Incomplete character" means bytes that one more continuation byte or a few
would turn into a valid character: Python's own incremental decoder is looser (it holds back
b"\xed\xa9", a surrogate that can never be valid), so the tail is tested by completing it.
Every case is also checked against HF tokenizers' decode of the full sequence: equal to it, or
equal to it less its final U+FFFD when the ids end inside a character.

(byte_level.py holds the byte map and the incomplete-character rule.)

Usage: .venv/bin/python tests/scripts/make_detokenizer_fixtures.py   (tokenizers 0.23.3)
"""
import json
import os
import random

import tokenizers
from tokenizers import Tokenizer

from byte_level import byte_decoder, incomplete_tail

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "smollm2", "tokenizer.json")
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "detokenizer_streams.json")


def main():
    tok = Tokenizer.from_file(TOKENIZER)
    decode_char = byte_decoder()
    special = {t.content for t in tok.get_added_tokens_decoder().values()}

    def token_bytes(i):
        return bytes(decode_char[c] for c in tok.id_to_token(i))

    cases = []

    def add(name, ids):
        raw = b"".join(token_bytes(i) for i in ids)
        tail = incomplete_tail(raw)
        stream = raw[:len(raw) - tail].decode("utf-8", "replace")
        ends_inside = tail > 0
        full = tok.decode(ids, skip_special_tokens=False)
        assert full == (stream + "\ufffd" if ends_inside else stream), (name, ids, full, stream)
        cases.append({"name": name, "ids": ids, "hf_decode": full, "ends_inside_char": ends_inside, "stream": stream})

    texts = ["Emoji list: 😀 😃 😄 😏👩‍💻", " 😏", "日本語のテキスト、中文。", "naïve café — déjà vu",
             "🤖🚀🇫🇷 ✓ ∑ ≤ ∞", "Zürich 21 °C ☀️", "ℕ𝕆𝕋 𝔸𝕊ℂ𝕀𝕀 ·"]
    for t, text in enumerate(texts):
        ids = tok.encode(text, add_special_tokens=False).ids
        for k in range(1, len(ids) + 1):  # every prefix: most end inside a character
            add(f"text{t}_prefix{k}", ids[:k])

    # Single-byte tokens: characters cut anywhere, stray continuation bytes, invalid lead bytes,
    # a lead byte followed by ASCII, overlong and surrogate forms, bytes above F4.
    byte_id = {}
    for b in range(256):
        char = next(c for c, v in decode_char.items() if v == b)
        i = tok.token_to_id(char)
        if i is not None and tok.id_to_token(i) not in special:
            byte_id[b] = i
    fixed = [[0xF0, 0x9F, 0x98, 0x8F], [0xF0, 0x9F], [0xF0], [0xF0, ord("a")], [0xFF], [0x80], [0xC3, ord("a"), 0xA9],
             [0xE2, 0x82], [0xE2, 0x82, 0xAC], [0xC0, 0x80], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80],
             [ord("x"), 0xE2, 0x82, ord("y"), 0xF0, 0x9F, 0x98], [0xC3, 0xA9, 0xC3], [0xF5, 0x80]]
    # (The vocabulary has no token for some bytes that never occur in UTF-8, e.g. 0xFF.)
    for n, seq in enumerate(fixed):
        if all(b in byte_id for b in seq):
            add(f"bytes{n}", [byte_id[b] for b in seq])
    rng = random.Random(20261201)
    pool = [b for b in (0x20, 0x61, 0x80, 0x8F, 0x98, 0x9F, 0xA9, 0xBF, 0xC0, 0xC2, 0xC3, 0xE2, 0xED, 0xF0, 0xF4, 0xF5, 0xFF)
            if b in byte_id]
    for n in range(400):
        add(f"random{n}", [byte_id[rng.choice(pool)] for _ in range(rng.randint(1, 8))])

    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"tokenizer": "tests/fixtures/tokenizer/smollm2/tokenizer.json",
                   "generator": "tests/scripts/make_detokenizer_fixtures.py",
                   "versions": {"tokenizers": tokenizers.__version__}, "cases": cases}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    inside = sum(c["ends_inside_char"] for c in cases)
    print(f"{len(cases)} cases ({inside} end inside a character) -> {os.path.relpath(OUT, ROOT)} {os.path.getsize(OUT)} bytes")


if __name__ == "__main__":
    main()
