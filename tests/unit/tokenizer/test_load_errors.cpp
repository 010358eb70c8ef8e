// Hostile or unsupported tokenizer files fail at load with an error that names the problem;
// hostile text and ids never crash encode/decode.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>

#include "model/formats/gguf.hpp"
#include "model/text/utf8.hpp"
#include "model/tokenizer/pre_tokenizer.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "tokenizer_fixtures.hpp"

using namespace fp8serve;
using nlohmann::json;
using test::GgufBuilder;

namespace {

std::filesystem::path write_temp(const std::string& name, const std::string& bytes) {
  const auto path = std::filesystem::temp_directory_path() / ("fp8serve_test_" + name);
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  return path;
}

// A minimal tokenizer.json: byte-level vocabulary of "a", "b", "ab".
json tiny_tokenizer_json() {
  return json{{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
              {"decoder", {{"type", "ByteLevel"}}},
              {"added_tokens", json::array()}};
}

std::string load_error(const json& j) {
  const auto path = write_temp("tokenizer.json", j.dump());
  try {
    load_tokenizer_json(path);
  } catch (const TokenizerError& e) {
    return e.what();
  }
  return "(no error)";
}

GgufBuilder tiny_gpt2_gguf(const std::string& pre) {
  GgufBuilder b;
  b.add_string("general.architecture", "llama");
  b.add_string("tokenizer.ggml.model", "gpt2");
  b.add_string("tokenizer.ggml.pre", pre);
  b.add_strings("tokenizer.ggml.tokens", {"a", "b", "ab", "<|end|>"});
  b.add_i32s("tokenizer.ggml.token_type", {1, 1, 1, 3});
  b.add_strings("tokenizer.ggml.merges", {"a b"});
  b.add_u32("tokenizer.ggml.eos_token_id", 3);
  return b;
}

}  // namespace

TEST_CASE("a minimal tokenizer.json loads and merges", "[tokenizer]") {
  const auto path = write_temp("tokenizer.json", tiny_tokenizer_json().dump());
  auto tok = load_tokenizer_json(path);
  CHECK(tok->encode("abba", false) == std::vector<int32_t>{2, 1, 0});
  CHECK(tok->decode(std::vector<int32_t>{2, 1, 0}, false) == "abba");
  CHECK(tok->encode("", true).empty());
}

TEST_CASE("unsupported tokenizer.json features are named", "[tokenizer]") {
  json j = tiny_tokenizer_json();
  j["model"]["type"] = "WordPiece";
  CHECK_THAT(load_error(j), Catch::Contains("WordPiece"));
  j = tiny_tokenizer_json();
  j["normalizer"] = {{"type", "Lowercase"}};
  CHECK_THAT(load_error(j), Catch::Contains("Lowercase"));
  j = tiny_tokenizer_json();
  j["decoder"] = {{"type", "Metaspace"}};
  CHECK_THAT(load_error(j), Catch::Contains("Metaspace"));
  j = tiny_tokenizer_json();
  j["model"]["byte_fallback"] = true;
  CHECK_THAT(load_error(j), Catch::Contains("byte_fallback"));
  j = tiny_tokenizer_json();
  j["post_processor"] = {{"type", "BertProcessing"}};
  CHECK_THAT(load_error(j), Catch::Contains("BertProcessing"));
}

TEST_CASE("malformed tokenizer.json fails with TokenizerError", "[tokenizer]") {
  json j = tiny_tokenizer_json();
  j["model"]["merges"] = {"a zz"};
  CHECK_THAT(load_error(j), Catch::Contains("missing from the vocabulary"));
  j = tiny_tokenizer_json();
  j["model"]["vocab"]["huge"] = 1 << 30;
  CHECK_THAT(load_error(j), Catch::Contains("out of range"));
  j = tiny_tokenizer_json();
  j["model"]["merges"] = {"nospace"};
  CHECK_THAT(load_error(j), Catch::Contains("malformed merge"));
  j = tiny_tokenizer_json();
  j["model"].erase("vocab");
  CHECK_THAT(load_error(j), Catch::Contains("tokenizer"));
  // Truncations of a real file: always an error, never a crash.
  std::ifstream in(test::tokenizer_fixtures() / "smollm2" / "tokenizer.json");
  const std::string full((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, full.size() / 3, full.size() - 2}) {
    const auto path = write_temp("cut_tokenizer.json", full.substr(0, cut));
    CHECK_THROWS_AS(load_tokenizer_json(path), TokenizerError);
  }
  CHECK_THROWS_AS(load_tokenizer_dir("/nonexistent/dir"), TokenizerError);
}

TEST_CASE("corrupt SentencePiece models fail with TokenizerError", "[tokenizer]") {
  std::ifstream in(test::tokenizer_fixtures() / "mistral_spm" / "tokenizer.model", std::ios::binary);
  const std::string full((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (std::size_t cut : {std::size_t{0}, std::size_t{7}, full.size() / 2, full.size() - 1}) {
    const auto path = write_temp("cut_tokenizer.model", full.substr(0, cut));
    CHECK_THROWS_AS(load_sentencepiece(path), TokenizerError);
  }
}

TEST_CASE("GGUF vocabularies: tiny gpt2 loads, unknown pre and missing keys are named", "[tokenizer]") {
  auto tok = from_gguf(tiny_gpt2_gguf("gpt-2").build());
  CHECK(tok->kind() == "bpe (gguf)");
  CHECK(tok->encode("ab<|end|>b", false) == std::vector<int32_t>{2, 3, 1});
  CHECK(tok->eos_id() == 3);
  CHECK(tok->is_special(3));
  CHECK_THROWS_WITH(from_gguf(tiny_gpt2_gguf("mystery-pre").build()), Catch::Contains("mystery-pre"));

  GgufBuilder no_model;
  no_model.add_string("general.architecture", "llama");
  CHECK_THROWS_WITH(from_gguf(no_model.build()), Catch::Contains("tokenizer.ggml.model"));

  GgufBuilder bad_types = tiny_gpt2_gguf("gpt-2");
  bad_types.add_u32("tokenizer.ggml.bos_token_id", 99);
  CHECK_THROWS_WITH(from_gguf(bad_types.build()), Catch::Contains("bos_token_id"));

  GgufBuilder wrong_kind;
  wrong_kind.add_string("tokenizer.ggml.model", "bert");
  wrong_kind.add_strings("tokenizer.ggml.tokens", {"a"});
  CHECK_THROWS_WITH(from_gguf(wrong_kind.build()), Catch::Contains("bert"));

  GgufBuilder spm_no_unk;
  spm_no_unk.add_string("tokenizer.ggml.model", "llama");
  spm_no_unk.add_strings("tokenizer.ggml.tokens", {"a", "b"});
  spm_no_unk.add_i32s("tokenizer.ggml.token_type", {1, 1});
  CHECK_THROWS_WITH(from_gguf(spm_no_unk.build()), Catch::Contains("unknown token"));

  GgufBuilder mismatched = tiny_gpt2_gguf("gpt-2");
  mismatched.add_i32s("tokenizer.ggml.token_type", {1});  // duplicate key or wrong length
  CHECK_THROWS(from_gguf(mismatched.build()));
}

TEST_CASE("arbitrary bytes encode without crashing and decode to their repaired form", "[tokenizer]") {
  auto bpe = load_tokenizer_dir(test::tokenizer_fixtures() / "smollm2");
  auto spm = load_tokenizer_dir(test::tokenizer_fixtures() / "mistral_spm");
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> byte(0, 255), length(0, 64);
  for (int round = 0; round < 500; ++round) {
    std::string text(static_cast<std::size_t>(length(rng)), '\0');
    for (char& c : text) c = static_cast<char>(byte(rng));
    const std::string repaired = utf8::to_valid_lossy(text);
    // SmolLM2's vocabulary lacks a few byte tokens (0xF2 and up, never in real text); HF drops
    // such bytes too, so the round trip is exact only when every byte has its token.
    const bool all_bytes_known = std::all_of(repaired.begin(), repaired.end(), [&](char c) {
      return bpe->piece_to_id(byte_level_encode(std::string(1, c))).has_value();
    });
    const std::string bpe_text = bpe->decode(bpe->encode(text, false), false);
    CHECK(utf8::is_valid(bpe_text));
    if (all_bytes_known) CHECK(bpe_text == repaired);
    CHECK(spm->decode(spm->encode(text, false), false) == repaired);
  }
  // One long word with no split points: the heap keeps BPE n log n.
  // Long runs for every regex branch (letters, spaces before a look-ahead, newlines, symbols,
  // CJK): no stack limits, no quadratic blow-up.
  std::string cjk;
  for (int i = 0; i < 50000; ++i) cjk += "\xE4\xB8\xAD";
  for (const std::string& run : {std::string(200000, 'a'), std::string(200000, ' ') + "x", std::string(100000, '\n'),
                                 std::string(100000, '!'), cjk}) {
    CHECK(bpe->decode(bpe->encode(run, false), false) == run);
  }
}
