#include "cache/block_manager.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

namespace fp8serve {

namespace {

[[noreturn]] void broken(const std::string& what) { throw std::logic_error("BlockManager: " + what); }

}  // namespace

BlockManager::BlockManager(const BlockManagerOptions& options)
    : block_size_(options.block_size),
      num_layers_(options.num_layers),
      pool_(options.num_blocks, options.enable_prefix_caching) {
  if (block_size_ <= 0) throw std::invalid_argument("BlockManager: block_size must be > 0");
  if (num_layers_ <= 0) throw std::invalid_argument("BlockManager: num_layers must be > 0");
}

const BlockManager::Sequence& BlockManager::seq(SeqId id) const {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) broken("unknown sequence " + std::to_string(id));
  return it->second;
}

BlockManager::Sequence& BlockManager::seq(SeqId id) {
  return const_cast<Sequence&>(static_cast<const BlockManager*>(this)->seq(id));
}

int BlockManager::num_blocks_for(std::size_t num_tokens) const {
  const auto bs = static_cast<std::size_t>(block_size_);
  return static_cast<int>((num_tokens + bs - 1) / bs);
}

// The chain key of full block i of `tokens`; `parent` is block i-1's key (nullptr for i = 0).
BlockHash BlockManager::block_key(std::span<const int32_t> tokens, std::size_t i, const BlockHash* parent) const {
  const auto bs = static_cast<std::size_t>(block_size_);
  return hash_block_tokens(parent, tokens.subspan(i * bs, bs));
}

// The longest chain of cached blocks that starts the prompt. Stops before the block holding
// the last prompt token (that token is always computed: the step needs its logits), and at
// the first block written with other scales than the chain's first block, so that every block
// of a sequence shares one scale per layer even when two writers cached parts of one prefix.
BlockManager::PrefixMatch BlockManager::match_prefix(std::span<const int32_t> prompt) const {
  PrefixMatch match;
  if (!pool_.prefix_caching_enabled() || prompt.empty()) return match;
  const std::size_t max_blocks = (prompt.size() - 1) / static_cast<std::size_t>(block_size_);
  const KvScales* chain_scales = nullptr;
  for (std::size_t i = 0; i < max_blocks; ++i) {
    const BlockHash key = block_key(prompt, i, match.keys.empty() ? nullptr : &match.keys.back());
    const std::optional<int32_t> block = pool_.lookup(key);
    if (!block) break;
    const KvScales& scales = *pool_.cached_scales(*block);
    if (chain_scales == nullptr) {
      chain_scales = &scales;
    } else if (!(scales == *chain_scales)) {
      break;
    }
    match.blocks.push_back(*block);
    match.keys.push_back(key);
  }
  return match;
}

bool BlockManager::can_allocate(std::span<const int32_t> prompt) const {
  if (prompt.empty()) return false;
  const PrefixMatch match = match_prefix(prompt);
  // Hit blocks that sit idle on the LRU stop being allocatable once mapped.
  const auto num_idle_hits = std::count_if(match.blocks.begin(), match.blocks.end(),
                                           [&](int32_t b) { return pool_.ref_count(b) == 0; });
  const int num_new = num_blocks_for(prompt.size()) - static_cast<int>(match.blocks.size());
  return num_new <= pool_.num_free_blocks() - static_cast<int>(num_idle_hits);
}

AllocateResult BlockManager::allocate(SeqId id, std::span<const int32_t> prompt) {
  if (contains(id)) broken("allocate() of live sequence " + std::to_string(id));
  if (!can_allocate(prompt)) broken("allocate() without can_allocate() (empty prompt or pool full)");
  PrefixMatch match = match_prefix(prompt);
  Sequence s;
  s.tokens.assign(prompt.begin(), prompt.end());
  // Hits first: acquiring takes them off the LRU, so the allocations below cannot evict them.
  for (const int32_t block : match.blocks) {
    pool_.acquire(block);
    s.block_table.push_back(block);
  }
  while (static_cast<int>(s.block_table.size()) < num_blocks_for(prompt.size())) {
    s.block_table.push_back(pool_.allocate());
  }
  s.num_computed_tokens = static_cast<int>(match.blocks.size()) * block_size_;
  if (match.blocks.empty()) {
    s.scales = std::make_shared<KvScales>(num_layers_);
  } else {
    s.scales = pool_.cached_scales(match.blocks.front());  // frozen: inherited, never recalibrated
  }
  s.block_keys = std::move(match.keys);
  if (pool_.prefix_caching_enabled()) {
    stats_.num_queried_tokens += prompt.size();
    stats_.num_hit_tokens += static_cast<uint64_t>(s.num_computed_tokens);
  }
  const AllocateResult result{s.num_computed_tokens};
  seqs_.emplace(id, std::move(s));
  return result;
}

