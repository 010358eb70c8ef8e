#pragma once
// Block tables of the running sequences over one BlockPool, with prefix caching and the
// per-sequence FP8 scales (docs/design.md, "FP8 semantics"). Pure host logic, driven by the engine loop only.
//
// The manager holds a sequence's KV, not its tokens: its table, how many slots it holds
// (num_tokens), how many of them are computed and final in FP8, the chain keys of its cached
// blocks, its scales and its tail ring. The tokens belong to whoever owns the sequence (the
// Scheduler's Sequence; the draft model's own list): allocate() and mark_computed() read them
// for the prefix cache's keys, and nothing keeps a copy.
//
// A sequence's life, in engine terms:
//   can_allocate(prompt) / allocate(id, prompt)  table for the whole prompt; the longest cached
//                                                prefix is mapped, not recomputed (its count is
//                                                returned; those tokens are already computed)
//   forward step over tokens [computed, n)       kv_write calibrates scales_to_calibrate(id)
//                                                (non-null only before the first commit)
//   mark_computed(id, tokens, n)                 freezes the scales; full blocks become cached
//   can_append(id) / append_slot(id)             slot for the next token's KV (+ a block copy
//                                                to do first when the last block was shared)
//   fork(parent, child)                          child shares every block (n > 1 sampling)
//   free(id)                                     finished, aborted or preempted
//
// Slot of token t: table[t / block_size] * block_size + t % block_size.
//
// With the bf16 recent window (options.window, cache/kv_window.hpp) a running sequence also
// owns a tail ring when one is free (allocated with its table, copied by the engine at fork(),
// released by free()); the rings are a capped share of the KV budget (the engine sizes them), so
// there may be fewer than running sequences: a sequence admitted when none is free runs as pure
// FP8 (every computed position final in FP8, as without a window), for its whole life. The
// manager tracks which positions of a sequence are final in FP8: num_fp8_tokens. A step that ends at n tokens reads fp8_len_after(id, n) of
// them from the FP8 pool (kernels/paged_kv.hpp) and spills [num_fp8_tokens, that) out of the
// tail. Blocks in the window hold nothing final yet, so:
//   - only blocks below num_fp8_tokens are offered to the prefix cache, and a prefix hit stops
//     before the new prompt's own window (a hit never maps a block the window should hold);
//   - fork() shares them like any other block, and the copy-on-write happens when a spill is
//     about to write into one (append_slot: a fresh block, nothing to copy), never for the
//     partial last block, whose new token goes to the tail. A K-only window (window.values
//     false) writes every token's V straight into the pool, so there the last block is copied on
//     write as without a window, and so is a shared block about to be spilled into.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_hash.hpp"
#include "cache/block_pool.hpp"
#include "cache/kv_scales.hpp"
#include "cache/kv_window.hpp"

namespace fp8serve {

using SeqId = int64_t;

constexpr int kNoCap = 1 << 30;  // no cap on a prefix hit

struct BlockManagerOptions {
  int block_size = kDefaultBlockSize;
  int num_layers = 0;  // scales per sequence
  int num_blocks = 0;  // KvCacheSpec::num_blocks_for_budget
  bool enable_prefix_caching = false;
  KvWindow window;         // off by default; window.block_size must equal block_size
  int num_tail_rings = 0;  // with a window: rings in the tail pool (> 0)
};

struct AllocateResult {
  int num_cached_tokens = 0;  // prefix tokens mapped from the cache: already computed
};

// The engine copies block src to dst (every layer, K and V) before writing into dst.
struct BlockCopy {
  int32_t src = -1;
  int32_t dst = -1;
};

struct AppendResult {
  int64_t slot = -1;
  std::optional<BlockCopy> copy;  // copy-on-write of a last block shared after fork()
  // A K-only window: copy-on-write of a shared block that this step's spill fills (its V is
  // final already). A K+V window swaps such a block for a fresh one instead: nothing to copy.
  std::optional<BlockCopy> spill_copy;
};

struct PrefixCacheStats {
  uint64_t num_queried_tokens = 0;  // prompt tokens looked up by allocate()
  uint64_t num_hit_tokens = 0;      // of those, mapped from cached blocks
};

class BlockManager {
 public:
  explicit BlockManager(const BlockManagerOptions& options);

