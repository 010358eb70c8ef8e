"""Makes tests/fixtures/grammar/schemas.json: 50 JSON Schemas for structured outputs, each with
instances that Python's `jsonschema` (Draft 2020-12, format checks on) accepts and instances it
rejects. The C++ grammar tests check that the compiled grammar accepts the valid instances and
rejects the invalid ones; the reference test and the integration tests generate from them.

Valid instances are written as a model would write them and as fp8serve's grammar allows:
properties in schema order, `json.dumps` spacing or indent=2, raw UTF-8.

    .venv/bin/python tests/scripts/make_grammar_schemas.py
"""
import json
from pathlib import Path
from typing import Literal, Optional

import jsonschema
import pydantic
from openai.lib._pydantic import to_strict_json_schema

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "grammar" / "schemas.json"
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


def obj(props, required=None, additional=False):
    s = {"type": "object", "properties": props, "required": list(props) if required is None else required}
    if additional is not None:
        s["additionalProperties"] = additional
    return s


S = {"type": "string"}
I = {"type": "integer"}
N = {"type": "number"}
B = {"type": "boolean"}


class Pet(pydantic.BaseModel):
    name: str
    species: Literal["cat", "dog", "parrot"]
    age_years: Optional[int] = None


class Owner(pydantic.BaseModel):
    full_name: str
    pets: list[Pet]
    verified: bool


class Step(pydantic.BaseModel):
    explanation: str
    output: str


class MathReasoning(pydantic.BaseModel):
    steps: list[Step]
    final_answer: str


