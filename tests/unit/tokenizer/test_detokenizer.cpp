// Streaming detokenization: every piece valid UTF-8; the concatenation equals decode(), less the
// final U+FFFD of a sequence that ends inside a character (held back, then dropped); checked
// against HF tokenizers and Python's UTF-8 codec (detokenizer_streams.json).
#include <catch2/catch.hpp>

#include <fstream>
#include <random>

#include "model/formats/gguf.hpp"
#include "model/text/utf8.hpp"
#include "model/tokenizer/detokenizer.hpp"
#include "tokenizer_fixtures.hpp"

using namespace fp8serve;

namespace {

std::string stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  IncrementalDetokenizer detok(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = detok.push(id);
    REQUIRE(utf8::is_valid(piece));
    streamed += piece;
  }
  detok.finish();
  return streamed;
}

void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  const std::string streamed = stream(tok, ids, skip_special);
  const std::string full = tok.decode(ids, skip_special);
  // Equal, or the full decode shows the character the ids end inside as one U+FFFD.
  if (streamed != full) REQUIRE(streamed + "\xEF\xBF\xBD" == full);
}

void check_tokenizer(const Tokenizer& tok) {
  INFO(tok.kind());
  const auto lines = test::corpus();
  for (std::size_t i = 0; i < lines.size(); i += 3) {
    std::vector<int32_t> ids = tok.encode(lines[i], true);
    check_stream(tok, ids, false);
    check_stream(tok, ids, true);
  }
  // Random id streams: cut characters, stray continuation bytes, specials anywhere.
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> any_id(0, tok.vocab_size() - 1), small_id(0, 300);
  for (int round = 0; round < 300; ++round) {
    std::vector<int32_t> ids;
    for (int k = 0; k < 12; ++k) ids.push_back(k % 2 ? any_id(rng) : small_id(rng));
    check_stream(tok, ids, round % 2 == 0);
  }
}

}  // namespace

TEST_CASE("incremental detokenizer: byte-level BPE", "[tokenizer]") {
  auto tok = load_tokenizer_dir(test::tokenizer_fixtures() / "smollm2");
  check_tokenizer(*tok);
  // An emoji is four bytes spread over several tokens: nothing comes out until it is whole.
  const auto ids = tok->encode("🤖", false);
  REQUIRE(ids.size() > 1);
  IncrementalDetokenizer detok(*tok);
  for (std::size_t i = 0; i + 1 < ids.size(); ++i) CHECK(detok.push(ids[i]).empty());
  CHECK(detok.push(ids.back()) == "🤖");
}

TEST_CASE("incremental detokenizer: SentencePiece leading-space rules", "[tokenizer]") {
  auto tok = load_tokenizer_dir(test::tokenizer_fixtures() / "mistral_spm");
  check_tokenizer(*tok);
  IncrementalDetokenizer detok(*tok);
  std::string text;
  for (int32_t id : tok->encode("Hello world", true)) text += detok.push(id);
  CHECK(text == "Hello world");  // no dummy-prefix space, inner space kept
}

TEST_CASE("incremental detokenizer: SentencePiece from GGUF", "[tokenizer]") {
  const GgufFile gguf = GgufFile::open((test::tokenizer_fixtures() / "mistral_spm" / "vocab.gguf").string());
  check_tokenizer(*from_gguf(gguf));
}

TEST_CASE("utf8 helpers", "[tokenizer]") {
  CHECK(utf8::is_valid("h\xC3\xA9llo \xF0\x9F\xA4\x96"));
  CHECK(!utf8::is_valid("\xC0\x80"));          // overlong
  CHECK(!utf8::is_valid("\xED\xA0\x80"));      // surrogate
  CHECK(!utf8::is_valid("\xF4\x90\x80\x80"));  // above U+10FFFF
  CHECK(utf8::to_valid_lossy("a\xFF" "b") == "a\xEF\xBF\xBD" "b");
  // Maximal subparts: an incomplete 3-byte sequence is one U+FFFD, as Rust's from_utf8_lossy.
  CHECK(utf8::to_valid_lossy("\xE2\x82x") == "\xEF\xBF\xBDx");
  CHECK(utf8::incomplete_tail_length("ab\xE2\x82") == 2);
  CHECK(utf8::incomplete_tail_length("ab\xE2\x82\xAC") == 0);
  CHECK(utf8::incomplete_tail_length("\xF0\x9F") == 2);
  CHECK(utf8::incomplete_tail_length("\xF0\x9F\x98") == 3);
  CHECK(utf8::incomplete_tail_length("a\xF0") == 1);
  CHECK(utf8::incomplete_tail_length("\xFF") == 0);          // never valid: released as U+FFFD
  CHECK(utf8::incomplete_tail_length("\xED\xA9") == 0);      // a surrogate can never complete
  CHECK(utf8::incomplete_tail_length("\xE0\x80") == 0);      // overlong
  CHECK(utf8::incomplete_tail_length("\xF4\x90") == 0);      // above U+10FFFF
  CHECK(utf8::incomplete_tail_length("\x80\x80\x80") == 0);  // stray continuation bytes
  CHECK(utf8::incomplete_tail_length("") == 0);
}

// Token sequences of the real SmolLM2 tokenizer that cut characters (every prefix of emoji, CJK
// and accented text; single-byte tokens: cut, stray and invalid bytes). The expected text comes
// from Python (bytes less an incomplete final character, decoded with errors="replace") and was
// checked against HF tokenizers' decode of the whole sequence when the fixture was made.
TEST_CASE("incremental detokenizer: split characters held back, dropped at the end (HF reference)", "[tokenizer]") {
  auto tok = load_tokenizer_dir(test::tokenizer_fixtures() / "smollm2");
  std::ifstream in(test::tokenizer_fixtures() / "detokenizer_streams.json");
  const nlohmann::json fixture = nlohmann::json::parse(in);
  int ends_inside = 0;
  for (const auto& c : fixture.at("cases")) {
    INFO(c.at("name").get<std::string>());
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    CHECK(stream(*tok, ids, false) == c.at("stream").get<std::string>());
    CHECK(tok->decode(ids, false) == c.at("hf_decode").get<std::string>());
    ends_inside += c.at("ends_inside_char").get<bool>() ? 1 : 0;
  }
  CHECK(ends_inside > 100);
}
