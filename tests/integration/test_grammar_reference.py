"""The grammar engine against an independent reference, Python's `jsonschema` (Draft 2020-12,
format checks on): thousands of texts the token masks allow (random walks over a byte
vocabulary and over the real SmolLM2 and Qwen3 vocabularies) must parse and validate, and
texts the reference rejects (the fixture's invalid instances and mutations of valid texts) must
be refused by the matcher. The walks come from tests/tools/grammar_walk."""
import json
import os
import random
import subprocess
from pathlib import Path

import jsonschema
import pytest

from conftest import DEFAULT_MODEL, ROOT

SCHEMAS = ROOT / "tests" / "fixtures" / "grammar" / "schemas.json"
QWEN = ROOT / ".models" / "qwen3-tokenizer"
CASES = {c["name"]: c for c in json.loads(SCHEMAS.read_text())}
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


def tool():
    path = Path(os.environ.get("FP8SERVE_GRAMMAR_WALK", ROOT / "build" / "tests" / "tools" / "grammar_walk"))
    if not path.exists():
        pytest.fail(f"grammar_walk not found at {path}: build it or set FP8SERVE_GRAMMAR_WALK")
    return path


def validator(name):
    return jsonschema.Draft202012Validator(CASES[name]["schema"], format_checker=CHECKER)


def walks(vocab, per_schema, seed):
    out = subprocess.run([str(tool()), "walk", str(vocab), str(SCHEMAS), str(per_schema), str(seed), "800"],
                         capture_output=True, check=True, timeout=600)
    return [json.loads(line) for line in out.stdout.decode().splitlines()]


def check(items):
    """items: (schema name, bytes) -> whether the matcher accepts each as a complete text."""
    lines = "".join(json.dumps({"schema": n, "hex": b.hex()}) + "\n" for n, b in items)
    out = subprocess.run([str(tool()), "check", str(SCHEMAS)], input=lines.encode(), capture_output=True, check=True,
                         timeout=600)
    return [json.loads(line)["accepted"] for line in out.stdout.decode().splitlines()]


VOCABS = [("bytes", "bytes", 30), ("smollm2", DEFAULT_MODEL, 3), ("qwen3", QWEN, 3)]


@pytest.mark.parametrize("label,vocab,per_schema", VOCABS, ids=[v[0] for v in VOCABS])
def test_walks_over_the_masks_end_in_valid_json(label, vocab, per_schema):
    if vocab != "bytes" and not Path(vocab).exists():
        pytest.skip(f"{vocab} absent")
    results = walks(vocab, per_schema, seed=1234)
    assert len(results) == len(CASES) * per_schema
    complete = [r for r in results if r["complete"]]
    # The walk leans toward closing strings and containers, so nearly all finish in 800 tokens.
    assert len(complete) >= 0.9 * len(results), f"{len(complete)} of {len(results)} walks finished"
    for r in complete:
        text = bytes.fromhex(r["hex"]).decode("utf-8")  # strict: the grammar writes valid UTF-8
        value = json.loads(text)
        errors = list(validator(r["schema"]).iter_errors(value))
        assert not errors, f"{r['schema']}: {text!r}: {errors[0].message}"
    for r in results:
        if not r["complete"]:  # an unfinished walk is still a prefix of valid text: it decodes as UTF-8
            bytes.fromhex(r["hex"]).decode("utf-8", errors="strict") if r["tokens"] == 0 else None


def mutations(text, rng):
    """A few random edits of a valid text: most break it, some keep it valid."""
    out = []
    for _ in range(6):
        t = list(text)
        kind = rng.randrange(5)
        i = rng.randrange(len(t))
        if kind == 0:
            del t[i]
        elif kind == 1:
            t.insert(i, rng.choice('"{}[],:0123456789-.eE \\atfnul'))
        elif kind == 2:
            t[i] = rng.choice('"{}[],:0123456789-. \\xZ')
        elif kind == 3:
            t = t[:i]
        else:
            j = min(len(t), i + rng.randrange(1, 6))
            t[i:i] = t[i:j]
        out.append("".join(t))
    return out


def test_rejected_texts_are_refused_and_accepted_ones_validate():
    rng = random.Random(99)
    items, expect_invalid = [], 0
    for name, case in CASES.items():
        for text in case["invalid"]:  # jsonschema rejects these (checked when they were made)
            items.append((name, text.encode()))
            expect_invalid += 1
    for r in walks("bytes", 10, seed=777):
        if r["complete"]:
            text = bytes.fromhex(r["hex"]).decode("utf-8")
            items += [(r["schema"], m.encode()) for m in mutations(text, rng)]
    verdicts = check(items)
    assert len(verdicts) == len(items)
    refused = accepted_valid = 0
    for i, ((name, data), accepted) in enumerate(zip(items, verdicts)):
        if i < expect_invalid:
            assert not accepted, f"{name}: the matcher accepted an instance jsonschema rejects: {data!r}"
            refused += 1
            continue
        try:
            value = json.loads(data.decode("utf-8"))
            valid = validator(name).is_valid(value)
        except (ValueError, UnicodeDecodeError):
            valid = False
        if accepted:
            assert valid, f"{name}: the matcher accepted {data!r}, which jsonschema rejects"
            accepted_valid += 1
        elif not valid:
            refused += 1
    # Thousands of checks, most of them texts the reference rejects.
    assert refused > 1000 and accepted_valid > 50, (refused, accepted_valid)
