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
      window_(options.window),
      num_tail_rings_(options.num_tail_rings),
      pool_(options.num_blocks, options.enable_prefix_caching) {
  if (block_size_ <= 0) throw std::invalid_argument("BlockManager: block_size must be > 0");
  if (num_layers_ <= 0) throw std::invalid_argument("BlockManager: num_layers must be > 0");
  window_.validate();
  if (window_.enabled()) {
    if (window_.block_size != block_size_) throw std::invalid_argument("BlockManager: window.block_size != block_size");
    if (num_tail_rings_ <= 0) throw std::invalid_argument("BlockManager: a window needs num_tail_rings > 0");
    for (int r = num_tail_rings_ - 1; r >= 0; --r) free_rings_.push_back(r);
  }
}

int BlockManager::take_ring() {
  if (!window_.enabled()) return -1;
  if (free_rings_.empty()) broken("no free tail ring (more live sequences than num_tail_rings)");
  const int ring = free_rings_.back();
  free_rings_.pop_back();
  return ring;
}

int BlockManager::fp8_len_after(const Sequence& s, int num_tokens, int fp8_floor) const {
  if (!in_window(s)) return num_tokens;
  const int floor = std::min(fp8_floor, num_tokens) / block_size_ * block_size_;
  return std::max({s.num_fp8_tokens, window_.fp8_len(num_tokens), floor});
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
// the last prompt token (that token is always computed: the step needs its logits), before the
// prompt's own bf16 window (those positions must be exact, and a cached block is FP8), and at
// the first block written with other scales than the chain's first block, so that every block
// of a sequence shares one scale per layer even when two writers cached parts of one prefix.
BlockManager::PrefixMatch BlockManager::match_prefix(std::span<const int32_t> prompt, int max_cached_tokens) const {
  PrefixMatch match;
  if (!pool_.prefix_caching_enabled() || prompt.empty()) return match;
  const std::size_t max_blocks =
      std::min({(prompt.size() - 1) / static_cast<std::size_t>(block_size_),
                static_cast<std::size_t>(window_.fp8_len(static_cast<int>(prompt.size())) / block_size_),
                static_cast<std::size_t>(std::max(max_cached_tokens, 0) / block_size_)});
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

int BlockManager::num_cached_prefix_tokens(std::span<const int32_t> prompt) const {
  return static_cast<int>(match_prefix(prompt, kNoCap).blocks.size()) * block_size_;
}

bool BlockManager::can_allocate(std::span<const int32_t> prompt, int max_cached_tokens, int need_rings) const {
  if (prompt.empty()) return false;
  if (window_.enabled() && static_cast<int>(free_rings_.size()) < need_rings) return false;
  const PrefixMatch match = match_prefix(prompt, max_cached_tokens);
  // Hit blocks that sit idle on the LRU stop being allocatable once mapped.
  const auto num_idle_hits = std::count_if(match.blocks.begin(), match.blocks.end(),
                                           [&](int32_t b) { return pool_.ref_count(b) == 0; });
  const int num_new = num_blocks_for(prompt.size()) - static_cast<int>(match.blocks.size());
  return num_new <= pool_.num_free_blocks() - static_cast<int>(num_idle_hits);
}

AllocateResult BlockManager::allocate(SeqId id, std::span<const int32_t> prompt, int max_cached_tokens, int group) {
  if (contains(id)) broken("allocate() of live sequence " + std::to_string(id));
  if (!can_allocate(prompt, max_cached_tokens)) broken("allocate() without can_allocate() (empty prompt or pool full)");
  PrefixMatch match = match_prefix(prompt, max_cached_tokens);
  Sequence s;
  s.num_tokens = static_cast<int>(prompt.size());
  // Hits first: acquiring takes them off the LRU, so the allocations below cannot evict them.
  for (const int32_t block : match.blocks) {
    pool_.acquire(block);
    s.block_table.push_back(block);
  }
  while (static_cast<int>(s.block_table.size()) < num_blocks_for(prompt.size())) {
    s.block_table.push_back(pool_.allocate());
  }
  s.num_computed_tokens = static_cast<int>(match.blocks.size()) * block_size_;
  s.num_fp8_tokens = s.num_computed_tokens;  // hits are FP8 blocks outside the window
  if (window_.enabled() && static_cast<int>(free_rings_.size()) >= std::max(group, 1)) {
    s.tail_ring = take_ring();
    for (int i = 1; i < group; ++i) s.reserved_rings.push_back(take_ring());
  } else if (window_.enabled()) {
    num_seqs_without_ring_ += static_cast<uint64_t>(std::max(group, 1));
  }
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
  const bool new_block = s.num_tokens % block_size_ == 0;
  int needed = new_block ? 1 : 0;
  // The new token's pool slot (its K and V; its V alone in a K-only window; nothing, its
  // token going to the tail, in a K+V window) needs a private last block.
  const bool writes_last_block = !in_window(s) || !window_.values;
  if (writes_last_block && !new_block && pool_.ref_count(s.block_table.back()) > 1) ++needed;
  if (in_window(s)) {
    // The blocks this step's spill writes into: a shared one needs a private replacement.
    const int end = fp8_len_after(s, s.num_tokens + 1, 0) / block_size_;
    for (int b = s.num_fp8_tokens / block_size_; b < end; ++b) {
      needed += pool_.ref_count(s.block_table[static_cast<std::size_t>(b)]) > 1 ? 1 : 0;
    }
  }
  return needed <= pool_.num_free_blocks();
}

AppendResult BlockManager::append_slot(SeqId id) {
  if (!can_append(id)) broken("append_slot() without can_append() (pool full)");
  Sequence& s = seq(id);
  const int position = s.num_tokens;
  const int offset = position % block_size_;
  AppendResult result;
  // A private block in place of a shared one (copy-on-write); returns the copy to make.
  auto make_private = [this](int32_t& block) {
    const int32_t shared = block;
    block = pool_.allocate();
    pool_.release(shared);
    return BlockCopy{shared, block};
  };
  if (in_window(s)) {
    // The block this step's spill fills. In a K+V window it holds nothing final (its tokens are
    // in the tail): a fresh block, no copy. In a K-only one its V is final: a copy.
    const int end = fp8_len_after(s, position + 1, 0) / block_size_;
    for (int b = s.num_fp8_tokens / block_size_; b < end; ++b) {
      int32_t& block = s.block_table[static_cast<std::size_t>(b)];
      if (pool_.ref_count(block) == 1) continue;
      const BlockCopy copy = make_private(block);
      if (!window_.values) result.spill_copy = copy;
    }
  }
  if (offset == 0) {
    s.block_table.push_back(pool_.allocate());
  } else if ((!in_window(s) || !window_.values) && pool_.ref_count(s.block_table.back()) > 1) {
    // Shared partial block (after fork) that the new token writes into: a private copy, the
    // original left to the other holders.
    result.copy = make_private(s.block_table.back());
  }
  ++s.num_tokens;
  result.slot = static_cast<int64_t>(s.block_table.back()) * block_size_ + static_cast<int64_t>(offset);
  return result;
}

void BlockManager::mark_computed(SeqId id, std::span<const int32_t> tokens, int num_computed_tokens, int fp8_floor) {
  Sequence& s = seq(id);
  if (num_computed_tokens < s.num_computed_tokens || num_computed_tokens > s.num_tokens) {
    broken("mark_computed(" + std::to_string(num_computed_tokens) + ") outside [" +
           std::to_string(s.num_computed_tokens) + ", " + std::to_string(s.num_tokens) + "]");
  }
  if (static_cast<int>(tokens.size()) < num_computed_tokens) {
    broken("mark_computed(" + std::to_string(num_computed_tokens) + ") given " + std::to_string(tokens.size()) + " tokens");
  }
  if (num_computed_tokens == s.num_computed_tokens) return;
  s.num_fp8_tokens = fp8_len_after(s, num_computed_tokens, fp8_floor);
  s.num_computed_tokens = num_computed_tokens;
  s.scales->frozen = true;  // the first chunk calibrated them; every later token reuses them
  cache_full_blocks(s, tokens);
}

// Caches the full blocks computed so far and final in FP8 (out of the window). A key already
// cached by another writer keeps that block (ours stays private, freed normally);
// match_prefix() then stops at any scale change.
void BlockManager::cache_full_blocks(Sequence& s, std::span<const int32_t> tokens) {
  if (!pool_.prefix_caching_enabled()) return;
  const std::size_t num_full = static_cast<std::size_t>(s.num_fp8_tokens / block_size_);
  for (std::size_t i = s.block_keys.size(); i < num_full; ++i) {
    const BlockHash key = block_key(tokens, i, i == 0 ? nullptr : &s.block_keys.back());
    s.block_keys.push_back(key);
    const int32_t block = s.block_table[i];
    if (!pool_.is_cached(block) && pool_.register_block(block, key, s.scales)) {
      const auto bs = static_cast<std::size_t>(block_size_);
      pool_.announce(block, i == 0 ? nullptr : &s.block_keys[i - 1], tokens.subspan(i * bs, bs));
    }
  }
}

void BlockManager::fork(SeqId parent, SeqId child) {
  if (contains(child)) broken("fork() into live sequence " + std::to_string(child));
  Sequence& p = seq(parent);
  if (p.num_computed_tokens != p.num_tokens || !p.scales->frozen) {
    broken("fork() of sequence " + std::to_string(parent) + " with uncomputed tokens or unfrozen scales");
  }
  Sequence c = p;  // same token count, table, keys and the same scales object
  c.reserved_rings.clear();
  if (in_window(p)) {
    // The ring allocate() reserved for it; a fork beyond those (not what the scheduler does)
    // takes a free one.
    if (!p.reserved_rings.empty()) {
      c.tail_ring = p.reserved_rings.back();
      p.reserved_rings.pop_back();
    } else {
      c.tail_ring = take_ring();
    }
  } else if (window_.enabled()) {
    c.tail_ring = -1;  // its parent's window positions are FP8 already: pure FP8 too (counted at allocate)
  }
  for (const int32_t block : c.block_table) pool_.acquire(block);
  seqs_.emplace(child, std::move(c));
}

void BlockManager::free(SeqId id) {
  Sequence& s = seq(id);
  for (auto it = s.block_table.rbegin(); it != s.block_table.rend(); ++it) pool_.release(*it);
  if (s.tail_ring >= 0) free_rings_.push_back(s.tail_ring);
  for (const int ring : s.reserved_rings) free_rings_.push_back(ring);
  seqs_.erase(id);
}

void BlockManager::truncate(SeqId id, int num_tokens) {
  Sequence& s = seq(id);
  if (num_tokens < s.num_computed_tokens || num_tokens > s.num_tokens || num_tokens < 1) {
    broken("truncate(" + std::to_string(num_tokens) + ") outside [max(1, " + std::to_string(s.num_computed_tokens) +
           "), " + std::to_string(s.num_tokens) + "]");
  }
  s.num_tokens = num_tokens;
  const auto keep = static_cast<std::size_t>(num_blocks_for(static_cast<std::size_t>(num_tokens)));
  while (s.block_table.size() > keep) {
    pool_.release(s.block_table.back());
    s.block_table.pop_back();
  }
}

int BlockManager::tail_ring(SeqId id) const { return seq(id).tail_ring; }
int BlockManager::num_fp8_tokens(SeqId id) const { return seq(id).num_fp8_tokens; }
int BlockManager::fp8_len_after(SeqId id, int num_tokens, int fp8_floor) const {
  return fp8_len_after(seq(id), num_tokens, fp8_floor);
}

std::span<const int32_t> BlockManager::block_table(SeqId id) const { return seq(id).block_table; }
int BlockManager::num_tokens(SeqId id) const { return seq(id).num_tokens; }
int BlockManager::num_computed_tokens(SeqId id) const { return seq(id).num_computed_tokens; }
const KvScales& BlockManager::scales(SeqId id) const { return *seq(id).scales; }

KvScales* BlockManager::scales_to_calibrate(SeqId id) {
  Sequence& s = seq(id);
  return s.scales->frozen ? nullptr : s.scales.get();
}

int64_t BlockManager::slot(SeqId id, int position) const {
  const Sequence& s = seq(id);
  if (position < 0 || position >= s.num_tokens) {
    broken("slot() of position " + std::to_string(position) + " outside sequence " + std::to_string(id));
  }
  const int32_t block = s.block_table[static_cast<std::size_t>(position / block_size_)];
  return static_cast<int64_t>(block) * block_size_ + position % block_size_;
}

void BlockManager::check_integrity(const TokensOf& tokens_of) const {
  std::vector<int> refs(static_cast<std::size_t>(pool_.num_blocks()), 0);
  std::set<int64_t> pending_slots;
  std::set<int> rings(free_rings_.begin(), free_rings_.end());
  if (rings.size() != free_rings_.size()) broken("a tail ring is free twice");
  for (const auto& [id, s] : seqs_) {
    const std::string name = "sequence " + std::to_string(id);
    const int num_tokens = s.num_tokens;
    if (num_tokens < 1) broken(name + " has no tokens");
    if (static_cast<int>(s.block_table.size()) != num_blocks_for(static_cast<std::size_t>(num_tokens))) {
      broken(name + " table does not cover exactly its tokens");
    }
    if (s.num_computed_tokens < 0 || s.num_computed_tokens > num_tokens) {
      broken(name + " computed count out of range");
    }
    if (!s.scales || s.scales->num_layers() != num_layers_ ||
        static_cast<int>(s.scales->v.size()) != num_layers_) {
      broken(name + " scales do not have one K and one V per layer");
    }
    if (s.num_computed_tokens > 0 && !s.scales->frozen) broken(name + " computed tokens with unfrozen scales");
    for (const int ring : s.reserved_rings)
      if (!window_.enabled() || ring < 0 || ring >= num_tail_rings_ || !rings.insert(ring).second)
        broken(name + " reserves a tail ring that is not its own");
    if (in_window(s)) {
      if (s.tail_ring >= num_tail_rings_ || !rings.insert(s.tail_ring).second) {
        broken(name + " has no tail ring of its own");
      }
      if (s.num_fp8_tokens < 0 || s.num_fp8_tokens > s.num_computed_tokens || s.num_fp8_tokens % block_size_ != 0 ||
          s.num_fp8_tokens < window_.fp8_len(s.num_computed_tokens)) {
        broken(name + " FP8 count " + std::to_string(s.num_fp8_tokens) + " off the window's rule");
      }
      if (num_tokens - fp8_len_after(s, num_tokens, 0) > window_.ring_blocks() * block_size_) {
        broken(name + " has more tokens in the window than its tail ring holds");
      }
    } else if (s.tail_ring != -1 || s.num_fp8_tokens != s.num_computed_tokens) {
      broken(name + " has window state without a ring");
    }
    std::set<int32_t> own(s.block_table.begin(), s.block_table.end());
    if (own.size() != s.block_table.size()) broken(name + " holds one block twice");
    for (const int32_t block : s.block_table) {
      if (block < 0 || block >= pool_.num_blocks()) broken(name + " names block out of range");
      ++refs[static_cast<std::size_t>(block)];
    }
    // Slots still to be written into the pool - the uncomputed tokens' (those of them that go
    // to the tail excepted, in a K+V window) and the blocks the next spill fills - must belong to
    // this sequence alone, in uncached blocks, and no two pending tokens anywhere share a slot.
    const int fp8_after = fp8_len_after(s, num_tokens, 0);
    for (int t = s.num_computed_tokens; t < num_tokens; ++t) {
      if (in_window(s) && window_.values && t >= fp8_after) continue;  // all of it to the tail
      const int32_t block = s.block_table[static_cast<std::size_t>(t / block_size_)];
      if (pool_.ref_count(block) != 1 || pool_.is_cached(block)) {
        broken(name + " will write token " + std::to_string(t) + " into a shared or cached block");
      }
      if (!pending_slots.insert(slot(id, t)).second) {
        broken(name + " slot of token " + std::to_string(t) + " handed out twice");
      }
    }
    for (int b = s.num_fp8_tokens / block_size_; b < fp8_after / block_size_; ++b) {
      if (pool_.ref_count(s.block_table[static_cast<std::size_t>(b)]) != 1) {
        broken(name + " will spill into shared block " + std::to_string(b));
      }
    }
    const std::size_t num_full_final = static_cast<std::size_t>(s.num_fp8_tokens / block_size_);
    if (s.block_keys.size() > num_full_final) broken(name + " has keys for blocks not computed or in its window");
    if (pool_.prefix_caching_enabled() && s.block_keys.size() != num_full_final) {
      broken(name + " has computed full blocks that were not offered to the cache");
    }
    const std::span<const int32_t> tokens = tokens_of ? tokens_of(id) : std::span<const int32_t>{};
    if (tokens_of && tokens.size() < s.block_keys.size() * static_cast<std::size_t>(block_size_)) {
      broken(name + " has keys for more blocks than its owner has tokens");
    }
    for (std::size_t i = 0; i < s.block_keys.size(); ++i) {
      const BlockHash& key = s.block_keys[i];
      if (tokens_of && key != block_key(tokens, i, i == 0 ? nullptr : &s.block_keys[i - 1])) {
        broken(name + " block key " + std::to_string(i) + " does not match its tokens");
      }
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
  if (window_.enabled() && static_cast<int>(rings.size()) != num_tail_rings_) broken("a tail ring is lost");
  pool_.check_integrity(refs);
}

}  // namespace fp8serve
