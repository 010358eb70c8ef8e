#include "server/api/request_features.hpp"

#include <algorithm>
#include <cstring>

#include "server/api/request_fields.hpp"

namespace fp8serve {

using api_detail::Json;
using api_detail::reject;
using api_detail::type_name;

namespace {

constexpr unsigned C = kCompletionField, H = kChatField, CH = kBothEndpoints;
constexpr FieldStatus OK = FieldStatus::supported, NO = FieldStatus::rejected, IGN = FieldStatus::ignored;
constexpr FieldType ANY = FieldType::any, BOOL = FieldType::boolean, NUM = FieldType::number, STR = FieldType::string,
                    OBJ = FieldType::object, ARR = FieldType::array;

// Ordered as docs/api.md shows it: OpenAI's fields, then vLLM's extensions.
const RequestFieldSpec kFields[] = {
    // --- OpenAI, both endpoints
    {"model", CH, OK, Refuse::never, STR, "OpenAI", "the served name (`GET /v1/models`); another name is a 404; may be omitted",
     R"("model": null)", R"("model": 3)"},
    {"max_tokens", CH, OK, Refuse::never, NUM, "OpenAI",
     "default: 16 (completions), the rest of the context (chat); 0 only with echo (the prompt scored, nothing generated)",
     R"("max_tokens": 4)", R"("max_tokens": 0)"},
    {"temperature", CH, OK, Refuse::never, NUM, "OpenAI", "[0, 2]; 0 is greedy", R"("temperature": 0)", R"("temperature": -1)"},
    {"top_p", CH, OK, Refuse::never, NUM, "OpenAI", "(0, 1]", R"("top_p": 0.5)", R"("top_p": 0)"},
    {"n", CH, OK, Refuse::never, NUM, "OpenAI", "[1, 16], at most --max-num-seqs", R"("n": 2)", R"("n": 0)"},
    {"seed", CH, OK, Refuse::never, NUM, "OpenAI", "any 64-bit integer; choice i draws from seed + i", R"("seed": 7)",
     R"("seed": 1.5)"},
    {"stop", CH, OK, Refuse::never, ANY, "OpenAI", "a string or up to 16 strings of at most 512 bytes", R"("stop": ["x"])",
     R"("stop": 5)"},
    {"stream", CH, OK, Refuse::never, BOOL, "OpenAI", "server-sent events ending with `data: [DONE]`", R"("stream": true)",
     R"("stream": "yes")"},
    {"stream_options", CH, OK, Refuse::never, OBJ, "OpenAI, vLLM",
     "`include_usage`; `include_obfuscation` is ignored (no obfuscation padding is sent); vLLM's "
     "`continuous_usage_stats: true` is rejected",
     R"("stream": true, "stream_options": {"include_usage": true})",
     R"("stream": true, "stream_options": {"continuous_usage_stats": true})"},
    {"frequency_penalty", CH, OK, Refuse::never, NUM, "OpenAI", "[-2, 2]", R"("frequency_penalty": 0.5)",
     R"("frequency_penalty": 3)"},
    {"presence_penalty", CH, OK, Refuse::never, NUM, "OpenAI", "[-2, 2]", R"("presence_penalty": 0.5)",
     R"("presence_penalty": 3)"},
    {"logit_bias", CH, OK, Refuse::never, OBJ, "OpenAI",
     "token id strings to values in [-100, 100], added to the logits before sampling (greedy too); at most 1024 entries",
     R"("logit_bias": {"1": -100})", R"("logit_bias": {"x": 1})"},
    {"best_of", CH, OK, Refuse::never, NUM, "OpenAI, vLLM",
     "integer >= n: generates best_of choices, returns the n with the highest cumulative logprob; not with stream "
     "when > n; usage counts every generated token",
     R"("n": 1, "best_of": 2)", R"("n": 2, "best_of": 1)"},
    {"user", CH, IGN, Refuse::never, STR, "OpenAI", "no per-user accounting or abuse monitoring here", R"("user": "u")",
     R"("user": 3)"},
    {"response_format", CH, OK, Refuse::custom, OBJ, "OpenAI, vLLM",
     "`text`, `json_object` and `json_schema` (`name`, `schema`, `strict`): grammar-constrained decoding, "
     "docs/structured-outputs.md; a schema keyword that is not enforced is a 400 naming it; `structural_tag` is rejected",
     R"("response_format": {"type": "json_object"})", R"("response_format": {"type": "xml"})"},
    // --- OpenAI, completions
    {"prompt", C, OK, Refuse::never, ANY, "OpenAI", "a string, strings, token ids, or lists of token ids (up to 64 prompts)",
     R"("prompt": "hello")", R"("prompt": 5)"},
    {"echo", C, OK, Refuse::never, BOOL, "OpenAI",
     "the prompt before the text; with logprobs, the prompt tokens' logprobs (the first is null) before the generated "
     "ones, computed in prefill through the FP8 cache (docs/api.md, \"Prompt logprobs\")",
     R"("echo": true, "logprobs": 1, "max_tokens": 0)", R"("echo": "yes")"},
    {"logprobs", C, OK, Refuse::never, NUM, "OpenAI", "[0, 20]: the chosen token's and the top N; raw model logprobs",
     R"("logprobs": 2)", R"("logprobs": 21)"},
    {"suffix", C, NO, Refuse::non_empty, STR, "OpenAI", "insertion (fill-in-the-middle) is not supported; \"\" is accepted",
     R"("suffix": "")", R"("suffix": "tail")"},
    // --- OpenAI, chat
    {"messages", H, OK, Refuse::never, ANY, "OpenAI", "string content or text parts; images and audio are rejected",
     R"("messages": [{"role": "user", "content": "hi"}])", R"("messages": [])"},
    {"max_completion_tokens", H, OK, Refuse::never, NUM, "OpenAI", "wins over max_tokens", R"("max_completion_tokens": 4)",
     R"("max_completion_tokens": 0)"},
    {"logprobs", H, OK, Refuse::never, BOOL, "OpenAI", "raw model logprobs of the chosen tokens", R"("logprobs": true)",
     R"("logprobs": 1)"},
    {"top_logprobs", H, OK, Refuse::never, NUM, "OpenAI", "[0, 20], needs logprobs: true",
     R"("logprobs": true, "top_logprobs": 2)", R"("top_logprobs": 2)"},
    {"tools", H, OK, Refuse::custom, ARR, "OpenAI, vLLM",
     "function tools, rendered by the chat template (or a system message when it ignores tools); the model's calls "
     "come back in `message.tool_calls` (docs/structured-outputs.md)",
     R"("tools": [{"type": "function", "function": {"name": "f"}}])", R"("tools": [{"type": "code_interpreter"}])"},
    {"tool_choice", H, OK, Refuse::custom, ANY, "OpenAI, vLLM",
     "`none`, `auto`, `required` and a named function; the last two constrain the answer to calls whose arguments "
     "satisfy the tool's parameters",
     R"("tools": )" "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]" R"(, "tool_choice": "required")",
     R"("tool_choice": "sometimes")"},
    {"parallel_tool_calls", H, OK, Refuse::never, BOOL, "OpenAI, vLLM",
     "default true; false: at most one call (required writes exactly one; with auto, only the first call written is returned)", R"("parallel_tool_calls": false)",
     R"("parallel_tool_calls": "x")"},
    {"functions", H, NO, Refuse::any_value, ARR, "OpenAI", "deprecated function calling is not supported",
     R"("functions": null)", R"("functions": [{"name": "f"}])"},
    {"function_call", H, NO, Refuse::custom, ANY, "OpenAI", "deprecated function calling is not supported; \"none\" is accepted",
     R"("function_call": "none")", R"("function_call": "auto")"},
    {"audio", H, NO, Refuse::any_value, OBJ, "OpenAI", "audio output is not supported", R"("audio": null)",
     R"("audio": {"voice": "alloy", "format": "wav"})"},
    {"modalities", H, NO, Refuse::custom, ARR, "OpenAI", "only `[\"text\"]` is accepted", R"("modalities": ["text"])",
     R"("modalities": ["text", "audio"])"},
    {"reasoning_effort", H, NO, Refuse::any_value, STR, "OpenAI, vLLM",
     "no reasoning-effort control; use chat_template_kwargs (e.g. enable_thinking) where the model's template has one",
     R"("reasoning_effort": null)", R"("reasoning_effort": "low")"},
    {"verbosity", H, NO, Refuse::any_value, STR, "OpenAI", "no verbosity control", R"("verbosity": null)",
     R"("verbosity": "low")"},
    {"web_search_options", H, NO, Refuse::any_value, OBJ, "OpenAI", "no web search", R"("web_search_options": null)",
     R"("web_search_options": {})"},
    {"moderation", H, NO, Refuse::any_value, OBJ, "OpenAI", "no moderation policies", R"("moderation": null)",
     R"("moderation": {"mode": "block"})"},
    {"store", H, NO, Refuse::true_value, BOOL, "OpenAI", "completions are never stored; false is accepted",
     R"("store": false)", R"("store": true)"},
    {"metadata", H, IGN, Refuse::never, OBJ, "OpenAI", "only meaningful for stored completions", R"("metadata": {"k": "v"})",
     R"("metadata": 5)"},
    {"service_tier", H, IGN, Refuse::never, STR, "OpenAI", "one tier here", R"("service_tier": "auto")",
     R"("service_tier": 5)"},
    {"prediction", H, IGN, Refuse::never, OBJ, "OpenAI", "predicted outputs only speed generation up; the output is the same",
     R"("prediction": {"type": "content", "content": "x"})", R"("prediction": 5)"},
    {"prompt_cache_key", H, IGN, Refuse::never, STR, "OpenAI", "prefix caching is automatic (--enable-prefix-caching)",
     R"("prompt_cache_key": "k")", R"("prompt_cache_key": 5)"},
    {"prompt_cache_options", H, IGN, Refuse::never, OBJ, "OpenAI", "prefix caching is automatic",
     R"("prompt_cache_options": {})", R"("prompt_cache_options": 5)"},
    {"prompt_cache_retention", H, IGN, Refuse::never, STR, "OpenAI", "cached blocks live until evicted (LRU)",
     R"("prompt_cache_retention": "24h")", R"("prompt_cache_retention": 5)"},
    {"safety_identifier", H, IGN, Refuse::never, STR, "OpenAI", "no abuse monitoring here", R"("safety_identifier": "s")",
     R"("safety_identifier": 5)"},
    // --- vLLM's sampling extensions, both endpoints
    {"top_k", CH, OK, Refuse::never, NUM, "vLLM", "-1 or 0: off", R"("top_k": 5)", R"("top_k": -2)"},
    {"min_p", CH, OK, Refuse::never, NUM, "vLLM", "[0, 1]", R"("min_p": 0.1)", R"("min_p": 2)"},
    {"repetition_penalty", CH, OK, Refuse::never, NUM, "vLLM", "(0, 2]", R"("repetition_penalty": 1.1)",
     R"("repetition_penalty": 0)"},
    {"stop_token_ids", CH, OK, Refuse::never, ARR, "vLLM", "besides the model's EOS ids", R"("stop_token_ids": [1])",
     R"("stop_token_ids": [-1])"},
    {"ignore_eos", CH, OK, Refuse::never, BOOL, "vLLM", "", R"("ignore_eos": true)", R"("ignore_eos": 1)"},
    {"skip_special_tokens", CH, OK, Refuse::never, BOOL, "vLLM", "default true", R"("skip_special_tokens": false)",
     R"("skip_special_tokens": "no")"},
    {"include_stop_str_in_output", CH, OK, Refuse::never, BOOL, "vLLM", "", R"("include_stop_str_in_output": true)",
     R"("include_stop_str_in_output": 1)"},
    {"truncate_prompt_tokens", CH, OK, Refuse::never, NUM, "vLLM", ">= 1: keep the prompt's last N tokens",
     R"("truncate_prompt_tokens": 2)", R"("truncate_prompt_tokens": 0)"},
    {"allowed_token_ids", CH, OK, Refuse::never, ARR, "vLLM", "sampling only among these ids", R"("allowed_token_ids": [1, 2])",
     R"("allowed_token_ids": [])"},
    {"add_special_tokens", CH, OK, Refuse::never, BOOL, "vLLM", "default true (completions), false (chat: the template adds them)",
     R"("add_special_tokens": true)", R"("add_special_tokens": 1)"},
    {"return_tokens_as_token_ids", CH, OK, Refuse::never, BOOL, "vLLM", "logprobs tokens as `token_id:N`",
     R"("return_tokens_as_token_ids": true)", R"("return_tokens_as_token_ids": 1)"},
    {"use_beam_search", CH, NO, Refuse::true_value, BOOL, "vLLM", "beam search is not supported", R"("use_beam_search": false)",
     R"("use_beam_search": true)"},
    {"length_penalty", CH, IGN, Refuse::never, NUM, "vLLM", "only used by beam search, which is rejected",
     R"("length_penalty": 1.0)", R"("length_penalty": "x")"},
    {"min_tokens", CH, OK, Refuse::never, NUM, "vLLM",
     "[0, max_tokens]: EOS and stop_token_ids are masked until that many tokens, and stop strings not looked for",
     R"("min_tokens": 2, "max_tokens": 4)", R"("min_tokens": 5, "max_tokens": 4)"},
    {"spaces_between_special_tokens", CH, IGN, Refuse::never, BOOL, "vLLM",
     "only slow Python tokenizers insert such spaces; these tokenizers decode as HF's fast ones do",
     R"("spaces_between_special_tokens": true)", R"("spaces_between_special_tokens": 1)"},
    {"prompt_logprobs", CH, OK, Refuse::never, NUM, "vLLM",
     "[0, 20]: per prompt token after the first, its logprob, rank and the top N, in vLLM's shape (completions: "
     "per choice; chat: top level); not with stream; computed in prefill with no prefix-cache hit",
     R"("prompt_logprobs": 1)", R"("prompt_logprobs": 21)"},
    {"bad_words", CH, NO, Refuse::non_empty, ARR, "vLLM", "banned words are not supported; [] is accepted",
     R"("bad_words": [])", R"("bad_words": ["x"])"},
    {"logits_processors", CH, NO, Refuse::any_value, ARR, "vLLM", "no custom logits processors", R"("logits_processors": null)",
     R"("logits_processors": ["m.P"])"},
    {"priority", CH, OK, Refuse::never, NUM, "vLLM",
     "an integer, lower runs first, with --scheduling-policy priority (else only 0: a 400 says why)", R"("priority": 0)",
     R"("priority": 1.5)"},
    {"request_id", CH, IGN, Refuse::never, STR, "vLLM", "the server assigns every request its own id (X-Request-Id)",
     R"("request_id": "abc")", R"("request_id": 5)"},
    {"cache_salt", CH, NO, Refuse::any_value, STR, "vLLM", "prefix-cache salting is not implemented",
     R"("cache_salt": null)", R"("cache_salt": "salt")"},
    {"kv_transfer_params", CH, NO, Refuse::any_value, OBJ, "vLLM", "no disaggregated serving", R"("kv_transfer_params": null)",
     R"("kv_transfer_params": {})"},
    {"vllm_xargs", CH, NO, Refuse::any_value, OBJ, "vLLM", "no custom extensions", R"("vllm_xargs": null)",
     R"("vllm_xargs": {"a": 1})"},
    {"guided_json", CH, NO, Refuse::any_value, ANY, "vLLM", "vLLM's guided decoding is not supported; use response_format json_schema",
     R"("guided_json": null)", R"("guided_json": {"type": "object"})"},
    {"guided_regex", CH, NO, Refuse::any_value, STR, "vLLM", "vLLM's guided decoding is not supported; use response_format json_schema (pattern)",
     R"("guided_regex": null)", R"("guided_regex": "a+")"},
    {"guided_choice", CH, NO, Refuse::any_value, ARR, "vLLM", "vLLM's guided decoding is not supported; use response_format json_schema (enum)",
     R"("guided_choice": null)", R"("guided_choice": ["a", "b"])"},
    {"guided_grammar", CH, NO, Refuse::any_value, STR, "vLLM", "grammars other than JSON Schema are not supported",
     R"("guided_grammar": null)", R"("guided_grammar": "root ::= \"a\"")"},
    {"structured_outputs", CH, NO, Refuse::any_value, OBJ, "vLLM", "vLLM's structured_outputs object is not supported; use response_format",
     R"("structured_outputs": null)", R"("structured_outputs": {"choice": ["a"]})"},
    {"guided_decoding_backend", CH, IGN, Refuse::never, STR, "vLLM", "only picks the backend of guided decoding; response_format has one backend",
     R"("guided_decoding_backend": "xgrammar")", R"("guided_decoding_backend": 5)"},
    {"guided_whitespace_pattern", CH, IGN, Refuse::never, STR, "vLLM", "only used by vLLM's guided decoding; whitespace in structured outputs is bounded (docs/structured-outputs.md)",
     R"("guided_whitespace_pattern": " ")", R"("guided_whitespace_pattern": 5)"},
    // --- vLLM, completions
    {"prompt_embeds", C, NO, Refuse::any_value, ANY, "vLLM", "prompts are text or token ids", R"("prompt_embeds": null)",
     R"("prompt_embeds": "AAAA")"},
    // --- vLLM, chat
    {"add_generation_prompt", H, OK, Refuse::never, BOOL, "vLLM", "default true", R"("add_generation_prompt": false)",
     R"("add_generation_prompt": 1)"},
    {"continue_final_message", H, OK, Refuse::never, BOOL, "vLLM",
     "the prompt ends inside the last message (as transformers does it); not with add_generation_prompt: true",
     R"("messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}], )"
     R"("continue_final_message": true, "add_generation_prompt": false)",
     R"("continue_final_message": true, "add_generation_prompt": true)"},
    {"chat_template_kwargs", H, OK, Refuse::never, OBJ, "vLLM", "extra template variables, e.g. enable_thinking",
     R"("chat_template_kwargs": {"enable_thinking": false})", R"("chat_template_kwargs": [])"},
    {"documents", H, OK, Refuse::never, ARR, "vLLM", "passed to the template as `documents` (RAG templates)",
     R"("documents": [{"title": "t", "text": "x"}])", R"("documents": "doc")"},
    {"echo", H, NO, Refuse::true_value, BOOL, "vLLM", "echoing the last message is not supported; false is accepted",
     R"("echo": false)", R"("echo": true)"},
    {"include_reasoning", H, NO, Refuse::false_value, BOOL, "vLLM",
     "no reasoning parser: reasoning stays in the content, so only true (the default) is accepted",
     R"("include_reasoning": true)", R"("include_reasoning": false)"},
    {"chat_template", H, NO, Refuse::any_value, STR, "vLLM",
     "a per-request template is not accepted; start the server with --chat-template FILE", R"("chat_template": null)",
     R"("chat_template": "{{ messages }}")"},
    {"mm_processor_kwargs", H, NO, Refuse::any_value, OBJ, "vLLM", "no multimodal input", R"("mm_processor_kwargs": null)",
     R"("mm_processor_kwargs": {})"},
    {"structural_tag", H, NO, Refuse::any_value, STR, "vLLM", "structural tags are not supported",
     R"("structural_tag": null)", R"("structural_tag": "{}")"},
};

