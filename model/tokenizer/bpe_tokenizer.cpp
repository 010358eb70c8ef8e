#include "model/tokenizer/bpe_tokenizer.hpp"

#include <algorithm>
#include <queue>

#include "model/text/utf8.hpp"
#include "model/tokenizer/unicode_nfc.hpp"

namespace fp8serve {
namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Token ids are int32 and index dense tables: refuse absurd ids from a hostile file.
constexpr int32_t kMaxTokenId = 1 << 24;

}  // namespace

BpeTokenizer::BpeTokenizer(BpeConfig config)
    : nfc_(config.nfc),
      pre_tokenizer_(std::move(config.pre_tokenizer)),
      byte_level_decoder_(config.byte_level_decoder),
      ignore_merges_(config.ignore_merges),
      unk_id_(config.unk_id),
      prefix_ids_(std::move(config.prefix_ids)),
      suffix_ids_(std::move(config.suffix_ids)),
      bos_id_(config.bos_id),
      eos_id_(config.eos_id),
      kind_(std::move(config.kind)) {
  if (config.vocab.empty()) throw TokenizerError("tokenizer: BPE vocabulary is empty");
  int32_t max_id = -1;
  for (const auto& [token, id] : config.vocab) max_id = std::max(max_id, id);
  for (const auto& t : config.added_tokens) max_id = std::max(max_id, t.id);
  for (const auto& [token, id] : config.vocab) {
    if (id < 0 || id >= kMaxTokenId) throw TokenizerError("tokenizer: token id " + std::to_string(id) + " out of range");
  }
  for (const auto& t : config.added_tokens) {
    if (t.id < 0 || t.id >= kMaxTokenId) throw TokenizerError("tokenizer: added token id " + std::to_string(t.id) + " out of range");
  }
  id_to_token_.resize(static_cast<std::size_t>(max_id) + 1);
  token_to_id_.reserve(config.vocab.size());
  for (auto& [token, id] : config.vocab) {
    token_to_id_.emplace(token, id);
    id_to_token_[static_cast<std::size_t>(id)] = std::move(token);
  }
  merges_.reserve(config.merges.size());
  int32_t rank = 0;
  for (const auto& [left, right] : config.merges) {
    const auto a = token_to_id_.find(left), b = token_to_id_.find(right);
    const auto merged = token_to_id_.find(left + right);
    if (a == token_to_id_.end() || b == token_to_id_.end() || merged == token_to_id_.end()) {
      throw TokenizerError("tokenizer: merge \"" + left + " " + right + "\" uses a token missing from the vocabulary");
    }
    merges_.try_emplace(pair_key(a->second, b->second), Merge{rank++, merged->second});
  }
  added_by_id_.resize(id_to_token_.size());
  std::vector<AddedToken> raw, normalized;
  for (auto& t : config.added_tokens) {
    if (id_to_token_[static_cast<std::size_t>(t.id)].empty()) id_to_token_[static_cast<std::size_t>(t.id)] = t.content;
    added_by_id_[static_cast<std::size_t>(t.id)] = t;
    added_to_id_[t.content] = t.id;
    (t.normalized ? normalized : raw).push_back(t);
  }
  raw_added_ = AddedVocab(std::move(raw));
  normalized_added_ = AddedVocab(std::move(normalized));
  for (int32_t id : prefix_ids_) {
    if (id < 0 || id > max_id) throw TokenizerError("tokenizer: post-processor token id " + std::to_string(id) + " out of range");
  }
  for (int32_t id : suffix_ids_) {
    if (id < 0 || id > max_id) throw TokenizerError("tokenizer: post-processor token id " + std::to_string(id) + " out of range");
  }
}

// Merges by rank inside one word, lowest rank first and leftmost among equals, with a heap so
// a hostile megabyte-long word costs n log n, not n^2.
void BpeTokenizer::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (auto it = token_to_id_.find(word); it != token_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  char32_t cp;
  std::size_t len;
  for (std::size_t pos = 0; pos < word.size(); pos += len) {
    utf8::decode(word, pos, cp, len);
    auto it = token_to_id_.find(std::string_view(word).substr(pos, len));
    int32_t id;
    if (it != token_to_id_.end()) {
      id = it->second;
    } else if (unk_id_) {
      id = *unk_id_;
    } else {
      continue;  // HF drops a character with no token when no unk token is configured
    }
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, true});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[static_cast<std::size_t>(pos)].next;
    if (next < 0) return;
    auto it = merges_.find(pair_key(symbols[static_cast<std::size_t>(pos)].id, symbols[static_cast<std::size_t>(next)].id));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[static_cast<std::size_t>(c.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<std::size_t>(left.next)];
    // Stale entry: the pair at pos changed since it was pushed.
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != c.new_id || it->second.rank != c.rank) continue;
    left.id = c.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = c.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[static_cast<std::size_t>(i)].next) {
    out.push_back(symbols[static_cast<std::size_t>(i)].id);
  }
}

void BpeTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  std::string normalized = nfc_ ? nfc(text) : std::string(text);
  for (const Fragment& f : normalized_added_.split(normalized)) {
    if (f.id >= 0) {
      out.push_back(f.id);
      continue;
    }
    for (const std::string& word : pre_tokenizer_.run(f.text)) encode_word(word, out);
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  // Text from a client may be any bytes; the regexes need UTF-8, as HF's Rust strings are.
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::to_valid_lossy(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  if (add_special_tokens) out = prefix_ids_;
  for (const Fragment& f : raw_added_.split(text)) {
    if (f.id >= 0) {
      out.push_back(f.id);
    } else {
      encode_text(f.text, out);
    }
  }
  if (add_special_tokens) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

void BpeTokenizer::append_token_bytes(int32_t id, bool skip_special_tokens, bool& at_start,
                                      std::string& out) const {
  if (id < 0 || static_cast<std::size_t>(id) >= id_to_token_.size()) return;
  const AddedToken& added = added_by_id_[static_cast<std::size_t>(id)];
  if (!added.content.empty() && added.special && skip_special_tokens) return;
  const std::string& token = id_to_token_[static_cast<std::size_t>(id)];
  const std::size_t before = out.size();
  if (!byte_level_decoder_) {
    out += token;
  } else {
    // HF's ByteLevel decoder: map every character back to its byte; a token with a character
    // outside the map (an added token such as "a b") is emitted as its own UTF-8.
    char32_t cp;
    std::size_t len;
    bool all_mapped = true;
    for (std::size_t pos = 0; pos < token.size(); pos += len) {
      const int b = utf8::decode(token, pos, cp, len) ? unicode_to_byte(cp) : -1;
      if (b < 0) {
        all_mapped = false;
        break;
      }
      out += static_cast<char>(b);
    }
    if (!all_mapped) {
      out.resize(before);
      out += token;
    }
  }
  if (out.size() > before) at_start = false;
}

std::optional<std::string> BpeTokenizer::id_to_piece(int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= id_to_token_.size() || id_to_token_[static_cast<std::size_t>(id)].empty()) {
    return std::nullopt;
  }
  return id_to_token_[static_cast<std::size_t>(id)];
}

std::optional<int32_t> BpeTokenizer::piece_to_id(std::string_view piece) const {
  if (auto it = added_to_id_.find(piece); it != added_to_id_.end()) return it->second;
  if (auto it = token_to_id_.find(piece); it != token_to_id_.end()) return it->second;
  return std::nullopt;
}

bool BpeTokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<std::size_t>(id) < added_by_id_.size() &&
         !added_by_id_[static_cast<std::size_t>(id)].content.empty() && added_by_id_[static_cast<std::size_t>(id)].special;
}

}  // namespace fp8serve
