#!/usr/bin/env python3
"""Generates tests/fixtures/chat_templates/<name>.cases.json: conversations and the prompt each
chat template renders for them, as transformers' apply_chat_template renders it.

Every case is rendered twice and the two must agree byte for byte:
  1. by transformers' own render_jinja_template (the code apply_chat_template runs), after
     transformers' message normalisation (_normalize_chat_messages), and
  2. by a plain jinja2 ImmutableSandboxedEnvironment set up as transformers sets it up
     (trim_blocks, lstrip_blocks, loopcontrols, tojson(ensure_ascii=False), raise_exception,
     strftime_now, namespace, dict).
strftime_now is pinned to FIXED_NOW so the fixtures are deterministic; the C++ test passes the
same time. A case that makes the template raise records the error instead of a prompt.

Usage: /work/refvenv/venv/bin/python tests/scripts/make_chat_template_fixtures.py
Versions used: see tests/scripts/requirements-reference.txt (jinja2, transformers, gguf).
"""
import datetime
import json
import os
import random
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

import transformers
import transformers.utils.chat_template_utils as ctu

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "chat_templates")
GGUF = os.path.join(ROOT, ".models", "SmolLM2-135M-Instruct.Q4_1.gguf")
FIXED_NOW = datetime.datetime(2025, 3, 7, 14, 5, 9)


class FixedDateTime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


ctu.datetime = FixedDateTime  # transformers' strftime_now calls datetime.now()


def mirrored_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: FIXED_NOW.strftime(fmt)
    env.globals["dict"] = dict
    env.globals["namespace"] = jinja2.utils.Namespace
    return env


def render_both(template, messages, tools, add_generation_prompt, extra):
    """Returns ("ok", text) or ("raised", message) or ("error", type name)."""
    outcomes = []
    # 1. transformers
    try:
        chat = ctu._normalize_chat_messages(messages)
        rendered, _ = ctu.render_jinja_template(
            conversations=[chat], tools=tools, chat_template=template,
            add_generation_prompt=add_generation_prompt, **extra)
        outcomes.append(("ok", rendered[0]))
    except jinja2.exceptions.TemplateError as e:
        outcomes.append(("raised", str(e)) if type(e) is jinja2.exceptions.TemplateError else ("error", type(e).__name__))
    except Exception as e:  # noqa: BLE001 - any failure is an expected error for the C++ side
        outcomes.append(("error", type(e).__name__))
    # 2. plain jinja2 with the same inputs transformers passes
    try:
        chat = ctu._alias_reasoning_fields(ctu._plain_template_data(ctu._normalize_chat_messages(messages)))
        ctx = dict(messages=chat, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **extra)
        outcomes.append(("ok", mirrored_env().from_string(template).render(**ctx)))
    except jinja2.exceptions.TemplateError as e:
        outcomes.append(("raised", str(e)) if type(e) is jinja2.exceptions.TemplateError else ("error", type(e).__name__))
    except Exception as e:  # noqa: BLE001
        outcomes.append(("error", type(e).__name__))
    if outcomes[0] != outcomes[1]:
        sys.exit(f"transformers and jinja2 disagree: {outcomes}")
    return outcomes[0]


# ---- conversations ----

TRICKY = [
    "Hello!", "", " ", "  padded  ", "line one\nline two\n", "\n\nleading newlines",
    "Ünïcödé — ñ, 日本語のテキスト, 中文, العربية, emoji 😀🚀", "quotes ' \" and \\ backslash \\n not a newline",
    "{{ not_a_tag }} {% if %} {# c #}", "<|im_end|><|eot_id|></s>[INST]", "tab\tseparated\tvalues",
    "x" * 3000, "JSON {\"a\": [1, 2.5, null, true]}", "trailing spaces   \n  ", "\u2028line sep\u2029para",
]


def u(content):
    return {"role": "user", "content": content}


def a(content):
    return {"role": "assistant", "content": content}


def s(content):
    return {"role": "system", "content": content}


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city — ☀️",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "default": 5}},
                   "required": ["query"]}}}


