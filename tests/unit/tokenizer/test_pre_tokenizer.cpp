// The split regexes under PCRE2 against HF tokenizers (Oniguruma) on the corpus, Split's five
// behaviours with and without invert, Digits, and ByteLevel's prefix space.
#include <catch2/catch.hpp>

#include "model/text/utf8.hpp"
#include "model/tokenizer/pre_tokenizer.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "tokenizer_fixtures.hpp"

using namespace fp8serve;

namespace {

std::size_t count_code_points(std::string_view s) {
  std::size_t n = 0;
  char32_t cp;
  std::size_t len;
  for (std::size_t pos = 0; pos < s.size(); pos += len, ++n) utf8::decode(s, pos, cp, len);
  return n;
}

}  // namespace

TEST_CASE("pre-tokenizer splits match HF tokenizers on the corpus", "[tokenizer]") {
  const auto lines = test::corpus();
  std::ifstream in(test::tokenizer_fixtures() / "pre_tokenizer_splits.jsonl");
  std::size_t num_cases = 0;
  for (std::string row; std::getline(in, row);) {
    const auto j = nlohmann::json::parse(row);
    const PreTokenizer pre(parse_pre_tokenizer_json(j["config"]));
    const auto& expected = j["lengths"];
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < expected.size(); ++i) {
      std::vector<std::size_t> got;
      for (const auto& piece : pre.run(lines[i])) got.push_back(count_code_points(piece));
      if (got != expected[i].get<std::vector<std::size_t>>() && ++mismatches <= 3) {
        UNSCOPED_INFO(j["config"].dump() << "\n  line " << i << " " << nlohmann::json(lines[i]).dump()
                                         << "\n  got " << nlohmann::json(got).dump() << "\n  expected "
                                         << expected[i].dump());
      }
    }
    CHECK(mismatches == 0);
    ++num_cases;
  }
  CHECK(num_cases >= 25);
}

TEST_CASE("byte-level map is GPT-2's and reversible", "[tokenizer]") {
  CHECK(byte_to_unicode(' ') == U'\u0120');  // "Ġ"
  CHECK(byte_to_unicode('\n') == U'\u010A');  // "Ċ"
  CHECK(byte_to_unicode('a') == U'a');
  for (int b = 0; b < 256; ++b) CHECK(unicode_to_byte(byte_to_unicode(static_cast<unsigned char>(b))) == b);
  CHECK(unicode_to_byte(U' ') == -1);
  CHECK(byte_level_encode("a b\xC3\xA9") == "a\xC4\xA0" "b\xC3\x83\xC2\xA9");
}

TEST_CASE("unsupported or malformed pre-tokenizers fail by name", "[tokenizer]") {
  using nlohmann::json;
  CHECK_THROWS_WITH(parse_pre_tokenizer_json(json{{"type", "Metaspace"}}), Catch::Contains("Metaspace"));
  CHECK_THROWS_WITH(parse_pre_tokenizer_json(json{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}}),
                    Catch::Contains("bad split regex"));
  CHECK_THROWS_AS(parse_pre_tokenizer_json(json{{"type", "Split"}}), TokenizerError);
  CHECK_THROWS_WITH(parse_pre_tokenizer_json(json{{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}}),
                    Catch::Contains("Sideways"));
  CHECK(parse_pre_tokenizer_json(json(nullptr)).empty());
}