  // Whether allocate() can map this prompt now (counting prefix hits, evicting if needed).
  // max_cached_tokens caps the prefix hit (a recompute after preemption asks for a hit its
  // replay can use; see Scheduler). need_rings > 0 (with a window): also that many free tail
  // rings (a recompute of a sequence that ran with one must run with one again).
  bool can_allocate(std::span<const int32_t> prompt, int max_cached_tokens = kNoCap, int need_rings = 0) const;
  // PRECOND: can_allocate(prompt, max_cached_tokens, need_rings), id not live, prompt not empty
  // (std::logic_error otherwise). With a window the sequence gets a tail ring when `group` rings
  // are free (itself and the forks it will have: the rest are reserved for fork()); otherwise
  // it and its forks run as pure FP8, counted by num_seqs_without_ring().
  AllocateResult allocate(SeqId id, std::span<const int32_t> prompt, int max_cached_tokens = kNoCap, int group = 1);
  // Tokens of the prompt allocate() would map from the prefix cache now (before any cap).
  int num_cached_prefix_tokens(std::span<const int32_t> prompt) const;
  // Whether append_slot() can place one more token (a new or copied block if it needs one, and
  // with a window a private block for a shared one that the step's spill writes into).
  bool can_append(SeqId id) const;
  // A slot for the sequence's next token (position num_tokens(id)), returned. PRECOND: can_append(id).
  AppendResult append_slot(SeqId id);
  // The step wrote KV for tokens [0, num_computed_tokens). Freezes the scales; caches the
  // full blocks now computed (and out of the window), keyed by `tokens` (the sequence's, at
  // least num_computed_tokens of them). fp8_floor: the step's fp8_len_after floor.
  // PRECOND: old count <= num_computed_tokens <= num_tokens(id).
  void mark_computed(SeqId id, std::span<const int32_t> tokens, int num_computed_tokens, int fp8_floor = 0);
  // `child` shares all of `parent`'s blocks and scales; the next append of either copies the
  // shared last block. With a window the child gets its own tail ring, which the engine fills
  // with a copy of the parent's (tail_ring()). PRECOND: parent fully computed (scales frozen),
  // child not live.
  void fork(SeqId parent, SeqId child);
  // Releases the sequence's blocks, tail first so the LRU evicts suffixes before prefixes.
  void free(SeqId id);
  // Drops the tokens from num_tokens on (speculative decoding's rejected proposals) and the
  // blocks that then hold none of the rest. Their KV was written but never marked computed: no
  // key was published for them, the FP8 count and the scales did not move, so the sequence is
  // as if they had never been appended. PRECOND: num_computed_tokens(id) <= num_tokens.
  void truncate(SeqId id, int num_tokens);

  bool contains(SeqId id) const { return seqs_.count(id) != 0; }
  std::span<const int32_t> block_table(SeqId id) const;
  int num_tokens(SeqId id) const;  // slots held: its computed tokens, then those a step will compute
  int num_computed_tokens(SeqId id) const;
  int64_t slot(SeqId id, int position) const;
  const KvScales& scales(SeqId id) const;
  // Where kv_write stores the calibrated scales; nullptr once frozen (or inherited).
  KvScales* scales_to_calibrate(SeqId id);

