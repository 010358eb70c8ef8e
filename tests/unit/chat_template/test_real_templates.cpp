// Real model chat templates rendered by our interpreter must match, byte for byte, what
// transformers + jinja2 render for the same conversations (tests/fixtures/chat_templates, made by
// tests/scripts/make_chat_template_fixtures.py), including which inputs make a template raise.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "model/chat_template/chat_template.hpp"
#include "tests/unit/chat_template/fixture_util.hpp"

namespace {

using fp8serve::ChatTemplate;
using fp8serve::ChatTemplateOptions;
using ojson = nlohmann::ordered_json;

using fp8serve::test::fixed_time_options;
using fp8serve::test::read_fixture_file;

void check_template(const std::string& name, size_t min_cases) {
  const std::string dir = std::string(FP8SERVE_FIXTURES_DIR) + "/chat_templates/";
  const ojson fixture = ojson::parse(read_fixture_file(dir + name + ".cases.json"));
  const ChatTemplate tmpl = ChatTemplate::parse(read_fixture_file(dir + fixture.at("template").get<std::string>()));
  const ChatTemplateOptions options = fixed_time_options();
  size_t rendered = 0;
  size_t errors = 0;
  for (const ojson& c : fixture.at("cases")) {
    INFO(name << " case " << c.at("name").get<std::string>());
    const ojson ctx = fp8serve::make_chat_context(c.at("messages"), c.at("tools"),
                                                  c.at("add_generation_prompt").get<bool>(), c.at("extra"));
    const auto result = tmpl.render(ctx, options);
    if (c.contains("expected")) {
      INFO((result.ok() ? std::string() : result.error->message));
      REQUIRE(result.ok());
      CHECK(result.text == c.at("expected").get<std::string>());
      ++rendered;
    } else {
      REQUIRE_FALSE(result.ok());
      if (c.at("error") == "raised") {
        CHECK(result.error->kind == fp8serve::jinja::ErrorKind::raised);
        CHECK(result.error->message == c.at("message").get<std::string>());
      } else {
        CHECK(result.error->kind == fp8serve::jinja::ErrorKind::runtime);
      }
      ++errors;
    }
  }
  CHECK(rendered + errors >= min_cases);
  CHECK(rendered >= 30);
}

}  // namespace

TEST_CASE("SmolLM2-Instruct template matches jinja2", "[chat_template]") { check_template("smollm2", 60); }
TEST_CASE("Qwen2.5-Instruct template matches jinja2", "[chat_template]") { check_template("qwen2_5", 60); }
TEST_CASE("Qwen3 template matches jinja2, thinking on and off", "[chat_template]") { check_template("qwen3", 60); }
TEST_CASE("Llama-3.1-Instruct template matches jinja2", "[chat_template]") { check_template("llama3_1", 60); }
TEST_CASE("Llama-3.2-Instruct template matches jinja2", "[chat_template]") { check_template("llama3_2", 60); }
TEST_CASE("Zephyr/TinyLlama template matches jinja2", "[chat_template]") { check_template("zephyr", 60); }
TEST_CASE("Mistral-7B-Instruct-v0.2 template matches jinja2", "[chat_template]") { check_template("mistral_v0_2", 60); }
