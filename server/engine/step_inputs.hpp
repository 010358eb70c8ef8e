#pragma once
// A step's inputs: the scheduled chunks laid out over the block manager's tables as one forward
// batch (docs/design.md, "One request"): token ids, positions and slots per token; context length,
// block table, FP8 scales and the bf16 window's boundaries per forward-batch sequence. The engine
// and the draft model build their batches here, and both hand the calibrated scales back here.
//
//   begin(num_rows, max_blocks)      a new batch of num_rows forward-batch sequences ("rows")
//   add(id, begin, tokens, ...)      one row: `tokens` at positions [begin, end) of `id`,
//                                    attending to [0, end)
//   add_sample_row(row)              a token row whose logits are wanted
//   batch()                          the ForwardBatch (valid until the next begin())
//   write_back_scales(id, row)       after the forward pass: the row's calibrated scales into the
//                                    block manager, which freezes them when the step is committed
#include <cstdint>
#include <span>

#include "cache/block_manager.hpp"
#include "model/transformer.hpp"

namespace fp8serve {

class StepInputs {
 public:
  // PRECOND: blocks outlives this object.
  StepInputs(BlockManager& blocks, int num_layers) : blocks_(blocks), num_layers_(num_layers) {}

  // Starts a batch of num_rows rows whose block tables are at most max_blocks wide. Scales start
  // at 1 and tables at block 0, so that a row added with fewer blocks reads nothing undefined.
  void begin(int32_t num_rows, int32_t max_blocks);
  // Adds the next row: `tokens` at positions [begin, end = begin + tokens.size()) of sequence
  // `id` (whose block table holds their slots), attending to positions [0, end); `calibrate`:
  // kv_write calibrates the row's FP8 scales (the sequence's first prefill chunk). With the bf16
  // window, fp8_len is where the FP8 part ends after the step and spill_start where it ended
  // before (kernels/paged_kv.hpp). Returns the row's index.
  int32_t add(SeqId id, int begin, std::span<const int32_t> tokens, bool calibrate, int fp8_len = 0, int spill_start = 0);
  void add_sample_row(int32_t token_row) { batch_.sample_rows.push_back(token_row); }

  int32_t num_tokens() const { return static_cast<int32_t>(batch_.token_ids.size()); }
  ForwardBatch batch() { return batch_.view(); }
  // Row `row` calibrated the scales of `id`: they go to the block manager before
  // Scheduler::on_step_done (or BlockManager::mark_computed) freezes them.
  void write_back_scales(SeqId id, int32_t row);

 private:
  BlockManager& blocks_;
  int num_layers_ = 0;
  int32_t num_rows_ = 0;
  int32_t next_row_ = 0;
  HostBatch batch_;  // reused from step to step: a decode step allocates little
};

}  // namespace fp8serve