def tool_call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def base_conversations():
    convs = {
        "single_user": [u("Hello, who are you?")],
        "system_user": [s("You are a helpful assistant."), u("What is 2+2?")],
        "multi_turn": [s("Be brief."), u("Hi"), a("Hello! How can I help?"), u("Tell me a joke."),
                       a("Why did the chicken cross the road?"), u("Why?")],
        "no_system_multi_turn": [u("First question"), a("First answer"), u("Second question")],
        "empty_user": [u("")],
        "empty_system": [s(""), u("hi")],
        "whitespace_content": [u("   \n\t  ")],
        "unicode": [s("Réponds en français, s'il te plaît."), u(TRICKY[6]), a("はい 👍"), u("Ελληνικά; Русский?")],
        "newlines_and_padding": [u(TRICKY[3]), a(TRICKY[4]), u(TRICKY[5])],
        "jinja_lookalike": [u(TRICKY[8])],
        "special_tokens_in_content": [u(TRICKY[9])],
        "quotes_backslashes": [u(TRICKY[7])],
        "long_content": [u(TRICKY[11])],
        "line_separators": [u(TRICKY[14])],
        "ends_with_assistant": [u("Finish this: once upon a"), a("time, there was")],
        "assistant_first": [a("I start."), u("ok")],
        "consecutive_users": [u("one"), u("two")],
        "system_only": [s("Only a system prompt.")],
        "empty_conversation": [],
        "capitalised_role": [{"role": "User", "content": "Hi"}],
        "unknown_role": [{"role": "developer", "content": "Follow the rules."}, u("Hi")],
        "extra_keys": [{"role": "user", "content": "Hi", "name": "alice", "id": 7}],
        "none_content": [u("Question"), {"role": "assistant", "content": None}],
        "missing_content": [{"role": "user"}],
        "integer_content": [u(42)],
        "list_content": [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "image"}]}],
        "two_systems": [s("first"), u("x"), s("second"), u("y")],
        "tool_call_dict_args": [u("Weather in Paris?"),
                                {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", {"city": "Paris", "unit": "celsius"})]},
                                {"role": "tool", "content": "{\"temp\": 21}"}, a("It is 21 °C.")],
        "tool_call_string_args": [u("Search cats"),
                                  {"role": "assistant", "content": None, "tool_calls": [tool_call("search", "{\"query\": \"cats\"}")]},
                                  {"role": "tool", "content": "cats are great"}],
        "two_tool_calls": [u("Weather in Paris and Rome?"),
                           {"role": "assistant", "content": "Checking.", "tool_calls": [
                               tool_call("get_weather", {"city": "Paris"}), tool_call("get_weather", {"city": "Rome"})]},
                           {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rain"}],
        "tool_content_dict": [u("x"), {"role": "tool", "content": {"ok": True, "n": 1.5}}],
        "reasoning_field": [u("2+2?"), {"role": "assistant", "content": "4", "reasoning_content": "Add two and two."}, u("3+3?")],
        "think_in_content": [u("2+2?"), a("<think>\nadd\n</think>\n\n4"), u("and 3+3?"), a("<think>add again</think>6")],
        "tool_response_as_user": [u("<tool_response>\nx\n</tool_response>")],
    }
    rng = random.Random(1234)
    for i in range(8):
        msgs = []
        if rng.random() < 0.5:
            msgs.append(s(rng.choice(TRICKY)))
        for turn in range(rng.randint(1, 4)):
            msgs.append(u(rng.choice(TRICKY)))
            if rng.random() < 0.8:
                msgs.append(a(rng.choice(TRICKY)))
        convs[f"random_{i}"] = msgs
    return convs


SPECIAL = {
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
    "qwen2_5": {"bos_token": None, "eos_token": "<|im_end|>"},
    "qwen3": {"bos_token": None, "eos_token": "<|im_end|>"},
    "llama3_1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3_2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "zephyr": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistral_v0_2": {"bos_token": "<s>", "eos_token": "</s>"},
}


def variants(name):
    """(case suffix, tools, extra kwargs) combinations to render each conversation with."""
    out = [("", None, {})]
    if name in ("qwen2_5", "qwen3", "llama3_1", "llama3_2"):
        out.append(("tools", [WEATHER_TOOL, SEARCH_TOOL], {}))
    if name == "qwen3":
        out.append(("no_think", None, {"enable_thinking": False}))
        out.append(("think", None, {"enable_thinking": True}))
    if name in ("llama3_1", "llama3_2"):
        out.append(("tools_in_system", [WEATHER_TOOL], {"tools_in_user_message": False}))
        out.append(("date", None, {"date_string": "01 Jan 2030"}))
    if name == "llama3_1":
        out.append(("builtin", [WEATHER_TOOL], {"builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"]}))
    return out


def main():
    sources = {}
    for fname in sorted(os.listdir(FIXTURES)):
        if fname.endswith(".jinja"):
            with open(os.path.join(FIXTURES, fname), encoding="utf-8", newline="") as f:
                sources[fname[:-6]] = f.read()
    if os.path.exists(GGUF):  # the committed SmolLM2 template must be the one the GGUF carries
        from gguf import GGUFReader
        field = GGUFReader(GGUF).fields["tokenizer.chat_template"]
        if bytes(field.parts[field.data[0]]).decode() != sources["smollm2"]:
            sys.exit("smollm2.jinja differs from the GGUF's tokenizer.chat_template")
    convs = base_conversations()
    for name, template in sources.items():
        cases = []
        for conv_name, messages in convs.items():
            for suffix, tools, kwargs in variants(name):
                if suffix and conv_name.startswith("random_"):
                    continue
                for agp in (True, False):
                    extra = {k: v for k, v in SPECIAL[name].items()}
                    extra.update(kwargs)
                    status, payload = render_both(template, messages, tools, agp, extra)
                    case = {"name": f"{conv_name}{'/' + suffix if suffix else ''}/{'gen' if agp else 'nogen'}",
                            "messages": messages, "tools": tools, "add_generation_prompt": agp, "extra": extra}
                    if status == "ok":
                        case["expected"] = payload
                    else:
                        case["error"] = status
                        if status == "raised":
                            case["message"] = payload
                    cases.append(case)
        doc = {"template": name + ".jinja", "now": FIXED_NOW.isoformat(),
               "generator": "tests/scripts/make_chat_template_fixtures.py",
               "versions": {"jinja2": jinja2.__version__, "transformers": transformers.__version__},
               "cases": cases}
        path = os.path.join(FIXTURES, name + ".cases.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_err = sum("error" in c for c in cases)
        print(f"{name}: {len(cases)} cases ({n_err} expected errors) -> {os.path.relpath(path, ROOT)} "
              f"{os.path.getsize(path)} bytes")


def render_feature(template, context):
    env = mirrored_env()
    try:
        compiled = env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError:
        return ("syntax", None)
    except (jinja2.exceptions.TemplateAssertionError, SyntaxError):  # 'break' outside a loop
        return ("syntax", None)
    try:
        return ("ok", compiled.render(**context))
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:
            return ("raised", str(e))
        return ("error", type(e).__name__)
    except Exception as e:  # noqa: BLE001
        return ("error", type(e).__name__)


def write_features(file_name, feature_cases):
    cases = []
    for name, template, context in feature_cases:
        status, payload = render_feature(template, context)
        case = {"name": name, "template": template, "context": context}
        if status == "ok":
            case["expected"] = payload
        else:
            case["error"] = status
            if status == "raised":
                case["message"] = payload
        cases.append(case)
    path = os.path.join(FIXTURES, file_name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"now": FIXED_NOW.isoformat(), "generator": "tests/scripts/make_chat_template_fixtures.py",
                   "versions": {"jinja2": jinja2.__version__}, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{file_name}: {len(cases)} cases -> {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import chat_template_feature_cases as features
    write_features("features.cases.json", features.CASES)
    write_features("random.cases.json", features.random_cases(1, 1500))
    if "--features-only" not in sys.argv:
        main()
