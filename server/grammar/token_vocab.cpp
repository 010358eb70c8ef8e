#include "server/grammar/token_vocab.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "model/text/utf8.hpp"
#include "model/tokenizer/tokenizer.hpp"

namespace fp8serve::grammar {

namespace {

// Characters in `bytes` when all of them may stand unescaped in a JSON string (complete UTF-8,
// no '"', no '\\', no control character); 0 otherwise.
int plain_chars(std::string_view bytes) {
  int n = 0;
  char32_t cp;
  size_t len;
  for (size_t i = 0; i < bytes.size(); i += len) {
    if (!utf8::decode(bytes, i, cp, len) || cp < 0x20 || cp == '"' || cp == '\\') return 0;
    ++n;
  }
  return n;
}

}  // namespace

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes, std::vector<uint8_t> usable,
                                 std::vector<int32_t> end_tokens, int32_t mask_size)
    : token_bytes_(std::move(token_bytes)), usable_(std::move(usable)), end_tokens_(std::move(end_tokens)), mask_size_(mask_size) {
  if (usable_.size() != token_bytes_.size()) throw std::invalid_argument("TokenVocabulary: usable and bytes differ in size");
  if (mask_size_ < static_cast<int32_t>(token_bytes_.size())) mask_size_ = static_cast<int32_t>(token_bytes_.size());
  for (size_t id = 0; id < usable_.size(); ++id)
    if (token_bytes_[id].empty()) usable_[id] = 0;  // a token that writes nothing cannot advance a grammar
  end_tokens_.erase(std::remove_if(end_tokens_.begin(), end_tokens_.end(),
                                   [&](int32_t id) { return id < 0 || id >= mask_size_; }),
                    end_tokens_.end());
  byte_tokens_.fill(-1);
  for (int32_t id = static_cast<int32_t>(usable_.size()) - 1; id >= 0; --id)
    if (usable_[static_cast<size_t>(id)] && token_bytes_[static_cast<size_t>(id)].size() == 1)
      byte_tokens_[static_cast<uint8_t>(token_bytes_[static_cast<size_t>(id)][0])] = id;
  std::vector<int32_t> all, non_plain;
  plain_slice_.assign(static_cast<size_t>(mask_words()), 0);
  for (int32_t id = 0; id < static_cast<int32_t>(usable_.size()); ++id) {
    if (!usable_[static_cast<size_t>(id)]) continue;
    all.push_back(id);
    const int n = plain_chars(token_bytes_[static_cast<size_t>(id)]);
    if (n >= 1 && n <= kPlainSliceChars) {
      plain_slice_[static_cast<size_t>(id) >> 6] |= 1ull << (id & 63);
    } else {
      non_plain.push_back(id);
    }
  }
  build_trie(trie_, std::move(all));
  build_trie(non_plain_trie_, std::move(non_plain));
}

bool TokenVocabulary::is_end_token(int32_t id) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), id) != end_tokens_.end();
}

void TokenVocabulary::build_trie(TokenTrie& trie, std::vector<int32_t> ids) {
  std::vector<int32_t>& sorted = trie.sorted;
  std::vector<TrieNode>& nodes = trie.nodes;
  sorted = std::move(ids);
  std::sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) {
    const std::string& x = token_bytes_[static_cast<size_t>(a)];
    const std::string& y = token_bytes_[static_cast<size_t>(b)];
    return x != y ? x < y : a < b;
  });
  std::vector<int32_t> path;  // path[d - 1]: the open node at depth d
  std::string_view prev;
  auto close_to = [&](size_t depth, int32_t tok_index) {
    while (path.size() > depth) {
      TrieNode& node = nodes[static_cast<size_t>(path.back())];
      node.subtree_end = static_cast<int32_t>(nodes.size());
      node.tok_last = tok_index;
      path.pop_back();
    }
  };
  for (int32_t k = 0; k < static_cast<int32_t>(sorted.size()); ++k) {
    const std::string_view b = token_bytes_[static_cast<size_t>(sorted[static_cast<size_t>(k)])];
    if (b.size() > 0xFFFF) throw std::invalid_argument("TokenVocabulary: a token longer than 65535 bytes");
    size_t lcp = 0;
    while (lcp < prev.size() && lcp < b.size() && prev[lcp] == b[lcp]) ++lcp;
    close_to(lcp, k);
    for (size_t d = lcp + 1; d <= b.size(); ++d) {
      nodes.push_back({static_cast<uint8_t>(b[d - 1]), static_cast<uint16_t>(d), 0, k, k, 0});
      path.push_back(static_cast<int32_t>(nodes.size()) - 1);
    }
    nodes[static_cast<size_t>(path.back())].own_end = k + 1;
    max_token_bytes_ = std::max(max_token_bytes_, static_cast<int32_t>(b.size()));
    prev = b;
  }
  close_to(0, static_cast<int32_t>(sorted.size()));
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tokenizer, int32_t mask_size,
                                                                      std::vector<int32_t> end_tokens) {
  const int32_t n = tokenizer.vocab_size();
  std::vector<std::string> bytes(static_cast<size_t>(n));
  std::vector<uint8_t> usable(static_cast<size_t>(n), 0);
  std::vector<std::pair<int32_t, std::string>> variants;
  for (int32_t id = 0; id < n; ++id) {
    bool at_start = false;
    tokenizer.append_token_bytes(id, /*skip_special_tokens=*/false, at_start, bytes[static_cast<size_t>(id)]);
    usable[static_cast<size_t>(id)] = tokenizer.is_special(id) ? 0 : 1;
    if (!usable[static_cast<size_t>(id)]) continue;
    std::string first;
    at_start = true;
    tokenizer.append_token_bytes(id, false, at_start, first);
    if (first != bytes[static_cast<size_t>(id)]) variants.emplace_back(id, std::move(first));
  }
  auto vocab = std::make_shared<TokenVocabulary>(std::move(bytes), std::move(usable), std::move(end_tokens), mask_size);
  vocab->set_first_token_variants(std::move(variants));
  return vocab;
}

}  // namespace fp8serve::grammar
