// NFC against Python's unicodedata on the corpus, plus the algorithm's corner cases.
#include <catch2/catch.hpp>

#include "model/tokenizer/unicode_nfc.hpp"
#include "tokenizer_fixtures.hpp"

using namespace fp8serve;

TEST_CASE("NFC matches Python's unicodedata on the corpus", "[tokenizer]") {
  const auto lines = test::corpus(), expected = test::corpus_nfc();
  REQUIRE(lines.size() == expected.size());
  std::size_t changed = 0, mismatches = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    changed += lines[i] != expected[i];
    if (nfc(lines[i]) != expected[i] && ++mismatches <= 5) UNSCOPED_INFO("line " << i << ": " << nlohmann::json(lines[i]).dump());
  }
  CHECK(mismatches == 0);
  CHECK(changed > 100);  // the corpus does exercise composition
}

TEST_CASE("NFC corner cases", "[tokenizer]") {
  CHECK(nfc("e\xCC\x81") == "\xC3\xA9");                        // e + acute -> é
  CHECK(nfc("\xE2\x84\xAB") == "\xC3\x85");                     // Angstrom sign -> Å (singleton)
  CHECK(nfc("\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB") == "\xED\x95\x9C");  // Hangul L V T -> 한
  CHECK(nfc("a\xCC\xA3\xCC\x81") == nfc("a\xCC\x81\xCC\xA3"));  // canonical reordering
  CHECK(nfc("\xE0\xA5\x98") == "\xE0\xA4\x95\xE0\xA4\xBC");     // composition exclusion stays decomposed
  CHECK(nfc("plain ascii") == "plain ascii");
  CHECK(nfc("") == "");
}