// /v1/responses, ordered as docs/api.md shows it. What a field means is chat's wherever the two
// share a meaning: the request is run as the chat request it translates to (responses_api.cpp).
constexpr unsigned R = kResponsesField;
const RequestFieldSpec kResponsesFields[] = {
    {"model", R, OK, Refuse::never, STR, "OpenAI", "the served name; another name is a 404; may be omitted", R"("model": null)",
     R"("model": 3)"},
    {"input", R, OK, Refuse::never, ANY, "OpenAI",
     "a string, or up to 4096 items: messages (`system`, `developer`, `user`, `assistant`; `input_text` / `output_text` "
     "parts), `function_call` and `function_call_output`; images, files and other item types are rejected",
     R"("input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}])", R"("input": 5)"},
    {"instructions", R, OK, Refuse::never, STR, "OpenAI",
     "a system message before the conversation; not carried over by previous_response_id (as OpenAI)",
     R"("instructions": "Be brief.")", R"("instructions": 5)"},
    {"max_output_tokens", R, OK, Refuse::never, NUM, "OpenAI",
     ">= 1, default the rest of the context; a response it cuts is `incomplete` (reason `max_output_tokens`)",
     R"("max_output_tokens": 4)", R"("max_output_tokens": 0)"},
    {"temperature", R, OK, Refuse::never, NUM, "OpenAI", "[0, 2]; 0 is greedy", R"("temperature": 0)", R"("temperature": -1)"},
    {"top_p", R, OK, Refuse::never, NUM, "OpenAI", "(0, 1]", R"("top_p": 0.5)", R"("top_p": 0)"},
    {"stream", R, OK, Refuse::never, BOOL, "OpenAI",
     "server-sent events in OpenAI's order (`response.created` ... `response.completed`), each with its sequence_number",
     R"("stream": true)", R"("stream": "yes")"},
    {"stream_options", R, IGN, Refuse::never, OBJ, "OpenAI", "`include_obfuscation`: no obfuscation padding is sent",
     R"("stream": true, "stream_options": {"include_obfuscation": false})", R"("stream_options": 5)"},
    {"tools", R, OK, Refuse::custom, ARR, "OpenAI",
     "function tools (`name`, `description`, `parameters`, `strict`), run as chat's tools; built-in tools (web search, "
     "file search, computer use, code interpreter, MCP, image generation, shell, custom) are rejected",
     R"("tools": [{"type": "function", "name": "f"}])", R"("tools": [{"type": "web_search"}])"},
    {"tool_choice", R, OK, Refuse::custom, ANY, "OpenAI",
     "`none`, `auto`, `required` and `{\"type\": \"function\", \"name\": ...}`, as chat's; other choices are rejected",
     R"("tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "f"})",
     R"("tool_choice": "sometimes")"},
    {"parallel_tool_calls", R, OK, Refuse::never, BOOL, "OpenAI", "default true; false: at most one call, as chat",
     R"("parallel_tool_calls": false)", R"("parallel_tool_calls": "x")"},
    {"text", R, OK, Refuse::custom, OBJ, "OpenAI",
     "`format`: `text`, `json_object`, `json_schema` (`name`, `schema`, `strict`), as chat's response_format; "
     "`verbosity` is rejected",
     R"("text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}})",
     R"("text": {"format": {"type": "xml"}})"},
    {"include", R, OK, Refuse::custom, ARR, "OpenAI",
     "only `message.output_text.logprobs` (each output token's logprob and the top_logprobs); others are rejected",
     R"("include": ["message.output_text.logprobs"])", R"("include": ["reasoning.encrypted_content"])"},
    {"top_logprobs", R, OK, Refuse::never, NUM, "OpenAI", "[0, 20]; turns logprobs on, as the include value does",
     R"("top_logprobs": 2)", R"("top_logprobs": 21)"},
    {"metadata", R, OK, Refuse::never, OBJ, "OpenAI", "up to 16 string values (keys <= 64, values <= 512 chars), echoed and stored",
     R"("metadata": {"k": "v"})", R"("metadata": {"k": 1})"},
    {"store", R, OK, Refuse::never, BOOL, "OpenAI",
     "default true: kept in this replica's memory for GET, input_items and previous_response_id, bounded by "
     "--responses-store-max-entries, --responses-store-max-bytes and --responses-store-ttl",
     R"("store": false)", R"("store": "yes")"},
    {"previous_response_id", R, OK, Refuse::never, STR, "OpenAI",
     "continues a stored response: its whole conversation is rendered again through the chat template, then this input "
     "(the prefix cache makes the repeated prompt cheap); an unknown id is a 400",
     R"("previous_response_id": null)", R"("previous_response_id": 5)"},
    {"truncation", R, OK, Refuse::never, STR, "OpenAI",
     "`disabled` (the default): an input longer than the context is a 400; `auto` (dropping old items) is rejected",
     R"("truncation": "disabled")", R"("truncation": "auto")"},
    {"user", R, IGN, Refuse::never, STR, "OpenAI", "no per-user accounting or abuse monitoring here", R"("user": "u")",
     R"("user": 3)"},
    {"safety_identifier", R, IGN, Refuse::never, STR, "OpenAI", "no abuse monitoring here", R"("safety_identifier": "s")",
     R"("safety_identifier": 5)"},
    {"service_tier", R, IGN, Refuse::never, STR, "OpenAI", "one tier here", R"("service_tier": "auto")", R"("service_tier": 5)"},
    {"prompt_cache_key", R, IGN, Refuse::never, STR, "OpenAI", "prefix caching is automatic (--enable-prefix-caching)",
     R"("prompt_cache_key": "k")", R"("prompt_cache_key": 5)"},
    {"prompt_cache_options", R, IGN, Refuse::never, OBJ, "OpenAI", "prefix caching is automatic", R"("prompt_cache_options": {})",
     R"("prompt_cache_options": 5)"},
    {"prompt_cache_retention", R, IGN, Refuse::never, STR, "OpenAI", "cached blocks live until evicted (LRU)",
     R"("prompt_cache_retention": "24h")", R"("prompt_cache_retention": 5)"},
    {"access_programs", R, IGN, Refuse::never, OBJ, "OpenAI", "no access programs here", R"("access_programs": {})",
     R"("access_programs": 5)"},
    {"image", R, IGN, Refuse::never, OBJ, "OpenAI", "image options; image input is rejected", R"("image": {})", R"("image": 5)"},
    {"background", R, NO, Refuse::true_value, BOOL, "OpenAI", "responses are not run in the background; false is accepted",
     R"("background": false)", R"("background": true)"},
    {"background_options", R, NO, Refuse::any_value, OBJ, "OpenAI", "responses are not run in the background",
     R"("background_options": null)", R"("background_options": {})"},
    {"conversation", R, NO, Refuse::any_value, ANY, "OpenAI", "no conversation objects; use previous_response_id",
     R"("conversation": null)", R"("conversation": "conv_1")"},
    {"context_management", R, NO, Refuse::any_value, ARR, "OpenAI", "no context compaction", R"("context_management": null)",
     R"("context_management": [{"type": "compaction"}])"},
    {"reasoning", R, NO, Refuse::custom, OBJ, "OpenAI",
     "no reasoning control or summaries; an object that sets neither `effort` nor `summary` is accepted",
     R"("reasoning": {})", R"("reasoning": {"effort": "low"})"},
    {"prompt", R, NO, Refuse::any_value, OBJ, "OpenAI", "no stored prompt templates", R"("prompt": null)",
     R"("prompt": {"id": "pmpt_1"})"},
    {"max_tool_calls", R, NO, Refuse::any_value, NUM, "OpenAI", "it bounds built-in tool calls, which this server has none of",
     R"("max_tool_calls": null)", R"("max_tool_calls": 3)"},
    {"moderation", R, NO, Refuse::any_value, OBJ, "OpenAI", "no moderation policies", R"("moderation": null)",
     R"("moderation": {"model": "m"})"},
    // --- vLLM's extensions
    {"seed", R, OK, Refuse::never, NUM, "vLLM", "any 64-bit integer, as chat", R"("seed": 7)", R"("seed": 1.5)"},
    {"top_k", R, OK, Refuse::never, NUM, "vLLM", "-1 or 0: off", R"("top_k": 5)", R"("top_k": -2)"},
    {"min_p", R, OK, Refuse::never, NUM, "vLLM", "[0, 1]", R"("min_p": 0.1)", R"("min_p": 2)"},
    {"repetition_penalty", R, OK, Refuse::never, NUM, "vLLM", "(0, 2]", R"("repetition_penalty": 1.1)",
     R"("repetition_penalty": 0)"},
    {"priority", R, OK, Refuse::never, NUM, "vLLM", "as chat: lower runs first with --scheduling-policy priority",
     R"("priority": 0)", R"("priority": 1.5)"},
    {"request_id", R, IGN, Refuse::never, STR, "vLLM", "the server assigns every request its own id (X-Request-Id)",
     R"("request_id": "abc")", R"("request_id": 5)"},
};

