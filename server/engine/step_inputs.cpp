#include "server/engine/step_inputs.hpp"

#include <algorithm>
#include <stdexcept>

namespace fp8serve {

void StepInputs::begin(int32_t num_rows, int32_t max_blocks) {
  HostBatch& b = batch_;
  b.token_ids.clear();
  b.positions.clear();
  b.slot_mapping.clear();
  b.query_start_loc.assign(1, 0);
  b.context_lens.clear();
  b.sample_rows.clear();
  b.score_rows.clear();
  b.calibrate.clear();
  b.fp8_lens.clear();
  b.spill_starts.clear();
  b.tail_slots.clear();
  b.max_blocks_per_seq = max_blocks;
  b.block_tables.assign(static_cast<std::size_t>(num_rows) * static_cast<std::size_t>(max_blocks), 0);
  // [num_layers, num_rows]
  b.k_scales.assign(static_cast<std::size_t>(num_layers_) * static_cast<std::size_t>(num_rows), 1.0f);
  b.v_scales.assign(b.k_scales.size(), 1.0f);
  num_rows_ = num_rows;
  next_row_ = 0;
}

int32_t StepInputs::add(SeqId id, int begin, std::span<const int32_t> tokens, bool calibrate, int fp8_len, int spill_start) {
  if (next_row_ >= num_rows_) throw std::logic_error("StepInputs::add: more rows than begin() was told");
  HostBatch& b = batch_;
  const int32_t row = next_row_++;
  const int end = begin + static_cast<int>(tokens.size());
  b.token_ids.insert(b.token_ids.end(), tokens.begin(), tokens.end());
  for (int p = begin; p < end; ++p) {
    b.positions.push_back(p);
    b.slot_mapping.push_back(blocks_.slot(id, p));
  }
  b.query_start_loc.push_back(static_cast<int32_t>(b.token_ids.size()));
  b.context_lens.push_back(end);
  if (blocks_.window().enabled()) {
    b.fp8_lens.push_back(fp8_len);
    b.spill_starts.push_back(spill_start);
    // A sequence without a ring reads nothing from the tail (its fp8_len is its context): ring 0
    // only keeps the slot in range.
    b.tail_slots.push_back(std::max(0, blocks_.tail_ring(id)));
  }
  b.calibrate.push_back(calibrate ? 1 : 0);
  const std::span<const int32_t> table = blocks_.block_table(id);
  std::copy(table.begin(), table.end(), b.block_tables.begin() + static_cast<std::ptrdiff_t>(row) * b.max_blocks_per_seq);
  const KvScales& scales = blocks_.scales(id);
  for (int layer = 0; layer < num_layers_; ++layer) {
    const auto at = static_cast<std::size_t>(layer) * static_cast<std::size_t>(num_rows_) + static_cast<std::size_t>(row);
    b.k_scales[at] = scales.k[static_cast<std::size_t>(layer)];
    b.v_scales[at] = scales.v[static_cast<std::size_t>(layer)];
  }
  return row;
}

void StepInputs::write_back_scales(SeqId id, int32_t row) {
  KvScales* scales = blocks_.scales_to_calibrate(id);
  if (scales == nullptr) throw std::logic_error("calibrating a sequence whose scales are frozen");
  for (int layer = 0; layer < num_layers_; ++layer) {
    const auto at = static_cast<std::size_t>(layer) * static_cast<std::size_t>(num_rows_) + static_cast<std::size_t>(row);
    scales->k[static_cast<std::size_t>(layer)] = batch_.k_scales[at];
    scales->v[static_cast<std::size_t>(layer)] = batch_.v_scales[at];
  }
}

}  // namespace fp8serve
