// Randomized operation sequences against the block manager (allocate, step/commit, append,
// fork, free; prefix hits, eviction, exhaustion), checked after every operation by
// check_integrity() (its keys against the model's tokens, which the test owns as the scheduler
// owns a sequence's) and by an independent model:
//   - a shadow KV memory: every computed token writes (position, FNV fingerprint of its whole
//     prefix, scale tag) into its slot; a copy-on-write copies shadow blocks. Every live
//     sequence must read back exactly its own prefix and its own scale tag through its block
//     table, at all times. A slot handed out twice, a wrong prefix hit, a missed copy or a
//     block reused while referenced shows up here, whatever the manager's own bookkeeping says.
//   - a plain model of each sequence (tokens, computed count) and of the committed prefixes,
//     which bounds prefix hits (exact while nothing was evicted);
//   - block accounting from the tables: free blocks == total - blocks referenced by a table.
// With the bf16 window the shadow has a second memory, the tail rings: a step writes each new
// token into its FP8 slot or its ring slot and first spills the positions that leave the window
// (ring -> FP8 slot), as kv_spill and kv_write do; a fork copies the parent's ring. Every live
// sequence must read its FP8 positions back through its table and the others through its ring.
// K and V have shadows of their own: a K-only window writes every V straight into its slot.
// With prefix caching the KV-cache events feed a router's index, modelled as Dynamo's indexer
// keeps one (a block stored only under a known parent, removed, all cleared; each hash checked
// against the SHA-256 chain of the tokens the events carry): for every prompt the index may
// never promise more blocks than the cache would map. Now and then the cache is reset.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "cache/block_manager.hpp"

namespace {

using fp8serve::BlockManager;
using fp8serve::SeqId;

struct ShadowSlot {
  bool written = false;
  int position = -1;
  uint64_t prefix_fp = 0;
  int scale_tag = -1;
};

struct ModelSeq {
  std::vector<int32_t> tokens;
  int num_computed = 0;
  int scale_tag = -1;  // -1 until the first commit calibrates (or a hit inherits)
};

// FNV-1a over token ids: an identity of the prefix that shares nothing with SHA-256.
std::vector<uint64_t> prefix_fingerprints(const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> fps(tokens.size());
  uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    for (int byte = 0; byte < 4; ++byte) {
      h ^= (static_cast<uint32_t>(tokens[i]) >> (8 * byte)) & 0xffu;
      h *= 1099511628211ull;
    }
    fps[i] = h;
  }
  return fps;
}

// Distinct, recognizable scales per calibration tag.
float tag_k(int tag, int layer) { return 0.001f * static_cast<float>(tag + 1) + static_cast<float>(layer); }
float tag_v(int tag, int layer) { return 0.002f * static_cast<float>(tag + 1) + static_cast<float>(layer); }

struct Coverage {
  int hits = 0, evictions = 0, copies = 0, alloc_refused = 0, append_refused = 0, forks = 0;
  int spills = 0, private_spills = 0;  // window: positions spilled; blocks made private to spill into
  int ringless = 0;  // window: sequences admitted (or forked) without a ring: pure FP8
  int router_hits = 0, resets = 0;  // prompts the events' index matched; resets of the cache
};

class RandomRun {
 public:
  // window: the bf16 window in tokens (0 = off), with num_rings tail rings; values: K and V in
  // the window (false: K only).
  RandomRun(int block_size, int num_blocks, bool prefix_caching, uint32_t seed, Coverage& coverage, int window = 0,
            int num_rings = 0, bool values = true)
      : m_({block_size, 2, num_blocks, prefix_caching, fp8serve::KvWindow{window, values, block_size}, num_rings}),
        block_size_(block_size),
        prefix_caching_(prefix_caching),
        window_{window, values, block_size},
        rng_(seed),
        shadow_(static_cast<std::size_t>(num_blocks * block_size)),
        shadow_v_(shadow_.size()),
        tail_shadow_(static_cast<std::size_t>(num_rings * window_.ring_blocks() * block_size)),
        coverage_(coverage) {
    if (prefix_caching) m_.enable_events();
    // A few stems that prompts share, so prefixes repeat across sequences.
    for (int s = 0; s < 3; ++s) {
      std::vector<int32_t> stem(static_cast<std::size_t>(4 * block_size + 3));
      for (int32_t& t : stem) t = static_cast<int32_t>(uniform(0, 5));
      stems_.push_back(stem);
    }
  }

