#include "server/engine/draft_model.hpp"

#include <algorithm>
#include <stdexcept>

namespace fp8serve {

namespace {

// The same vocabulary: equal sizes (tokenizer and logits) and every id the same string.
void check_vocabulary(const LoadedModel& draft, const LoadedModel& target) {
  const std::string prefix = "--speculative-model " + draft.name + ": its vocabulary differs from " + target.name + "'s";
  const Tokenizer& d = *draft.tokenizer;
  const Tokenizer& t = *target.tokenizer;
  if (d.vocab_size() != t.vocab_size() || draft.config.vocab_size != target.config.vocab_size) {
    throw std::invalid_argument(prefix + " (" + std::to_string(d.vocab_size()) + " tokens, logits " +
                                std::to_string(draft.config.vocab_size) + ", against " + std::to_string(t.vocab_size()) +
                                ", " + std::to_string(target.config.vocab_size) + "): a draft must share the tokenizer");
  }
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    if (d.id_to_piece(id) != t.id_to_piece(id))
      throw std::invalid_argument(prefix + " (token id " + std::to_string(id) + " is another string): a draft must share the tokenizer");
  }
}

}  // namespace

DraftModel::DraftModel(LoadedModel draft, const LoadedModel& target, Backend& backend, const DraftOptions& options)
    : name_(draft.name), options_(options), config_(draft.config), vocab_(target.config.vocab_size) {
  check_vocabulary(draft, target);
  spec_.block_size = options_.block_size;
  spec_.num_layers = config_.num_layers;
  spec_.num_kv_heads = config_.num_kv_heads;
  spec_.head_dim = config_.head_dim;
  spec_.dtype = options_.kv_dtype;
  spec_.validate();
  TransformerOptions topts;
  topts.kv_dtype = options_.kv_dtype;
  topts.block_size = options_.block_size;
  topts.num_blocks = 0;
  topts.max_num_tokens = options_.max_num_tokens;
  topts.max_num_seqs = std::max(1, options_.max_num_seqs);
  topts.max_sample_rows = topts.max_num_seqs;
  topts.max_model_len = options_.max_model_len;
  topts.kv_scale_margin = options_.kv_scale_margin;
  topts.kv_rotation = options_.kv_rotation;
  topts.graphs = TransformerOptions::Graphs::off;
  transformer_ = std::make_unique<Transformer>(config_, draft.weights, backend, topts);
}

uint64_t DraftModel::kv_share(uint64_t budget, uint64_t target_bytes_per_token) const {
  const double draft = static_cast<double>(spec_.bytes_per_token());
  return static_cast<uint64_t>(static_cast<double>(budget) * draft / (draft + static_cast<double>(target_bytes_per_token)));
}

void DraftModel::allocate_kv_cache(uint64_t bytes) {
  const int num_blocks = spec_.num_blocks_for_budget(bytes);
  if (num_blocks < 1)
    throw std::invalid_argument("the draft model's share of the KV budget (" + std::to_string(bytes) + " bytes) holds no block: raise --kv-cache-memory");
  transformer_->allocate_kv_cache(num_blocks, 0);
  BlockManagerOptions bopts;
  bopts.block_size = options_.block_size;
  bopts.num_layers = config_.num_layers;
  bopts.num_blocks = num_blocks;
  bopts.enable_prefix_caching = false;
  blocks_ = std::make_unique<BlockManager>(bopts);
  inputs_ = std::make_unique<StepInputs>(*blocks_, config_.num_layers);
}

void DraftModel::release(SeqId id) {
  if (blocks_->contains(id)) blocks_->free(id);
  fed_.erase(id);
  held_.erase(std::remove(held_.begin(), held_.end(), id), held_.end());
}

bool DraftModel::make_room(int blocks, std::span<const SeqId> keep) {
  // Oldest first: a sequence that stopped speculating (a larger batch, a paused gate) goes first.
  std::vector<SeqId> others;
  for (const SeqId id : held_)
    if (std::find(keep.begin(), keep.end(), id) == keep.end()) others.push_back(id);
  for (std::size_t i = 0; i < others.size() && blocks_->num_free_blocks() < blocks; ++i) release(others[i]);
  return blocks_->num_free_blocks() >= blocks;
}

bool DraftModel::catch_up(SeqId id, std::span<const int32_t> tokens, std::span<const SeqId> keep) {
  const int bs = options_.block_size;
  if (blocks_->contains(id)) {
    // Keep what the target kept: the computed tokens and the draft's own proposals it accepted
    // (their KV is written); the rest is rolled back as the target rolls back its own.
    const std::vector<int32_t>& held = fed_.at(id);
    const auto mismatch = std::mismatch(held.begin(), held.end(), tokens.begin(), tokens.end());
    const int common = static_cast<int>(mismatch.first - held.begin());
    // The last token is run again even when held: its row gives the first proposal.
    const int kept = std::min(common, static_cast<int>(tokens.size()) - 1);
    if (kept < blocks_->num_computed_tokens(id)) {
      release(id);  // not a continuation of what the draft computed: start again
    } else {
      blocks_->mark_computed(id, tokens, kept);
      blocks_->truncate(id, kept);
      fed_.at(id).resize(static_cast<std::size_t>(kept));
    }
  }
  if (!blocks_->contains(id)) {
    const int need = (static_cast<int>(tokens.size()) + bs - 1) / bs;
    if (!make_room(need, keep) || !blocks_->can_allocate(tokens)) return false;
    blocks_->allocate(id, tokens);
    held_.push_back(id);
    fed_[id].assign(tokens.begin(), tokens.end());
    return true;
  }
  std::vector<int32_t>& fed = fed_.at(id);
  for (std::size_t p = fed.size(); p < tokens.size(); ++p) {
    if (!blocks_->can_append(id) && !make_room(1, keep)) {
      release(id);
      return false;
    }
    blocks_->append_slot(id);
    fed.push_back(tokens[p]);
  }
  return true;
}