bool has_type(const Json& v, FieldType type) {
  switch (type) {
    case FieldType::any: return true;
    case FieldType::boolean: return v.is_boolean();
    case FieldType::number: return v.is_number();
    case FieldType::string: return v.is_string();
    case FieldType::object: return v.is_object();
    case FieldType::array: return v.is_array();
  }
  return true;
}

const char* type_word(FieldType type) {
  switch (type) {
    case FieldType::any: return "a value";
    case FieldType::boolean: return "a boolean";
    case FieldType::number: return "a number";
    case FieldType::string: return "a string";
    case FieldType::object: return "an object";
    case FieldType::array: return "a list";
  }
  return "a value";
}

[[noreturn]] void unsupported(const std::string& param, const std::string& what) {
  reject(param, "'" + param + "' is not supported by this server: " + what + ".", "unsupported_parameter");
}

const RequestFieldSpec* find_spec(const std::string& name, std::span<const RequestFieldSpec> table, unsigned endpoint) {
  for (const RequestFieldSpec& spec : table)
    if ((spec.endpoints & endpoint) != 0 && name == spec.name) return &spec;
  return nullptr;
}

void check_response_format(const Json& format) {
  // A supported field: the table's type check is skipped for it, so the shape is checked here.
  if (!format.is_object())
    reject("response_format", "'response_format' must be an object, e.g. {\"type\": \"json_object\"}, got " +
                                  type_name(format) + ".");
  const Json* type = format.contains("type") ? &format["type"] : nullptr;
  if (type == nullptr || !type->is_string())
    reject("response_format.type", "'response_format.type' must be a string: text, json_object or json_schema.");
  const std::string& name = type->get_ref<const std::string&>();
  // json_object and json_schema are compiled (and their schema judged) in structured_output.cpp.
  if (name == "text" || name == "json_object" || name == "json_schema") return;
  if (name == "structural_tag")
    reject("response_format", "response_format type 'structural_tag' is not supported; use json_schema.", "unsupported_parameter");
  reject("response_format.type", "'response_format.type' must be one of text, json_object, json_schema, got '" + name + "'.");
}

