// Added and special tokens against HF tokenizers: lstrip / rstrip / single_word / normalized
// flags, decoding with and without skip_special_tokens, and the special-token API.
#include <catch2/catch.hpp>

#include <cstdio>

#include "model/tokenizer/tokenizer.hpp"
#include "tokenizer_fixtures.hpp"

using namespace fp8serve;
using nlohmann::json;

TEST_CASE("added-token flags behave as in HF tokenizers", "[tokenizer]") {
  const auto fixtures = test::tokenizer_fixtures();
  std::ifstream in(fixtures / "added_token_cases.json");
  const json cases = json::parse(in);
  std::ifstream tin(fixtures / "smollm2" / "tokenizer.json");
  json tj = json::parse(tin);
  // The edits the fixture script made before asking HF.
  for (auto& t : tj["added_tokens"]) {
    const auto& flags = cases["edits"]["flags"];
    if (flags.contains(t["content"].get<std::string>())) t.update(flags[t["content"].get<std::string>()]);
  }
  for (const auto& t : cases["edits"]["new"]) tj["added_tokens"].push_back(t);
  const auto path = std::filesystem::temp_directory_path() / "fp8serve_test_added_tokens.json";
  {
    std::ofstream out(path);
    out << tj.dump();
  }
  auto tok = load_tokenizer_json(path);
  std::filesystem::remove(path);
  for (const auto& c : cases["cases"]) {
    const std::string text = c["text"];
    INFO(json(text).dump());
    const auto ids = tok->encode(text, false);
    CHECK(ids == c["ids"].get<std::vector<int32_t>>());
    CHECK(tok->decode(ids, false) == c["decoded"].get<std::string>());
    CHECK(tok->decode(ids, true) == c["decoded_skip"].get<std::string>());
  }
}

TEST_CASE("special-token API of the byte-level BPE", "[tokenizer]") {
  auto tok = load_tokenizer_dir(test::tokenizer_fixtures() / "smollm2");
  const auto im_end = tok->piece_to_id("<|im_end|>");
  REQUIRE(im_end);
  CHECK(*im_end == 2);
  CHECK(tok->is_special(*im_end));
  CHECK(!tok->is_special(tok->piece_to_id("Ġthe").value()));
  CHECK(tok->id_to_piece(*im_end) == "<|im_end|>");
  CHECK(tok->id_to_piece(-1) == std::nullopt);
  CHECK(tok->id_to_piece(tok->vocab_size()) == std::nullopt);
  CHECK(tok->piece_to_id("no such piece") == std::nullopt);
  const auto ids = tok->encode("<|im_start|>user\nHi<|im_end|>", false);
  CHECK(ids.front() == 1);
  CHECK(ids.back() == 2);
  CHECK(tok->decode(ids, true) == "user\nHi");
  // Ids outside the vocabulary are skipped, never read out of bounds.
  const std::vector<int32_t> hostile{-5, 1 << 30, 28120};
  CHECK(tok->decode(hostile, false) == tok->decode(std::vector<int32_t>{28120}, false));
}

TEST_CASE("SentencePiece: BOS on request, special strings matched, leading spaces kept", "[tokenizer]") {
  auto tok = load_tokenizer_dir(test::tokenizer_fixtures() / "mistral_spm");
  const auto with_bos = tok->encode("Hello", true), without = tok->encode("Hello", false);
  REQUIRE(with_bos.size() == without.size() + 1);
  CHECK(with_bos.front() == 1);
  CHECK(tok->is_special(1));
  CHECK(tok->id_to_piece(1) == "<s>");
  CHECK(tok->piece_to_id("</s>") == 2);
  CHECK(tok->piece_to_id("<unk>") == 0);
  CHECK(tok->piece_to_id("definitely-not-a-piece") == std::nullopt);
  CHECK(tok->decode(with_bos, true) == "Hello");
  for (const char* text : {" leading", "  two", "<s> after", "a</s>b", "\n", " "}) {
    INFO(text);
    CHECK(tok->decode(tok->encode(text, false), false) == text);
  }
  CHECK(tok->encode("[INST]</s>", false).back() == 2);
}
