// The sandbox: hostile templates and hostile request data end in an error (a TemplateError at
// load, an error value at render), never in a crash, a hang or unbounded memory.
#include <catch2/catch.hpp>

#include <string>

#include "model/chat_template/chat_template.hpp"

namespace {

using fp8serve::ChatTemplate;
using fp8serve::ChatTemplateOptions;
using fp8serve::jinja::ErrorKind;
using ojson = nlohmann::ordered_json;

fp8serve::ChatTemplateResult render(const std::string& source, const ojson& ctx = ojson::object(),
                                    const ChatTemplateOptions& options = {}) {
  return ChatTemplate::parse(source).render(ctx, options);
}

}  // namespace

TEST_CASE("output size is bounded", "[chat_template][sandbox]") {
  ChatTemplateOptions options;
  options.limits.max_output_bytes = 1 << 16;
  const auto r = render("{% for i in range(1000) %}{{ 'x' * 100 }}{% endfor %}", ojson::object(), options);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error->kind == ErrorKind::limit);
  // Exactly at the limit is fine.
  const auto ok = render("{{ 'x' * 65536 }}", ojson::object(), options);
  REQUIRE(ok.ok());
  CHECK(ok.text.size() == 65536);
}

TEST_CASE("strings that double in a loop hit the size limit", "[chat_template][sandbox]") {
  const auto r = render(
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error->kind == ErrorKind::limit);
  CHECK_FALSE(render("{{ 'ab' * 9223372036854775807 }}").ok());
  CHECK_FALSE(render("{{ [1, 2] * 9223372036854775807 }}").ok());
}

TEST_CASE("loop iterations are bounded", "[chat_template][sandbox]") {
  ChatTemplateOptions options;
  options.limits.max_loop_iterations = 50000;
  const auto r = render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
                        ojson::object(), options);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error->kind == ErrorKind::limit);
  CHECK(render("{% for i in range(100) %}{% endfor %}done", ojson::object(), options).text == "done");
}

TEST_CASE("macro recursion is bounded", "[chat_template][sandbox]") {
  const auto r = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error->kind == ErrorKind::limit);
}

TEST_CASE("deeply nested templates are load-time errors, not stack overflows", "[chat_template][sandbox]") {
  CHECK_THROWS_AS(ChatTemplate::parse("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}"),
                  fp8serve::TemplateError);
  CHECK_THROWS_AS(ChatTemplate::parse("{{ " + std::string(100000, '[') + " }}"), fp8serve::TemplateError);
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  CHECK_THROWS_AS(ChatTemplate::parse(ifs), fp8serve::TemplateError);
  std::string nots = "{{ ";
  for (int i = 0; i < 50000; ++i) nots += "not ";
  CHECK_THROWS_AS(ChatTemplate::parse(nots + "x }}"), fp8serve::TemplateError);
  std::string minus = "{{ ";
  for (int i = 0; i < 50000; ++i) minus += "- ";
  CHECK_THROWS_AS(ChatTemplate::parse(minus + "1 }}"), fp8serve::TemplateError);
}

TEST_CASE("deeply nested request data is an error value", "[chat_template][sandbox]") {
  ojson deep = "leaf";
  for (int i = 0; i < 1000; ++i) deep = ojson::array({deep});
  const auto r = render("{{ x|tojson }}", ojson{{"x", deep}});
  REQUIRE_FALSE(r.ok());
}

TEST_CASE("self-referencing values do not recurse forever", "[chat_template][sandbox]") {
  const auto r = render(
      "{% set ns = namespace(a=1) %}{% set ns.self = ns %}{% set ns.list = [ns, ns] %}{{ ns.list }}{{ ns == ns }}");
  REQUIRE(r.ok());
  CHECK(r.text == "[<Namespace>, <Namespace>]True");
  CHECK_FALSE(render("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns|tojson }}").ok());
}

TEST_CASE("no file, module or environment access", "[chat_template][sandbox]") {
  for (const char* source : {"{% include 'secrets.txt' %}", "{% import 'x' as y %}", "{% extends 'base' %}",
                             "{% from 'x' import y %}", "{% block b %}{% endblock %}"}) {
    INFO(source);
    CHECK_THROWS_AS(ChatTemplate::parse(source), fp8serve::TemplateError);
  }
  // Python escape hatches are not there: such names are undefined, and using them is an error.
  CHECK_FALSE(render("{{ os.environ }}").ok());
  CHECK_FALSE(render("{{ cycler.__init__.__globals__ }}").ok());
  CHECK_FALSE(render("{{ ''.__class__.__mro__ }}").ok());
  CHECK(render("[{{ ''.__class__ }}]{{ ''.__class__ is defined }}{{ [].__len__ is defined }}").text == "[]FalseFalse");
  CHECK_FALSE(render("{% set ns = namespace(_private=1) %}").ok());
  CHECK_FALSE(render("{% set ns = namespace() %}{% set ns._x = 1 %}").ok());
  CHECK_FALSE(render("{% set x = 'a' %}{% set x.y = 1 %}").ok());
}

TEST_CASE("caller() cannot escape its call block", "[chat_template][sandbox]") {
  const auto r = render(
      "{% set ns = namespace() %}{% macro keep() %}{% set ns.c = caller %}{% endmacro %}"
      "{% call keep() %}body{% endcall %}{{ ns.c() }}");
  REQUIRE_FALSE(r.ok());
}

TEST_CASE("broken templates name the line at load time", "[chat_template]") {
  try {
    ChatTemplate::parse("line one\n{% for x in y %}\n{{ x }\n{% endfor %}");
    FAIL("expected a TemplateError");
  } catch (const fp8serve::TemplateError& e) {
    CHECK(e.line() == 3);
    CHECK(std::string(e.what()).find("line 3") != std::string::npos);
  }
}

TEST_CASE("raise_exception gives a request error with the template's message", "[chat_template]") {
  const auto r = render("{{ raise_exception('Conversation roles must alternate') }}");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error->kind == ErrorKind::raised);
  CHECK(r.error->message == "Conversation roles must alternate");
  const auto not_object = ChatTemplate::parse("x").render(ojson::array());
  CHECK_FALSE(not_object.ok());
}

TEST_CASE("{% generation %} renders its body, as transformers' extension does", "[chat_template]") {
  CHECK(render("a{% generation %}{{ 'b' }}{% endgeneration %}c").text == "abc");
}

TEST_CASE("make_chat_context mirrors transformers' message preparation", "[chat_template]") {
  const ojson messages = ojson::parse(R"([
    {"role": "user", "content": "hi", "name": null},
    {"role": "assistant", "content": "ok", "reasoning": "because"}])");
  const ojson ctx = fp8serve::make_chat_context(messages, nullptr, true, ojson{{"bos_token", "<s>"}});
  CHECK(ctx.dump() ==
        R"({"messages":[{"role":"user","content":"hi"},)"
        R"({"thinking":"because","role":"assistant","content":"ok","reasoning":"because","reasoning_content":"because"}],)"
        R"("tools":null,"documents":null,"add_generation_prompt":true,"bos_token":"<s>"})");
  // Tool schemas keep the client's key order through tojson (nlohmann::json would sort them).
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "f", "description": "d"}}])");
  const auto r = render("{{ tools[0]|tojson }}", fp8serve::make_chat_context(ojson::array(), tools, false));
  CHECK(r.text == R"({"type": "function", "function": {"name": "f", "description": "d"}})");
}