void check_tools(const Json& tools) {
  if (!tools.is_array()) reject("tools", "'tools' must be a list, got " + type_name(tools) + ".");
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const std::string param = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object() || tool.value("type", "") != "function" || !tool.contains("function") ||
        !tool["function"].is_object() || !tool["function"].contains("name") || !tool["function"]["name"].is_string())
      reject(param, "'" + param + "' must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}.");
  }
}

// The shape of tools and tool_choice; tool_calls.cpp checks the rest (names, parameters, that
// a named function is among the tools).
void check_tool_choice(const Json* tools, const Json* choice) {
  const bool has_tools = tools != nullptr && !tools->empty();
  if (tools != nullptr) check_tools(*tools);
  if (choice == nullptr) return;
  if (choice->is_string()) {
    const std::string mode = choice->get<std::string>();
    if (mode != "none" && mode != "auto" && mode != "required")
      reject("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function, got '" + mode + "'.");
    if (mode == "required" && !has_tools) reject("tool_choice", "'tool_choice': \"required\" needs 'tools'.");
  } else if (choice->is_object()) {
    if (choice->value("type", "") != "function" || !choice->contains("function") || !(*choice)["function"].is_object() ||
        !(*choice)["function"].contains("name") || !(*choice)["function"]["name"].is_string())
      reject("tool_choice", "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}.");
    if (!has_tools) reject("tool_choice", "'tool_choice' names a function, but there are no 'tools'.");
  } else {
    reject("tool_choice", "'tool_choice' must be a string or an object, got " + type_name(*choice) + ".");
  }
}

