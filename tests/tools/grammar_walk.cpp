// grammar_walk: texts for checking the grammar engine against Python's jsonschema
// (tests/integration/test_grammar_reference.py).
//
//   grammar_walk walk VOCAB SCHEMAS.json WALKS_PER_SCHEMA SEED [MAX_TOKENS]
//       Random walks over the token masks: at every step a token the mask allows (uniform, or
//       biased to short tokens and to ones that close a string, array or object, so that walks
//       end), until the grammar terminates, the end token is drawn, or MAX_TOKENS. One JSON line
//       per walk: {"schema", "hex", "complete", "tokens"}.
//   grammar_walk check SCHEMAS.json < lines
//       For each input line {"schema", "hex"}: {"accepted": the whole text is a complete value}.
//
// VOCAB: bytes (every byte a token), smollm2 (the default model's GGUF vocabulary), or a
// tokenizer directory (the Qwen3 tokenizer). Paths are relative to the current directory.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/formats/gguf.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "server/grammar/json_schema.hpp"
#include "server/grammar/matcher.hpp"

using namespace fp8serve;
using namespace fp8serve::grammar;
using Json = nlohmann::ordered_json;

namespace {

std::shared_ptr<const TokenVocabulary> load_vocab(const std::string& which, std::unique_ptr<Tokenizer>& keep) {
  if (which == "bytes") {
    std::vector<std::string> bytes(257);
    std::vector<uint8_t> usable(257, 1);
    for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
    usable[256] = 0;
    return std::make_shared<const TokenVocabulary>(std::move(bytes), std::move(usable), std::vector<int32_t>{256}, 257);
  }
  if (std::filesystem::is_directory(which)) {
    keep = load_tokenizer_dir(which);
  } else {
    keep = from_gguf(GgufFile::open(which));
  }
  return TokenVocabulary::from_tokenizer(*keep, keep->vocab_size(), {*keep->eos_id()});
}

std::string to_hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : bytes) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

int walk(const std::string& vocab_name, const Json& cases, int walks, uint64_t seed, int max_tokens) {
  std::unique_ptr<Tokenizer> keep;
  const auto vocab = load_vocab(vocab_name, keep);
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> mask(static_cast<size_t>(vocab->mask_words()));
  std::vector<int32_t> allowed, short_ones, closing;
  for (const Json& c : cases) {
    const auto g = std::make_shared<const CompiledGrammar>(json_schema_grammar(c["schema"]), vocab);
    for (int w = 0; w < walks; ++w) {
      GrammarMatcher m(g);
      std::string text;
      int tokens = 0;
      while (tokens < max_tokens && !m.is_terminated()) {
        m.fill_next_token_bitmask(mask);
        allowed.clear();
        short_ones.clear();
        closing.clear();
        for (size_t word = 0; word < mask.size(); ++word)
          for (uint64_t bits = mask[word]; bits; bits &= bits - 1) {
            const auto id = static_cast<int32_t>(word * 64 + static_cast<size_t>(__builtin_ctzll(bits)));
            allowed.push_back(id);
            if (vocab->is_end_token(id)) continue;
            const std::string_view b = vocab->bytes(id);
            if (b.size() <= 2) short_ones.push_back(id);
            if (b.find_first_of("\"]}") != std::string_view::npos) closing.push_back(id);
          }
        if (allowed.empty()) break;  // cannot happen with a trimmed grammar; the test would see it
        const uint64_t r = rng() % 100;
        const std::vector<int32_t>& pool = r < 45 ? allowed : r < 80 && !short_ones.empty() ? short_ones
                                                             : !closing.empty() ? closing : allowed;
        const int32_t pick = pool[rng() % pool.size()];
        if (!m.accept_token(pick)) {
          std::fprintf(stderr, "grammar_walk: the mask allowed token %d that accept_token refused\n", pick);
          return 2;
        }
        ++tokens;
        if (m.ended()) break;
        text += vocab->bytes(pick);
      }
      const Json line = {{"schema", c["name"]}, {"hex", to_hex(text)}, {"complete", m.is_terminated() || m.ended() || m.can_end()},
                         {"tokens", tokens}};
      std::cout << line.dump() << '\n';
    }
  }
  return 0;
}

int check(const Json& cases) {
  const auto vocab = [] {
    std::unique_ptr<Tokenizer> none;
    return load_vocab("bytes", none);
  }();
  std::map<std::string, std::shared_ptr<const CompiledGrammar>> grammars;
  for (const Json& c : cases)
    grammars[c["name"].get<std::string>()] = std::make_shared<const CompiledGrammar>(json_schema_grammar(c["schema"]), vocab);
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    const Json in = Json::parse(line);
    GrammarMatcher m(grammars.at(in["schema"].get<std::string>()));
    const std::string text = from_hex(in["hex"].get<std::string>());
    const bool accepted = !text.empty() && m.accept_bytes(text) && m.can_end();
    std::cout << Json{{"accepted", accepted}}.dump() << '\n';
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.size() >= 4 && args[0] == "walk") {
      std::ifstream in(args[2]);
      const Json cases = Json::parse(in);
      return walk(args[1], cases, std::stoi(args[3]), args.size() > 4 ? std::stoull(args[4]) : 1,
                  args.size() > 5 ? std::stoi(args[5]) : 600);
    }
    if (args.size() == 2 && args[0] == "check") {
      std::ifstream in(args[1]);
      return check(Json::parse(in));
    }
    std::fprintf(stderr, "usage: grammar_walk walk VOCAB SCHEMAS.json WALKS SEED [MAX_TOKENS] | check SCHEMAS.json\n");
    return 64;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grammar_walk: %s\n", e.what());
    return 1;
  }
}
