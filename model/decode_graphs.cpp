#include "model/decode_graphs.hpp"

#include <algorithm>
#include <utility>

namespace fp8serve {

std::vector<int32_t> graph_batch_sizes(int32_t max_num_seqs) {
  const int32_t top = std::min(max_num_seqs, 256);
  std::vector<int32_t> sizes;
  for (int32_t n = 1; n <= std::min(top, 8); n *= 2) sizes.push_back(n);
  for (int32_t n = 16; n <= top; n += 8) sizes.push_back(n);
  if (!sizes.empty() && sizes.back() < top) sizes.push_back(top);
  return sizes;
}

std::optional<GraphKey> graph_key(const ForwardBatch& b, const std::vector<int32_t>& buckets, int32_t max_blocks,
                                  int32_t max_spill_tokens, int32_t block_size) {
  const auto n = static_cast<int32_t>(b.context_lens.size());
  if (static_cast<int32_t>(b.token_ids.size()) != n || b.sample_rows.size() != static_cast<std::size_t>(n)) {
    return std::nullopt;
  }
  for (int32_t s = 0; s < n; ++s) {
    if (b.sample_rows[static_cast<std::size_t>(s)] != s || b.calibrate[static_cast<std::size_t>(s)] != 0) return std::nullopt;
  }
  if (max_spill_tokens > block_size) return std::nullopt;
  const auto bucket = std::lower_bound(buckets.begin(), buckets.end(), n);
  if (bucket == buckets.end()) return std::nullopt;
  int32_t width = 1;
  while (width < b.max_blocks_per_seq) width *= 2;
  return GraphKey{*bucket, std::min(width, max_blocks)};
}

HostBatch pad_decode(const ForwardBatch& b, GraphKey key, int32_t num_layers) {
  const auto n = static_cast<std::size_t>(b.context_lens.size());
  const auto m = static_cast<std::size_t>(key.num_seqs);
  const auto w = static_cast<std::size_t>(key.width);
  HostBatch p;
  p.max_blocks_per_seq = key.width;
  auto padded = [m](auto span, auto fill) {
    std::vector<std::remove_const_t<typename decltype(span)::element_type>> v(span.begin(), span.end());
    v.resize(m, fill);
    return v;
  };
  p.token_ids = padded(b.token_ids, 0);
  p.positions = padded(b.positions, 0);            // padding: position 0 ...
  p.slot_mapping = padded(b.slot_mapping, int64_t{-1});  // ... written nowhere ...
  p.context_lens = padded(b.context_lens, 1);      // ... attending over position 0 of block 0
  p.calibrate = padded(b.calibrate, uint8_t{0});
  p.query_start_loc.resize(m + 1);
  for (std::size_t s = 0; s <= m; ++s) p.query_start_loc[s] = static_cast<int32_t>(s);
  p.sample_rows = p.query_start_loc;
  p.sample_rows.pop_back();
  p.block_tables.assign(m * w, 0);
  const auto old_width = static_cast<std::size_t>(b.max_blocks_per_seq);
  for (std::size_t s = 0; s < n; ++s) {
    std::copy_n(b.block_tables.begin() + static_cast<std::ptrdiff_t>(s * old_width), old_width,
                p.block_tables.begin() + static_cast<std::ptrdiff_t>(s * w));
  }
  p.k_scales.assign(static_cast<std::size_t>(num_layers) * m, 1.0f);
  p.v_scales.assign(p.k_scales.size(), 1.0f);
  for (std::size_t l = 0; l < static_cast<std::size_t>(num_layers); ++l) {
    std::copy_n(b.k_scales.begin() + static_cast<std::ptrdiff_t>(l * n), n, p.k_scales.begin() + static_cast<std::ptrdiff_t>(l * m));
    std::copy_n(b.v_scales.begin() + static_cast<std::ptrdiff_t>(l * n), n, p.v_scales.begin() + static_cast<std::ptrdiff_t>(l * m));
  }
  if (!b.fp8_lens.empty()) {  // the window: padding reads its one position from the FP8 pool
    p.fp8_lens = padded(b.fp8_lens, 1);
    p.spill_starts = padded(b.spill_starts, 1);  // nothing to spill: start past the context
    p.tail_slots = padded(b.tail_slots, 0);
  }
  return p;
}

int Transformer::capture_decode_graphs() {
  if (options_.graphs != TransformerOptions::Graphs::on) return 0;
  // graph_key's widths: the powers of two below the widest table, and the widest.
  const int32_t max_blocks = max_table_blocks();
  std::vector<int32_t> widths;
  for (int32_t w = 1; w < max_blocks; w *= 2) widths.push_back(w);
  widths.push_back(max_blocks);
  const uint64_t before = graphs_captured_;
  for (const int32_t bucket : graph_buckets_) {
    for (const int32_t width : widths) {
      if (graphs_.count({bucket, width}) != 0) continue;
      // Padding sequences only, shaped as a real decode step of this key is (the window's arrays
      // included), so the captured launches are the ones a real step replays.
      HostBatch padding = pad_decode(ForwardBatch{}, GraphKey{bucket, width}, config_.num_layers);
      if (options_.window.enabled()) {
        padding.fp8_lens.assign(static_cast<std::size_t>(bucket), 1);
        padding.spill_starts.assign(static_cast<std::size_t>(bucket), 1);
        padding.tail_slots.assign(static_cast<std::size_t>(bucket), 0);
      }
      forward_graphed(padding.view(), bucket, width, {}, {});
    }
  }
  return static_cast<int>(graphs_captured_ - before);
}

void Transformer::forward_graphed(const ForwardBatch& b, int32_t num_seqs, int32_t width, std::span<float> logits,
                                  std::span<KvWriteCounts> counts) {
  HostBatch padded = pad_decode(b, GraphKey{num_seqs, width}, config_.num_layers);
  const ForwardBatch p = padded.view();
  StepShape shape;
  shape.num_tokens = num_seqs;
  shape.num_seqs = num_seqs;
  shape.max_blocks_per_seq = width;
  shape.num_rows = num_seqs;
  // The same launches for every step of the bucket: kv_spill always, with the most a step that
  // graph_key admits can spill (nothing to do for most sequences), counts always.
  shape.max_spill_tokens = options_.window.enabled() ? options_.block_size : 0;
  shape.track_counts = true;
  const StepLayout layout = step_layout(static_cast<std::size_t>(num_seqs), static_cast<std::size_t>(num_seqs),
                                        static_cast<std::size_t>(width));
  upload_batch(p, layout, true);
  if (options_.graphs == TransformerOptions::Graphs::padded) {
    enqueue(layout, shape);
  } else if (const auto it = graphs_.find({num_seqs, width}); it != graphs_.end()) {
    backend_.replay(*it->second, stream_);
    ++graph_replays_;
  } else {
    // Op by op first: that runs this step and grows every workspace to the bucket's size, so
    // the capture (which runs nothing) sees the buffers the replays will use.
    enqueue(layout, shape);
    backend_.begin_capture(stream_);
    try {
      enqueue(layout, shape);
    } catch (...) {
      try {
        (void)backend_.end_capture(stream_);
      } catch (...) {
      }
      throw;
    }
    graphs_.emplace(std::pair{num_seqs, width}, backend_.end_capture(stream_));
    ++graphs_captured_;
  }
  finish(p, layout, shape, logits, counts);
}

}  // namespace fp8serve