CASES = [
    ("person", obj({"name": {"type": "string", "minLength": 1}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                    "email": {"type": "string", "format": "email"}}, required=["name", "age"]),
     [{"name": "Ada Lovelace", "age": 36}, {"name": "Bo", "age": 0, "email": "bo@example.com"}],
     [{"name": "", "age": 3}, {"name": "X", "age": 151}, {"age": 3}, {"name": "X", "age": 3, "email": "nope"}]),
    ("address", obj({"street": S, "city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                     "country": {"enum": ["US", "CA", "MX"]}}),
     [{"street": "1 Main St", "city": "Springfield", "zip": "12345", "country": "US"}],
     [{"street": "1", "city": "c", "zip": "1234", "country": "US"}, {"street": "1", "city": "c", "zip": "12345", "country": "FR"}]),
    ("product", obj({"id": {"type": "string", "format": "uuid"}, "name": S,
                     "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 100000},
                     "tags": {"type": "array", "items": S, "maxItems": 5}, "in_stock": B}, required=["id", "name", "price"]),
     [{"id": "123e4567-e89b-12d3-a456-426614174000", "name": "Lamp", "price": 19.99, "tags": ["home"], "in_stock": True}],
     [{"id": "x", "name": "Lamp", "price": 1}, {"id": "123e4567-e89b-12d3-a456-426614174000", "name": "L", "price": 0}]),
    ("order", {"$defs": {"line": obj({"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                                      "qty": {"type": "integer", "minimum": 1, "maximum": 99}})},
               **obj({"lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1},
                      "total": {"type": "number", "minimum": 0}})},
     [{"lines": [{"sku": "ABC-1234", "qty": 2}], "total": 10.5}],
     [{"lines": [], "total": 1}, {"lines": [{"sku": "abc-1234", "qty": 2}], "total": 1}, {"lines": [{"sku": "ABC-1234", "qty": 0}], "total": 1}]),
    ("event", obj({"title": S, "start": {"type": "string", "format": "date-time"}, "end": {"type": "string", "format": "date-time"},
                   "all_day": B}),
     [{"title": "Launch", "start": "2025-03-01T09:00:00Z", "end": "2025-03-01T10:30:00+01:00", "all_day": False}],
     [{"title": "x", "start": "tomorrow", "end": "2025-03-01T10:30:00Z", "all_day": False}]),
    ("weather_args", obj({"location": S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, required=["location"]),
     [{"location": "Paris, France"}, {"location": "Oslo", "unit": "celsius"}],
     [{"unit": "celsius"}, {"location": "Oslo", "unit": "kelvin"}]),
    ("tree", {"$defs": {"node": obj({"value": I, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, required=["value"])},
              "$ref": "#/$defs/node"},
     [{"value": 1, "children": [{"value": 2}, {"value": 3, "children": []}]}],
     [{"value": 1, "children": [{"v": 2}]}, {"children": []}]),
    ("linked_list", obj({"value": S, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}),
     [{"value": "a", "next": {"value": "b", "next": None}}],
     [{"value": "a", "next": {"value": "b"}}, {"value": "a", "next": 3}]),
    ("rgb", {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 255}] * 3, "items": False, "minItems": 3},
     [[255, 128, 0]], [[256, 0, 0], [1, 2], [1, 2, 3, 4]]),
    ("sentiment", obj({"label": {"enum": ["positive", "negative", "neutral"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}}),
     [{"label": "positive", "confidence": 0.93}, {"label": "neutral", "confidence": 1}],
     [{"label": "happy", "confidence": 0.5}, {"label": "positive", "confidence": 1.5}]),
    ("pet_union", {"oneOf": [obj({"kind": {"const": "cat"}, "lives": {"type": "integer", "minimum": 0, "maximum": 9}}),
                             obj({"kind": {"const": "dog"}, "good_boy": B})]},
     [{"kind": "cat", "lives": 7}, {"kind": "dog", "good_boy": True}],
     [{"kind": "cat", "good_boy": True}, {"kind": "bird"}]),
    ("scalar_union", {"anyOf": [S, I, {"type": "null"}]}, ["text", 42, None], [1.5, True, []]),
    ("company", {"$defs": {"person": obj({"name": S, "role": S})},
                 **obj({"name": S, "founded": {"type": "string", "format": "date"},
                        "employees": {"type": "array", "items": {"$ref": "#/$defs/person"}, "maxItems": 10}})},
     [{"name": "Acme", "founded": "1999-12-31", "employees": [{"name": "Wile", "role": "engineer"}]}],
     [{"name": "Acme", "founded": "1999-02-30", "employees": []}, {"name": "Acme", "founded": "1999-12-31", "employees": [{"name": "W"}]}]),
    ("matrix", {"type": "array", "items": {"type": "array", "items": N, "minItems": 2, "maxItems": 2}, "maxItems": 3},
     [[[1, 2], [3.5, -4]]], [[[1]], [[1, 2], [3, "4"]]]),
    ("counters", {"type": "object", "additionalProperties": I},
     [{"apples": 3, "pears": 0}, {}], [{"apples": "3"}]),
    ("labelled_extras", {"type": "object", "properties": {"id": I}, "required": ["id"], "additionalProperties": S},
     [{"id": 1, "note": "hello"}], [{"id": 1, "note": 2}, {"note": "x"}]),
    ("flags", obj({"debug": B, "verbose": B, "dry_run": B}, required=[]),
     [{}, {"verbose": True}, {"debug": False, "dry_run": True}], [{"debug": "yes"}, {"other": True}]),
    ("versioned", obj({"version": {"const": 2}, "data": {"type": "object", "properties": {"x": N}, "required": ["x"]}}),
     [{"version": 2, "data": {"x": 1}}], [{"version": 1, "data": {"x": 1}}, {"version": 2, "data": {}}]),
    ("server", obj({"host": {"type": "string", "format": "ipv4"}, "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "name": {"type": "string", "format": "hostname"}}, required=["host", "port"]),
     [{"host": "10.0.0.1", "port": 8080, "name": "api.example"}], [{"host": "10.0.0.300", "port": 80}, {"host": "10.0.0.1", "port": 0}]),
    ("ids", {"type": "array", "items": {"type": "string", "format": "uuid"}, "minItems": 1, "maxItems": 4},
     [["123e4567-e89b-12d3-a456-426614174000"]], [[], ["not-a-uuid"]]),
    ("code", obj({"code": {"type": "string", "minLength": 3, "maxLength": 8}}),
     [{"code": "abc"}, {"code": "abcdefgh"}], [{"code": "ab"}, {"code": "abcdefghi"}]),
    ("temperature", obj({"celsius": {"type": "number", "minimum": -50.5, "maximum": 60.25}}),
     [{"celsius": -50.5}, {"celsius": 21.3}, {"celsius": 60.25}], [{"celsius": -50.51}, {"celsius": 60.26}]),
    ("open_interval", obj({"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}}),
     [{"n": 1}, {"n": 9}], [{"n": 0}, {"n": 10}]),
    ("nullable_fields", obj({"nickname": {"anyOf": [S, {"type": "null"}], "default": None},
                             "score": {"anyOf": [{"type": "number"}, {"type": "null"}]}}),
     [{"nickname": None, "score": 3.5}, {"nickname": "Ace", "score": None}], [{"nickname": 3, "score": None}]),
    ("pydantic_owner", Owner.model_json_schema(),
     [{"full_name": "Sam", "pets": [{"name": "Rex", "species": "dog", "age_years": 3}], "verified": True}],
     [{"full_name": "Sam", "pets": [{"name": "Rex", "species": "lion"}], "verified": True}]),
    ("openai_strict_math", to_strict_json_schema(MathReasoning),
     [{"steps": [{"explanation": "add", "output": "2"}], "final_answer": "2"}],
     [{"steps": [{"explanation": "add"}], "final_answer": "2"}]),
    ("calendar_slot", obj({"day": {"type": "string", "format": "date"}, "at": {"type": "string", "format": "time"}}),
     [{"day": "2024-07-04", "at": "18:30:00Z"}], [{"day": "2024-07-04", "at": "25:00:00Z"}]),
    ("json_rpc", obj({"jsonrpc": {"const": "2.0"}, "method": S, "params": {"type": "object"}, "id": I}),
     [{"jsonrpc": "2.0", "method": "sum", "params": {"a": [1, 2]}, "id": 7}], [{"jsonrpc": "1.0", "method": "sum", "params": {}, "id": 1}]),
    ("geo_point", obj({"type": {"const": "Point"},
                       "coordinates": {"type": "array", "prefixItems": [{"type": "number", "minimum": -180, "maximum": 180},
                                                                        {"type": "number", "minimum": -90, "maximum": 90}],
                                       "items": False, "minItems": 2}}),
     [{"type": "Point", "coordinates": [2.35, 48.85]}], [{"type": "Point", "coordinates": [200, 0]}, {"type": "Line", "coordinates": [0, 0]}]),
    ("tool_choice_shape", obj({"name": {"enum": ["search", "calculator", "weather"]}, "arguments": {"type": "object"}}),
     [{"name": "search", "arguments": {"q": "fp8"}}], [{"name": "shell", "arguments": {}}]),
    ("empty_object", {"type": "object", "properties": {}, "additionalProperties": False}, [{}], [{"a": 1}]),
    ("anything", {}, [{"a": [1, "b", None]}, "s", 3], []),
    ("choices", {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 4},
     [["a", "b"], ["c", "c", "a", "b"]], [["a"], ["a", "d"]]),
    ("yes_no", obj({"answer": {"type": "string", "pattern": "^(yes|no|maybe)$"}}),
     [{"answer": "maybe"}], [{"answer": "perhaps"}]),
    ("translation", obj({"source": S, "target": S, "language": {"type": "string", "minLength": 2, "maxLength": 5}}),
     [{"source": "Grüße aus Köln", "target": "Greetings from Cologne", "language": "de"}], [{"source": "x", "target": "y", "language": "g"}]),
    ("deep", obj({"a": obj({"b": obj({"c": obj({"d": obj({"e": I})})})})}),
     [{"a": {"b": {"c": {"d": {"e": 5}}}}}], [{"a": {"b": {"c": {"d": {}}}}}]),
    ("recipe", obj({"title": S, "ingredients": {"type": "array", "items": obj({"name": S, "amount": {"type": "number", "exclusiveMinimum": 0},
                                                                                 "unit": {"enum": ["g", "ml", "piece"]}})},
                    "steps": {"type": "array", "items": S, "minItems": 1}}),
     [{"title": "Tea", "ingredients": [{"name": "water", "amount": 250, "unit": "ml"}], "steps": ["Boil", "Steep"]}],
     [{"title": "Tea", "ingredients": [{"name": "water", "amount": 0, "unit": "ml"}], "steps": ["Boil"]}]),
    ("invoice", {"$defs": {"line": obj({"description": S, "amount": {"type": "number", "minimum": 0}})},
                 **obj({"currency": {"type": "string", "pattern": "^[A-Z]{3}$"}, "due": {"type": "string", "format": "date"},
                        "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}}})},
     [{"currency": "EUR", "due": "2025-01-31", "lines": [{"description": "Work", "amount": 1200}]}],
     [{"currency": "euro", "due": "2025-01-31", "lines": []}]),
    ("review", obj({"rating": {"type": "integer", "minimum": 1, "maximum": 5}, "text": {"type": "string", "maxLength": 200}}),
     [{"rating": 5, "text": "Great."}], [{"rating": 6, "text": "x"}, {"rating": 3, "text": "x" * 201}]),
    ("multi_label", obj({"labels": {"type": "array", "items": {"enum": ["bug", "feature", "question", "docs"]}, "maxItems": 4}}),
     [{"labels": ["bug", "docs"]}, {"labels": []}], [{"labels": ["wontfix"]}]),
    ("math_answer", obj({"expression": S, "result": N}), [{"expression": "2+2", "result": 4}], [{"expression": "2+2", "result": "4"}]),
    ("people_list", {"type": "array", "items": obj({"name": S, "age": I}), "maxItems": 5},
     [[{"name": "A", "age": 1}, {"name": "B", "age": 2}]], [[{"name": "A"}]]),
    ("mood", {"type": "string", "enum": ["happy", "sad", "angry", "calm"]}, ["calm"], ["bored"]),
    ("dice", {"type": "integer", "minimum": 1, "maximum": 6}, [1, 6], [0, 7, 3.5]),
    ("bool_only", {"type": "boolean"}, [True, False], ["true", 1]),
    ("draft7_defs", {"definitions": {"point": obj({"x": N, "y": N})}, "type": "array", "items": {"$ref": "#/definitions/point"}},
     [[{"x": 1, "y": 2}]], [[{"x": 1}]]),
    ("optional_short_text", obj({"note": {"type": ["string", "null"], "maxLength": 10}}),
     [{"note": None}, {"note": "short"}], [{"note": "much too long text"}]),
    ("ambiguous_objects", {"anyOf": [obj({"a": I, "b": I}), obj({"a": I, "c": S})]},
     [{"a": 1, "b": 2}, {"a": 1, "c": "x"}], [{"a": 1}, {"a": 1, "d": 2}]),
    ("big_enum", obj({"code": {"enum": [f"C{i:03d}" for i in range(200)]}}), [{"code": "C000"}, {"code": "C199"}], [{"code": "C200"}]),
    ("entities", obj({"entities": {"type": "array", "items": obj({"text": S, "type": {"enum": ["PERSON", "ORG", "LOC"]},
                                                                   "start": {"type": "integer", "minimum": 0},
                                                                   "end": {"type": "integer", "minimum": 0}})}}),
     [{"entities": [{"text": "Ada", "type": "PERSON", "start": 0, "end": 3}]}],
     [{"entities": [{"text": "Ada", "type": "PET", "start": 0, "end": 3}]}, {"entities": [{"text": "A", "type": "ORG", "start": -1, "end": 0}]}]),
]


def texts(value):
    """The ways a model may write a valid instance that fp8serve's grammar allows."""
    return [json.dumps(value, ensure_ascii=False), json.dumps(value, ensure_ascii=False, indent=2),
            json.dumps(value, ensure_ascii=False, separators=(",", ":"))]


def main():
    assert len(CASES) == 50, len(CASES)
    out = []
    names = set()
    for name, schema, valid, invalid in CASES:
        assert name not in names
        names.add(name)
        validator = jsonschema.Draft202012Validator(schema, format_checker=CHECKER)
        validator.check_schema(schema)
        for v in valid:
            validator.validate(v)
        for v in invalid:
            assert not validator.is_valid(v), (name, v)
        out.append({"name": name, "schema": schema, "valid": [t for v in valid for t in texts(v)],
                    "invalid": [json.dumps(v, ensure_ascii=False) for v in invalid]})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    seeds = OUT.parent / "fuzz_seeds"  # one schema per file, for the fuzz_json_schema corpus
    seeds.mkdir(exist_ok=True)
    for case in out:
        (seeds / f"{case['name']}.json").write_text(json.dumps(case["schema"], ensure_ascii=False))
    print(f"wrote {OUT} ({len(out)} schemas)")


if __name__ == "__main__":
    main()