  void run(int num_ops) {
    for (int op = 0; op < num_ops; ++op) {
      const int kind = uniform(0, 99);
      INFO("op " << op << " kind " << kind);
      if (kind < 25 || model_.empty()) {
        do_allocate();
      } else if (kind < 50) {
        do_step();
      } else if (kind < 75) {
        do_append();
      } else if (kind < 83) {
        do_fork();
      } else if (kind < 99) {
        do_free();
      } else {
        m_.reset_prefix_cache();
        reset_ = true;
        ++coverage_.resets;
      }
      apply_events();
      verify();
    }
    coverage_.evictions += static_cast<int>(m_.pool().num_evictions());
  }

 private:
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  SeqId pick_live() {
    auto it = model_.begin();
    std::advance(it, uniform(0, static_cast<int>(model_.size()) - 1));
    return it->first;
  }

  // The longest run of block-aligned prefixes committed with one scale tag, first writer per
  // prefix (what the cache holds while nothing has been evicted), capped before the last token.
  int predicted_hit_tokens(const std::vector<int32_t>& prompt) const {
    if (!prefix_caching_) return 0;
    const int max_blocks = std::min((static_cast<int>(prompt.size()) - 1) / block_size_,
                                    window_.fp8_len(static_cast<int>(prompt.size())) / block_size_);
    int chain_tag = -1, hits = 0;
    for (int i = 0; i < max_blocks; ++i) {
      const std::vector<int32_t> prefix(prompt.begin(), prompt.begin() + (i + 1) * block_size_);
      const auto it = first_writer_.find(prefix);
      if (it == first_writer_.end() || (chain_tag >= 0 && it->second != chain_tag)) break;
      chain_tag = it->second;
      hits = (i + 1) * block_size_;
    }
    return hits;
  }

  int tag_of_scales(const fp8serve::KvScales& scales) const {
    for (int tag = 0; tag < next_tag_; ++tag) {
      if (scales.k[1] == tag_k(tag, 1) && scales.v[1] == tag_v(tag, 1)) return tag;
    }
    return -1;
  }

  void do_allocate() {
    const auto& stem = stems_[static_cast<std::size_t>(uniform(0, 2))];
    std::vector<int32_t> prompt(stem.begin(), stem.begin() + uniform(0, static_cast<int>(stem.size())));
    const int extra = uniform(prompt.empty() ? 1 : 0, 2 * block_size_);
    for (int i = 0; i < extra; ++i) prompt.push_back(static_cast<int32_t>(uniform(0, 5)));
    const int needed_without_hits = (static_cast<int>(prompt.size()) + block_size_ - 1) / block_size_;
    if (!m_.can_allocate(prompt)) {
      // Refusing is only right when the prompt does not fit even counting every free block (a
      // taken ring refuses nothing: the sequence runs without one).
      REQUIRE(needed_without_hits > m_.num_free_blocks());
      ++coverage_.alloc_refused;
      return;
    }
    const SeqId id = next_id_++;
    const int predicted = predicted_hit_tokens(prompt);
    const bool ring_free = m_.num_free_tail_rings() > 0;
    const int hits = m_.allocate(id, prompt).num_cached_tokens;
    if (window_.enabled()) REQUIRE(ringed(id) == ring_free);
    coverage_.ringless += window_.enabled() && !ringed(id) ? 1 : 0;
    REQUIRE(hits % block_size_ == 0);
    REQUIRE(hits <= (static_cast<int>(prompt.size()) - 1) / block_size_ * block_size_);
    // While nothing was evicted the cache holds exactly the first writer of every prefix.
    if (m_.pool().num_evictions() == 0 && !reset_) REQUIRE(hits == predicted);
    ModelSeq s;
    s.tokens = prompt;
    s.num_computed = hits;
    if (hits > 0) {
      ++coverage_.hits;
      REQUIRE(m_.scales_to_calibrate(id) == nullptr);
      s.scale_tag = tag_of_scales(m_.scales(id));
      REQUIRE(s.scale_tag >= 0);
      // Never a hit the commits cannot explain: every hit prefix was committed with this tag.
      for (int i = 0; i < hits / block_size_; ++i) {
        const auto it = ever_committed_.find(
            std::vector<int32_t>(prompt.begin(), prompt.begin() + (i + 1) * block_size_));
        REQUIRE(it != ever_committed_.end());
        REQUIRE(it->second.count(s.scale_tag) == 1);
      }
    } else {
      REQUIRE(m_.scales_to_calibrate(id) != nullptr);
    }
    model_[id] = s;
  }