void check_rule(const RequestFieldSpec& spec, const Json& v) {
  switch (spec.refuse) {
    case Refuse::never:
    case Refuse::custom:
      return;
    case Refuse::any_value:
      unsupported(spec.name, spec.note);
    case Refuse::true_value:
      if (v.get<bool>()) unsupported(spec.name, spec.note);
      return;
    case Refuse::false_value:
      if (!v.get<bool>()) unsupported(spec.name, spec.note);
      return;
    case Refuse::non_empty:  // (nlohmann's empty() is false for every string)
      if (v.is_string() ? !v.get_ref<const std::string&>().empty() : !v.empty()) unsupported(spec.name, spec.note);
      return;
    case Refuse::non_zero:
      if (v.get<double>() != 0) unsupported(spec.name, spec.note);
      return;
  }
}

// The table's part of the checks: unknown fields, the type and rule of every field that is not
// supported (the parsers check the supported ones).
void check_table(const Json& body, std::span<const RequestFieldSpec> table, unsigned endpoint,
                 std::span<const std::string> ignored) {
  for (const auto& [key, value] : body.items()) {
    const RequestFieldSpec* spec = find_spec(key, table, endpoint);
    if (spec == nullptr && std::find(ignored.begin(), ignored.end(), key) != ignored.end()) continue;
    if (spec == nullptr)
      reject(key, "Unknown parameter: '" + key + "'. This server rejects fields it does not know rather than ignore "
                      "them; docs/api.md lists every field it accepts (an operator can accept a router's own fields "
                      "with --ignore-request-fields).",
             "unknown_parameter");
    if (value.is_null() || spec->status == FieldStatus::supported) continue;  // the parser checks its own fields
    if (!has_type(value, spec->type))
      reject(key, "'" + key + "' must be " + type_word(spec->type) + ", got " + type_name(value) + ".");
    check_rule(*spec, value);
  }
}

}  // namespace

