"""OpenAI's Responses API (/v1/responses) on the real server with the default model (SmolLM2-135M),
through the official `openai` client and raw HTTP: the response object, its equivalence with chat
completions, logprobs, streaming events, structured output, function calls and their round trip,
the response store (retrieve, input items, delete, previous_response_id, caps), and bad or
hostile requests, each answered with an OpenAI error object while every KV block comes back."""
import json
import subprocess
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import jsonschema
import openai
import pydantic
import pytest

from conftest import DEFAULT_MODEL, TINY_QWEN3, Server, binary, read_then_drop

MODEL = DEFAULT_MODEL.stem  # the served name: the GGUF file's stem
R = "/v1/responses"
LOGPROBS = "message.output_text.logprobs"
ABORTED = 'fp8serve:request_success_total{finished_reason="abort"}'

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city", "strict": True,
                "parameters": {"type": "object",
                               "properties": {"city": {"type": "string"},
                                              "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                               "required": ["city", "unit"], "additionalProperties": False}}
TIME_TOOL = {"type": "function", "name": "get_time", "description": "The time now", "strict": True,
             "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}
TOOLS = {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}


def chat_tool(tool):
    """The same function tool in chat completions' nested shape."""
    return {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters", "strict")}}


@pytest.fixture(scope="module")
def server(structured_server):
    """The default model (FP8 KV cache, prefix caching on by default) with room for 16 sequences,
    shared with the structured-output tests; its teardown checks that every KV block came back."""
    return structured_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


def call(server, method, path, body=None, timeout=60):
    """Any method on any path; returns (status, headers, body bytes)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(server.base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def check_error(status, body, want_status, param=None, code=None):
    """An OpenAI error object with this status; `param` exact, or a prefix when it ends in '*'."""
    assert status == want_status, body[:500]
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    if param is not None and param.endswith("*"):
        assert isinstance(err["param"], str) and err["param"].startswith(param[:-1]), err
    elif param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def validate(schema, value):
    jsonschema.Draft202012Validator(schema).validate(value)


def messages_of(response):
    return [o for o in response.output if o.type == "message"]


def calls_of(response):
    return [o for o in response.output if o.type == "function_call"]


def text_of(item):
    return "".join(p.text for p in item.content)


def greedy(client, **kwargs):
    return client.responses.create(model=MODEL, temperature=0, **kwargs)


def chat_greedy(client, messages, max_tokens, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=max_tokens, temperature=0,
                                          **kwargs)


def status_for(chat):
    """The Responses status a chat completion's finish_reason corresponds to."""
    return "incomplete" if chat.choices[0].finish_reason == "length" else "completed"


# ---------------------------------------------------------------------------------------------
# The response object, and its equivalence with chat completions

def test_help_lists_the_store_flags():
    """`serve --help` documents the store's three limits, the TTL in seconds."""
    run = subprocess.run([str(binary()), "serve", "--help"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    lines = {line.split()[0]: line for line in run.stdout.splitlines() if line.startswith("  --")}
    for flag in ("--responses-store-max-entries", "--responses-store-max-bytes", "--responses-store-ttl"):
        assert flag in lines, flag
    assert "second" in lines["--responses-store-ttl"], lines["--responses-store-ttl"]


def test_response_object_has_openai_shape_and_echoes_the_settings(server, client):
    """A plain request gives a `response` object with a message item, usage that adds up, and every
    request setting echoed; the client's `output_text` reads the same text."""
    body = {"model": MODEL, "input": "Say hello.", "instructions": "Be brief.", "max_output_tokens": 40, "temperature": 0,
            "top_p": 1.0, "metadata": {"suite": "responses"}, "user": "alice", "truncation": "disabled",
            "service_tier": "auto", "prompt_cache_key": "k", "safety_identifier": "s", "parallel_tool_calls": True}
    before = time.time()
    status, headers, raw = server.post(R, body)
    assert status == 200, raw
    assert headers["Content-Type"].startswith("application/json") and len(headers["X-Request-Id"]) == 16
    r = json.loads(raw)
    assert r["id"].startswith("resp_") and r["object"] == "response" and r["model"] == MODEL
    assert before - 5 <= r["created_at"] <= time.time() + 5
    assert r["error"] is None
    [item] = r["output"]
    assert item["type"] == "message" and item["id"].startswith("msg_") and item["role"] == "assistant"
    assert item["status"] == "completed"
    [part] = item["content"]
    assert part["type"] == "output_text" and part["text"].strip() and part["annotations"] == []
    usage = r["usage"]
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 40
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
    assert 0 <= usage["input_tokens_details"]["cached_tokens"] <= usage["input_tokens"]
    if usage["output_tokens"] < 40:
        assert r["status"] == "completed" and r["incomplete_details"] is None
    echoed = {"instructions": "Be brief.", "max_output_tokens": 40, "temperature": 0, "top_p": 1.0, "tools": [],
              "tool_choice": "auto", "parallel_tool_calls": True, "text": {"format": {"type": "text"}},
              "metadata": {"suite": "responses"}, "previous_response_id": None, "store": True, "truncation": "disabled",
              "user": "alice"}
    assert {k: r.get(k, "<absent>") for k in echoed} == echoed
    again = client.responses.create(**body)
    assert again.id != r["id"] and again.output_text == part["text"]
    assert again.usage.input_tokens == usage["input_tokens"] and again.usage.output_tokens == usage["output_tokens"]
    status, _, raw = server.post(R, {k: v for k, v in body.items() if k != "model"})  # the served model by default
    assert status == 200 and json.loads(raw)["model"] == MODEL


def test_greedy_text_equals_chat_with_instructions_as_the_system_message(client):
    """instructions + input messages give exactly chat's text and token counts for the system
    message + the same messages; content as parts or as a string, and a bare string input, agree."""
    history = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "Apple."},
               {"role": "user", "content": "Name another one and say why you like it."}]
    r = greedy(client, input=history, instructions="You are a cheerful grocer.", max_output_tokens=30, store=False)
    chat = chat_greedy(client, [{"role": "system", "content": "You are a cheerful grocer."}, *history], 30)
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
    assert r.status == status_for(chat)
    parts = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": history[0]["content"]}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": history[1]["content"], "annotations": []}]},
             {"role": "user", "content": [{"type": "input_text", "text": history[2]["content"]}]}]
    typed = greedy(client, input=parts, instructions="You are a cheerful grocer.", max_output_tokens=30, store=False)
    assert typed.output_text == r.output_text and typed.usage.input_tokens == r.usage.input_tokens
    one = greedy(client, input="Name a fruit.", max_output_tokens=20, store=False)
    chat = chat_greedy(client, [history[0]], 20)
    assert one.output_text == chat.choices[0].message.content and one.usage.input_tokens == chat.usage.prompt_tokens