  void do_step() {
    std::vector<SeqId> pending;
    for (const auto& [id, s] : model_) {
      if (s.num_computed < static_cast<int>(s.tokens.size())) pending.push_back(id);
    }
    if (pending.empty()) return;
    const SeqId id = pending[static_cast<std::size_t>(uniform(0, static_cast<int>(pending.size()) - 1))];
    ModelSeq& s = model_[id];
    const int target = uniform(s.num_computed + 1, static_cast<int>(s.tokens.size()));
    // kv_write: calibrate on the first chunk, then write every new token into its slot.
    if (fp8serve::KvScales* scales = m_.scales_to_calibrate(id)) {
      REQUIRE(s.scale_tag == -1);
      s.scale_tag = next_tag_++;
      for (int l = 0; l < 2; ++l) {
        scales->k[static_cast<std::size_t>(l)] = tag_k(s.scale_tag, l);
        scales->v[static_cast<std::size_t>(l)] = tag_v(s.scale_tag, l);
      }
    } else {
      REQUIRE(s.scale_tag >= 0);
    }
    const auto fps = prefix_fingerprints(s.tokens);
    const int fp8_before = m_.num_fp8_tokens(id);
    const int fp8_after = m_.fp8_len_after(id, target);
    REQUIRE(fp8_after == (ringed(id) ? std::max(fp8_before, window_.fp8_len(target)) : target));
    // kv_spill, then kv_write (kernels/paged_kv.hpp).
    for (int t = fp8_before; t < std::min(fp8_after, s.num_computed); ++t) {
      const auto slot = static_cast<std::size_t>(m_.slot(id, t));
      shadow_.at(slot) = tail_shadow_.at(ring_slot(id, t));
      if (window_.values) shadow_v_.at(slot) = tail_shadow_.at(ring_slot(id, t));
      ++coverage_.spills;
    }
    for (int t = s.num_computed; t < target; ++t) {
      const ShadowSlot written{true, t, fps[static_cast<std::size_t>(t)], s.scale_tag};
      const auto slot = static_cast<std::size_t>(m_.slot(id, t));
      if (t < fp8_after) shadow_.at(slot) = written;
      else tail_shadow_.at(ring_slot(id, t)) = written;
      if (t < fp8_after || !window_.values) shadow_v_.at(slot) = written;
    }
    m_.mark_computed(id, s.tokens, target);
    REQUIRE(m_.num_fp8_tokens(id) == fp8_after);
    REQUIRE(m_.scales_to_calibrate(id) == nullptr);
    // Offered to the prefix cache: the full blocks out of the window.
    for (int i = fp8_before / block_size_; i < fp8_after / block_size_; ++i) {
      std::vector<int32_t> prefix(s.tokens.begin(), s.tokens.begin() + (i + 1) * block_size_);
      ever_committed_[prefix].insert(s.scale_tag);
      first_writer_.emplace(std::move(prefix), s.scale_tag);
    }
    s.num_computed = target;
  }

  bool ringed(SeqId id) const { return window_.enabled() && m_.tail_ring(id) >= 0; }

