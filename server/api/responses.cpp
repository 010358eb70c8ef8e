#include "server/api/responses.hpp"

#include <algorithm>

namespace fp8serve {

using Json = nlohmann::ordered_json;

std::string dump_json(const nlohmann::ordered_json& value) {
  return value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string sse_event(const nlohmann::ordered_json& value) { return "data: " + dump_json(value) + "\n\n"; }

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
    case FinishReason::error: return "error";
  }
  return "stop";
}

namespace {

Json bytes_array(const std::string& bytes) {
  Json out = Json::array();
  for (unsigned char c : bytes) out.push_back(static_cast<int>(c));
  return out;
}

// A token's bytes as text: invalid or cut UTF-8 sequences become U+FFFD (as HF decode does), so
// distinct byte tokens that print alike share one key, the same key a client would see.
std::string printable(const std::string& bytes) {
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool valid = len > 0 && i + len <= bytes.size();
    for (size_t k = 1; valid && k < len; ++k) valid = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    if (valid && len > 1) {
      // Reject overlong forms, surrogates and code points above U+10FFFF.
      uint32_t cp = c & (0x7F >> len);
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(bytes[i + k]) & 0x3F);
      static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      valid = cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (valid) {
      out.append(bytes, i, len);
      i += len;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

// "tool_calls" whenever the answer holds calls and none was cut: ended by the model or the
// grammar, or by max_tokens in text after the calls.
bool calls_finished(const ToolCallStream& parser, const std::optional<FinishReason>& finish) {
  if (parser.num_calls() == 0 || !finish) return false;
  return *finish == FinishReason::stop || (*finish == FinishReason::length && !parser.ended_inside_call());
}

Json finish_json(const std::optional<FinishReason>& finish) {
  if (!finish || *finish == FinishReason::error) return nullptr;
  return finish_reason_name(*finish);
}

}  // namespace

std::vector<std::string> JobOutput::stream_error(const std::string& request_id) {
  return {sse_event(Json(error_body(internal_error(request_id))))};
}

Json token_logprob_items(const std::vector<SampleResult>& samples, const TokenBytesFn& token_bytes, bool tokens_as_ids) {
  auto text = [&](int32_t token, const std::string& bytes) {
    return tokens_as_ids ? "token_id:" + std::to_string(token) : printable(bytes);
  };
  Json items = Json::array();
  for (const SampleResult& s : samples) {
    const std::string bytes = token_bytes(s.token);
    Json top = Json::array();
    for (const TokenLogprob& t : s.top_logprobs) {
      const std::string tb = token_bytes(t.token);
      top.push_back({{"token", text(t.token, tb)}, {"logprob", t.logprob}, {"bytes", bytes_array(tb)}});
    }
    items.push_back({{"token", text(s.token, bytes)}, {"logprob", s.logprob}, {"bytes", bytes_array(bytes)},
                     {"top_logprobs", std::move(top)}});
  }
  return items;
}

ResponseBuilder::ResponseBuilder(ResponseMeta meta, TokenBytesFn token_bytes)
    : meta_(std::move(meta)), token_bytes_(std::move(token_bytes)) {
  meta_.best_of = std::max(meta_.best_of, meta_.n);
  choices_.resize(static_cast<size_t>(meta_.num_prompts) * static_cast<size_t>(meta_.best_of));
  cached_tokens_.assign(static_cast<size_t>(meta_.num_prompts), 0);
  if (meta_.prompt_tokens.size() < static_cast<size_t>(meta_.num_prompts)) meta_.prompt_tokens.resize(meta_.num_prompts, 0);
  for (size_t i = 0; i < choices_.size(); ++i) {
    choices_[i].logprobs = nullptr;
    if (meta_.stream && meta_.tool_parser)
      choices_[i].tools =
          std::make_shared<ToolCallStream>(*meta_.tool_parser, meta_.id + ":" + std::to_string(i), meta_.max_tool_calls);
  }
  for (int p = 0; p < meta_.num_prompts && !meta_.echo_texts.empty(); ++p)
    for (int i = 0; i < meta_.best_of; ++i) choices_[p * meta_.best_of + i].text = meta_.echo_texts[p];
}

Json ResponseBuilder::chunk_base() const {
  Json chunk;
  chunk["id"] = meta_.id;
  chunk["object"] = meta_.kind == ApiKind::chat ? "chat.completion.chunk" : "text_completion";
  chunk["created"] = meta_.created;
  chunk["model"] = meta_.model;
  chunk["choices"] = Json::array();
  return chunk;
}

std::string ResponseBuilder::token_text(int32_t token, const std::string& bytes) const {
  return meta_.tokens_as_ids ? "token_id:" + std::to_string(token) : printable(bytes);
}

// The logprobs of this output's tokens, in the kind's format; also accumulated into the choice.
Json ResponseBuilder::logprobs_delta(Choice& choice, const RequestOutput& output) {
  for (const SampleResult& s : output.logprobs) choice.cumulative_logprob += s.logprob;
  if (meta_.num_logprobs < 0) return nullptr;
  Json delta;
  if (meta_.kind == ApiKind::chat) {
    delta["content"] = token_logprob_items(output.logprobs, token_bytes_, meta_.tokens_as_ids);
  } else {
    delta = {{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()},
             {"text_offset", Json::array()}};
    for (const SampleResult& s : output.logprobs) {
      const std::string bytes = token_bytes_(s.token);
      delta["tokens"].push_back(token_text(s.token, bytes));
      delta["token_logprobs"].push_back(s.logprob);
      Json top = Json::object();
      for (const TokenLogprob& t : s.top_logprobs) {
        const std::string tb = token_text(t.token, token_bytes_(t.token));
        if (!top.contains(tb)) top[tb] = t.logprob;  // a dict: the first (most likely) wins
      }
      delta["top_logprobs"].push_back(meta_.num_logprobs > 0 ? std::move(top) : Json(nullptr));
      delta["text_offset"].push_back(choice.text_offset);
      choice.text_offset += static_cast<int>(bytes.size());
    }
  }
  return delta;
}

Json ResponseBuilder::echo_logprobs(Choice& choice, int prompt_index, const RequestOutput& output) {
  const std::vector<int32_t>& ids = meta_.prompt_ids.at(static_cast<std::size_t>(prompt_index));
  Json delta = {{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()},
                {"text_offset", Json::array()}};
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::string bytes = token_bytes_(ids[i]);
    delta["tokens"].push_back(token_text(ids[i], bytes));
    delta["text_offset"].push_back(choice.text_offset);
    choice.text_offset += static_cast<int>(bytes.size());
    const SampleResult* s = i > 0 && i - 1 < output.prompt_logprobs.size() ? &output.prompt_logprobs[i - 1] : nullptr;
    if (s == nullptr) {  // the first token: nothing came before it to predict it
      delta["token_logprobs"].push_back(nullptr);
      delta["top_logprobs"].push_back(nullptr);
      continue;
    }
    delta["token_logprobs"].push_back(s->logprob);
    if (meta_.num_logprobs == 0) {
      delta["top_logprobs"].push_back(nullptr);
      continue;
    }
    Json top = Json::object();
    for (std::size_t k = 0; k < s->top_logprobs.size() && k < static_cast<std::size_t>(meta_.num_logprobs); ++k) {
      const TokenLogprob& t = s->top_logprobs[k];
      const std::string key = token_text(t.token, token_bytes_(t.token));
      if (!top.contains(key)) top[key] = t.logprob;
    }
    delta["top_logprobs"].push_back(std::move(top));
  }
  return delta;
}

Json ResponseBuilder::vllm_prompt_logprobs(int prompt_index, const RequestOutput& output) const {
  const std::vector<int32_t>& ids = meta_.prompt_ids.at(static_cast<std::size_t>(prompt_index));
  Json list = Json::array();
  list.push_back(nullptr);
  for (std::size_t i = 1; i < ids.size() && i - 1 < output.prompt_logprobs.size(); ++i) {
    const SampleResult& s = output.prompt_logprobs[i - 1];
    // vLLM's order: the prompt token, then the top N by rank (a dict: the token keeps its place).
    Json entry = Json::object();
    auto add = [&](int32_t token, float logprob, int rank) {
      const std::string key = std::to_string(token);
      if (entry.contains(key)) return;
      entry[key] = {{"logprob", logprob}, {"rank", rank}, {"decoded_token", token_text(token, token_bytes_(token))}};
    };
    add(s.token, s.logprob, s.rank);
    for (std::size_t k = 0; k < s.top_logprobs.size() && k < static_cast<std::size_t>(meta_.num_prompt_logprobs); ++k)
      add(s.top_logprobs[k].token, s.top_logprobs[k].logprob, static_cast<int>(k) + 1);
    list.push_back(std::move(entry));
  }
  return list;
}

void ResponseBuilder::append_logprobs(Json& into, const Json& delta, ApiKind kind) {
  if (delta.is_null()) return;
  if (into.is_null()) {
    into = delta;
    return;
  }
  if (kind == ApiKind::chat) {
    for (const auto& item : delta["content"]) into["content"].push_back(item);
  } else {
    for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
      for (const auto& item : delta[key]) into[key].push_back(item);
  }
}

std::vector<std::string> ResponseBuilder::on_output(int prompt_index, const RequestOutput& output) {
  std::vector<std::string> events;
  if (prompt_index < 0 || prompt_index >= meta_.num_prompts || output.index < 0 || output.index >= meta_.best_of) return events;
  Choice& choice = choices_[static_cast<size_t>(prompt_index * meta_.best_of + output.index)];
  if (choice.finish) return events;  // late news for a finished choice
  const int choice_index = prompt_index * meta_.n + output.index;  // streamed only when best_of == n
  meta_.prompt_tokens[prompt_index] = std::max(meta_.prompt_tokens[prompt_index], output.prompt_tokens);
  cached_tokens_[prompt_index] = std::max(cached_tokens_[prompt_index], output.cached_tokens);
  choice.completion_tokens = std::max(choice.completion_tokens, output.completion_tokens);

  Json lp;
  std::string echo_text;  // echo with logprobs: the prompt text goes out with its logprobs
  if (!choice.started) {
    choice.started = true;
    if (meta_.echo_logprobs) {
      lp = echo_logprobs(choice, prompt_index, output);
      if (meta_.stream) echo_text = meta_.echo_texts[static_cast<std::size_t>(prompt_index)];
    }
    if (meta_.num_prompt_logprobs >= 0) choice.prompt_logprobs = vllm_prompt_logprobs(prompt_index, output);
  }
  append_logprobs(lp, logprobs_delta(choice, output), meta_.kind);
  if (output.finish) {
    choice.finish = output.finish;
    ++num_finished_;
    if (*output.finish == FinishReason::error && !engine_error_) engine_error_ = output.error.empty() ? "engine error" : output.error;
  }
  if (!meta_.stream) {
    choice.text += output.text_delta;
    append_logprobs(choice.logprobs, lp, meta_.kind);
    return events;
  }
  // An error or an abort ends the stream without a normal final chunk.
  if (output.finish && (*output.finish == FinishReason::error || *output.finish == FinishReason::abort)) return events;
  if (output.text_delta.empty() && lp.is_null() && !output.finish) return events;

  Json c;
  c["index"] = choice_index;
  if (choice.tools) {
    // Text through the tool-call parser: content, and the calls as OpenAI's deltas.
    ToolCallDelta d = choice.tools->push(output.text_delta);
    if (output.finish) d.append(choice.tools->finish());
    if (d.empty() && lp.is_null() && !output.finish) return events;
    c["delta"] = Json::object();
    if (!d.content.empty()) c["delta"]["content"] = d.content;
    if (!d.tool_calls.empty()) c["delta"]["tool_calls"] = std::move(d.tool_calls);
  } else if (meta_.kind == ApiKind::chat) {
    c["delta"] = output.text_delta.empty() ? Json::object() : Json{{"content", output.text_delta}};
  } else {
    c["text"] = echo_text + output.text_delta;
  }
  c["logprobs"] = std::move(lp);
  c["finish_reason"] = finish_json(output.finish);
  if (choice.tools && calls_finished(*choice.tools, output.finish)) c["finish_reason"] = "tool_calls";
  Json chunk = chunk_base();
  chunk["choices"].push_back(std::move(c));
  if (meta_.include_usage) chunk["usage"] = nullptr;
  events.push_back(sse_event(chunk));
  return events;
}

std::vector<std::string> ResponseBuilder::stream_head() {
  std::vector<std::string> events;
  for (int i = 0; i < static_cast<int>(choices_.size()); ++i) {
    Json c;
    c["index"] = i;
    if (meta_.kind == ApiKind::chat) {
      c["delta"] = {{"role", "assistant"}, {"content", ""}};
    } else if (!meta_.echo_texts.empty() && !meta_.echo_logprobs) {  // else with its logprobs, in the first chunk
      c["text"] = meta_.echo_texts[static_cast<size_t>(i / meta_.best_of)];
    } else {
      continue;  // completions have no role chunk
    }
    c["logprobs"] = nullptr;
    c["finish_reason"] = nullptr;
    Json chunk = chunk_base();
    chunk["choices"].push_back(std::move(c));
    if (meta_.include_usage) chunk["usage"] = nullptr;
    events.push_back(sse_event(chunk));
  }
  return events;
}

std::string ResponseBuilder::summary_finish() const {
  int rank = 0;  // 0 stop, 1 length, 2 abort, 3 error
  for (const auto& c : choices_) {
    if (!c.finish) continue;
    const int r = *c.finish == FinishReason::error ? 3 : *c.finish == FinishReason::abort ? 2 : *c.finish == FinishReason::length ? 1 : 0;
    rank = std::max(rank, r);
  }
  static constexpr const char* kNames[] = {"stop", "length", "abort", "error"};
  return kNames[rank];
}

Usage ResponseBuilder::usage() const {
  Usage u;
  for (int p = 0; p < meta_.num_prompts; ++p) {
    u.prompt_tokens += meta_.prompt_tokens[p];
    u.cached_tokens += cached_tokens_[p];
  }
  for (const auto& c : choices_) u.completion_tokens += c.completion_tokens;
  return u;
}

Json ResponseBuilder::usage_json() const {
  const Usage u = usage();
  return {{"prompt_tokens", u.prompt_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"completion_tokens", u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

std::vector<std::string> ResponseBuilder::stream_tail() {
  std::vector<std::string> events;
  if (meta_.include_usage) {
    Json chunk = chunk_base();
    chunk["usage"] = usage_json();
    events.push_back(sse_event(chunk));
  }
  events.push_back(kSseDone);
  return events;
}

Json ResponseBuilder::final_body() {
  Json body;
  body["id"] = meta_.id;
  body["object"] = meta_.kind == ApiKind::chat ? "chat.completion" : "text_completion";
  body["created"] = meta_.created;
  body["model"] = meta_.model;
  body["choices"] = Json::array();
  for (int p = 0; p < meta_.num_prompts; ++p) {
    const std::vector<int> returned = returned_choices(p);
    for (int rank = 0; rank < meta_.n; ++rank) {
      const int i = returned[static_cast<size_t>(rank)];
      const Choice& choice = choices_[static_cast<size_t>(i)];
      Json c;
      c["index"] = p * meta_.n + rank;
      Json finish = finish_json(choice.finish);
      if (meta_.kind == ApiKind::chat && meta_.tool_parser) {
        // The same parser as streaming, over the whole text.
        ToolCallStream parser(*meta_.tool_parser, meta_.id + ":" + std::to_string(i), meta_.max_tool_calls);
        parser.push(choice.text);
        parser.finish();
        c["message"] = {{"role", "assistant"}, {"content", parser.content()}};
        if (parser.num_calls() > 0) {
          if (parser.content().empty()) c["message"]["content"] = nullptr;
          c["message"]["tool_calls"] = parser.tool_calls();
          if (calls_finished(parser, choice.finish)) finish = "tool_calls";
        }
      } else if (meta_.kind == ApiKind::chat) {
        c["message"] = {{"role", "assistant"}, {"content", choice.text}};
      } else {
        c["text"] = choice.text;
      }
      c["logprobs"] = choice.logprobs;
      c["finish_reason"] = std::move(finish);
      if (meta_.kind == ApiKind::completion && meta_.num_prompt_logprobs >= 0) c["prompt_logprobs"] = choice.prompt_logprobs;
      body["choices"].push_back(std::move(c));
    }
  }
  // vLLM puts a chat request's prompt logprobs at the top level (one prompt for every choice).
  if (meta_.kind == ApiKind::chat && meta_.num_prompt_logprobs >= 0 && !choices_.empty())
    body["prompt_logprobs"] = choices_.front().prompt_logprobs;
  body["usage"] = usage_json();
  return body;
}

std::vector<int> ResponseBuilder::returned_choices(int prompt_index) const {
  std::vector<int> order(static_cast<size_t>(meta_.best_of));
  for (int i = 0; i < meta_.best_of; ++i) order[static_cast<size_t>(i)] = prompt_index * meta_.best_of + i;
  if (meta_.best_of > meta_.n)
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return choices_[static_cast<size_t>(a)].cumulative_logprob > choices_[static_cast<size_t>(b)].cumulative_logprob;
    });
  order.resize(static_cast<size_t>(meta_.n));
  return order;
}

}  // namespace fp8serve