bool BlockManager::can_append(SeqId id) const {
  const Sequence& s = seq(id);
  const bool needs_block = s.tokens.size() % static_cast<std::size_t>(block_size_) == 0 ||
                           pool_.ref_count(s.block_table.back()) > 1;
  return !needs_block || pool_.num_free_blocks() > 0;
}

AppendResult BlockManager::append_slot(SeqId id, int32_t token) {
  if (!can_append(id)) broken("append_slot() without can_append() (pool full)");
  Sequence& s = seq(id);
  const std::size_t position = s.tokens.size();
  const std::size_t offset = position % static_cast<std::size_t>(block_size_);
  AppendResult result;
  if (offset == 0) {
    s.block_table.push_back(pool_.allocate());
  } else if (pool_.ref_count(s.block_table.back()) > 1) {
    // Shared partial block (after fork): write into a private copy, leave the original to
    // the other holders.
    const int32_t shared = s.block_table.back();
    const int32_t copy = pool_.allocate();
    pool_.release(shared);
    s.block_table.back() = copy;
    result.copy = BlockCopy{shared, copy};
  }
  s.tokens.push_back(token);
  result.slot = static_cast<int64_t>(s.block_table.back()) * block_size_ + static_cast<int64_t>(offset);
  return result;
}

void BlockManager::mark_computed(SeqId id, int num_computed_tokens) {
  Sequence& s = seq(id);
  if (num_computed_tokens < s.num_computed_tokens || num_computed_tokens > static_cast<int>(s.tokens.size())) {
    broken("mark_computed(" + std::to_string(num_computed_tokens) + ") outside [" +
           std::to_string(s.num_computed_tokens) + ", " + std::to_string(s.tokens.size()) + "]");
  }
  if (num_computed_tokens == s.num_computed_tokens) return;
  s.num_computed_tokens = num_computed_tokens;
  s.scales->frozen = true;  // the first chunk calibrated them; every later token reuses them
  cache_full_blocks(s);
}

// Caches the full blocks computed so far. A key already cached by another writer keeps that
// block (ours stays private, freed normally); match_prefix() then stops at any scale change.
void BlockManager::cache_full_blocks(Sequence& s) {
  if (!pool_.prefix_caching_enabled()) return;
  const std::size_t num_full = static_cast<std::size_t>(s.num_computed_tokens / block_size_);
  for (std::size_t i = s.block_keys.size(); i < num_full; ++i) {
    const BlockHash key = block_key(s.tokens, i, i == 0 ? nullptr : &s.block_keys.back());
    s.block_keys.push_back(key);
    const int32_t block = s.block_table[i];
    if (!pool_.is_cached(block)) pool_.register_block(block, key, s.scales);
  }
}

void BlockManager::fork(SeqId parent, SeqId child) {
  if (contains(child)) broken("fork() into live sequence " + std::to_string(child));
  const Sequence& p = seq(parent);
  if (p.num_computed_tokens != static_cast<int>(p.tokens.size()) || !p.scales->frozen) {
    broken("fork() of sequence " + std::to_string(parent) + " with uncomputed tokens or unfrozen scales");
  }
  Sequence c = p;  // same tokens, table, keys and the same scales object
  for (const int32_t block : c.block_table) pool_.acquire(block);
  seqs_.emplace(child, std::move(c));
}

void BlockManager::free(SeqId id) {
  Sequence& s = seq(id);
  for (auto it = s.block_table.rbegin(); it != s.block_table.rend(); ++it) pool_.release(*it);
  seqs_.erase(id);
}