  // The slot of position t of a sequence in the tail rings, by the window's own arithmetic.
  std::size_t ring_slot(SeqId id, int t) const {
    const int ring = m_.tail_ring(id);
    REQUIRE(ring >= 0);
    const int block = ring * window_.ring_blocks() + (t / block_size_) % window_.ring_blocks();
    return static_cast<std::size_t>(block * block_size_ + t % block_size_);
  }

  void do_append() {
    const SeqId id = pick_live();
    ModelSeq& s = model_[id];
    const bool new_block = s.tokens.size() % static_cast<std::size_t>(block_size_) == 0;
    int needed = new_block ? 1 : 0;
    std::vector<int> to_privatize;  // window: shared blocks the next step spills into
    const bool writes_last_block = !ringed(id) || !window_.values;  // the new token's K or V
    const bool copies_last = writes_last_block && !new_block && shared_block(id, m_.block_table(id).back());
    needed += copies_last ? 1 : 0;
    if (ringed(id)) {
      const int end = m_.fp8_len_after(id, static_cast<int>(s.tokens.size()) + 1) / block_size_;
      for (int b = m_.num_fp8_tokens(id) / block_size_; b < end; ++b) {
        if (shared_block(id, m_.block_table(id)[static_cast<std::size_t>(b)])) to_privatize.push_back(b);
      }
      needed += static_cast<int>(to_privatize.size());
    }
    if (!m_.can_append(id)) {
      REQUIRE(needed > m_.num_free_blocks());
      ++coverage_.append_refused;
      return;
    }
    const std::vector<int32_t> table_before(m_.block_table(id).begin(), m_.block_table(id).end());
    const auto token = static_cast<int32_t>(uniform(0, 5));
    const fp8serve::AppendResult r = m_.append_slot(id);
    REQUIRE(r.copy.has_value() == copies_last);
    // K+V window: a fresh block, not another sequence's, nothing to copy; K only: a copy (its V
    // is final).
    REQUIRE(r.spill_copy.has_value() == (!window_.values && !to_privatize.empty()));
    for (const int b : to_privatize) {
      const int32_t now = m_.block_table(id)[static_cast<std::size_t>(b)];
      REQUIRE(now != table_before[static_cast<std::size_t>(b)]);
      REQUIRE_FALSE(shared_block(id, now));
      if (r.spill_copy) {
        REQUIRE(r.spill_copy->src == table_before[static_cast<std::size_t>(b)]);
        REQUIRE(r.spill_copy->dst == now);
        copy_shadow_block(*r.spill_copy);
      }
      ++coverage_.private_spills;
    }
    if (r.copy) {
      ++coverage_.copies;
      copy_shadow_block(*r.copy);
    }
    s.tokens.push_back(token);
    REQUIRE(r.slot == m_.slot(id, static_cast<int>(s.tokens.size()) - 1));
  }

  void copy_shadow_block(const fp8serve::BlockCopy& copy) {
    for (int o = 0; o < block_size_; ++o) {
      const auto dst = static_cast<std::size_t>(copy.dst * block_size_ + o);
      const auto src = static_cast<std::size_t>(copy.src * block_size_ + o);
      shadow_.at(dst) = shadow_.at(src);
      shadow_v_.at(dst) = shadow_v_.at(src);
    }
  }

  // Whether another live sequence's table holds this block (from the tables).
  bool shared_block(SeqId id, int32_t block) const {
    for (const auto& [other, s] : model_) {
      if (other == id) continue;
      const auto table = m_.block_table(other);
      if (std::find(table.begin(), table.end(), block) != table.end()) return true;
    }
    return false;
  }

