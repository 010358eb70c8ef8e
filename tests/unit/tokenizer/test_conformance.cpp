// Token ids identical to the HF references on the committed 2,200-line corpus, and
// decode(encode(x)) == x (NFC(x) for tokenizers that normalize), for every tokenizer route:
// tokenizer.json, tokenizer.model, and the GGUF-embedded vocabularies.
#include <catch2/catch.hpp>

#include "model/formats/gguf.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "tokenizer_fixtures.hpp"

using namespace fp8serve;
using fp8serve::test::tokenizer_fixtures;

namespace {

std::string show_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

// Compares every line; reports the first few mismatches in full, then the count.
void check_corpus(const Tokenizer& tok, const std::filesystem::path& expected_file, bool nfc_round_trip) {
  const auto lines = test::corpus();
  const auto expected = test::read_expected_ids(expected_file);
  const auto nfc_lines = test::corpus_nfc();
  REQUIRE(lines.size() >= 2000);
  REQUIRE(expected.size() == lines.size());
  REQUIRE(nfc_lines.size() == lines.size());
  std::size_t id_mismatches = 0, text_mismatches = 0, num_ids = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto ids = tok.encode(lines[i], false);
    num_ids += ids.size();
    if (ids != expected[i] && ++id_mismatches <= 5) {
      UNSCOPED_INFO("line " << i << " " << nlohmann::json(lines[i]).dump() << "\n  got      " << show_ids(ids)
                            << "\n  expected " << show_ids(expected[i]));
    }
    const std::string& want = nfc_round_trip ? nfc_lines[i] : lines[i];
    if (tok.decode(ids, false) != want && ++text_mismatches <= 5) {
      UNSCOPED_INFO("round trip, line " << i << ": " << nlohmann::json(lines[i]).dump() << " -> "
                                        << nlohmann::json(tok.decode(ids, false)).dump());
    }
  }
  INFO(tok.kind() << ": " << lines.size() << " lines, " << num_ids << " ids");
  CHECK(id_mismatches == 0);
  CHECK(text_mismatches == 0);
}

}  // namespace

TEST_CASE("SmolLM2 tokenizer.json (as transformers converts the GGUF) matches HF tokenizers", "[tokenizer]") {
  const auto dir = tokenizer_fixtures() / "smollm2";
  auto tok = load_tokenizer_dir(dir);
  CHECK(tok->kind() == "bpe (tokenizer.json)");
  CHECK(tok->vocab_size() == 49152);
  CHECK(tok->bos_id() == 1);
  CHECK(tok->eos_id() == 2);
  check_corpus(*tok, dir / "expected_ids.txt", false);
}

TEST_CASE("SmolLM2 vocabulary embedded in the default GGUF matches HF tokenizers", "[tokenizer][model]") {
  const auto path = test::models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) {
    WARN("skipped: " << path << " is absent (the installer fetches it)");
    return;
  }
  const GgufFile gguf = GgufFile::open(path.string());
  auto tok = from_gguf(gguf);
  CHECK(tok->kind() == "bpe (gguf)");
  CHECK(tok->vocab_size() == 49152);
  CHECK(tok->bos_id() == 1);
  CHECK(tok->eos_id() == 2);
  CHECK(tok->encode("hi", true) == tok->encode("hi", false));  // add_bos_token is false
  check_corpus(*tok, tokenizer_fixtures() / "smollm2" / "expected_ids.txt", false);
}

TEST_CASE("Qwen3 tokenizer.json (real Qwen vocabulary, NFC) matches HF tokenizers and tiktoken", "[tokenizer]") {
  const auto dir = test::models_dir() / "qwen3-tokenizer";
  if (!std::filesystem::exists(dir / "tokenizer.json")) {
    WARN("skipped: " << dir << " is absent (python3 tests/scripts/fetch_qwen_tokenizer.py makes it)");
    return;
  }
  auto tok = load_tokenizer_dir(dir);
  CHECK(tok->vocab_size() == 151669);
  CHECK(tok->eos_id() == 151645);
  CHECK(!tok->bos_id());
  CHECK(tok->piece_to_id("<think>") == 151667);
  check_corpus(*tok, tokenizer_fixtures() / "qwen3" / "expected_ids.txt", true);
}

TEST_CASE("SentencePiece tokenizer.model (Mistral v0.1, Llama-2 style) matches sentencepiece", "[tokenizer]") {
  const auto dir = tokenizer_fixtures() / "mistral_spm";
  auto tok = load_tokenizer_dir(dir);
  CHECK(tok->kind() == "sentencepiece");
  CHECK(tok->vocab_size() == 32000);
  CHECK(tok->bos_id() == 1);
  CHECK(tok->eos_id() == 2);
  check_corpus(*tok, dir / "expected_ids.txt", false);
}

TEST_CASE("SentencePiece vocabulary from a GGUF (llama model) matches sentencepiece", "[tokenizer]") {
  const auto dir = tokenizer_fixtures() / "mistral_spm";
  const GgufFile gguf = GgufFile::open((dir / "vocab.gguf").string());
  auto tok = from_gguf(gguf);
  CHECK(tok->kind() == "spm (gguf)");
  CHECK(tok->vocab_size() == 32000);
  check_corpus(*tok, dir / "expected_ids.txt", false);
  // Same ids as the tokenizer.model route, special tokens included.
  auto from_model = load_tokenizer_dir(dir);
  const std::string text = "<s>[INST] Hi there [/INST] Hello</s>";
  CHECK(tok->encode(text, true) == from_model->encode(text, true));
}

TEST_CASE("Qwen3 vocabulary as a GGUF (gpt2 model, qwen2 pre) matches HF tokenizers", "[tokenizer]") {
  const auto path = test::models_dir() / "qwen3-tokenizer" / "tokenizer.json";
  if (!std::filesystem::exists(path)) {
    WARN("skipped: " << path << " is absent (python3 tests/scripts/fetch_qwen_tokenizer.py makes it)");
    return;
  }
  // What a GGUF converter writes for this vocabulary: tokens by id, "a b" merges, added tokens
  // as control (special) or user-defined (4) types, tokenizer.ggml.pre = "qwen2".
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<std::string> tokens(151669);
  std::vector<int32_t> types(tokens.size(), 1);
  for (const auto& [token, id] : j["model"]["vocab"].items()) tokens.at(id.get<std::size_t>()) = token;
  for (const auto& t : j["added_tokens"]) {
    tokens.at(t["id"].get<std::size_t>()) = t["content"].get<std::string>();
    types.at(t["id"].get<std::size_t>()) = t["special"].get<bool>() ? 3 : 4;
  }
  test::GgufBuilder b;
  b.add_string("general.architecture", "qwen3");
  b.add_string("tokenizer.ggml.model", "gpt2");
  b.add_string("tokenizer.ggml.pre", "qwen2");
  b.add_strings("tokenizer.ggml.tokens", tokens);
  b.add_i32s("tokenizer.ggml.token_type", types);
  b.add_strings("tokenizer.ggml.merges", j["model"]["merges"].get<std::vector<std::string>>());
  b.add_u32("tokenizer.ggml.eos_token_id", 151645);
  auto tok = from_gguf(b.build());
  CHECK(tok->kind() == "bpe (gguf)");
  CHECK(tok->eos_id() == 151645);
  check_corpus(*tok, tokenizer_fixtures() / "qwen3" / "expected_ids.txt", true);
}
