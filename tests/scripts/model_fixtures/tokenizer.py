"""Small byte-level BPE tokenizers for the tiny fixture models.

Two flavours are trained, both deterministically, on the fixed text below:
  - "llama3": Llama-3 split regex (digits in runs of 1..3), no normalizer, BOS prepended by a
    TemplateProcessing post-processor, Llama-3-style chat template (header tokens, <|eot_id|>).
  - "qwen2":  Qwen2 split regex (single digits), NFC normalizer, no BOS, ChatML chat template
    (the Qwen3 one also knows `enable_thinking=False`).
Special tokens are appended after the trained vocabulary (ids base_vocab..), as in Llama 3 and Qwen,
so a loader cannot assume they sit at the start. `<think>`/`</think>` are added but NOT special
(Qwen3 ships them that way): they must be matched whole and still be printed when decoding with
skip_special_tokens.
"""

import json

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
]
PLAIN_ADDED_TOKENS = ["<think>", "</think>"]

LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Training text: written for this fixture (no external corpus), mixing prose, code, numbers,
# whitespace runs and a little non-ASCII so that multi-byte merges exist.
TRAINING_TEXT = """
The quick brown fox jumps over the lazy dog. A small model reads the same sentence many times.
In the morning the river was quiet, and the boats waited by the old stone bridge for the tide.
She opened the window, listened to the rain, and wrote three short letters to her brother.
Inference servers batch requests together so that the hardware stays busy while tokens stream out.
Every token is a piece of text; every piece of text is a sequence of bytes; every byte has a value.
The cache stores keys and values for each layer, and each block holds sixteen tokens at a time.
When the memory is full, the scheduler preempts the newest sequence and computes it again later.
There were 12 apples, 345 oranges and 6789 grapes in the market on the 1st of March 2024.
Call 555-0134 before 10:30, or send 2.5 kg by train; the price was $19.99 (tax included).
def forward(self, x):
    h = self.norm(x)
    q, k, v = self.qkv(h).split(3, dim=-1)
    return x + self.out(attention(q, k, v))

for (int i = 0; i < num_tokens; ++i) {
    out[i] = weight[i] * input[i] / sqrt(mean + eps);
}
if value is not None and value > threshold:
    print("value is too large:", value)
    return False
{"name": "tiny", "layers": 2, "heads": [4, 2], "ok": true}
She said: "It's fine, they're here, we'll go, I'd say you've seen what I'm doing."
Café au lait, naïve façade, jalapeño, Straße, smörgåsbord, crème brûlée, déjà vu.
Москва и Санкт-Петербург — два больших города. Ελληνικά γράμματα: α β γ δ.
東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다。
Emoji are bytes too: 🙂 🚀 👍🏽 ❤️ and the flag 🇫🇷 is two symbols.
    Indented lines keep their spaces,		tabs stay tabs,
and blank lines stay blank.


The end of the story came slowly: the fox went home, the dog slept, and the river kept on flowing.
Learning rates, batch sizes and sequence lengths are the numbers people change first.
Attention compares each query with every key, scales the scores, and mixes the values.
Residual connections add the input back, so each layer only learns a small correction.
Normalization keeps activations in range; rotary embeddings encode the position of a token.
"""


def _added_tokens():
    special = [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    plain = [AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED_TOKENS]
    return special, plain


def train_tokenizer(flavour, vocab_size):
    """A byte-level BPE with exactly `vocab_size` entries (trained part + added tokens)."""
    split = {"llama3": LLAMA3_SPLIT, "qwen2": QWEN2_SPLIT}[flavour]
    num_added = len(SPECIAL_TOKENS) + len(PLAIN_ADDED_TOKENS)
    tok = Tokenizer(models.BPE())
    if flavour == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - num_added,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    # Repeating the text gives every pair a count well above min_frequency without changing order.
    tok.train_from_iterator([TRAINING_TEXT] * 4, trainer=trainer)
    base = tok.get_vocab_size()
    if base != vocab_size - num_added:
        raise RuntimeError(f"trained {base} tokens, wanted {vocab_size - num_added}: enlarge TRAINING_TEXT")
    special, plain = _added_tokens()
    tok.add_special_tokens(special)
    tok.add_tokens(plain)
    bos_id = tok.token_to_id("<|begin_of_text|>")
    if flavour == "llama3":
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single="<|begin_of_text|> $A",
                    pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                    special_tokens=[("<|begin_of_text|>", bos_id)],
                ),
            ]
        )
    else:
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} entries, wanted {vocab_size}")
    return tok


def tokenizer_config(tok, flavour, chat_template):
    """tokenizer_config.json in the shape the Hub files have (not what transformers 5 would write)."""
    decoder = {}
    for token in SPECIAL_TOKENS + PLAIN_ADDED_TOKENS:
        decoder[str(tok.token_to_id(token))] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token in SPECIAL_TOKENS,
        }
    if flavour == "llama3":
        specials = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": None}
        add_bos = True
    else:
        specials = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
        add_bos = False
    return {
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "added_tokens_decoder": decoder,
        **specials,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def write_tokenizer(tok, flavour, chat_template, out_dir):
    tok.save(str(out_dir / "tokenizer.json"), pretty=True)
    cfg = tokenizer_config(tok, flavour, chat_template)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


ROUND_TRIP_TEXTS = [
    TRAINING_TEXT,
    "Hello world! 123456789 numbers, 3.14159 and   spaces\t\ttabs\n\nnew lines",
    "Unseen words: zygomorphic quixotry, Ünïcödé, ñandú, 鼠标, 🦀🦀, combining e\u0301 accent",
    "<|im_start|>user\nHi<|im_end|>\n<think>x</think><|endoftext|>",
]


def check_round_trip(tok, flavour):
    """decode(encode(x)) == x (NFC(x) for the qwen flavour), and special tokens stay whole."""
    import unicodedata

    for text in ROUND_TRIP_TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        back = tok.decode(ids, skip_special_tokens=False)
        want = unicodedata.normalize("NFC", text) if flavour == "qwen2" else text
        if back != want:
            raise RuntimeError(f"{flavour}: round trip failed for {text[:40]!r}")
    ids = tok.encode("<|im_start|>user<|im_end|><think>", add_special_tokens=False).ids
    expect = [tok.token_to_id("<|im_start|>")] + tok.encode("user", add_special_tokens=False).ids
    expect += [tok.token_to_id("<|im_end|>"), tok.token_to_id("<think>")]
    if ids != expect:
        raise RuntimeError(f"{flavour}: added tokens not matched whole: {ids} != {expect}")
