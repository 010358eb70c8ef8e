"""Byte-level BPE helpers shared by the detokenizer fixture script and the integration tests:
the bytes a GPT-2-style token stands for, and the text a streaming detokenizer may show for a
byte string (Python's UTF-8 codec as the reference)."""


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map (ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_decoder():
    """bytes_to_unicode inverted: token characters -> bytes."""
    return {c: b for b, c in bytes_to_unicode().items()}


def token_bytes(tokenizer, token_id, decoder=None):
    """The bytes of one token of a `tokenizers.Tokenizer` with a ByteLevel vocabulary."""
    decoder = decoder or byte_decoder()
    return bytes(decoder[c] for c in tokenizer.id_to_token(token_id))


def incomplete_tail(raw):
    """Length of the incomplete character `raw` ends with: bytes that a few continuation bytes
    would turn into a valid character (0 if none). Python's incremental decoder is looser (it
    holds back b"\\xed\\xa9", a surrogate that can never be valid), so the tail is completed and
    decoded instead."""
    for back in range(1, min(3, len(raw)) + 1):
        lead = raw[-back]
        if 0x80 <= lead <= 0xBF:
            continue  # a continuation byte: look further back for the lead byte
        need = 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else 4 if 0xF0 <= lead <= 0xF4 else 0
        if need <= back:
            return 0
        for fill in (b"\x80", b"\xbf"):  # every valid second byte range holds one of these
            try:
                (raw[-back:] + fill * (need - back)).decode("utf-8")
                return back
            except UnicodeDecodeError:
                pass
        return 0
    return 0


def stream_text(raw):
    """What a stream shows for these bytes once it has ended: less an incomplete final character
    (dropped), invalid bytes as U+FFFD (one per maximal invalid subpart)."""
    return raw[:len(raw) - incomplete_tail(raw)].decode("utf-8", "replace")
