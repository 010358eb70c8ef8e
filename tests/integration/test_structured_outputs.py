"""Structured outputs and tool calling end to end: the real server with the default model
(SmolLM2-135M), driven by curl, the official `openai` client and LangChain's ChatOpenAI.
Every generated document is checked by Python's `jsonschema`, never by our own matcher."""
import concurrent.futures
import json
import subprocess
import time
from typing import Literal, Optional

import jsonschema
import pydantic
import pytest

from conftest import ROOT

SCHEMAS = json.loads((ROOT / "tests" / "fixtures" / "grammar" / "schemas.json").read_text())
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
MODEL = "SmolLM2-135M-Instruct.Q4_1"


def validate(schema, value):
    jsonschema.Draft202012Validator(schema, format_checker=CHECKER).validate(value)


@pytest.fixture(scope="module")
def server(structured_server):
    return structured_server


@pytest.fixture(scope="module")
def client(structured_client):
    return structured_client


def schema_format(name, schema):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_fifty_schemas_every_output_parses_and_validates(server, client):
    def run(case):
        r = client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=400,
            messages=[{"role": "system", "content": "You reply with JSON only."},
                      {"role": "user", "content": f"Give an example of a {case['name'].replace('_', ' ')} as JSON matching "
                                                  f"this schema: {json.dumps(case['schema'])}"}],
            response_format=schema_format(case["name"], case["schema"]))
        return case, r.choices[0], r.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, SCHEMAS))
    assert len(results) == 50
    finished = 0
    for case, choice, used in results:
        # Complete whatever ended it: the model, or max_tokens closing it within its budget.
        assert choice.finish_reason == "stop", case["name"]
        validate(case["schema"], json.loads(choice.message.content))
        finished += used < 400
    assert finished >= 30, f"only {finished} of 50 ended on their own"
    assert server.wait_kv_idle() == 0


def test_json_object_mode_on_chat_and_completions_streaming_or_not(server, client):
    r = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=120, response_format={"type": "json_object"},
                                       messages=[{"role": "user", "content": "Describe a cat in JSON."}])
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    stream = client.completions.create(model=MODEL, prompt="A JSON object describing a dog:", max_tokens=120, temperature=0.7,
                                       seed=3, stream=True, extra_body={"response_format": {"type": "json_object"}})
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert isinstance(json.loads(text), dict)


def test_streamed_document_equals_the_non_streamed_one_and_n_choices_all_validate(client):
    case = next(c for c in SCHEMAS if c["name"] == "person")
    kwargs = dict(model=MODEL, temperature=0, max_tokens=200, response_format=schema_format("person", case["schema"]),
                  messages=[{"role": "user", "content": "Invent a person."}])
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs))
    assert streamed == full
    many = client.chat.completions.create(**{**kwargs, "temperature": 1.0, "n": 4, "seed": 11})
    assert len(many.choices) == 4
    for choice in many.choices:
        validate(case["schema"], json.loads(choice.message.content))


def test_curl_json_schema(server):
    body = {"model": MODEL, "max_tokens": 60, "temperature": 0,
            "messages": [{"role": "user", "content": "Rate the movie Alien."}],
            "response_format": schema_format("rating", {"type": "object", "properties": {"stars": {"type": "integer", "minimum": 1,
                                                                                                  "maximum": 5}},
                                                        "required": ["stars"], "additionalProperties": False})}
    out = subprocess.run(["curl", "-s", server.base + "/v1/chat/completions", "-H", "Content-Type: application/json",
                          "-d", json.dumps(body)], capture_output=True, check=True, timeout=120)
    content = json.loads(out.stdout)["choices"][0]["message"]["content"]
    assert 1 <= json.loads(content)["stars"] <= 5


class Person(pydantic.BaseModel):
    name: str
    age: int = pydantic.Field(ge=0, le=120)
    nickname: Optional[str] = None


def test_openai_client_parse(client):
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    r = parse(model=MODEL, temperature=0, max_tokens=200, response_format=Person,
              messages=[{"role": "user", "content": "Invent a person."}])
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                              "parameters": {"type": "object", "properties": {}}}}


def test_langchain_structured_output_and_bind_tools(server):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=server.base + "/v1", api_key="unused", model=MODEL, temperature=0, max_tokens=200, max_retries=0)
    person = llm.with_structured_output(Person, method="json_schema").invoke("Invent a person.")
    assert isinstance(person, Person) and 0 <= person.age <= 120

    @tool
    def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
        """Current weather in a city."""
        return "sunny"

    schema = get_weather.args_schema.model_json_schema()
    for choice in ("get_weather", "required"):
        msg = llm.bind_tools([get_weather], tool_choice=choice).invoke("What is the weather in Paris?")
        assert msg.tool_calls, choice
        for call in msg.tool_calls:
            assert call["name"] == "get_weather" and call["id"].startswith("call_")
            validate(schema, call["args"])
        assert msg.response_metadata["finish_reason"] == "tool_calls"