std::span<const RequestFieldSpec> request_field_specs() { return kFields; }
std::span<const RequestFieldSpec> responses_field_specs() { return kResponsesFields; }

void check_responses_fields(const Json& body, std::span<const std::string> ignored) {
  check_table(body, kResponsesFields, kResponsesField, ignored);
  if (const auto it = body.find("reasoning"); it != body.end() && it->is_object())
    for (const char* key : {"effort", "summary", "generate_summary"})
      if (it->contains(key) && !(*it)[key].is_null())
        unsupported("reasoning", "no reasoning control or summaries for this model ('reasoning." + std::string(key) + "')");
}

const char* field_status_name(FieldStatus status) {
  switch (status) {
    case FieldStatus::supported: return "supported";
    case FieldStatus::rejected: return "rejected";
    case FieldStatus::ignored: return "ignored";
  }
  return "supported";
}

std::string why_not_ignorable(const std::string& name) {
  for (const auto table : {std::span<const RequestFieldSpec>(kFields), std::span<const RequestFieldSpec>(kResponsesFields)})
    for (const RequestFieldSpec& spec : table)
      if (name == spec.name)
        return "'" + name + "' is a request field this server knows (" + field_status_name(spec.status) +
               " in docs/api.md): only fields it does not know can be ignored";
  return {};
}

void check_request_fields(const Json& body, ApiKind kind, std::span<const std::string> ignored) {
  check_table(body, kFields, kind == ApiKind::chat ? kChatField : kCompletionField, ignored);
  if (kind != ApiKind::chat) {
    if (const auto it = body.find("response_format"); it != body.end() && !it->is_null()) check_response_format(*it);
    return;
  }
  auto present = [&](const char* key) -> const Json* {
    const auto it = body.find(key);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  if (const Json* format = present("response_format")) check_response_format(*format);
  if (const Json* modalities = present("modalities")) {
    for (const Json& m : *modalities)
      if (m != "text") unsupported("modalities", "only text output; got " + m.dump());
  }
  if (const Json* call = present("function_call"); call != nullptr && *call != "none")
    unsupported("function_call", "deprecated function calling is not supported; use tool_choice: \"none\" or omit it");
  check_tool_choice(present("tools"), present("tool_choice"));
}

}  // namespace fp8serve