void DraftModel::propose(std::span<DraftJob> jobs) {
  std::vector<SeqId> keep;
  for (const DraftJob& job : jobs) {
    job.out->clear();
    keep.push_back(job.id);
  }
  std::vector<SeqId> live;
  std::vector<DraftJob*> live_jobs;
  for (DraftJob& job : jobs) {
    if (job.max_tokens <= 0 || job.tokens.empty()) continue;
    if (!catch_up(job.id, job.tokens, keep)) continue;
    live.push_back(job.id);
    live_jobs.push_back(&job);
  }
  std::vector<int32_t> next;
  // Catch-up: one sequence at a time (a prompt may take several chunks); its last row is d1.
  for (std::size_t i = 0; i < live.size(); ++i) {
    forward(std::span<const SeqId>(&live[i], 1), true, next, live_jobs[i]->num_prompt_tokens);
    live_jobs[i]->out->push_back(next[0]);
  }
  // Greedy decode, batched: feed d_k, read d_{k+1}. The fed tokens are never marked computed;
  // the next propose() keeps those the target accepted.
  for (int k = 1;; ++k) {
    std::vector<SeqId> step;
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < live.size(); ++i) {
      if (k >= live_jobs[i]->max_tokens || !blocks_->contains(live[i])) continue;
      if (!blocks_->can_append(live[i])) continue;  // the pool is full: fewer proposals
      blocks_->append_slot(live[i]);
      fed_.at(live[i]).push_back(live_jobs[i]->out->back());
      step.push_back(live[i]);
      which.push_back(i);
    }
    if (step.empty()) break;
    forward(step, false, next);
    for (std::size_t j = 0; j < which.size(); ++j) live_jobs[which[j]]->out->push_back(next[j]);
  }
}

void DraftModel::forward(std::span<const SeqId> ids, bool catching_up, std::vector<int32_t>& next, int calibrate_end) {
  const auto vocab = static_cast<std::size_t>(config_.vocab_size);
  const auto num_seqs = static_cast<int32_t>(ids.size());
  // Where each sequence's unprocessed tokens start: a catch-up at the computed count, a decode
  // step at its one appended token (past the uncomputed proposals).
  std::vector<int> begin;
  for (const SeqId id : ids) begin.push_back(catching_up ? blocks_->num_computed_tokens(id) : blocks_->num_tokens(id) - 1);
  std::vector<int> ends(ids.size());
  std::vector<uint8_t> calibrating(ids.size(), 0);
  next.assign(ids.size(), 0);
  for (bool more = true; more;) {
    more = false;
    int32_t max_blocks = 1;
    for (const SeqId id : ids) max_blocks = std::max(max_blocks, static_cast<int32_t>(blocks_->block_table(id).size()));
    inputs_->begin(num_seqs, max_blocks);
    for (int32_t i = 0; i < num_seqs; ++i) {
      const auto si = static_cast<std::size_t>(i);
      const SeqId id = ids[si];
      const int total = blocks_->num_tokens(id);
      const int start = begin[si];
      ends[si] = std::min(total, start + std::max(1, options_.max_num_tokens / num_seqs));
      calibrating[si] = blocks_->scales_to_calibrate(id) != nullptr;
      if (calibrating[si] && calibrate_end > start) ends[si] = std::min(ends[si], calibrate_end);
      if (ends[si] < total) more = true;
      const std::span<const int32_t> fed = fed_.at(id);
      const auto chunk = fed.subspan(static_cast<std::size_t>(start), static_cast<std::size_t>(ends[si] - start));
      inputs_->add(id, start, chunk, calibrating[si]);
      inputs_->add_sample_row(inputs_->num_tokens() - 1);
    }
    logits_.resize(ids.size() * vocab);
    transformer_->forward(inputs_->batch(), logits_);
    for (int32_t i = 0; i < num_seqs; ++i) {
      const auto si = static_cast<std::size_t>(i);
      const SeqId id = ids[si];
      if (calibrating[si]) inputs_->write_back_scales(id, i);
      // Catch-up tokens are the target's own: computed (the scales freeze after the first chunk).
      if (catching_up) blocks_->mark_computed(id, fed_.at(id), ends[si]);
      begin[si] = ends[si];
      next[si] = argmax(std::span<const float>(logits_.data() + si * vocab, vocab));
    }
  }
}

int32_t DraftModel::argmax(std::span<const float> row) const {
  const auto end = row.begin() + std::min<std::ptrdiff_t>(vocab_, static_cast<std::ptrdiff_t>(row.size()));
  return static_cast<int32_t>(std::max_element(row.begin(), end) - row.begin());
}

}  // namespace fp8serve
