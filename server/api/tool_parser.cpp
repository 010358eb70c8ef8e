#include "server/api/tool_parser.hpp"

#include <cstdio>

namespace fp8serve {

namespace {

using Json = nlohmann::ordered_json;
constexpr size_t npos = std::string::npos;
constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>", kPythonTag = "<|python_tag|>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

bool all_space(std::string_view s) {
  for (const char c : s)
    if (!is_space(c)) return false;
  return true;
}

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_tag(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

// The index after the JSON string that starts at s[i] == '"', or npos while it is unfinished.
size_t skip_string(std::string_view s, size_t i) {
  for (size_t k = i + 1; k < s.size(); ++k) {
    if (s[k] == '\\') {
      ++k;
    } else if (s[k] == '"') {
      return k + 1;
    }
  }
  return npos;
}

// The index after the JSON value that starts at s[i], or npos while it is unfinished (a number
// or literal is finished only once something follows it).
size_t skip_value(std::string_view s, size_t i) {
  if (i >= s.size()) return npos;
  if (s[i] == '"') return skip_string(s, i);
  if (s[i] == '{' || s[i] == '[') {
    int depth = 0;
    for (size_t k = i; k < s.size(); ++k) {
      const char c = s[k];
      if (c == '"') {
        const size_t end = skip_string(s, k);
        if (end == npos) return npos;
        k = end - 1;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if ((c == '}' || c == ']') && --depth == 0) {
        return k + 1;
      }
    }
    return npos;
  }
  size_t k = i;
  while (k < s.size() && !is_space(s[k]) && s[k] != ',' && s[k] != '}' && s[k] != ']') ++k;
  return k < s.size() ? k : npos;
}

// What is known so far about a call object {"name": ..., "arguments" | "parameters": ...}.
struct CallScan {
  bool malformed = false;
  bool done = false;
  size_t end = 0;  // after the object's '}'
  std::optional<std::string> name;
  bool has_arguments = false, arguments_done = false;
  size_t arguments_begin = 0, arguments_end = 0;
};

std::optional<std::string> json_string_value(std::string_view text) {
  try {
    const Json v = Json::parse(text);
    if (v.is_string()) return v.get<std::string>();
  } catch (const Json::exception&) {
  }
  return std::nullopt;
}

CallScan scan_call(std::string_view s) {
  CallScan r;
  size_t i = 0;
  auto skip_space = [&] {
    while (i < s.size() && is_space(s[i])) ++i;
    return i < s.size();
  };
  if (!skip_space()) return r;
  if (s[i++] != '{') return r.malformed = true, r;
  while (true) {
    if (!skip_space()) return r;
    if (s[i] == '}') return r.done = true, r.end = i + 1, r;
    if (s[i] != '"') return r.malformed = true, r;
    const size_t key_end = skip_string(s, i);
    if (key_end == npos) return r;
    const std::optional<std::string> key = json_string_value(s.substr(i, key_end - i));
    if (!key) return r.malformed = true, r;
    i = key_end;
    if (!skip_space()) return r;
    if (s[i++] != ':') return r.malformed = true, r;
    if (!skip_space()) return r;
    const size_t value_begin = i, value_end = skip_value(s, i);
    if (*key == "arguments" || *key == "parameters") {
      r.has_arguments = true;
      r.arguments_begin = value_begin;
      r.arguments_end = value_end == npos ? s.size() : value_end;
      r.arguments_done = value_end != npos;
    }
    if (value_end == npos) return r;
    if (*key == "name") {
      r.name = json_string_value(s.substr(value_begin, value_end - value_begin));
      if (!r.name) return r.malformed = true, r;
    }
    i = value_end;
    if (!skip_space()) return r;
    if (s[i] == ',') {
      ++i;
    } else if (s[i] == '}') {
      return r.done = true, r.end = i + 1, r;
    } else {
      return r.malformed = true, r;
    }
  }
}

uint64_t fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

}  // namespace

std::optional<ToolCallFormat> parse_tool_call_format(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::hermes;
  if (name == "llama3_json") return ToolCallFormat::llama3_json;
  return std::nullopt;
}

const char* tool_call_format_name(ToolCallFormat format) {
  return format == ToolCallFormat::hermes ? "hermes" : "llama3_json";
}

void ToolCallDelta::append(ToolCallDelta other) {
  content += other.content;
  for (auto& item : other.tool_calls) tool_calls.push_back(std::move(item));
}

ToolCallStream::ToolCallStream(ToolCallFormat format, std::string id_seed, int max_calls)
    : format_(format), id_seed_(std::move(id_seed)), mode_(format == ToolCallFormat::hermes ? Mode::content : Mode::undecided),
      max_calls_(max_calls) {}

int ToolCallStream::num_calls() const {
  int n = 0;
  for (const Call& c : calls_) n += !c.dropped;
  return n;
}

ToolCallDelta ToolCallStream::push(std::string_view text) {
  buffer_.append(text);
  ToolCallDelta out;
  step(out, false);
  return out;
}

ToolCallDelta ToolCallStream::finish() {
  ToolCallDelta out;
  const size_t calls_before = calls_.size();
  const bool was_inside = mode_ == Mode::call;
  step(out, true);
  // Still inside a call, or one given up at the end (its text went back to the content).
  ended_inside_call_ = mode_ == Mode::call || (was_inside && calls_.size() < calls_before);
  // What is left is text, unless it is the rest of a call already announced (cut by max_tokens:
  // the call keeps the arguments written so far).
  if (!buffer_.empty() && !(mode_ == Mode::call && calls_.back().header_sent)) emit_content(out, buffer_);
  buffer_.clear();
  return out;
}

void ToolCallStream::emit_content(ToolCallDelta& out, std::string_view text) {
  if (text.empty()) return;
  if (!calls_.empty() && all_space(text)) {
    held_spaces_.append(text);  // between or after calls: only worth sending if text follows
    return;
  }
  std::string piece = std::move(held_spaces_);
  held_spaces_.clear();
  piece.append(text);
  content_ += piece;
  out.content += piece;
}

void ToolCallStream::open_call() {
  Call c;
  c.dropped = max_calls_ > 0 && num_calls() >= max_calls_;
  const uint64_t a = fnv1a(id_seed_ + "#" + std::to_string(calls_.size()));
  char id[32];
  std::snprintf(id, sizeof id, "call_%016llx%08llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(fnv1a(std::to_string(a), a) & 0xffffffffull));
  c.id = id;
  calls_.push_back(std::move(c));
  mode_ = Mode::call;
}

void ToolCallStream::step(ToolCallDelta& out, bool at_end) {
  for (bool progress = true; progress;) {
    switch (mode_) {
      case Mode::undecided: {
        // Llama 3: the whole answer is the calls when it starts with '{' (after <|python_tag|>).
        size_t i = 0;
        while (i < buffer_.size() && is_space(buffer_[i])) ++i;
        std::string_view rest = std::string_view(buffer_).substr(i);
        if (rest.rfind(kPythonTag, 0) == 0) {
          buffer_.erase(0, i + kPythonTag.size());
          continue;
        }
        if (!at_end && (rest.empty() || std::string_view(kPythonTag).rfind(rest, 0) == 0)) return;
        if (!rest.empty() && rest.front() == '{') {
          buffer_.erase(0, i);
          open_call();
        } else {
          mode_ = Mode::content;
        }
        progress = true;
        break;
      }
      case Mode::content: progress = step_content(out, at_end); break;
      case Mode::call: progress = step_call(out, at_end); break;
    }
  }
}

bool ToolCallStream::step_content(ToolCallDelta& out, bool at_end) {
  if (format_ == ToolCallFormat::llama3_json) {
    emit_content(out, buffer_);
    buffer_.clear();
    return false;
  }
  const size_t open = buffer_.find(kHermesOpen);
  if (open != npos) {
    emit_content(out, std::string_view(buffer_).substr(0, open));
    buffer_.erase(0, open + kHermesOpen.size());
    open_call();
    return true;
  }
  const size_t hold = at_end ? 0 : partial_tag(buffer_, kHermesOpen);
  emit_content(out, std::string_view(buffer_).substr(0, buffer_.size() - hold));
  buffer_.erase(0, buffer_.size() - hold);
  return false;
}

bool ToolCallStream::step_call(ToolCallDelta& out, bool at_end) {
  Call& call = calls_.back();
  const CallScan scan = scan_call(buffer_);
  auto give_up = [&] {
    // Not a call after all: its text goes back to the content, as the model wrote it.
    const std::string text = (format_ == ToolCallFormat::hermes ? std::string(kHermesOpen) : std::string()) + buffer_;
    buffer_.clear();
    calls_.pop_back();
    mode_ = Mode::content;
    emit_content(out, text);
    return false;
  };
  if (scan.malformed && !call.header_sent) return give_up();
  const size_t index = calls_.size() - 1;
  auto send_header = [&] {
    if (call.header_sent || !scan.name) return;
    call.name = *scan.name;
    call.header_sent = true;
    if (call.dropped) return;
    out.tool_calls.push_back({{"index", index}, {"id", call.id}, {"type", "function"},
                              {"function", {{"name", call.name}, {"arguments", ""}}}});
  };
  auto send_arguments = [&](std::string_view more) {
    if (more.empty()) return;
    call.arguments.append(more);
    if (call.dropped) return;
    out.tool_calls.push_back({{"index", index}, {"function", {{"arguments", std::string(more)}}}});
  };
  send_header();
  if (call.header_sent && scan.has_arguments) {
    const std::string_view value = std::string_view(buffer_).substr(scan.arguments_begin, scan.arguments_end - scan.arguments_begin);
    if (!value.empty() && value.front() == '"') {
      // Arguments written as a JSON string holding JSON: sent once, decoded.
      if (scan.arguments_done && call.arguments.empty()) send_arguments(json_string_value(value).value_or(""));
    } else if (value.size() > call.arguments.size() && value.substr(0, call.arguments.size()) == call.arguments) {
      send_arguments(value.substr(call.arguments.size()));
    }
  }
  if (!scan.done) {
    if (at_end && !call.header_sent) return give_up();
    return false;
  }
  if (!call.header_sent) return give_up();  // a complete object without a name
  if (!scan.has_arguments && call.arguments.empty()) send_arguments("{}");
  size_t after = scan.end;
  if (format_ == ToolCallFormat::hermes) {
    while (after < buffer_.size() && is_space(buffer_[after])) ++after;
    const std::string_view rest = std::string_view(buffer_).substr(after);
    if (rest.rfind(kHermesClose, 0) == 0) {
      after += kHermesClose.size();
    } else if (!at_end && std::string_view(kHermesClose).rfind(rest, 0) == 0) {
      return false;  // the closing tag may still come
    }
  }
  buffer_.erase(0, after);
  mode_ = Mode::content;
  if (format_ == ToolCallFormat::llama3_json) {
    // More calls may follow, separated by ';'.
    size_t i = 0;
    while (i < buffer_.size() && is_space(buffer_[i])) ++i;
    if (i < buffer_.size() && buffer_[i] == ';') {
      ++i;
      while (i < buffer_.size() && is_space(buffer_[i])) ++i;
      if (i < buffer_.size() && buffer_[i] == '{') {
        buffer_.erase(0, i);
        open_call();
      } else if (i == buffer_.size() && !at_end) {
        mode_ = Mode::undecided;  // wait for the next call's '{'
        buffer_.erase(0, i);
      }
    }
  }
  return true;
}

std::string ToolCallStream::content() const {
  if (calls_.empty()) return content_;
  size_t a = 0, b = content_.size();
  while (a < b && is_space(content_[a])) ++a;
  while (b > a && is_space(content_[b - 1])) --b;
  return content_.substr(a, b - a);
}

Json ToolCallStream::tool_calls() const {
  Json out = Json::array();
  for (const Call& c : calls_) {
    if (!c.header_sent || c.dropped) continue;
    out.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return out;
}

}  // namespace fp8serve