std::span<const int32_t> BlockManager::block_table(SeqId id) const { return seq(id).block_table; }
std::span<const int32_t> BlockManager::tokens(SeqId id) const { return seq(id).tokens; }
int BlockManager::num_tokens(SeqId id) const { return static_cast<int>(seq(id).tokens.size()); }
int BlockManager::num_computed_tokens(SeqId id) const { return seq(id).num_computed_tokens; }
const KvScales& BlockManager::scales(SeqId id) const { return *seq(id).scales; }

KvScales* BlockManager::scales_to_calibrate(SeqId id) {
  Sequence& s = seq(id);
  return s.scales->frozen ? nullptr : s.scales.get();
}

int64_t BlockManager::slot(SeqId id, int position) const {
  const Sequence& s = seq(id);
  if (position < 0 || position >= static_cast<int>(s.tokens.size())) {
    broken("slot() of position " + std::to_string(position) + " outside sequence " + std::to_string(id));
  }
  const int32_t block = s.block_table[static_cast<std::size_t>(position / block_size_)];
  return static_cast<int64_t>(block) * block_size_ + position % block_size_;
}

void BlockManager::check_integrity() const {
  std::vector<int> refs(static_cast<std::size_t>(pool_.num_blocks()), 0);
  std::set<int64_t> pending_slots;
  for (const auto& [id, s] : seqs_) {
    const std::string name = "sequence " + std::to_string(id);
    if (s.tokens.empty()) broken(name + " has no tokens");
    if (static_cast<int>(s.block_table.size()) != num_blocks_for(s.tokens.size())) {
      broken(name + " table does not cover exactly its tokens");
    }
    if (s.num_computed_tokens < 0 || s.num_computed_tokens > static_cast<int>(s.tokens.size())) {
      broken(name + " computed count out of range");
    }
    if (!s.scales || s.scales->num_layers() != num_layers_ ||
        static_cast<int>(s.scales->v.size()) != num_layers_) {
      broken(name + " scales do not have one K and one V per layer");
    }
    if (s.num_computed_tokens > 0 && !s.scales->frozen) broken(name + " computed tokens with unfrozen scales");
    std::set<int32_t> own(s.block_table.begin(), s.block_table.end());
    if (own.size() != s.block_table.size()) broken(name + " holds one block twice");
    for (const int32_t block : s.block_table) {
      if (block < 0 || block >= pool_.num_blocks()) broken(name + " names block out of range");
      ++refs[static_cast<std::size_t>(block)];
    }
    // Tokens still to be written: their slots must belong to this sequence alone, in
    // uncached blocks, and no two pending tokens anywhere may share a slot.
    for (int t = s.num_computed_tokens; t < static_cast<int>(s.tokens.size()); ++t) {
      const int32_t block = s.block_table[static_cast<std::size_t>(t / block_size_)];
      if (pool_.ref_count(block) != 1 || pool_.is_cached(block)) {
        broken(name + " will write token " + std::to_string(t) + " into a shared or cached block");
      }
      if (!pending_slots.insert(slot(id, t)).second) {
        broken(name + " slot of token " + std::to_string(t) + " handed out twice");
      }
    }
    const std::size_t num_full_computed = static_cast<std::size_t>(s.num_computed_tokens / block_size_);
    if (s.block_keys.size() > num_full_computed) broken(name + " has keys for blocks not computed");
    if (pool_.prefix_caching_enabled() && s.block_keys.size() != num_full_computed) {
      broken(name + " has computed full blocks that were not offered to the cache");
    }
    for (std::size_t i = 0; i < s.block_keys.size(); ++i) {
      const BlockHash key = block_key(s.tokens, i, i == 0 ? nullptr : &s.block_keys[i - 1]);
      if (key != s.block_keys[i]) broken(name + " block key " + std::to_string(i) + " does not match its tokens");
      const int32_t block = s.block_table[i];
      if (pool_.is_cached(block)) {
        if (pool_.lookup(key) != block) {
          broken(name + " block " + std::to_string(i) + " cached under another key");
        }
        if (!(*pool_.cached_scales(block) == *s.scales)) {
          broken(name + " maps cached block " + std::to_string(block) + " written with other scales");
        }
      }
    }
    for (std::size_t i = s.block_keys.size(); i < s.block_table.size(); ++i) {
      if (pool_.is_cached(s.block_table[i])) broken(name + " maps a cached block past its computed blocks");
    }
  }
  pool_.check_integrity(refs);
}

}  // namespace fp8serve
