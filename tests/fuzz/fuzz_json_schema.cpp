// libFuzzer target: any byte string as a JSON Schema. Compiling may refuse it (GrammarError);
// whatever compiles must then run: a walk of the matcher over a byte vocabulary, where every
// mask has a token, every masked-in token is accepted, and a document that fits in the budget
// always ends complete, without crashing, hanging or tripping ASan/UBSan. Limits are small so each input
// runs fast.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "server/grammar/json_schema.hpp"
#include "server/grammar/matcher.hpp"

using namespace fp8serve::grammar;

namespace {

std::shared_ptr<const TokenVocabulary> vocab() {
  static const auto v = [] {
    std::vector<std::string> bytes(257);
    std::vector<uint8_t> usable(257, 1);
    for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
    bytes[256] = "</s>";
    usable[256] = 0;
    return std::make_shared<const TokenVocabulary>(std::move(bytes), std::move(usable), std::vector<int32_t>{256}, 257);
  }();
  return v;
}

struct TooDeep {};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1 << 14) return 0;
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(data, data + size, [](int depth, nlohmann::ordered_json::parse_event_t, nlohmann::ordered_json&) {
      if (depth > 64) throw TooDeep{};
      return true;
    });
  } catch (...) {
    return 0;
  }
  SchemaLimits limits;
  limits.max_schema_nodes = 2000;
  limits.max_string_length = 64;
  limits.max_items = 16;
  limits.max_properties = 32;
  limits.max_enum_values = 64;
  limits.regex.max_repeat = 64;
  limits.regex.max_char_states = 2000;
  limits.grammar.max_nfa_states = 40000;
  limits.grammar.max_dfa_states = 10000;
  std::shared_ptr<const CompiledGrammar> g;
  try {
    g = std::make_shared<const CompiledGrammar>(json_schema_grammar(schema, limits), vocab());
  } catch (const GrammarError&) {
    return 0;
  }
  GrammarMatcher m(g);
  std::vector<uint64_t> mask(static_cast<size_t>(vocab()->mask_words()));
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  const int64_t budget = 48;
  const int64_t fewest = m.tokens_to_end(budget);
  for (int64_t used = 0; used < budget && !m.is_terminated(); ++used) {
    m.fill_next_token_bitmask(mask);
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < 257; ++id)
      if (bitmask_test(mask, id)) allowed.push_back(id);
    if (allowed.empty()) __builtin_trap();  // a trimmed grammar never strands the matcher
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    int32_t pick = allowed[(h >> 33) % allowed.size()];
    if (!m.fits_after(pick, budget - used - 1)) {
      // As the engine does: choose again among the tokens the budget can still finish.
      m.fill_budget_bitmask(mask, budget - used - 1);
      allowed.clear();
      for (int32_t id = 0; id < 257; ++id)
        if (bitmask_test(mask, id)) allowed.push_back(id);
      if (allowed.empty()) break;  // no complete document fits in the budget
      pick = allowed[(h >> 17) % allowed.size()];
    }
    if (!m.accept_token(pick)) __builtin_trap();
    if (m.ended()) break;
  }
  if (fewest <= budget && !m.can_end()) __builtin_trap();  // it fitted, so it must have ended complete
  return 0;
}
