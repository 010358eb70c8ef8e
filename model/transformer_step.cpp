// A step's metadata on its way to the device and back: the checks of a ForwardBatch, its layout
// in one buffer (StepLayout), the one upload, and the download of the logits, the calibrated
// scales and the counts after the step.
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/transformer.hpp"

namespace fp8serve {

void Transformer::validate(const ForwardBatch& b, std::span<float> logits) const {
  const auto num_tokens = static_cast<int64_t>(b.token_ids.size());
  const auto num_seqs = static_cast<int64_t>(b.context_lens.size());
  const auto num_layers = static_cast<std::size_t>(config_.num_layers);
  const int64_t max_blocks = max_table_blocks();
  auto fail = [](const std::string& what) { throw std::invalid_argument("Transformer::forward: " + what); };
  if (num_tokens < 1 || num_tokens > options_.max_num_tokens) fail("num_tokens outside [1, max_num_tokens]");
  if (num_seqs < 1 || num_seqs > options_.max_num_seqs) fail("num_seqs outside [1, max_num_seqs]");
  if (b.positions.size() != b.token_ids.size() || b.slot_mapping.size() != b.token_ids.size())
    fail("positions and slot_mapping need one entry per token");
  if (b.query_start_loc.size() != static_cast<std::size_t>(num_seqs + 1) ||
      b.query_start_loc.front() != 0 || b.query_start_loc.back() != num_tokens)
    fail("query_start_loc must be [num_seqs + 1] from 0 to num_tokens");
  if (b.max_blocks_per_seq < 1 || b.max_blocks_per_seq > max_blocks ||
      b.block_tables.size() != static_cast<std::size_t>(num_seqs * b.max_blocks_per_seq))
    fail("block_tables must be [num_seqs, max_blocks_per_seq] with max_blocks_per_seq <= max_model_len / block_size");
  if (b.k_scales.size() != num_layers * static_cast<std::size_t>(num_seqs) ||
      b.v_scales.size() != b.k_scales.size())
    fail("k_scales and v_scales must be [num_layers, num_seqs]");
  if (b.calibrate.size() != static_cast<std::size_t>(num_seqs)) fail("calibrate must be [num_seqs]");
  if (b.sample_rows.size() > static_cast<std::size_t>(options_.max_sample_rows))
    fail("more sample rows than max_sample_rows");
  for (const int32_t row : b.sample_rows)
    if (row < 0 || row >= num_tokens) fail("a sample row outside [0, num_tokens)");
  if (b.score_rows.size() > static_cast<std::size_t>(num_tokens)) fail("more score rows than tokens");
  for (const int32_t row : b.score_rows)
    if (row < 0 || row >= num_tokens) fail("a score row outside [0, num_tokens)");
  if (!logits.empty() && logits.size() != b.sample_rows.size() * static_cast<std::size_t>(config_.vocab_size))
    fail("logits must be [sample_rows, vocab_size] or empty (left on the device)");
  for (const int64_t s : b.slot_mapping)
    if (s >= static_cast<int64_t>(options_.num_blocks) * options_.block_size) fail("slot outside the pool");
  for (const int32_t p : b.positions)
    if (p < 0 || p >= options_.max_model_len) fail("position outside [0, max_model_len)");
  // The embedding op checks ids too, but a device backend can only report after the fact.
  for (const int32_t id : b.token_ids) {
    if (id < 0 || id >= config_.vocab_size) {
      throw std::out_of_range("embedding: token id " + std::to_string(id) + " outside the vocabulary [0, " +
                              std::to_string(config_.vocab_size) + ")");
    }
  }
  const std::size_t window_fields = options_.window.enabled() ? static_cast<std::size_t>(num_seqs) : 0;
  if (b.fp8_lens.size() != window_fields || b.spill_starts.size() != window_fields ||
      b.tail_slots.size() != window_fields)
    fail("fp8_lens, spill_starts and tail_slots must be [num_seqs] with the bf16 window, empty without");
}

Transformer::StepLayout Transformer::step_layout(std::size_t num_tokens, std::size_t num_seqs,
                                                 std::size_t max_blocks_per_seq, std::size_t num_score_rows) const {
  StepLayout l;
  std::size_t at = 0;
  auto take = [&at](std::size_t bytes) {
    const std::size_t offset = at;
    at = (at + bytes + 15) / 16 * 16;
    return offset;
  };
  const auto layers = static_cast<std::size_t>(config_.num_layers);
  l.token_ids = take(num_tokens * sizeof(int32_t));
  l.positions = take(num_tokens * sizeof(int32_t));
  l.slot_mapping = take(num_tokens * sizeof(int64_t));
  l.query_start_loc = take((num_seqs + 1) * sizeof(int32_t));
  l.context_lens = take(num_seqs * sizeof(int32_t));
  l.block_tables = take(num_seqs * max_blocks_per_seq * sizeof(int32_t));
  l.calibrate = take(num_seqs * sizeof(uint8_t));
  l.sample_rows = take(std::max(num_seqs, num_tokens) * sizeof(int32_t));  // speculation: up to a row per token
  l.score_rows = take(num_score_rows * sizeof(int32_t));
  const std::size_t window_seqs = options_.window.enabled() ? num_seqs : 0;
  l.fp8_lens = take(window_seqs * sizeof(int32_t));
  l.spill_starts = take(window_seqs * sizeof(int32_t));
  l.tail_slots = take(window_seqs * sizeof(int32_t));
  l.k_scales = take(layers * num_seqs * sizeof(float));
  l.v_scales = take(layers * num_seqs * sizeof(float));
  l.counts = take(layers * sizeof(KvWriteCounts));
  l.end = at;
  return l;
}

void Transformer::upload_batch(const ForwardBatch& b, const StepLayout& layout, bool track_counts) {
  auto put = [&](std::size_t offset, auto span) {
    if (span.size_bytes()) std::memcpy(step_host_.data() + offset, span.data(), span.size_bytes());
  };
  put(layout.token_ids, b.token_ids);
  put(layout.positions, b.positions);
  put(layout.slot_mapping, b.slot_mapping);
  put(layout.query_start_loc, b.query_start_loc);
  put(layout.context_lens, b.context_lens);
  put(layout.block_tables, b.block_tables);
  put(layout.calibrate, b.calibrate);
  put(layout.sample_rows, b.sample_rows);
  put(layout.score_rows, b.score_rows);
  put(layout.fp8_lens, b.fp8_lens);
  put(layout.spill_starts, b.spill_starts);
  put(layout.tail_slots, b.tail_slots);
  put(layout.k_scales, std::span<const float>(b.k_scales));
  put(layout.v_scales, std::span<const float>(b.v_scales));
  const std::size_t end = track_counts ? layout.end : layout.counts;
  if (track_counts) std::memset(step_host_.data() + layout.counts, 0, end - layout.counts);
  backend_.copy_to_device(step_meta_.data(), step_host_.data(), end, stream_);
}

ForwardBatch HostBatch::view() {
  ForwardBatch b;
  b.token_ids = token_ids;
  b.positions = positions;
  b.query_start_loc = query_start_loc;
  b.context_lens = context_lens;
  b.block_tables = block_tables;
  b.max_blocks_per_seq = max_blocks_per_seq;
  b.slot_mapping = slot_mapping;
  b.k_scales = k_scales;
  b.v_scales = v_scales;
  b.calibrate = calibrate;
  b.sample_rows = sample_rows;
  b.score_rows = score_rows;
  b.fp8_lens = fp8_lens;
  b.spill_starts = spill_starts;
  b.tail_slots = tail_slots;
  return b;
}

void Transformer::finish(const ForwardBatch& b, const StepLayout& layout, const StepShape& shape,
                         std::span<float> logits, std::span<KvWriteCounts> counts) {
  if (!logits.empty()) backend_.copy_to_host(logits.data(), logits_.data(), logits.size_bytes(), stream_);
  // Scales (when some were calibrated) and counts come back in one copy; they land in
  // step_host_ once the stream is synchronized.
  auto* meta = static_cast<char*>(step_meta_.data());
  const std::size_t back_begin = shape.calibrates ? layout.k_scales : layout.counts;
  const std::size_t back_end = shape.track_counts ? layout.end : layout.counts;
  if (back_end > back_begin) {
    backend_.copy_to_host(step_host_.data() + back_begin, meta + back_begin, back_end - back_begin, stream_);
  }
  backend_.synchronize(stream_);
  if (shape.calibrates) {
    std::memcpy(b.k_scales.data(), step_host_.data() + layout.k_scales, b.k_scales.size_bytes());
    std::memcpy(b.v_scales.data(), step_host_.data() + layout.v_scales, b.v_scales.size_bytes());
  }
  if (!counts.empty()) {
    std::vector<KvWriteCounts> step(counts.size());
    std::memcpy(step.data(), step_host_.data() + layout.counts, counts.size_bytes());
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] += step[i];
  }
}

}  // namespace fp8serve