  void do_fork() {
    const SeqId parent = pick_live();
    const ModelSeq p = model_[parent];
    if (p.num_computed != static_cast<int>(p.tokens.size())) {
      REQUIRE_THROWS_AS(m_.fork(parent, next_id_), std::logic_error);
      return;
    }
    if (ringed(parent) && m_.num_free_tail_rings() == 0) {  // (the scheduler reserves rings for its forks)
      REQUIRE_THROWS_AS(m_.fork(parent, next_id_), std::logic_error);
      return;
    }
    const SeqId child = next_id_++;
    m_.fork(parent, child);
    REQUIRE(ringed(child) == ringed(parent));
    coverage_.ringless += window_.enabled() && !ringed(child) ? 1 : 0;
    if (ringed(parent)) {  // the engine copies the parent's ring into the child's
      const auto ring_tokens = static_cast<std::size_t>(window_.ring_blocks() * block_size_);
      const auto from = static_cast<std::size_t>(m_.tail_ring(parent)) * ring_tokens;
      const auto to = static_cast<std::size_t>(m_.tail_ring(child)) * ring_tokens;
      REQUIRE(from != to);
      std::copy(tail_shadow_.begin() + from, tail_shadow_.begin() + from + ring_tokens, tail_shadow_.begin() + to);
    }
    model_[child] = p;
    ++coverage_.forks;
  }

  void do_free() {
    const SeqId id = pick_live();
    m_.free(id);
    model_.erase(id);
  }

  // The router's side: the events applied to its index, each checked as it comes.
  void apply_events() {
    for (const fp8serve::KvCacheEvent& e : m_.take_events()) {
      switch (e.type) {
        case fp8serve::KvCacheEvent::Type::block_stored: {
          REQUIRE(!e.block_hashes.empty());
          REQUIRE(e.token_ids.size() == e.block_hashes.size() * static_cast<std::size_t>(block_size_));
          std::vector<int32_t> prefix;
          std::optional<uint64_t> parent = e.parent_block_hash;
          if (parent) {
            REQUIRE(index_.count(*parent) == 1);  // announced after its parent, never before
            prefix = index_.at(*parent).prefix;
          }
          for (std::size_t b = 0; b < e.block_hashes.size(); ++b) {
            const auto first = e.token_ids.begin() + static_cast<std::ptrdiff_t>(b) * block_size_;
            prefix.insert(prefix.end(), first, first + block_size_);
            REQUIRE(e.block_hashes[b] == router_hash(prefix));
            REQUIRE(index_.count(e.block_hashes[b]) == 0);  // one block per key while cached
            index_[e.block_hashes[b]] = {parent, prefix};
            parent = e.block_hashes[b];
          }
          break;
        }
        case fp8serve::KvCacheEvent::Type::block_removed:
          for (const uint64_t h : e.block_hashes) REQUIRE(index_.erase(h) == 1);  // only what was announced
          break;
        case fp8serve::KvCacheEvent::Type::all_blocks_cleared:
          index_.clear();
          break;
      }
    }
  }

  // The 64-bit id of the last full block of `prefix` (a whole number of blocks).
  uint64_t router_hash(const std::vector<int32_t>& prefix) const {
    fp8serve::BlockHash key{};
    for (std::size_t b = 0; b * static_cast<std::size_t>(block_size_) < prefix.size(); ++b) {
      const std::span<const int32_t> block(prefix.data() + b * static_cast<std::size_t>(block_size_),
                                           static_cast<std::size_t>(block_size_));
      key = fp8serve::hash_block_tokens(b == 0 ? nullptr : &key, block);
    }
    return fp8serve::external_block_hash(key);
  }

  // Full blocks of `prompt` the index matches (a chain from the first) and the cache holds
  // mappable (cached, with the first block's scales), whatever a request's own caps.
  std::pair<int, int> router_and_cache_blocks(const std::vector<int32_t>& prompt) const {
    int router = 0, cache = 0;
    std::optional<uint64_t> parent;
    fp8serve::BlockHash key{};
    const fp8serve::KvScales* chain_scales = nullptr;
    bool router_on = true, cache_on = true;
    for (int b = 0; (b + 1) * block_size_ <= static_cast<int>(prompt.size()); ++b) {
      const std::span<const int32_t> block(prompt.data() + b * block_size_, static_cast<std::size_t>(block_size_));
      key = fp8serve::hash_block_tokens(b == 0 ? nullptr : &key, block);
      const uint64_t h = fp8serve::external_block_hash(key);
      const auto it = index_.find(h);
      router_on = router_on && it != index_.end() && it->second.parent == parent;
      router += router_on ? 1 : 0;
      parent = h;
      const std::optional<int32_t> cached = m_.pool().lookup(key);
      if (cache_on && cached) {
        const fp8serve::KvScales& scales = *m_.pool().cached_scales(*cached);
        if (chain_scales == nullptr) chain_scales = &scales;
        cache_on = scales == *chain_scales;
      } else {
        cache_on = false;
      }
      cache += cache_on ? 1 : 0;
    }
    return {router, cache};
  }