def test_developer_role_renders_as_system(client):
    """A developer message is the system message: its text equals chat's with role system and
    Responses' with the same words as instructions."""
    dev = greedy(client, input=[{"role": "developer", "content": "Answer in French."},
                                {"role": "user", "content": "Name a colour."}], max_output_tokens=20, store=False)
    chat = chat_greedy(client, [{"role": "system", "content": "Answer in French."},
                                {"role": "user", "content": "Name a colour."}], 20)
    assert dev.output_text == chat.choices[0].message.content and dev.usage.input_tokens == chat.usage.prompt_tokens
    sys_msg = greedy(client, input=[{"role": "system", "content": "Answer in French."},
                                    {"role": "user", "content": "Name a colour."}], max_output_tokens=20, store=False)
    instructed = greedy(client, input="Name a colour.", instructions="Answer in French.", max_output_tokens=20, store=False)
    assert sys_msg.output_text == instructed.output_text == dev.output_text


def test_max_output_tokens_cut_is_incomplete_streamed_or_not(client):
    """Cut by max_output_tokens: status incomplete, reason max_output_tokens, exactly that many
    tokens; the stream ends with response.incomplete carrying the same text."""
    kwargs = dict(input="Write a very long story about a dragon who loves maps.", max_output_tokens=16)
    r = greedy(client, **kwargs)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 16 and r.output_text and messages_of(r)
    events = list(greedy(client, stream=True, **kwargs))
    types = [e.type for e in events]
    assert types[-1] == "response.incomplete" and "response.completed" not in types
    last = events[-1].response
    assert last.status == "incomplete" and last.incomplete_details.reason == "max_output_tokens"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text == last.output_text


def test_sampling_parameters_and_seed(client):
    """top_p and vLLM's top_k / min_p / repetition_penalty are accepted; the same seed draws the
    same text, another seed another; priority follows the scheduling policy as on chat."""
    kwargs = dict(model=MODEL, input="Tell me about the ocean.", max_output_tokens=20, temperature=0.9, top_p=0.9,
                  store=False)
    extra = {"seed": 1234, "top_k": 50, "min_p": 0.05, "repetition_penalty": 1.1, "priority": 0}
    a = client.responses.create(**kwargs, extra_body=extra)
    b = client.responses.create(**kwargs, extra_body=extra)
    assert a.output_text == b.output_text and a.temperature == 0.9 and a.top_p == 0.9
    c = client.responses.create(**kwargs, extra_body={**extra, "seed": 99})
    assert c.output_text != a.output_text
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**kwargs, extra_body={"priority": 1})
    assert e.value.body["param"] == "priority"


