// A model's chat template, parsed once at load and rendered per request: turns the OpenAI
// `messages` (plus tools and template kwargs) into the prompt text exactly as Python's jinja2
// renders it inside transformers' apply_chat_template.
//
//   auto tmpl = ChatTemplate::parse(source);              // TemplateError if broken (load time)
//   auto ctx = make_chat_context(messages, tools, true, {{"bos_token", "<s>"}});
//   RenderResult r = tmpl.render(ctx, options);           // r.error -> HTTP 400
//
// Use nlohmann::ordered_json for request data: tojson prints keys in the order the client sent
// them, as Python's dicts do; nlohmann::json would sort them.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/chat_template/ast.hpp"
#include "model/chat_template/builtins.hpp"
#include "model/chat_template/lexer.hpp"

namespace fp8serve {

using jinja::TemplateError;  // thrown by ChatTemplate::parse
using ChatTemplateLimits = jinja::RenderLimits;

struct ChatTemplateOptions {
  // What strftime_now() formats (Llama 3.x prints today's date into the system prompt). The
  // caller passes the wall-clock time; tests pass a fixed one. Broken-down local time.
  std::tm now{};
  ChatTemplateLimits limits;
};

struct ChatTemplateError {
  // raised: the template called raise_exception (a request the model does not accept);
  // runtime: the request's data did not fit the template (wrong types, missing fields);
  // limit: a sandbox limit (output size, loop iterations, recursion) was hit.
  jinja::ErrorKind kind = jinja::ErrorKind::runtime;
  std::string message;
};

struct ChatTemplateResult {
  std::string text;
  std::optional<ChatTemplateError> error;
  bool ok() const { return !error.has_value(); }
};

class ChatTemplate {
 public:
  // Throws TemplateError naming the line and the problem.
  static ChatTemplate parse(const std::string& source);

  // `context` is a JSON object; each key becomes a template variable. Never throws on bad data.
  ChatTemplateResult render(const nlohmann::ordered_json& context,
                            const ChatTemplateOptions& options = {}) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<const jinja::Body> body_;
};

// The variables transformers passes to a chat template: messages (with keys whose value is
// null dropped, and reasoning fields aliased as transformers does), tools and documents (null
// when absent, so `tools is defined` holds), add_generation_prompt, then `extra` (special
// tokens such as bos_token/eos_token, and template kwargs such as enable_thinking).
nlohmann::ordered_json make_chat_context(const nlohmann::ordered_json& messages,
                                         const nlohmann::ordered_json& tools,
                                         bool add_generation_prompt,
                                         const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());

// transformers' continue_final_message: the prompt ends inside the last message, so the model
// continues it instead of starting a new turn. The last message's text is tagged, the context
// rendered, and the prompt cut where the tag appears (render_jinja_template in transformers
// 5.24, which also sets add_generation_prompt false). An error when there is nothing to continue
// or the template does not show the text.
ChatTemplateResult render_continuing_final_message(const ChatTemplate& chat_template, nlohmann::ordered_json context,
                                                   const ChatTemplateOptions& options = {});

}  // namespace fp8serve