  // The bf16 window. Without one: no rings, every computed token is FP8.
  const KvWindow& window() const { return window_; }
  int tail_ring(SeqId id) const;  // -1 without a window, or for a sequence that has no ring
  // Positions whose FP8 slots hold their final values (computed and out of the window).
  int num_fp8_tokens(SeqId id) const;
  // Positions a step ending at num_tokens tokens reads from the FP8 pool - the batch's fp8_lens:
  // max(num_fp8_tokens, window.fp8_len(num_tokens), min(fp8_floor, num_tokens)), a multiple of
  // the block size. The floor (0: none) lets a recompute replay a step of the original run
  // whose FP8 part was larger than the window's rule gives for the replayed chunk (a longer
  // chunk, an earlier prefix hit). num_tokens without a window.
  int fp8_len_after(SeqId id, int num_tokens, int fp8_floor = 0) const;
  int num_tail_rings() const { return window_.enabled() ? num_tail_rings_ : 0; }
  int num_free_tail_rings() const { return static_cast<int>(free_rings_.size()); }
  // Sequences (forks included) that ran as pure FP8 for want of a ring, since start-up.
  uint64_t num_seqs_without_ring() const { return num_seqs_without_ring_; }

  int block_size() const { return block_size_; }
  int num_layers() const { return num_layers_; }
  int num_blocks() const { return pool_.num_blocks(); }
  int num_free_blocks() const { return pool_.num_free_blocks(); }
  int num_seqs() const { return static_cast<int>(seqs_.size()); }
  const BlockPool& pool() const { return pool_; }
  // KV-cache events (cache/kv_events.hpp): BlockPool's, for the sequences' blocks.
  void enable_events() { pool_.enable_events(); }
  std::vector<KvCacheEvent> take_events() { return pool_.take_events(); }
  // Nothing stays hittable (BlockPool::reset_prefix_cache); running sequences keep their blocks.
  void reset_prefix_cache() { pool_.reset_prefix_cache(); }
  PrefixCacheStats prefix_cache_stats() const { return stats_; }

  // Throws std::logic_error naming the first broken invariant: every block free xor idle xor
  // referenced; ref counts equal table entries; tables cover exactly the tokens; no slot that
  // will still be written is shared or cached; cached keys match their contents; a
  // sequence's cached blocks carry its own scales; computed sequences have frozen scales; with
  // a window, every live sequence owns one ring of its own, its tail fits the ring and no block
  // in its window is cached. The keys are checked against the tokens when tokens_of gives them
  // (a sequence's id -> its owner's tokens).
  using TokensOf = std::function<std::span<const int32_t>(SeqId)>;
  void check_integrity(const TokensOf& tokens_of = nullptr) const;

 private:
  struct Sequence {
    int num_tokens = 0;  // slots in block_table
    std::vector<int32_t> block_table;
    std::vector<BlockHash> block_keys;  // chain keys of the first block_keys.size() full blocks
    int num_computed_tokens = 0;
    int num_fp8_tokens = 0;  // == num_computed_tokens without a window
    int tail_ring = -1;
    std::vector<int> reserved_rings;  // for the forks this sequence will have
    std::shared_ptr<KvScales> scales;
  };

  struct PrefixMatch {
    std::vector<int32_t> blocks;
    std::vector<BlockHash> keys;
  };

  const Sequence& seq(SeqId id) const;
  Sequence& seq(SeqId id);
  int num_blocks_for(std::size_t num_tokens) const;
  BlockHash block_key(std::span<const int32_t> tokens, std::size_t i, const BlockHash* parent) const;
  PrefixMatch match_prefix(std::span<const int32_t> prompt, int max_cached_tokens) const;
  void cache_full_blocks(Sequence& s, std::span<const int32_t> tokens);
  int fp8_len_after(const Sequence& s, int num_tokens, int fp8_floor) const;
  int take_ring();
  bool in_window(const Sequence& s) const { return window_.enabled() && s.tail_ring >= 0; }

  int block_size_;
  int num_layers_;
  KvWindow window_;
  int num_tail_rings_;
  std::vector<int> free_rings_;  // LIFO
  BlockPool pool_;
  std::unordered_map<SeqId, Sequence> seqs_;
  PrefixCacheStats stats_;
  uint64_t num_seqs_without_ring_ = 0;
};

}  // namespace fp8serve
