#include "model/chat_template/chat_template.hpp"

#include <functional>

#include "model/chat_template/interpreter.hpp"
#include "model/chat_template/parser.hpp"
#include "model/chat_template/py_str.hpp"

namespace fp8serve {

namespace {

// jinja2 rejects unknown filters and tests when it compiles the template; so do we, so that a
// template we cannot render fails at load time rather than on some request.
void check_names(const jinja::Expr& e);

void check_expr(const jinja::ExprPtr& e) {
  if (e) check_names(*e);
}

void check_names(const jinja::Expr& e) {
  using Kind = jinja::Expr::Kind;
  if (e.kind == Kind::filter && !jinja::is_known_filter(e.name)) {
    throw TemplateError("no filter named '" + e.name + "'", e.line);
  }
  if (e.kind == Kind::test && !jinja::is_known_test(e.name)) {
    throw TemplateError("no test named '" + e.name + "'", e.line);
  }
  check_expr(e.object);
  check_expr(e.left);
  check_expr(e.right);
  check_expr(e.condition);
  check_expr(e.then);
  check_expr(e.otherwise);
  for (const auto& p : e.slice_parts) check_expr(p);
  for (const auto& i : e.items) check_expr(i);
  for (const auto& a : e.args) check_expr(a);
  for (const auto& kw : e.kwargs) check_expr(kw.value);
  for (const auto& [op, operand] : e.chain) check_expr(operand);
}

void check_body(const jinja::Body& body) {
  for (const jinja::StmtPtr& s : body) {
    check_expr(s->expr);
    check_expr(s->condition);
    check_expr(s->filter);
    for (const auto& [cond, branch] : s->branches) {
      check_expr(cond);
      check_body(branch);
    }
    for (const auto& p : s->params) check_expr(p.default_value);
    check_body(s->body);
    check_body(s->else_body);
  }
}

}  // namespace

ChatTemplate ChatTemplate::parse(const std::string& source) {
  ChatTemplate t;
  t.source_ = source;
  try {
    auto body = std::make_shared<jinja::Body>(jinja::parse_template(source));
    check_body(*body);
    t.body_ = std::move(body);
  } catch (const TemplateError&) {
    throw;
  } catch (const std::exception& e) {
    throw TemplateError(std::string("cannot parse chat template: ") + e.what(), 0);
  }
  return t;
}

ChatTemplateResult ChatTemplate::render(const nlohmann::ordered_json& context,
                                        const ChatTemplateOptions& options) const {
  ChatTemplateResult result;
  try {
    if (!context.is_object()) jinja::fail("chat template context must be a JSON object");
    jinja::Dict variables;
    for (const auto& [key, value] : context.items()) {
      variables.emplace_back(key, jinja::Value::from_json(value));
    }
    jinja::Interpreter interpreter(options.limits, options.now, std::move(variables));
    result.text = interpreter.render(*body_);
  } catch (const jinja::RenderFailure& e) {
    result.error = ChatTemplateError{e.kind(), e.what()};
  } catch (const std::bad_alloc&) {
    result.error = ChatTemplateError{jinja::ErrorKind::limit, "out of memory while rendering the chat template"};
  } catch (const std::exception& e) {  // a bug of ours must still be a request error, not a crash
    result.error = ChatTemplateError{jinja::ErrorKind::runtime, std::string("chat template failed: ") + e.what()};
  }
  return result;
}

nlohmann::ordered_json make_chat_context(const nlohmann::ordered_json& messages,
                                         const nlohmann::ordered_json& tools,
                                         bool add_generation_prompt,
                                         const nlohmann::ordered_json& extra) {
  static const char* const reasoning_fields[] = {"reasoning_content", "thinking", "reasoning"};
  nlohmann::ordered_json prepared = nlohmann::ordered_json::array();
  if (messages.is_array()) {
    for (const auto& message : messages) {
      if (!message.is_object()) {
        prepared.push_back(message);
        continue;
      }
      nlohmann::ordered_json m = nlohmann::ordered_json::object();
      for (const auto& [k, v] : message.items()) {
        if (!v.is_null()) m[k] = v;  // transformers drops keys whose value is None
      }
      const nlohmann::ordered_json* reasoning = nullptr;
      for (const char* f : reasoning_fields) {
        if (m.contains(f)) {
          reasoning = &m[f];
          break;
        }
      }
      if (reasoning != nullptr) {  // {"thinking": r, **message, "reasoning_content": r}
        const nlohmann::ordered_json r = *reasoning;
        nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
        aliased["thinking"] = r;
        for (const auto& [k, v] : m.items()) aliased[k] = v;
        aliased["reasoning_content"] = r;
        m = std::move(aliased);
      }
      prepared.push_back(std::move(m));
    }
  }
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = messages.is_array() ? prepared : messages;
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [k, v] : extra.items()) ctx[k] = v;
  return ctx;
}

ChatTemplateResult render_continuing_final_message(const ChatTemplate& chat_template, nlohmann::ordered_json context,
                                                   const ChatTemplateOptions& options) {
  static const std::string kTag = "CONTINUE_FINAL_MESSAGE_TAG ";
  static const std::string kTagStripped = "CONTINUE_FINAL_MESSAGE_TAG";
  auto failure = [](std::string message) {
    ChatTemplateResult r;
    r.error = ChatTemplateError{jinja::ErrorKind::runtime, std::move(message)};
    return r;
  };
  nlohmann::ordered_json* messages = context.contains("messages") ? &context["messages"] : nullptr;
  if (messages == nullptr || !messages->is_array() || messages->empty())
    return failure("continue_final_message is set but the conversation is empty");
  nlohmann::ordered_json& last = messages->back();
  if (!last.is_object() || !last.contains("content") || last["content"].is_null())
    return failure("continue_final_message is set but the final message has no content to continue");
  if (chat_template.source().find("content") == std::string::npos)
    return failure("continue_final_message is set but the chat template never reads a message's content");
  nlohmann::ordered_json* text = &last["content"];
  if (text->is_array()) {  // text parts: continue the last one that has text
    text = nullptr;
    for (auto it = last["content"].rbegin(); it != last["content"].rend() && text == nullptr; ++it)
      if (it->is_object() && it->contains("text")) text = &(*it)["text"];
    if (text == nullptr) return failure("continue_final_message is set but the final message has no text to continue");
  }
  if (!text->is_string()) return failure("continue_final_message: the final message's text is not a string");
  const std::string final_text = jinja::py_strip(text->get<std::string>(), nullptr, true, true);
  *text = text->get<std::string>() + kTag;
  ChatTemplateResult result = chat_template.render(context, options);
  if (!result.ok()) return result;
  const size_t at = result.text.rfind(kTagStripped);
  if (at == std::string::npos || result.text.find(final_text) == std::string::npos)
    return failure("continue_final_message is set but the final message does not appear in the rendered chat template");
  const bool spacing_kept = result.text.compare(at, kTag.size(), kTag) == 0;
  result.text.resize(at);
  if (!spacing_kept) result.text = jinja::py_strip(result.text, nullptr, false, true);
  return result;
}

}  // namespace fp8serve
