#include "server/engine/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <unordered_set>

namespace fp8serve {

namespace {

// Candidates are ordered by logit, best first; equal logits by lower id, so every order below
// is a total order and results never depend on std::sort's tie handling.
struct BetterLogit {
  std::span<const float> logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

// How many of the best candidates are sorted before top-p first looks at the mass: enough for
// almost every real distribution; flatter ones take more rounds.
constexpr size_t kTopPFirstSort = 1024;

}  // namespace

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt_tokens, uint64_t fallback_seed)
    : params_(params), rng_(params.seed.value_or(fallback_seed)) {
  if (params_.repetition_penalty != 1.0f) {
    std::unordered_set<int32_t> seen(prompt_tokens.begin(), prompt_tokens.end());
    prompt_tokens_.assign(seen.begin(), seen.end());
  }
}

double Sampler::uniform01() {
  // 53 random bits -> [0, 1): exact and identical on every platform (unlike
  // std::uniform_real_distribution, whose algorithm the standard leaves open).
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

void Sampler::apply_processors(std::span<float> logits) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  mask_.assign(static_cast<size_t>((vocab + 31) / 32), 0u);
  if (allow_mask(mask_)) {
    // Everything else goes to -inf: no temperature, top-k, top-p or min-p can bring it back.
    for (int64_t t = 0; t < vocab; ++t)
      if (!(mask_[static_cast<size_t>(t / 32)] >> (t % 32) & 1u)) logits[static_cast<size_t>(t)] = -std::numeric_limits<float>::infinity();
  }
  edits_.clear();
  logit_edits(edits_);
  for (const LogitEdit& e : edits_) logits[static_cast<size_t>(e.token)] = apply_logit_edit(logits[static_cast<size_t>(e.token)], e);
}

bool Sampler::allow_mask(std::span<uint32_t> words) const {
  if (params_.allowed_token_ids.empty()) return false;
  std::fill(words.begin(), words.end(), 0u);
  for (const int32_t t : params_.allowed_token_ids) words[static_cast<size_t>(t / 32)] |= 1u << (t % 32);
  return true;
}

void Sampler::logit_edits(std::vector<LogitEdit>& edits) const {
  // Per token, in the host's order: bias, min_tokens' ban, repetition, frequency + presence.
  // Tokens are independent of each other, so one combined edit per token is the same row.
  std::unordered_map<int32_t, size_t> at;  // token -> its edit in `edits`
  auto edit = [&](int32_t t) -> LogitEdit& {
    const auto [it, fresh] = at.try_emplace(t, edits.size());
    if (fresh) edits.push_back(LogitEdit{.token = t});
    return edits[it->second];
  };
  for (const auto& [token, bias] : params_.logit_bias) {
    LogitEdit& e = edit(token);
    e.ops |= LogitEdit::kBias;
    e.bias = bias;
  }
  if (num_generated_ < params_.min_tokens)
    for (const int32_t token : params_.min_tokens_banned) edit(token).ops |= LogitEdit::kBan;
  const float r = params_.repetition_penalty;
  if (r != 1.0f) {
    auto penalize = [&](int32_t t) {
      LogitEdit& e = edit(t);
      e.ops |= LogitEdit::kRepetition;
      e.repetition = r;
    };
    for (const int32_t t : prompt_tokens_) penalize(t);
    for (const auto& [t, count] : output_counts_) penalize(t);
  }
  if (params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f) {
    for (const auto& [t, count] : output_counts_) {
      LogitEdit& e = edit(t);
      e.ops |= LogitEdit::kSubtract;
      e.subtract = params_.frequency_penalty * static_cast<float>(count) + params_.presence_penalty;
    }
  }
}

std::optional<size_t> Sampler::draw(std::span<const float> logits, int64_t vocab, const ExpSum* row_scaled_sum) {
  // Positions index `logits`: token ids for a whole row; for candidates (ascending ids) the
  // position order is the id order, so BetterLogit and argmax order them as the whole row would.
  const size_t n = logits.size();
  if (params_.temperature <= 1e-5f) return static_cast<size_t>(argmax(logits));

  order_.resize(n);
  for (size_t i = 0; i < n; ++i) order_[i] = static_cast<int32_t>(i);
  const BetterLogit better{logits};
  auto at = [this](size_t i) { return order_.begin() + static_cast<std::ptrdiff_t>(i); };
  // The best of order_[0, count) first: the one token kept when a filter keeps none, defined
  // whatever order nth_element left them in (so candidates and the whole row agree).
  auto keep_best = [&](size_t in_play) { std::iter_swap(order_.begin(), std::min_element(order_.begin(), at(in_play), better)); };

  // top-k: the k best, in order.
  size_t count = n;
  bool sorted = false;
  const bool top_k_cuts = params_.top_k > 0 && params_.top_k < vocab;
  // Candidates of a longer row that no filter has yet narrowed to themselves: the rest of the
  // row is still in play, and a draw that needs it is given up (nullopt) before any RNG use.
  bool open = static_cast<int64_t>(n) < vocab && !top_k_cuts;
  if (top_k_cuts) {
    if (static_cast<size_t>(params_.top_k) > n) return std::nullopt;
    count = static_cast<size_t>(params_.top_k);
    if (count < n) std::nth_element(order_.begin(), at(count), order_.end(), better);
  }

  // Temperature-scaled weights relative to the maximum, p_i ∝ exp((l_i - l_max) / T), computed
  // once for each remaining candidate: every stage below reads them.
  const float inv_t = 1.0f / params_.temperature;
  const float max_logit = logits[argmax(logits)];
  weights_.resize(n);
  for (size_t i = 0; i < count; ++i) {
    const int32_t t = order_[i];
    weights_[static_cast<size_t>(t)] = scaled_term(logits[t], max_logit, inv_t);
  }
  auto weight = [&](int32_t t) { return weights_[static_cast<size_t>(t)]; };

  // top-p: the smallest best-first prefix whose mass reaches top_p of the (top-k) total. The
  // total is an ExpSum (exact in any order: the device's over a whole row is the same bits).
  // The best candidates are sorted a chunk at a time (1024, then 4x more each round, each chunk
  // selected with nth_element), so a flat distribution costs a few linear passes, not a sort
  // of the vocabulary; the prefix is the one a full sort would give (BetterLogit is total).
  if (params_.top_p < 1.0f) {
    ExpSum sum;
    if (open) {
      sum = *row_scaled_sum;
    } else {
      for (size_t i = 0; i < count; ++i) sum.add(weight(order_[i]));
    }
    const double target = static_cast<double>(params_.top_p) * sum.value();
    double mass = 0;
    size_t keep = 0, sorted_count = 0;
    for (size_t chunk = kTopPFirstSort; mass < target && sorted_count < count; chunk *= 4) {
      const size_t end = std::min(count, sorted_count + chunk);
      if (end < count) std::nth_element(at(sorted_count), at(end), at(count), better);
      std::sort(at(sorted_count), at(end), better);
      sorted_count = end;
      while (keep < sorted_count && mass < target) mass += weight(order_[keep++]);
    }
    if (open && mass < target) return std::nullopt;  // the nucleus reaches past the candidates
    if (keep == 0) keep_best(count);  // a NaN total (an inf or NaN logit): nothing was kept
    count = std::max<size_t>(keep, 1);
    sorted = true;
    open = false;
  }

  // min-p: drop candidates below min_p times the most likely one's probability (kept in order).
  if (params_.min_p > 0.0f) {
    const double floor = static_cast<double>(params_.min_p);  // weight of the best is exactly 1
    size_t kept = 0;
    for (size_t i = 0; i < count; ++i)
      if (weight(order_[i]) >= floor) order_[kept++] = order_[i];
    // A candidate dropped proves that the rest of the row (no better than it) drops too.
    if (open && kept == count) return std::nullopt;
    if (kept < count) open = false;
    if (kept == 0) keep_best(count);  // NaN weights (an inf or NaN logit): nothing was kept
    count = std::max<size_t>(kept, 1);
  }
  if (open) return std::nullopt;  // a draw over the whole row, in id order
  // Any fixed order serves the draw below; only nth_element's order is unspecified, so top-k
  // candidates are put in a defined one.
  if (!sorted && static_cast<int64_t>(count) < vocab) std::sort(order_.begin(), at(count), better);

  double total = 0;
  for (size_t i = 0; i < count; ++i) total += weight(order_[i]);
  const double u = uniform01() * total;
  double acc = 0;
  for (size_t i = 0; i < count; ++i) {
    acc += weight(order_[i]);
    if (u < acc) return static_cast<size_t>(order_[i]);
  }
  // Rounding left u at the very top: the last candidate with any weight (a masked -inf logit
  // has none, and must never be drawn).
  for (size_t i = count; i-- > 0;)
    if (weight(order_[i]) > 0) return static_cast<size_t>(order_[i]);
  return static_cast<size_t>(order_[0]);
}

SampleResult Sampler::sample(std::span<float> logits) {
  SampleResult result;
  std::vector<float> raw;
  if (params_.num_logprobs >= 0) raw.assign(logits.begin(), logits.end());
  apply_processors(logits);
  result.token = static_cast<int32_t>(*draw(logits, static_cast<int64_t>(logits.size()), nullptr));
  if (params_.num_logprobs >= 0) result.logprob = raw_logprobs(raw, result.token, params_.num_logprobs, result.top_logprobs);
  record(result.token);
  return result;
}

SampleResult Sampler::sample_processed(std::span<float> logits) {
  SampleResult result;
  result.token = static_cast<int32_t>(*draw(logits, static_cast<int64_t>(logits.size()), nullptr));
  if (params_.num_logprobs >= 0) result.logprob = raw_logprobs(logits, result.token, params_.num_logprobs, result.top_logprobs);
  record(result.token);
  return result;
}

void Sampler::record(int32_t token) {
  ++output_counts_[token];
  ++num_generated_;
}

bool Sampler::processors_act() const {
  const SamplingParams& p = params_;
  const bool banning = num_generated_ < p.min_tokens && !p.min_tokens_banned.empty();
  return !p.allowed_token_ids.empty() || !p.logit_bias.empty() || banning || p.repetition_penalty != 1.0f ||
         p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

bool Sampler::greedy_on_raw_logits() const {
  return params_.temperature <= 1e-5f && !processors_act() && params_.num_logprobs <= 0;
}

bool Sampler::candidates_suffice(int32_t num_candidates) const {
  return !processors_act() && params_.num_logprobs <= num_candidates;
}

bool Sampler::processed_on_device() const { return processors_act() && params_.num_logprobs < 0; }

bool Sampler::greedy_on_device() const {
  return params_.temperature <= 1e-5f && (greedy_on_raw_logits() || processed_on_device());
}

bool Sampler::candidates_on_device(int32_t num_candidates) const {
  return candidates_suffice(num_candidates) || processed_on_device();
}

std::optional<SampleResult> Sampler::sample_candidates(const CandidateRow& row, std::span<const int32_t> ids,
                                                       std::span<const float> logits, int64_t vocab) {
  for (size_t i = 1; i < ids.size(); ++i)
    if (ids[i] <= ids[i - 1]) throw std::logic_error("Sampler::sample_candidates: ids must ascend");
  const std::optional<size_t> drawn = draw(logits, vocab, &row.scaled_sum);
  if (!drawn) return std::nullopt;
  SampleResult result;
  result.token = ids[*drawn];
  // The raw logprobs (no processor acted: the candidates' logits are the raw row's).
  if (params_.num_logprobs >= 0) {
    result.logprob = log_softmax_of(logits[*drawn], row.max_logit, row.raw_sum);
    order_.resize(logits.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int32_t>(i);
    const size_t k = std::min(order_.size(), static_cast<size_t>(params_.num_logprobs));
    std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(k), order_.end(), BetterLogit{logits});
    for (size_t i = 0; i < k; ++i)
      result.top_logprobs.push_back({ids[static_cast<size_t>(order_[i])],
                                     log_softmax_of(logits[static_cast<size_t>(order_[i])], row.max_logit, row.raw_sum)});
  }
  record(result.token);
  return result;
}

SampleResult Sampler::accept_greedy(const GreedyRow& pick) {
  SampleResult result;
  result.token = pick.token;
  // The pick's logit is the row's maximum (argmax and max_element choose the same element).
  if (params_.num_logprobs >= 0) result.logprob = log_softmax_of(pick.max_logit, pick.max_logit, pick.sum);
  record(result.token);
  return result;
}

void Sampler::forget(int32_t token) {
  const auto it = output_counts_.find(token);
  if (it == output_counts_.end()) return;
  --num_generated_;
  if (--it->second == 0) output_counts_.erase(it);
}

void LogitProcessingBatch::clear(int64_t vocab_size) {
  mask_words = (vocab_size + 31) / 32;
  mask_index.clear();
  masks.clear();
  edit_begin.assign(1, 0);
  edits.clear();
}

void LogitProcessingBatch::add_row(const Sampler* sampler, std::span<const uint64_t> grammar) {
  mask_index.push_back(-1);
  if (sampler != nullptr) {
    const size_t at = masks.size();
    masks.resize(at + static_cast<size_t>(mask_words), ~0u);
    const std::span<uint32_t> row = std::span<uint32_t>(masks).subspan(at);
    const bool allowed = sampler->allow_mask(row);
    if (!grammar.empty()) {
      for (size_t w = 0; w < row.size(); ++w) {
        const uint64_t word = w / 2 < grammar.size() ? grammar[w / 2] : 0;
        row[w] &= static_cast<uint32_t>(word >> (32 * (w % 2)));
      }
    }
    if (allowed || !grammar.empty())
      mask_index.back() = static_cast<int32_t>(at / static_cast<size_t>(mask_words));
    else
      masks.resize(at);
    sampler->logit_edits(edits);
  }
  edit_begin.push_back(static_cast<int32_t>(edits.size()));
}

float raw_logprobs(std::span<const float> logits, int32_t token, int n, std::vector<TokenLogprob>& top) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  // The fixed-point sum a device computes too, in any order (kernels/sampling_ops.hpp).
  ExpSum sum;
  for (float l : logits) sum.add(softmax_term(l, max_logit));
  auto logprob = [&](int32_t t) { return log_softmax_of(logits[t], max_logit, sum); };

  top.clear();
  if (n > 0) {
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    const size_t k = std::min(ids.size(), static_cast<size_t>(n));
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), BetterLogit{logits});
    for (size_t i = 0; i < k; ++i) top.push_back({ids[i], logprob(ids[i])});
  }
  return logprob(token);
}

}  // namespace fp8serve
