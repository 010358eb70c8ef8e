// Each feature of the Jinja subset, one small template per case, against the output Python's
// jinja2 gives for it (tests/fixtures/chat_templates/features.cases.json). Syntax errors must be
// load-time TemplateErrors; runtime errors must come back as error values, never as a crash.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "model/chat_template/chat_template.hpp"
#include "tests/unit/chat_template/fixture_util.hpp"

namespace {

using ojson = nlohmann::ordered_json;

ojson load_features(const std::string& file) {
  return ojson::parse(fp8serve::test::read_fixture_file(std::string(FP8SERVE_FIXTURES_DIR) + "/chat_templates/" + file));
}

// exact_errors: the fixture records every error as "ExceptionType: message" (Python's str(e)),
// and our message must equal jinja2's, not only fail where it fails.
void check_features(const std::string& file, size_t min_cases, bool exact_errors = false) {
  const ojson fixture = load_features(file);
  const fp8serve::ChatTemplateOptions options = fp8serve::test::fixed_time_options();
  size_t checked = 0;
  for (const ojson& c : fixture.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    const std::string source = c.at("template").get<std::string>();
    INFO("case " << name << ": " << source);
    const std::string error = c.value("error", "");
    if (error == "syntax") {
      CHECK_THROWS_AS(fp8serve::ChatTemplate::parse(source), fp8serve::TemplateError);
      ++checked;
      continue;
    }
    fp8serve::ChatTemplate tmpl;
    REQUIRE_NOTHROW(tmpl = fp8serve::ChatTemplate::parse(source));
    const auto result = tmpl.render(c.at("context"), options);
    if (c.contains("expected")) {
      INFO((result.ok() ? std::string() : result.error->message));
      CHECK(result.ok());
      if (result.ok()) CHECK(result.text == c.at("expected").get<std::string>());
    } else {
      CHECK_FALSE(result.ok());
      if (result.ok()) continue;
      if (error == "raised") {
        CHECK(result.error->kind == fp8serve::jinja::ErrorKind::raised);
        CHECK(result.error->message == c.at("message").get<std::string>());
      } else {
        CHECK(result.error->kind != fp8serve::jinja::ErrorKind::raised);
        if (exact_errors) {
          const std::string expected = c.at("message").get<std::string>();
          CHECK(result.error->message == expected.substr(expected.find(": ") + 2));
        }
      }
    }
    ++checked;
  }
  CHECK(checked >= min_cases);
}

}  // namespace

TEST_CASE("Jinja features render as jinja2 renders them", "[chat_template]") {
  check_features("features.cases.json", 100);
}

// Random mixes of whitespace-control tags, comments, raw blocks and expressions.
TEST_CASE("random whitespace/expression templates render as jinja2 renders them", "[chat_template]") {
  check_features("random.cases.json", 1500);
}

// Every filter on none, false, 0, 0.0, '', [], {}, an undefined name, true and 5: select /
// reject / selectattr / rejectattr / map yield nothing for a falsy input (functionary's template
// does `tools | selectattr(...)` with tools none), the others render or fail exactly as jinja2.
TEST_CASE("filters on falsy and non-iterable inputs behave as in jinja2, errors included", "[chat_template]") {
  check_features("falsy.cases.json", 440, /*exact_errors=*/true);
}
