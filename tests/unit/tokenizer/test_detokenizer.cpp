// Streaming detokenization: every piece valid UTF-8, and the concatenation equals decode().
#include <catch2/catch.hpp>

#include <random>

#include "model/formats/gguf.hpp"
#include "model/tokenizer/detokenizer.hpp"
#include "model/tokenizer/utf8.hpp"
#include "tokenizer_fixtures.hpp"

using namespace fp8serve;

namespace {

void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  IncrementalDetokenizer detok(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = detok.push(id);
    REQUIRE(utf8::is_valid(piece));
    streamed += piece;
  }
  streamed += detok.flush();
  REQUIRE(streamed == tok.decode(ids, skip_special));
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
  CHECK(text + detok.flush() == "Hello world");  // no dummy-prefix space, inner space kept
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
  CHECK(utf8::complete_prefix_length("ab\xE2\x82") == 2);
  CHECK(utf8::complete_prefix_length("ab\xE2\x82\xAC") == 5);
  CHECK(utf8::complete_prefix_length("\xF0\x9F") == 0);
}
