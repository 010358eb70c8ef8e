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


CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def mirrored_continue(template, chat, render):
    """transformers' continue_final_message on a plain jinja2 render: tag the final message's
    text, render, cut the prompt at the tag (render_jinja_template, transformers 5.24.0)."""
    if not chat:
        raise ValueError("empty conversation")
    final = chat[-1].get("content")
    if final is None or "content" not in template:
        raise ValueError("nothing to continue")
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                final = block["text"]
                block["text"] = block["text"] + CONTINUE_TAG
                break
        else:
            raise ValueError("no text to continue")
    else:
        chat[-1]["content"] = final + CONTINUE_TAG
    rendered = render(chat)
    if final.strip() not in rendered or CONTINUE_TAG.strip() not in rendered:
        raise ValueError("the final message does not appear in the rendered chat")
    loc = rendered.rindex(CONTINUE_TAG.strip())
    return rendered[:loc] if rendered[loc:loc + len(CONTINUE_TAG)] == CONTINUE_TAG else rendered[:loc].rstrip()


def render_both(template, messages, tools, add_generation_prompt, extra, continue_final_message=False):
    """Returns ("ok", text) or ("raised", message) or ("error", type name)."""
    outcomes = []
    extra = dict(extra)
    documents = extra.pop("documents", None)
    # 1. transformers
    try:
        chat = ctu._normalize_chat_messages(messages)
        rendered, _ = ctu.render_jinja_template(
            conversations=[chat], tools=tools, documents=documents, chat_template=template,
            add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message, **extra)
        outcomes.append(("ok", rendered[0]))
    except jinja2.exceptions.TemplateError as e:
        outcomes.append(("raised", str(e)) if type(e) is jinja2.exceptions.TemplateError else ("error", type(e).__name__))
    except Exception as e:  # noqa: BLE001 - any failure is an expected error for the C++ side
        outcomes.append(("error", type(e).__name__))
    # 2. plain jinja2 with the same inputs transformers passes
    try:
        chat = ctu._alias_reasoning_fields(ctu._plain_template_data(ctu._normalize_chat_messages(messages)))

        def render(chat):
            ctx = dict(messages=chat, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt, **extra)
            return mirrored_env().from_string(template).render(**ctx)

        outcomes.append(("ok", mirrored_continue(template, chat, render) if continue_final_message else render(chat)))
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

DESCRIBED_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city — ☀️",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "unit": {"type": "string", "description": "Temperature unit", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "What to look for"},
            "limit": {"type": "integer", "description": "How many results", "default": 5}}, "required": ["query"]}}},
]


def tool_call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def base_conversations(with_issue13_conversations=False):
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
    if with_issue13_conversations:
        convs["trailing_space_assistant"] = [u("Count to three."), a("One, two, ")]
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
    # Added for issue 13 (real templates no one here wrote; see SOURCES.md). Special tokens as
    # each model's tokenizer_config.json declares them.
    "seed_oss": {"bos_token": "<seed:bos>", "eos_token": "<seed:eos>", "pad_token": "<seed:pad>"},
    "command_r_plus_tool_use": {"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"},
    "command_r7b_tool_use": {"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"},
    "mistral_small_3_2": {"bos_token": "<s>", "eos_token": "</s>"},
    "nemotron_nano_v2": {"bos_token": "<SPECIAL_10>", "eos_token": "<SPECIAL_12>"},
    "hermes_3_tool_use": {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"},
    "qwq_32b": {"bos_token": None, "eos_token": "<|im_end|>"},
    "deepseek_r1_distill": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "deepseek_v3_1": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "firefunction_v2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "gemma_2": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "granite_3_3": {"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>"},
    "functionary_v3_1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "functionary_v3_2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "phi_3_5": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "mistral_nemo": {"bos_token": "<s>", "eos_token": "</s>"},
    "kimi_k2": {"bos_token": "[BOS]", "eos_token": "[EOS]"},
    "gpt_oss": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"},
    "devstral_small": {"bos_token": "<s>", "eos_token": "</s>"},
}

