#include "server/api/tool_calls.hpp"

#include <set>

#include "server/api/responses.hpp"
#include "server/grammar/json_text.hpp"

namespace fp8serve {

namespace {

using Json = nlohmann::ordered_json;

struct Rejected {
  ApiError error;
};

[[noreturn]] void reject(const std::string& param, const std::string& message) { throw Rejected{bad_request(message, param)}; }

bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

// The `function` objects of `tools`, validated.
std::vector<const Json*> parse_tools(const Json& tools) {
  std::vector<const Json*> out;
  if (tools.is_null()) return out;
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string param = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object())
      reject(param, "'" + param + "' must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}.");
    const Json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || !valid_function_name(f["name"].get<std::string>()))
      reject(param + ".function.name", "'" + param + ".function.name' must be 1 to 64 letters, digits, '_' or '-'.");
    if (!names.insert(f["name"].get<std::string>()).second)
      reject(param + ".function.name", "two tools are named '" + f["name"].get<std::string>() + "'.");
    if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object())
      reject(param + ".function.parameters", "'" + param + ".function.parameters' must be a JSON Schema object.");
    if (f.contains("description") && !f["description"].is_null() && !f["description"].is_string())
      reject(param + ".function.description", "'" + param + ".function.description' must be a string.");
    out.push_back(&f);
  }
  return out;
}

enum class Choice { none, auto_, required, named };

Choice parse_choice(const Json& choice, bool have_tools, const std::vector<const Json*>& tools, std::string& named) {
  if (choice.is_null()) return have_tools ? Choice::auto_ : Choice::none;
  if (choice.is_string()) {
    const std::string c = choice.get<std::string>();
    if (c == "none") return Choice::none;
    if (c == "auto") return Choice::auto_;
    if (c == "required") {
      if (!have_tools) reject("tool_choice", "'tool_choice': \"required\" needs 'tools'.");
      return Choice::required;
    }
    reject("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}.");
  }
  if (!choice.is_object() || choice.value("type", "") != "function" || !choice.contains("function") ||
      !choice["function"].is_object() || !choice["function"].contains("name") || !choice["function"]["name"].is_string())
    reject("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}.");
  named = choice["function"]["name"].get<std::string>();
  for (const Json* f : tools)
    if ((*f)["name"] == named) return Choice::named;
  reject("tool_choice", "'tool_choice' names the function '" + named + "', which is not in 'tools'.");
}

// A call as the model writes it in `format`.
std::string call_text(const std::string& name, const Json& arguments, ToolCallFormat format) {
  Json call = {{"name", name}, {format == ToolCallFormat::hermes ? "arguments" : "parameters", arguments}};
  const std::string json = dump_json(call);
  return format == ToolCallFormat::hermes ? "<tool_call>\n" + json + "\n</tool_call>" : json;
}

// The tools described in a system message, for templates that do not render them.
std::string tools_prompt(const Json& tools, ToolCallFormat format) {
  std::string out = "You can call functions to answer. These are available, each described as JSON:\n<tools>\n";
  for (const Json& t : tools) out += dump_json(t) + "\n";
  out += "</tools>\n";
  if (format == ToolCallFormat::hermes) {
    out += "To call a function, write a JSON object with its \"name\" and its \"arguments\" between <tool_call> and "
           "</tool_call>, one call per pair of tags:\n" +
           call_text("function_name", {{"argument", "value"}}, format);
  } else {
    out += "To call a function, answer only with a JSON object holding its \"name\" and its \"parameters\":\n" +
           call_text("function_name", {{"argument", "value"}}, format);
  }
  return out;
}

// The history as the template should see it: arguments strings parsed to objects (templates
// that print them with tojson expect objects), and, for templates that ignore tools, calls
// and results written out as text.
Json prepare_messages(const Json& messages, const Json& tools, bool inject, ToolCallFormat format) {
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    Json m = messages[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    const std::string role = m["role"].get<std::string>();
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (role != "assistant") reject(param + ".tool_calls", "only assistant messages carry 'tool_calls'.");
      if (!m["tool_calls"].is_array()) reject(param + ".tool_calls", "'" + param + ".tool_calls' must be a list.");
      std::string text = m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "";
      for (Json& call : m["tool_calls"]) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].contains("name") || !call["function"]["name"].is_string())
          reject(param + ".tool_calls", "each tool call needs {\"function\": {\"name\": ..., \"arguments\": ...}}.");
        Json& args = call["function"]["arguments"];
        if (args.is_string()) {
          try {
            Json parsed = Json::parse(args.get<std::string>());
            if (parsed.is_object()) args = std::move(parsed);
          } catch (const Json::exception&) {
          }
        }
        if (args.is_null()) args = Json::object();
        if (inject) text += (text.empty() ? "" : format == ToolCallFormat::hermes ? "\n" : "; ") +
                            call_text(call["function"]["name"].get<std::string>(), args, format);
      }
      if (inject) {
        m.erase("tool_calls");
        m["content"] = text;
      } else if (!m.contains("content") || m["content"].is_null()) {
        m["content"] = "";
      }
    }
    if (role == "tool" && inject) {
      const std::string result = m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "";
      m = {{"role", "user"}, {"content", "<tool_response>\n" + result + "\n</tool_response>"}};
    }
    out.push_back(std::move(m));
  }
  if (inject && tools.is_array() && !tools.empty()) {
    const std::string prompt = tools_prompt(tools, format);
    if (!out.empty() && out[0].value("role", "") == "system" && out[0]["content"].is_string()) {
      out[0]["content"] = out[0]["content"].get<std::string>() + "\n\n" + prompt;
    } else {
      out.insert(out.begin(), Json{{"role", "system"}, {"content", prompt}});
    }
  }
  return out;
}