  void verify_router_index() {
    std::vector<const std::vector<int32_t>*> prompts;
    for (const auto& [id, s] : model_) prompts.push_back(&s.tokens);
    for (const auto& stem : stems_) prompts.push_back(&stem);
    for (const std::vector<int32_t>* prompt : prompts) {
      const auto [router, cache] = router_and_cache_blocks(*prompt);
      REQUIRE(router <= cache);
      coverage_.router_hits += router > 0 ? 1 : 0;
    }
  }

  void verify() {
    if (prefix_caching_) verify_router_index();
    m_.check_integrity([this](SeqId id) { return std::span<const int32_t>(model_.at(id).tokens); });
    REQUIRE(m_.num_seqs() == static_cast<int>(model_.size()));
    std::set<int32_t> referenced;
    for (const auto& [id, s] : model_) {
      INFO("sequence " << id);
      REQUIRE(m_.num_tokens(id) == static_cast<int>(s.tokens.size()));
      REQUIRE(m_.num_computed_tokens(id) == s.num_computed);
      const auto table = m_.block_table(id);
      REQUIRE(static_cast<int>(table.size()) == (static_cast<int>(s.tokens.size()) + block_size_ - 1) / block_size_);
      referenced.insert(table.begin(), table.end());
      const auto fps = prefix_fingerprints(s.tokens);
      const int num_fp8 = m_.num_fp8_tokens(id);
      for (int t = 0; t < s.num_computed; ++t) {
        const auto pool_slot = static_cast<std::size_t>(m_.slot(id, t));
        const ShadowSlot& k = t < num_fp8 ? shadow_.at(pool_slot) : tail_shadow_.at(ring_slot(id, t));
        const ShadowSlot& v = t < num_fp8 || !window_.values ? shadow_v_.at(pool_slot) : tail_shadow_.at(ring_slot(id, t));
        for (const ShadowSlot* slot : {&k, &v}) {
          // One plain test per token; REQUIRE only on failure (millions of tokens are read).
          if (!slot->written || slot->position != t || slot->prefix_fp != fps[static_cast<std::size_t>(t)] ||
              slot->scale_tag != s.scale_tag) {
            FAIL("token " << t << (slot == &k ? " K" : " V") << " reads back written=" << slot->written
                          << " position=" << slot->position << " tag=" << slot->scale_tag << " (expected tag "
                          << s.scale_tag << ")" << (slot->prefix_fp != fps[static_cast<std::size_t>(t)] ? ", another prefix" : ""));
          }
        }
      }
      if (s.scale_tag >= 0) REQUIRE(tag_of_scales(m_.scales(id)) == s.scale_tag);
    }
    REQUIRE(m_.num_free_blocks() == m_.num_blocks() - static_cast<int>(referenced.size()));
  }

  BlockManager m_;
  int block_size_;
  bool prefix_caching_;
  fp8serve::KvWindow window_;
  std::mt19937 rng_;
  std::vector<ShadowSlot> shadow_;       // [num_blocks * block_size] K in the pool
  std::vector<ShadowSlot> shadow_v_;     // [num_blocks * block_size] V in the pool
  std::vector<ShadowSlot> tail_shadow_;  // [num_rings * ring_blocks * block_size]
  std::vector<std::vector<int32_t>> stems_;
  std::map<SeqId, ModelSeq> model_;
  std::map<std::vector<int32_t>, int> first_writer_;
  std::map<std::vector<int32_t>, std::set<int>> ever_committed_;
  struct Indexed {
    std::optional<uint64_t> parent;
    std::vector<int32_t> prefix;  // every token up to and with this block
  };
  std::map<uint64_t, Indexed> index_;  // the router's view, from the events
  bool reset_ = false;
  SeqId next_id_ = 1;
  int next_tag_ = 0;
  Coverage& coverage_;
};

}  // namespace