# The first seven templates; their fixtures stay exactly as they were generated.
ORIGINAL_TEMPLATES = {"smollm2", "qwen2_5", "qwen3", "llama3_1", "llama3_2", "zephyr", "mistral_v0_2"}
# Templates that render a tools list, and those that render RAG documents.
TOOL_TEMPLATES = {"qwen2_5", "qwen3", "llama3_1", "llama3_2", "seed_oss", "command_r_plus_tool_use", "command_r7b_tool_use",
                  "mistral_small_3_2", "nemotron_nano_v2", "hermes_3_tool_use", "qwq_32b", "firefunction_v2",
                  "granite_3_3", "functionary_v3_1", "functionary_v3_2", "mistral_nemo", "kimi_k2", "gpt_oss",
                  "devstral_small"}
DOCUMENT_TEMPLATES = {"command_r7b_tool_use", "granite_3_3"}
# continue_final_message (vLLM's field, transformers' semantics) on the templates added for issue 13.
CONTINUE_TEMPLATES = set(TOOL_TEMPLATES | {"deepseek_r1_distill", "deepseek_v3_1", "gemma_2", "phi_3_5"}) - {
    "qwen2_5", "qwen3", "llama3_1", "llama3_2"}
CONTINUE_CONVERSATIONS = {"ends_with_assistant", "newlines_and_padding", "unicode", "think_in_content",
                          "tool_call_dict_args", "single_user", "empty_user", "none_content", "list_content",
                          "trailing_space_assistant"}
DOCUMENTS = [{"title": "Zürich weather", "text": "Sunny, 21 °C."}, {"title": "Rome", "text": "Rain\nall day"}]


def variants(name):
    """(case suffix, tools, extra kwargs) combinations to render each conversation with."""
    base = {}
    if name == "firefunction_v2":  # its template reads the tools from `functions` and the date from `datetime`
        base = {"functions": json.dumps([t["function"] for t in DESCRIBED_TOOLS], ensure_ascii=False), "datetime": "2025-03-07"}
    out = [("", None, dict(base))]
    if name in TOOL_TEMPLATES:
        # Command R's tool parser prints every parameter's description: the added templates get
        # tools whose parameters all have one.
        out.append(("tools", DESCRIBED_TOOLS if name not in ORIGINAL_TEMPLATES else [WEATHER_TOOL, SEARCH_TOOL], dict(base)))
    if name in DOCUMENT_TEMPLATES:
        out.append(("documents", None, {**base, "documents": DOCUMENTS}))
    if name == "nemotron_nano_v2":
        out.append(("no_think", None, {**base, "enable_thinking": False}))
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
    for name, template in sources.items():
        convs = base_conversations(with_issue13_conversations=name not in ORIGINAL_TEMPLATES)
        cases = []
        for conv_name, messages in convs.items():
            runs = [(suffix, tools, kwargs, agp, False) for suffix, tools, kwargs in variants(name) for agp in (True, False)
                    if not (suffix and conv_name.startswith("random_"))]
            if conv_name in CONTINUE_CONVERSATIONS and name in CONTINUE_TEMPLATES:
                runs.append(("continue", None, variants(name)[0][2], False, True))
            for suffix, tools, kwargs, agp, cont in runs:
                extra = {k: v for k, v in SPECIAL[name].items()}
                extra.update(kwargs)
                status, payload = render_both(template, messages, tools, agp, extra, cont)
                case = {"name": f"{conv_name}{'/' + suffix if suffix else ''}/{'gen' if agp else 'nogen'}",
                        "messages": messages, "tools": tools, "add_generation_prompt": agp, "extra": extra}
                if cont:
                    case["continue_final_message"] = True
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


def render_feature(template, context, error_messages=False):
    """("ok", text) | ("raised", message) | ("syntax", None) | ("error", None), or with
    error_messages ("error", "TypeError: 'NoneType' object is not iterable")."""
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
        return ("error", f"{type(e).__name__}: {e}" if error_messages else None)
    except Exception as e:  # noqa: BLE001
        return ("error", f"{type(e).__name__}: {e}" if error_messages else None)


def write_features(file_name, feature_cases, error_messages=False):
    """error_messages: also record the message of errors other than raise_exception (str(e) of
    the Python exception), which the C++ test then compares exactly."""
    cases = []
    for name, template, context in feature_cases:
        status, payload = render_feature(template, context, error_messages)
        case = {"name": name, "template": template, "context": context}
        if status == "ok":
            case["expected"] = payload
        else:
            case["error"] = status
            if payload is not None:  # raise_exception's message, or (error_messages) the exception
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
    write_features("falsy.cases.json", features.falsy_cases(), error_messages=True)
    if "--features-only" not in sys.argv:
        main()