def test_logprobs_equal_chat_logprobs(client):
    """include=[message.output_text.logprobs] with top_logprobs=N: one entry per generated token,
    N alternatives each, the very tokens, bytes and logprobs chat reports for the same request;
    the stream's deltas carry the same entries."""
    r = greedy(client, input="Name a colour.", max_output_tokens=8, include=[LOGPROBS], top_logprobs=3, store=False)
    chat = chat_greedy(client, [{"role": "user", "content": "Name a colour."}], 8, logprobs=True, top_logprobs=3)
    got = messages_of(r)[0].content[0].logprobs
    want = chat.choices[0].logprobs.content
    assert len(got) == len(want) == r.usage.output_tokens
    for g, w in zip(got, want):
        assert (g.token, g.bytes) == (w.token, w.bytes)
        assert g.logprob == pytest.approx(w.logprob, abs=1e-6)
        assert len(g.top_logprobs) == 3
        assert [(t.token, t.bytes) for t in g.top_logprobs] == [(t.token, t.bytes) for t in w.top_logprobs]
        assert [t.logprob for t in g.top_logprobs] == pytest.approx([t.logprob for t in w.top_logprobs], abs=1e-6)
    events = list(greedy(client, input="Name a colour.", max_output_tokens=8, include=[LOGPROBS], top_logprobs=3,
                         store=False, stream=True))
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [x.model_dump() for x in streamed] == [x.model_dump() for x in got]
    zero = greedy(client, input="Name a colour.", max_output_tokens=8, include=[LOGPROBS], top_logprobs=0, store=False)
    lp = messages_of(zero)[0].content[0].logprobs
    assert [x.token for x in lp] == [x.token for x in got] and all(x.top_logprobs == [] for x in lp)


# ---------------------------------------------------------------------------------------------
# Streaming