// One or more calls (or exactly one), each {"name": <one of the tools>, "arguments": <its
// parameters' schema>} in the model's format.
grammar::Grammar call_grammar(const std::vector<const Json*>& functions, ToolCallFormat format, bool multiple,
                              const grammar::SchemaLimits& limits) {
  using namespace grammar;
  static const Json kNoParameters = {{"type", "object"}, {"properties", Json::object()}, {"additionalProperties", false}};
  GrammarBuilder builder(limits.grammar);
  Nfa& nfa = builder.nfa();
  std::vector<std::unique_ptr<JsonSchemaCompiler>> compilers;  // one per parameters document ($refs resolve in it)
  std::vector<Frag> calls;
  for (const Json* f : functions) {
    const Json& params = f->contains("parameters") && !(*f)["parameters"].is_null() ? (*f)["parameters"] : kNoParameters;
    compilers.push_back(std::make_unique<JsonSchemaCompiler>(builder, params, limits));
    const RuleId args = compilers.back()->rule_for(params);
    calls.push_back(nfa.seq({nfa.literal("{"), ws_break(nfa), nfa.literal("\"name\""), ws_inline(nfa), nfa.literal(":"),
                             ws_inline(nfa), nfa.literal(json_literal_text((*f)["name"])), ws_inline(nfa), nfa.literal(","),
                             ws_break(nfa), nfa.literal(format == ToolCallFormat::hermes ? "\"arguments\"" : "\"parameters\""),
                             ws_inline(nfa), nfa.literal(":"), ws_inline(nfa), nfa.call(args), ws_break(nfa), nfa.literal("}")}));
  }
  auto one = [&] { return nfa.alt(calls); };
  Frag body;
  if (format == ToolCallFormat::hermes) {
    auto block = [&] { return nfa.seq({nfa.literal("<tool_call>"), ws_break(nfa), one(), ws_break(nfa), nfa.literal("</tool_call>")}); };
    body = multiple ? nfa.seq({block(), nfa.star(nfa.seq({nfa.literal("\n"), block()}))}) : block();
  } else {
    body = multiple ? nfa.seq({one(), nfa.star(nfa.seq({nfa.literal(";"), ws_inline(nfa), one()}))}) : one();
  }
  const RuleId root = builder.declare("tool calls");
  builder.define(root, body);
  return builder.build(root);
}

}  // namespace

ToolTemplateSupport tool_template_support(const std::string& source, std::optional<ToolCallFormat> forced) {
  ToolTemplateSupport s;
  s.renders_tools = source.find("tools") != std::string::npos;
  if (forced) {
    s.format = *forced;
  } else if (source.find("<tool_call>") != std::string::npos) {
    s.format = ToolCallFormat::hermes;
  } else if (source.find("<|python_tag|>") != std::string::npos || source.find("ipython") != std::string::npos) {
    s.format = ToolCallFormat::llama3_json;
  }
  return s;
}

std::variant<ToolSetup, ApiError> prepare_tools(const ApiRequest& r, const ToolTemplateSupport& support,
                                                StructuredOutputs* structured) {
  try {
    if (!r.tools.is_null() && !r.tools.is_array()) reject("tools", "'tools' must be a list.");
    const std::vector<const Json*> functions = parse_tools(r.tools);
    const bool have_tools = !functions.empty();
    std::string named;
    const Choice choice = parse_choice(r.tool_choice, have_tools, functions, named);
    ToolSetup setup;
    const bool inject = !support.renders_tools && choice != Choice::none;
    setup.messages = prepare_messages(r.messages, r.tools, inject, support.format);
    // With "none" the model does not see the tools (so it has no reason to write a call, which
    // would reach the client as text), as OpenAI's "will not call any tool" reads.
    if (support.renders_tools && have_tools && choice != Choice::none) setup.tools = r.tools;
    if (have_tools && choice != Choice::none) setup.parse = support.format;
    if (choice == Choice::required || choice == Choice::named) {
      if (structured == nullptr)
        return bad_request("'tool_choice' required or named needs structured outputs, which this server has not set up.",
                           "tool_choice");
      std::vector<const Json*> chosen;
      for (const Json* f : functions)
        if (choice == Choice::required || (*f)["name"] == named) chosen.push_back(f);
      const bool multiple = choice == Choice::required && r.parallel_tool_calls;
      Json key = {{"format", tool_call_format_name(support.format)}, {"multiple", multiple}, {"functions", Json::array()}};
      for (const Json* f : chosen) key["functions"].push_back({{"name", (*f)["name"]}, {"parameters", f->value("parameters", Json())}});
      auto compiled = structured->cached(
          "tools:" + dump_json(key),
          [&](const grammar::SchemaLimits& limits) { return call_grammar(chosen, support.format, multiple, limits); }, "tools",
          "tools[].function.parameters");
      if (auto* error = std::get_if<ApiError>(&compiled)) return *error;
      setup.grammar = std::get<GrammarPtr>(compiled);
    }
    return setup;
  } catch (const Rejected& e) {
    return e.error;
  }
}

}  // namespace fp8serve