def test_tool_calls_streamed_and_not_agree(client):
    kwargs = dict(model=MODEL, temperature=0, max_tokens=120, tools=[WEATHER_TOOL, TIME_TOOL],
                  tool_choice={"type": "function", "function": {"name": "get_weather"}},
                  messages=[{"role": "user", "content": "What is the weather in Rome?"}])
    full = client.chat.completions.create(**kwargs).choices[0]
    assert full.finish_reason == "tool_calls" and full.message.content is None
    [call] = full.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    validate(WEATHER_TOOL["function"]["parameters"], json.loads(call.function.arguments))
    calls, finish = {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for d in choice.delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            entry["id"] = d.id or entry["id"]
            entry["name"] = (d.function.name if d.function and d.function.name else None) or entry["name"]
            entry["arguments"] += (d.function.arguments or "") if d.function else ""
    assert finish == "tool_calls"
    assert list(calls.values()) == [{"id": call.id.replace(call.id, calls[0]["id"]), "name": "get_weather",
                                     "arguments": call.function.arguments}]


def test_required_calls_validate_and_auto_answers_in_a_valid_shape(client):
    # Sampled calls: which tool and how long its arguments run depend on the seed (get_time takes
    # any object, so a call may ramble until the budget closes it: then "length", still complete).
    for seed in (5, 6, 7, 8):
        r = client.chat.completions.create(model=MODEL, temperature=0.8, seed=seed, max_tokens=200,
                                           tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="required", parallel_tool_calls=False,
                                           messages=[{"role": "user", "content": "What time is it, and how warm is Oslo?"}])
        choice = r.choices[0]
        assert len(choice.message.tool_calls) == 1, seed
        assert choice.finish_reason == "tool_calls" or (choice.finish_reason == "length" and r.usage.completion_tokens > 100), \
            (seed, choice.finish_reason, r.usage.completion_tokens)
        call = choice.message.tool_calls[0]
        tool = {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}[call.function.name]
        validate(tool["function"]["parameters"], json.loads(call.function.arguments))
    auto = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=80, tools=[WEATHER_TOOL],
                                          messages=[{"role": "user", "content": "Say hello."}]).choices[0]
    if auto.message.tool_calls:
        assert auto.finish_reason == "tool_calls"
    else:
        assert auto.finish_reason in ("stop", "length") and auto.message.content


def test_tool_history_round_trip(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"}]
    r = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=40, tools=[WEATHER_TOOL], messages=messages)
    choice = r.choices[0]
    assert choice.message.content or choice.message.tool_calls


def test_tokenize_shows_the_tools_in_the_prompt(server):
    status, _, body = server.post("/tokenize", {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER_TOOL]})
    assert status == 200
    status, _, text = server.post("/detokenize", {"tokens": json.loads(body)["tokens"]})
    prompt = json.loads(text)["prompt"]
    assert "<tools>" in prompt and "get_weather" in prompt and "<tool_call>" in prompt


def nested(levels):
    s = {"type": "integer"}
    for _ in range(levels):
        s = {"items": s}
    return s


HOSTILE = [
    ("deeply nested", nested(40), None),
    ("huge enum", {"enum": [f"v{i}" for i in range(5000)]}, "enum"),
    ("enormous maxLength", {"type": "string", "maxLength": 10 ** 9}, "maxLength"),
    ("enormous minItems", {"type": "array", "minItems": 10 ** 6}, "minItems"),
    ("a $ref to itself", {"$ref": "#"}, None),
    ("$refs that only meet each other", {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, None),
    ("left recursion", {"anyOf": [{"type": "null"}, {"$ref": "#"}]}, "$ref"),
    ("unsatisfiable bounds", {"type": "integer", "minimum": 10, "maximum": 9}, None),
    ("required but forbidden", {"type": "object", "properties": {"a": False}, "required": ["a"]}, None),
    ("backreference", {"type": "string", "pattern": "(a)\\1"}, "pattern"),
    ("repetition bomb", {"type": "string", "pattern": "^((a{1000}){1000}){1000}$"}, "pattern"),
    ("overlapping oneOf", {"oneOf": [{"type": "number"}, {"type": "integer"}]}, "oneOf"),
    ("multipleOf", {"type": "number", "multipleOf": 0.5}, "multipleOf"),
    ("not", {"not": {"type": "string"}}, "not"),
    ("unknown format", {"type": "string", "format": "color"}, "format"),
    ("remote $ref", {"$ref": "https://example.com/schema.json"}, "$ref"),
    ("too many subschemas", {"anyOf": [{"type": "object", "properties": {f"p{i}": {"type": "integer"}}} for i in range(12000)]}, None),
    ("too many properties", {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1000)}}, "properties"),
]


@pytest.mark.parametrize("label,schema,keyword", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_schemas_get_a_fast_clear_400(server, label, schema, keyword):
    started = time.time()
    status, _, body = server.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                                           "response_format": schema_format("h", schema)}, timeout=60)
    elapsed = time.time() - started
    assert status == 400, body
    error = json.loads(body)["error"]
    assert error["param"] == "response_format" and error["type"] == "invalid_request_error"
    if keyword:
        assert f"'{keyword}'" in error["message"], error["message"]
    assert elapsed < 10, f"{label}: {elapsed:.1f} s"
    assert server.alive()


def test_hostile_tool_parameters_and_a_big_schema_that_compiles(server, client):
    bad = json.loads(json.dumps(WEATHER_TOOL))
    bad["function"]["parameters"]["properties"]["city"] = {"type": "string", "pattern": "(?<=x)y"}
    status, _, body = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [bad],
                                                           "tool_choice": "required"})
    assert status == 400 and json.loads(body)["error"]["param"] == "tools"
    # 200 optional properties: large, but within the limits; compiles in bounded time and generates.
    big = {"type": "object", "properties": {f"field_{i}": {"type": "integer"} for i in range(200)}, "required": ["field_0"],
           "additionalProperties": False}
    started = time.time()
    r = client.chat.completions.create(model=MODEL, max_tokens=30, temperature=0, response_format=schema_format("big", big),
                                       messages=[{"role": "user", "content": "Fill in the form."}])
    assert time.time() - started < 60
    assert r.choices[0].message.content.startswith("{")
    assert server.wait_kv_idle() == 0 and server.alive()