def text_stream_types(n_deltas, final):
    return (["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
            + ["response.output_text.delta"] * n_deltas
            + ["response.output_text.done", "response.content_part.done", "response.output_item.done", final])


def test_stream_events_come_in_order_and_give_the_non_streamed_text(server, client):
    """stream=True: the documented events in order, sequence numbers 0, 1, 2, ..., one item id
    throughout; the deltas, the done events and the final response all hold the non-streamed
    greedy text; the streamed response is stored; the client's stream helper agrees."""
    kwargs = dict(input="Write one sentence about the sea.", max_output_tokens=40)
    full = greedy(client, store=False, **kwargs)
    final = "response.completed" if full.status == "completed" else "response.incomplete"
    events = list(greedy(client, stream=True, stream_options={"include_obfuscation": False}, **kwargs))
    types = [e.type for e in events]
    n = types.count("response.output_text.delta")
    assert n >= 1 and types == text_stream_types(n, final)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created, in_progress, added, part_added = events[:4]
    text_done, part_done, item_done, last = events[-4:]
    assert created.response.id == in_progress.response.id == last.response.id != full.id
    assert created.response.status == in_progress.response.status == "in_progress"
    item_id = added.item.id
    assert added.item.type == "message" and item_id.startswith("msg_") and added.output_index == 0
    assert part_added.part.type == "output_text" and part_added.part.text == ""
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert {(e.item_id, e.output_index, e.content_index) for e in deltas + [text_done]} == {(item_id, 0, 0)}
    text = "".join(e.delta for e in deltas)
    assert text == full.output_text == text_done.text == part_done.part.text == last.response.output_text
    assert item_done.item.id == item_id and item_done.item.status == "completed" and text_of(item_done.item) == text
    assert last.response.status == full.status and last.response.usage.output_tokens == full.usage.output_tokens
    assert last.response.usage.input_tokens == full.usage.input_tokens
    assert client.responses.retrieve(last.response.id).model_dump() == last.response.model_dump()
    with client.responses.stream(model=MODEL, temperature=0, store=False, **kwargs) as stream:
        helper = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        if final == "response.completed":
            assert stream.get_final_response().output_text == helper
    assert helper == text
    # On the wire: server-sent events, each a JSON object whose type is the event's.
    status, headers, raw = server.post(R, {"model": MODEL, "input": "Hi.", "max_output_tokens": 8, "temperature": 0,
                                           "stream": True, "store": False})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    data = [json.loads(line[5:]) for line in raw.decode().splitlines() if line.startswith("data:") and "{" in line]
    assert data and data[0]["type"] == "response.created" and data[-1]["type"] in ("response.completed", "response.incomplete")
    assert [d["sequence_number"] for d in data] == list(range(len(data)))


# ---------------------------------------------------------------------------------------------
# Structured output

class Person(pydantic.BaseModel):
    name: str
    age: int = pydantic.Field(ge=0, le=120)
    nickname: Optional[str] = None


def test_parse_with_a_pydantic_model_and_json_modes(client):
    """responses.parse(text_format=Model) gives an instance of the model (strict json_schema);
    json_schema by hand validates; json_object gives a JSON object."""
    r = client.responses.parse(model=MODEL, input="Invent a person.", text_format=Person, max_output_tokens=200,
                               temperature=0, store=False)
    assert isinstance(r.output_parsed, Person) and 0 <= r.output_parsed.age <= 120
    assert r.text.format.type == "json_schema"
    schema = {"type": "object", "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5}},
              "required": ["stars"], "additionalProperties": False}
    rated = greedy(client, input="Rate the movie Alien.", max_output_tokens=60, store=False,
                   text={"format": {"type": "json_schema", "name": "rating", "schema": schema, "strict": True}})
    validate(schema, json.loads(rated.output_text))
    assert rated.text.format.type == "json_schema" and rated.text.format.name == "rating"
    obj = greedy(client, input="Describe a cat in JSON.", max_output_tokens=120, store=False,
                 text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(obj.output_text), dict) and obj.text.format.type == "json_object"
    with client.responses.stream(model=MODEL, input="Invent a person.", text_format=Person, max_output_tokens=200,
                                 temperature=0, store=False) as stream:
        streamed = stream.get_final_response()
    assert streamed.output_parsed == r.output_parsed and streamed.output_text == r.output_text


# ---------------------------------------------------------------------------------------------
# Function tools

def test_required_and_named_tool_choice_give_a_valid_function_call(client):
    """tool_choice required or naming a function: one function_call item whose arguments are JSON
    valid against the tool's schema; tool_choice none: a message and no call; settings echoed."""
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        r = greedy(client, input="What is the weather in Paris?", tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=choice,
                   parallel_tool_calls=False, max_output_tokens=100, store=False)
        assert r.status == "completed", r
        [fc] = calls_of(r)
        assert fc.id.startswith("fc_") and fc.call_id and fc.status == "completed", fc
        assert fc.name in TOOLS and (choice == "required" or fc.name == "get_weather")
        validate(TOOLS[fc.name]["parameters"], json.loads(fc.arguments))
        assert [t.name for t in r.tools] == ["get_weather", "get_time"] and r.tools[0].type == "function"
        assert r.parallel_tool_calls is False
        assert (r.tool_choice == "required") if choice == "required" else (r.tool_choice.name == "get_weather")
    both = greedy(client, input="What is the weather in Paris and in Rome?", tools=[WEATHER_TOOL], tool_choice="required",
                  max_output_tokens=120, store=False)
    calls = calls_of(both)
    assert calls and both.parallel_tool_calls is True
    assert len({c.id for c in calls}) == len({c.call_id for c in calls}) == len(calls)
    for c in calls:
        validate(WEATHER_TOOL["parameters"], json.loads(c.arguments))
    none = greedy(client, input="What is the weather in Paris?", tools=[WEATHER_TOOL], tool_choice="none",
                  max_output_tokens=30, store=False)
    assert calls_of(none) == [] and none.output_text and none.tool_choice == "none"


def test_streamed_function_call_equals_the_non_streamed_one(client):
    """A streamed call: output_item.added (function_call), arguments deltas, arguments.done,
    output_item.done, in order; the arguments equal the non-streamed call's."""
    kwargs = dict(input="What is the weather in Rome?", tools=[WEATHER_TOOL, TIME_TOOL], max_output_tokens=100,
                  tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False, store=False)
    [want] = calls_of(greedy(client, **kwargs))
    events = list(greedy(client, stream=True, **kwargs))
    types = [e.type for e in events]
    n = types.count("response.function_call_arguments.delta")
    assert n >= 1 and types == (["response.created", "response.in_progress", "response.output_item.added"]
                                + ["response.function_call_arguments.delta"] * n
                                + ["response.function_call_arguments.done", "response.output_item.done",
                                   "response.completed"])
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, done, item_done, last = events[2], events[-3], events[-2], events[-1]
    assert added.item.type == "function_call" and added.item.name == "get_weather" and added.item.id.startswith("fc_")
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert {e.item_id for e in deltas + [done]} == {added.item.id}
    arguments = "".join(e.delta for e in deltas)
    assert arguments == done.arguments == item_done.item.arguments == want.arguments
    assert item_done.item.call_id == added.item.call_id and item_done.item.status == "completed"
    [final] = calls_of(last.response)
    assert (final.name, final.arguments, final.call_id) == ("get_weather", want.arguments, added.item.call_id)


def test_tool_round_trip_by_items_and_by_previous_response_id(client):
    """The call's output sent back with the whole history as items, or with previous_response_id
    and only the output item: both complete with a message, the same greedy text and prompt,
    which is also chat's for the same tool history; the continuation lists only its own input."""
    user = {"role": "user", "content": "What is the weather in Paris?"}
    first = greedy(client, input=[user], tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False,
                   max_output_tokens=100)
    [fc] = calls_of(first)
    result = {"type": "function_call_output", "call_id": fc.call_id, "output": "18 degrees and sunny"}
    by_items = greedy(client, input=[user, fc, result], tools=[WEATHER_TOOL], tool_choice="none", max_output_tokens=60,
                      store=False)
    by_id = greedy(client, previous_response_id=first.id, input=[result], tools=[WEATHER_TOOL], tool_choice="none",
                   max_output_tokens=60)
    for r in (by_items, by_id):
        assert r.status == "completed" and messages_of(r) and not calls_of(r) and r.output_text, r
    assert by_id.output_text == by_items.output_text and by_id.usage.input_tokens == by_items.usage.input_tokens
    assert by_id.previous_response_id == first.id
    chat = chat_greedy(client, [user, {"role": "assistant", "content": None, "tool_calls": [
        {"id": fc.call_id, "type": "function", "function": {"name": fc.name, "arguments": fc.arguments}}]},
        {"role": "tool", "tool_call_id": fc.call_id, "content": result["output"]}], 60,
        tools=[chat_tool(WEATHER_TOOL)], tool_choice="none")
    assert by_items.output_text == chat.choices[0].message.content and by_items.usage.input_tokens == chat.usage.prompt_tokens
    [item] = client.responses.input_items.list(by_id.id).data
    assert item.type == "function_call_output" and item.call_id == fc.call_id and item.output == result["output"]


# ---------------------------------------------------------------------------------------------
# The store

def test_stored_response_is_retrieved_listed_and_deleted(server, client):
    """store defaults to true: retrieve gives the same object, input_items lists the request's
    items newest first (asc: oldest first), delete removes it: 404 after, and for a second delete."""
    history = [{"role": "user", "content": "My name is Adä 🙂, née 日本."}, {"role": "assistant", "content": "Hello Adä."},
               {"role": "user", "content": "What is my name?"}]
    r = greedy(client, input=history, instructions="Be brief.", max_output_tokens=20, metadata={"case": "store"})
    assert r.store is True
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    items = client.responses.input_items.list(r.id).data
    assert [(i.type, i.role, text_of(i)) for i in items] == [("message", h["role"], h["content"]) for h in history[::-1]]
    assert all(i.id for i in items) and len({i.id for i in items}) == 3
    asc = client.responses.input_items.list(r.id, order="asc").data
    assert [i.id for i in asc] == [i.id for i in items[::-1]]
    status, _, raw = server.get(f"{R}/{r.id}/input_items")
    listed = json.loads(raw)
    assert status == 200 and listed["object"] == "list" and listed["has_more"] is False
    assert (listed["first_id"], listed["last_id"]) == (items[0].id, items[-1].id)
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(r.id)
    assert r.id in e.value.body["message"] and e.value.status_code == 404
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(r.id)
    check_error(*call(server, "GET", f"{R}/{r.id}")[::2], 404)
    other = greedy(client, input="Hi.", max_output_tokens=16)
    status, _, raw = call(server, "DELETE", f"{R}/{other.id}")
    assert status == 200 and json.loads(raw) == {"id": other.id, "object": "response", "deleted": True}
    err = check_error(*server.get(f"{R}/resp_doesnotexist")[::2], 404)
    assert "resp_doesnotexist" in err["message"]


def test_concurrent_responses_are_each_stored_whole(client):
    """Sixteen responses at once: each retrieves as created and lists its own input."""
    def run(i):
        return i, greedy(client, input=f"Request {i}: name the number {i * 7 % 13}.", max_output_tokens=16)

    with ThreadPoolExecutor(16) as pool:
        done = list(pool.map(run, range(16)))
    assert len({r.id for _, r in done}) == 16
    for i, r in done:
        assert client.responses.retrieve(r.id).model_dump() == r.model_dump()
        [item] = client.responses.input_items.list(r.id).data
        assert text_of(item) == f"Request {i}: name the number {i * 7 % 13}."


def test_input_items_pages_with_limit_after_and_order(server, client):
    """limit defaults to 20 with has_more; limit and after page through the items (the client's
    auto-pagination sees every item once); a bad limit or order is a 400."""
    inputs = [{"role": "user", "content": f"Item number {i}."} for i in range(25)]
    r = greedy(client, input=inputs, max_output_tokens=16)
    first = client.responses.input_items.list(r.id)
    assert len(first.data) == 20 and first.has_more is True
    assert [text_of(i) for i in first.data] == [m["content"] for m in inputs[::-1][:20]]
    every = [text_of(i) for i in client.responses.input_items.list(r.id, order="asc", limit=7)]
    assert every == [m["content"] for m in inputs]
    asc = client.responses.input_items.list(r.id, order="asc", limit=100)
    assert len(asc.data) == 25 and asc.has_more is False
    page = client.responses.input_items.list(r.id, order="asc", limit=3, after=asc.data[4].id)
    assert [i.id for i in page.data] == [i.id for i in asc.data[5:8]] and page.has_more is True
    last = client.responses.input_items.list(r.id, order="asc", limit=3, after=asc.data[23].id)
    assert [i.id for i in last.data] == [asc.data[24].id] and last.has_more is False
    desc = client.responses.input_items.list(r.id, limit=2, after=asc.data[10].id)
    assert [i.id for i in desc.data] == [asc.data[9].id, asc.data[8].id]
    for query, param in [("limit=0", "limit"), ("limit=101", "limit"), ("limit=abc", "limit"), ("order=sideways", "order")]:
        check_error(*server.get(f"{R}/{r.id}/input_items?{query}")[::2], 400, param)


def test_unstored_and_unknown_responses(client):
    """store=false: nothing to retrieve (404) nor to continue; an unknown or deleted
    previous_response_id is a 400 naming the field."""
    r = greedy(client, input="Hi.", max_output_tokens=16, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    deleted = greedy(client, input="Hi.", max_output_tokens=16)
    client.responses.delete(deleted.id)
    for previous in ("resp_doesnotexist", r.id, deleted.id):
        with pytest.raises(openai.BadRequestError) as e:
            greedy(client, input="Hi.", max_output_tokens=16, previous_response_id=previous)
        assert e.value.body["param"] == "previous_response_id", e.value.body


def test_previous_response_id_renders_the_history_and_hits_the_prefix_cache(client):
    """Continuing a stored conversation reuses its cached blocks (at least every full block of the
    first prompt that lay outside the default 96-token bf16 window, whose blocks are cached only
    once they are final in FP8) and renders the whole history, two turns deep, without the earlier
    instructions (as OpenAI): the same text and prompt as sending it all as items."""
    # A uuid first, so no earlier request shares it.
    opening = (f"[{uuid.uuid4().hex}] Tell me a short story about a lighthouse keeper who watches the ships, "
               "counts the gulls, mends the lamp, writes letters to a sister inland and waits for the winter "
               "storms to pass over the rocks of the northern cape. In the spring the keeper paints the tower white, "
               "trades fish for bread with the boatmen of the harbour town and reads old almanacs by the fire.")
    first = greedy(client, input=opening, max_output_tokens=30)
    window = 96  # --kv-bf16-window's default (config/config.hpp)
    assert first.usage.input_tokens >= window + 16, first.usage  # at least one block outside the window
    follow = {"role": "user", "content": "Now give the keeper a name."}
    cont = greedy(client, previous_response_id=first.id, input=[follow], max_output_tokens=30)
    cached = cont.usage.input_tokens_details.cached_tokens
    assert cached >= 16 * ((first.usage.input_tokens - window) // 16), (cont.usage, first.usage)
    assert cached > 0 and cached % 16 == 0
    assert client.responses.retrieve(cont.id).previous_response_id == first.id
    # The openai docs' idiom: the previous output items go back as input as they came.
    whole = greedy(client, input=[{"role": "user", "content": opening}, *first.output, follow], max_output_tokens=30,
                   store=False)
    assert whole.output_text == cont.output_text and whole.usage.input_tokens == cont.usage.input_tokens
    # A third turn on the second, the second started with instructions that the third does not inherit.
    last = {"role": "user", "content": "Give the story a title."}
    briefed = greedy(client, previous_response_id=first.id, input=[follow], instructions="Answer in one line.",
                     max_output_tokens=30)
    third = greedy(client, previous_response_id=briefed.id, input=[last], max_output_tokens=20)
    whole = greedy(client, input=[{"role": "user", "content": opening}, *first.output, follow, *briefed.output, last],
                   max_output_tokens=20, store=False)
    assert whole.output_text == third.output_text and whole.usage.input_tokens == third.usage.input_tokens


def test_store_caps_keep_the_newest_entries_and_the_ttl_forgets(tmp_path):
    """--responses-store-max-entries 2: after three responses the first is gone and the last two
    are retrievable; --responses-store-ttl: after it, they are gone too."""
    ttl = 3
    s = Server(TINY_QWEN3, "--kv-cache-memory", 4_000_000, "--served-model-name", "tiny",
               "--responses-store-max-entries", 2, "--responses-store-ttl", ttl, "--responses-store-max-bytes", 1_000_000,
               tmp_path=tmp_path)
    try:
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=60)
        ids = [c.responses.create(model="tiny", input=f"hello {i}", max_output_tokens=16, temperature=0).id
               for i in range(3)]
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(ids[0])
        assert [c.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
        # A fixed wait, not a poll: polling would touch the entries, which a TTL may count from.
        time.sleep(ttl + 1.5)
        for i in ids[1:]:
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(i)
        assert s.wait_kv_idle() == 0
    finally:
        assert s.stop() == 0, s.log_text()


# ---------------------------------------------------------------------------------------------
# Refused, ignored and bad fields

USER = [{"role": "user", "content": "Hi."}]
IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
FILE = {"type": "input_file", "file_id": "file-123"}

# (name, extra fields, code, param; a param ending in '*' is a prefix)
REFUSED = [
    ("background", {"background": True}, "unsupported_parameter", "background"),
    ("conversation id", {"conversation": "conv_123"}, "unsupported_parameter", "conversation"),
    ("conversation object", {"conversation": {"id": "conv_123"}}, "unsupported_parameter", "conversation"),
    ("reasoning effort", {"reasoning": {"effort": "low"}}, "unsupported_parameter", "reasoning*"),
    ("reasoning summary", {"reasoning": {"summary": "auto"}}, "unsupported_parameter", "reasoning*"),
    ("web_search tool", {"tools": [{"type": "web_search"}]}, "unsupported_parameter", "tools[0]"),
    ("file_search tool", {"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "unsupported_parameter",
     "tools[0]"),
    ("built-in tool second", {"tools": [WEATHER_TOOL, {"type": "code_interpreter", "container": {"type": "auto"}}]},
     "unsupported_parameter", "tools[1]"),
    ("include other", {"include": ["file_search_call.results"]}, "unsupported_parameter", "include*"),
    ("include encrypted reasoning", {"include": [LOGPROBS, "reasoning.encrypted_content"]}, "unsupported_parameter",
     "include*"),
    ("prompt template", {"prompt": {"id": "pmpt_123"}}, "unsupported_parameter", "prompt"),
    ("max_tool_calls", {"max_tool_calls": 3}, "unsupported_parameter", "max_tool_calls"),
    ("text verbosity", {"text": {"format": {"type": "text"}, "verbosity": "low"}}, "unsupported_parameter", "text*"),
    ("truncation auto", {"truncation": "auto"}, "unsupported_parameter", "truncation"),
    ("input_image", {"input": [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"}, IMAGE]}]},
     "unsupported_parameter", "input[0]*"),
    ("input_file", {"input": [*USER, {"role": "user", "content": [FILE]}]}, "unsupported_parameter", "input[1]*"),
    ("typo", {"temprature": 0}, "unknown_parameter", "temprature"),
    ("chat field", {"max_tokens": 5}, "unknown_parameter", "max_tokens"),
]


@pytest.mark.parametrize("name,fields,code,param", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_fields_are_a_400_naming_them(server, name, fields, code, param):
    status, headers, body = server.post(R, {"model": MODEL, "input": "Hi.", "max_output_tokens": 16, **fields})
    check_error(status, body, 400, param, code)
    assert len(headers.get("X-Request-Id", "")) == 16


IGNORED = [
    ("background false", {"background": False}),
    ("conversation null", {"conversation": None}),
    ("reasoning null", {"reasoning": None}),
    ("reasoning unset", {"reasoning": {"effort": None, "summary": None}}),
    ("max_tool_calls null", {"max_tool_calls": None}),
    ("verbosity null", {"text": {"format": {"type": "text"}, "verbosity": None}}),
    ("truncation disabled", {"truncation": "disabled"}),
    ("service_tier", {"service_tier": "auto"}),
    ("prompt_cache_key", {"prompt_cache_key": "key"}),
    ("safety_identifier", {"safety_identifier": "user-1"}),
    ("user", {"user": "alice"}),
    ("include logprobs only", {"include": [LOGPROBS]}),
    ("include empty", {"include": []}),
    ("store false", {"store": False}),
    ("stream_options on a stream", {"stream": True, "stream_options": {"include_obfuscation": False}}),
]


@pytest.mark.parametrize("name,fields", IGNORED, ids=[c[0] for c in IGNORED])
def test_accepted_and_ignored_fields(server, name, fields):
    status, _, body = server.post(R, {"model": MODEL, "input": "Hi.", "max_output_tokens": 16, "temperature": 0, **fields})
    assert status == 200, body[:500]


# (name, body (dict / str / bytes), status, param or None; a param ending in '*' is a prefix)
BAD = [
    ("malformed JSON", "{", 400, None),
    ("truncated JSON", '{"model": "x", "input": "hi"', 400, None),
    ("array body", "[1, 2]", 400, None),
    ("deeply nested JSON", '{"input": "hi", "a": ' + "[" * 100000 + "]" * 100000 + "}", 400, None),
    ("invalid UTF-8", b'{"input": "\xff\xfe\xfd"}', 400, None),
    ("input missing", {}, 400, "input"),
    ("input number", {"input": 5}, 400, "input"),
    ("input number streamed", {"input": 5, "stream": True}, 400, "input"),
    ("input empty list", {"input": []}, 400, "input"),
    ("input object", {"input": {"role": "user", "content": "hi"}}, 400, "input"),
    ("item_reference", {"input": [{"type": "item_reference", "id": "msg_123"}]}, 400, "input[0]*"),
    ("bogus item", {"input": [{"type": "bogus"}]}, 400, "input[0]*"),
    ("bogus second item", {"input": [*USER, {"type": "bogus"}]}, 400, "input[1]*"),
    ("unknown role", {"input": [{"role": "wizard", "content": "x"}]}, 400, "input[0]*"),
    ("content number", {"input": [{"role": "user", "content": 5}]}, 400, "input[0]*"),
    ("bad content part", {"input": [{"role": "user", "content": [{"type": "bogus_part", "text": "x"}]}]}, 400, "input[0]*"),
    ("function_call_output without call_id", {"input": [{"type": "function_call_output", "output": "x"}]}, 400,
     "input*"),
    ("function_call without name", {"input": [{"type": "function_call", "call_id": "c1", "arguments": "{}"}]}, 400,
     "input*"),
    ("max_output_tokens 0", {"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ("max_output_tokens string", {"input": "hi", "max_output_tokens": "8"}, 400, "max_output_tokens"),
    ("temperature huge", {"input": "hi", "temperature": 3}, 400, "temperature"),
    ("top_p zero", {"input": "hi", "top_p": 0}, 400, "top_p"),
    ("top_k below -1", {"input": "hi", "top_k": -5}, 400, "top_k"),
    ("top_logprobs 21", {"input": "hi", "include": [LOGPROBS], "top_logprobs": 21}, 400, "top_logprobs"),
    ("top_logprobs negative", {"input": "hi", "include": [LOGPROBS], "top_logprobs": -1}, 400, "top_logprobs"),
    ("tool_choice unknown", {"input": "hi", "tools": [WEATHER_TOOL], "tool_choice": "sometimes"}, 400, "tool_choice*"),
    ("tool_choice names no tool", {"input": "hi", "tools": [WEATHER_TOOL],
                                   "tool_choice": {"type": "function", "name": "nope"}}, 400, "tool_choice*"),
    ("function tool without name", {"input": "hi", "tools": [{"type": "function", "parameters": {}}]}, 400, "tools[0]*"),
    ("chat-shaped tool", {"input": "hi", "tools": [chat_tool(WEATHER_TOOL)]}, 400, "tools[0]*"),
    ("text format yaml", {"input": "hi", "text": {"format": {"type": "yaml"}}}, 400, "text*"),
    ("json_schema without schema", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, 400,
     "text*"),
    ("metadata number", {"input": "hi", "metadata": 5}, 400, "metadata"),
    ("metadata value number", {"input": "hi", "metadata": {"k": 1}}, 400, "metadata*"),
    ("metadata 17 keys", {"input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata*"),
    ("store string", {"input": "hi", "store": "yes"}, 400, "store"),
    ("stream string", {"input": "hi", "stream": "yes"}, 400, "stream"),
    ("previous_response_id number", {"input": "hi", "previous_response_id": 5}, 400, "previous_response_id"),
    ("instructions number", {"input": "hi", "instructions": 5}, 400, "instructions"),
    ("unknown model", {"input": "hi", "model": "gpt-17"}, 404, None),
]


@pytest.mark.parametrize("name,body,status,param", BAD, ids=[c[0] for c in BAD])
def test_bad_request_is_an_openai_error(server, name, body, status, param):
    if isinstance(body, dict):
        body = {"model": MODEL, **body}
    got, headers, text = server.post(R, body)
    check_error(got, text, status, param)
    assert len(headers.get("X-Request-Id", "")) == 16


def test_input_longer_than_the_context_is_context_length_exceeded(server, client):
    """A prompt past --max-model-len: 400 context_length_exceeded, as a string or as items."""
    for value in ["word " * 3000, [{"role": "user", "content": "word " * 1500}, {"role": "user", "content": "word " * 1500}]]:
        status, _, body = server.post(R, {"model": MODEL, "input": value})
        check_error(status, body, 400, code="context_length_exceeded")
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="word " * 3000)
    assert e.value.body["code"] == "context_length_exceeded"


def test_wrong_method_is_a_405(server):
    """Each Responses path answers 405 to a method it does not serve."""
    for method, path in [("GET", R), ("PUT", R), ("DELETE", R), ("POST", f"{R}/resp_x"), ("PUT", f"{R}/resp_x"),
                         ("PATCH", f"{R}/resp_x"), ("POST", f"{R}/resp_x/input_items"),
                         ("DELETE", f"{R}/resp_x/input_items")]:
        body = {} if method in ("POST", "PUT", "PATCH") else None
        status, _, text = call(server, method, path, body)
        assert status == 405, (method, path, status, text[:300])
        check_error(status, text, 405)


# ---------------------------------------------------------------------------------------------
# Hostile clients

def test_100000_input_items_are_a_400_and_the_server_serves_on(server, client):
    """An input list of 100000 messages (3 MB) is refused naming input; the next request works."""
    body = json.dumps({"model": MODEL, "input": [{"role": "user", "content": "x"}] * 100_000}, separators=(",", ":"))
    start = time.time()
    status, _, text = server.post(R, body)
    check_error(status, text, 400, "input")
    assert time.time() - start < 20
    r = greedy(client, input="Still there?", max_output_tokens=16, store=False)
    assert r.output_text and server.alive()
    assert server.wait_kv_idle() == 0


LONG_PROMPTS = ["List every prime number below 1000, separated by commas.",
                "Write a very long story about a dragon who loves maps.",
                "Write a very long poem about the winter sea.",
                "Explain in great detail how a steam engine works, step by step."]


def drop_mid_stream(port, prompt, ids):
    # Closed long before 1500 tokens.
    seen = read_then_drop(port, R, {"model": MODEL, "input": prompt, "max_output_tokens": 1500, "stream": True},
                          b'"response.output_text.delta"', 3)
    ids.append(json.loads(seen.split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"]["id"])


def test_clients_dropping_mid_stream_give_back_every_kv_block(server, client):
    """Four streams dropped after three deltas each: all four aborted, none stored, every KV
    block back, and the server keeps serving."""
    before = server.metrics().get(ABORTED, 0)
    ids = []
    with ThreadPoolExecutor(len(LONG_PROMPTS)) as pool:  # a failed read fails the test
        list(pool.map(lambda p: drop_mid_stream(server.port, p, ids), LONG_PROMPTS))
    assert server.wait_kv_idle(timeout=30) == 0
    m = server.metrics()
    assert m[ABORTED] - before == len(LONG_PROMPTS)
    assert m["fp8serve:num_requests_running"] == 0
    assert len(ids) == len(LONG_PROMPTS)
    for i in ids:
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(i)
    r = greedy(client, input="After the storm, say hi.", max_output_tokens=16, store=False)
    assert r.output_text and r.usage.output_tokens > 0