TEST_CASE("random operation sequences keep every invariant and the shadow KV consistent", "[cache][random]") {
  struct Config {
    int block_size, num_blocks;
    bool prefix_caching;
  };
  const Config configs[] = {{1, 12, true}, {2, 10, true}, {4, 24, true}, {16, 8, true},
                            {4, 16, false}, {3, 400, true}};
  Coverage coverage;
  for (const Config& c : configs) {
    for (uint32_t seed = 1; seed <= 6; ++seed) {
      INFO("block_size " << c.block_size << " num_blocks " << c.num_blocks << " prefix caching "
                         << c.prefix_caching << " seed " << seed);
      RandomRun(c.block_size, c.num_blocks, c.prefix_caching, seed, coverage).run(1500);
    }
  }
  // The runs must actually have exercised the interesting paths.
  WARN("hits " << coverage.hits << " evictions " << coverage.evictions << " copies " << coverage.copies
               << " refused allocs " << coverage.alloc_refused << " refused appends "
               << coverage.append_refused << " forks " << coverage.forks);
  CHECK(coverage.hits > 100);
  CHECK(coverage.evictions > 100);
  CHECK(coverage.copies > 50);
  CHECK(coverage.alloc_refused > 50);
  CHECK(coverage.append_refused > 50);
  CHECK(coverage.forks > 100);
  WARN("router index hits " << coverage.router_hits << " resets " << coverage.resets);
  CHECK(coverage.router_hits > 1000);
  CHECK(coverage.resets > 10);
}

TEST_CASE("random operation sequences with a bf16 window keep the FP8 blocks and the tail rings consistent", "[cache][random][window]") {
  struct Config {
    int block_size, num_blocks, window, num_rings;
    bool prefix_caching, values;
  };
  // Few rings in some configs: sequences admitted without one run as pure FP8, forks of a
  // sequence with one are refused.
  const Config configs[] = {{1, 40, 2, 6, true, true}, {2, 16, 4, 4, true, true}, {4, 60, 8, 8, true, true},
                            {4, 24, 4, 3, false, true}, {3, 400, 6, 12, true, true}, {2, 16, 4, 4, true, false},
                            {4, 60, 8, 8, true, false}, {4, 24, 4, 3, false, false}};
  Coverage coverage;
  for (const Config& c : configs) {
    for (uint32_t seed = 1; seed <= 6; ++seed) {
      INFO("block_size " << c.block_size << " num_blocks " << c.num_blocks << " window " << c.window << " rings "
                         << c.num_rings << " prefix caching " << c.prefix_caching << (c.values ? " K+V" : " K only")
                         << " seed " << seed);
      RandomRun(c.block_size, c.num_blocks, c.prefix_caching, seed, coverage, c.window, c.num_rings, c.values).run(1500);
    }
  }
  WARN("hits " << coverage.hits << " evictions " << coverage.evictions << " spills " << coverage.spills
               << " private spill blocks " << coverage.private_spills << " refused allocs " << coverage.alloc_refused
               << " refused appends " << coverage.append_refused << " forks " << coverage.forks);
  CHECK(coverage.hits > 100);
  CHECK(coverage.spills > 1000);
  CHECK(coverage.private_spills > 50);
  CHECK(coverage.alloc_refused > 50);
  CHECK(coverage.append_refused > 50);
  CHECK(coverage.forks > 100);
  CHECK(coverage.copies > 50);  // a K-only window copies on write, as without a window
  CHECK(coverage.ringless > 100);
  WARN("sequences without a ring " << coverage.ringless << "; router index hits " << coverage.router_hits);
  CHECK(coverage.router_hits > 1000);
}
