#pragma once
// The forward pass of Llama / Qwen2 / Qwen3, written once against the Backend interface over a
// flattened batch that mixes prefill chunks and decode tokens (docs/design.md, "One request"). The families
// differ only by config flags: QKV bias (Qwen2), per-head q/k RMSNorm (Qwen3), llama3 rope
// scaling, tied embeddings.
//
// The Transformer owns the model's device state: the weights (uploaded once by WeightUploader;
// q, k and v concatenated into one qkv projection, gate and up into one gate_up projection, as
// every serious engine fuses them; projections bf16 or FP8), the paged KV pool (one K and one V
// buffer per layer, kernels/paged_kv.hpp layout), the activation buffers sized for the largest step (in the
// backend's activation dtype), and the step's metadata buffers. It does not know which block
// belongs to whom: the engine passes block tables, slots and scales in a ForwardBatch.
//
// Its members live by concern: transformer.cpp the forward pass (embed, the layers, the LM head);
// transformer_setup.cpp the constructor and the weights; transformer_kv_pool.cpp the pools and
// their copies; transformer_step.cpp a step's metadata (checks, layout, upload, download);
// transformer_sampling.cpp sampling on the device; decode_graphs.cpp the decode graphs.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/block_manager.hpp"
#include "cache/kv_scales.hpp"
#include "cache/kv_window.hpp"
#include "kernels/backend.hpp"
#include "kernels/kv_dtype.hpp"
#include "model/formats/model_config.hpp"
#include "model/formats/weights.hpp"
#include "model/weight_upload.hpp"

namespace fp8serve {

// "12.3 MiB": byte counts in the start-up log.
std::string mib_text(uint64_t bytes);

struct TransformerOptions {
  KvDtype kv_dtype = KvDtype::fp8_e4m3;
  int block_size = kDefaultBlockSize;
  // Blocks of the KV pool (KvCacheSpec::num_blocks_for_budget). 0: the constructor allocates no
  // pool, and allocate_kv_cache() must be called before forward() - the GPU engine sizes the pool
  // from the memory left once the weights and activation buffers are in place.
  int num_blocks = 0;
  int max_num_tokens = 2048;   // per step (--max-num-batched-tokens)
  int max_num_seqs = 64;       // per step
  // Rows whose logits one step may ask for (sample_rows); 0 = max_num_seqs. Speculative decoding
  // samples every verified row: 1 + K for each speculating sequence.
  int max_sample_rows = 0;
  int max_model_len = 0;       // positions the rope table covers; block tables' width
  float kv_scale_margin = kDefaultKvScaleMargin;
  // --quantization fp8: every projection's weights to FP8 E4M3 with one scale per output channel
  // (FP8 checkpoints load as FP8 whatever this says). Embeddings and norms stay bf16.
  bool quantize_fp8 = false;
  // With quantize_fp8, the LM head too (a tied head gets its own FP8 copy; the embedding table
  // stays bf16). Off by default: it costs far more quality than it saves bytes (docs/fp8-weights.md, "Quality").
  bool quantize_lm_head = false;
  // The bf16 recent window (FP8 pool only): allocate_kv_cache() adds a bf16 tail pool of one
  // ring of window.ring_blocks() blocks per sequence (allocate_kv_cache's num_tail_rings), K and
  // V or K only.
  KvWindow window;
  // --kv-rotation (FP8 pool only): each head's q and k after RoPE, and v, go through the
  // Walsh-Hadamard transform before the KV write, and the attention output comes back through
  // it before o_proj (kernels/forward_ops.hpp, HeadHadamardParams). rotate_values false: q and k
  // only, the output needs no transform back (bench_kv_quality compares the two).
  KvRotation kv_rotation = KvRotation::none;
  bool rotate_values = true;
  // CUDA graphs for decode steps (model/decode_graphs.hpp), on backends that have graphs. on: a
  // step whose sequences all decode one token is padded to a bucket and replays the graph
  // captured for it (captured the first time the bucket is met, right after running that step
  // op by op). off: every step runs op by op (--enforce-eager). padded: pads such steps but runs
  // them op by op - what a replay must equal bit for bit (tests).
  enum class Graphs : uint8_t { off, on, padded };
  Graphs graphs = Graphs::off;
};

// One step, host side. Sequence s owns tokens [query_start_loc[s], query_start_loc[s + 1]).
struct ForwardBatch {
  std::span<const int32_t> token_ids;        // [num_tokens]
  std::span<const int32_t> positions;        // [num_tokens]
  std::span<const int32_t> query_start_loc;  // [num_seqs + 1]
  std::span<const int32_t> context_lens;     // [num_seqs] cached + new tokens after this step
  std::span<const int32_t> block_tables;     // [num_seqs, max_blocks_per_seq], -1 padded
  int32_t max_blocks_per_seq = 0;
  std::span<const int64_t> slot_mapping;     // [num_tokens]
  // FP8 scales, [num_layers, num_seqs] each: read for every sequence, and overwritten with the
  // calibrated values for the sequences with calibrate[s] != 0 (their first prefill chunk).
  std::span<float> k_scales;
  std::span<float> v_scales;
  std::span<const uint8_t> calibrate;        // [num_seqs]
  std::span<const int32_t> sample_rows;      // token rows whose logits are wanted, <= max_sample_rows
  // Token rows scored on top (prompt logprobs): any number, each in [0, num_tokens); their
  // logits go to forward()'s ScoreFn in groups, never all at once.
  std::span<const int32_t> score_rows;
  // The bf16 window (kernels/paged_kv.hpp), [num_seqs] each; all empty without a window. Every
  // layer spills [spill_starts, min(fp8_lens, context_lens - new tokens)) before its kv_write.
  std::span<const int32_t> fp8_lens;      // positions read from the FP8 pool after this step
  std::span<const int32_t> spill_starts;  // the same before it
  std::span<const int32_t> tail_slots;    // each sequence's ring in the tail pool
};

// The arrays of a ForwardBatch, owned: steps built on the host (a padded decode step, benchmarks).
// view() points a ForwardBatch at them; keep the HostBatch alive while that is used.
struct HostBatch {
  std::vector<int32_t> token_ids, positions, query_start_loc, context_lens, block_tables, sample_rows, score_rows;
  std::vector<int64_t> slot_mapping;
  std::vector<float> k_scales, v_scales;
  std::vector<uint8_t> calibrate;
  std::vector<int32_t> fp8_lens, spill_starts, tail_slots;
  int32_t max_blocks_per_seq = 0;

  ForwardBatch view();
};

class Transformer {
 public:
  // Uploads the weights (the host copy may be dropped afterwards) and allocates the KV pool and
  // buffers. Throws std::invalid_argument for options that cannot work, std::bad_alloc when the
  // device is out of memory.
  Transformer(const ModelConfig& config, const ModelWeights& weights, Backend& backend,
              const TransformerOptions& options);

  // Allocates the KV pool when the options said num_blocks = 0. Once only. num_tail_rings: the
  // window's tail pool (-1: max_num_seqs); 0 turns the window off (options().window).
  void allocate_kv_cache(int num_blocks, int num_tail_rings = -1);
  bool has_kv_cache() const { return !kv_views_.empty(); }

  // Receives the fp32 logits of score_rows[first, first + num_rows), [num_rows, vocab_size];
  // valid during the call only.
  using ScoreFn = std::function<void(int64_t first, int64_t num_rows, std::span<const float> logits)>;

  // Runs the step and writes [sample_rows.size(), vocab_size] fp32 logits to `logits`; an empty
  // `logits` leaves them on the device, for sample_greedy() or sample_candidates().
  // counts (optional, [num_layers]) accumulates kv_write's saturation counts per layer.
  // With score_rows, `score` then receives their logits, max_num_seqs rows at a time: the LM
  // head runs again on the step's final hidden states (still in place), so a long prompt never
  // needs [num_tokens, vocab] of logits at once.
  void forward(const ForwardBatch& batch, std::span<float> logits,
               std::span<KvWriteCounts> counts = {}, const ScoreFn& score = {});

  // Whether the backend samples where the logits are (Backend::supports_device_sampling).
  bool samples_on_device() const { return backend_.supports_device_sampling(); }
  // The greedy pick of each sample row of the last forward() (given no logits, nothing else comes
  // back): only the picks (kernels/sampling_ops.hpp), into pinned memory, valid until the next
  // call. [sample_rows.size()] of that step. PRECOND: samples_on_device(); that step scored no
  // rows (score_rows reuse the logits' memory).
  std::span<const GreedyRow> sample_greedy();
  // The top-k prefilter of the same rows (Backend::sample_candidates), K = kMaxSampleCandidates
  // (or the vocabulary): per row its CandidateRow, then K ids and K logits, in pinned memory valid
  // until the next call. inv_temperature: [sample rows] 1/T in fp32 (any value for greedy rows);
  // raw_sum_wanted: [sample rows] whether the row's raw_sum is wanted (its request asks for
  // logprobs), else left 0 (CandidateSampleParams::raw_sum_wanted).
  struct Candidates {
    std::span<const CandidateRow> rows;
    const int32_t* ids = nullptr;     // [rows, k]
    const float* logits = nullptr;    // [rows, k]
    int32_t k = 0;
  };
  Candidates sample_candidates(std::span<const float> inv_temperature, std::span<const uint8_t> raw_sum_wanted);
  // The host sampler's logit processing of the same rows, in place, before either of the above
  // (Backend::process_logits): mask_index [rows] each row's mask in masks ([*, ceil(vocab/32)]
  // words) or -1; edit_begin [rows + 1] each row's range of `edits`. One upload of these.
  void process_logits(std::span<const int32_t> mask_index, std::span<const uint32_t> masks,
                      std::span<const int32_t> edit_begin, std::span<const LogitEdit> edits);
  // One sample row's logits of the last forward() ([vocab_size]), for a row its candidates could
  // not decide. `out`: best from the backend's allocate_host (one DMA).
  void download_logits_row(int64_t row, std::span<float> out);

  // Copy-on-write: every layer's K and V block src -> dst (BlockManager::append_slot asks).
  void copy_blocks(std::span<const BlockCopy> copies);
  // A fork's tail: ring src -> ring dst, every block, every layer (BlockCopy of ring ids).
  void copy_tail_rings(std::span<const BlockCopy> copies);

  const ModelConfig& config() const { return config_; }
  const TransformerOptions& options() const { return options_; }
  // Captures now the decode graph of every (batch-size bucket, block-table width) a step can
  // replay (graphs on), each after running its step op by op with inert padding sequences, so
  // that no step later pauses to capture one. Returns how many it captured. PRECOND: the KV cache
  // is allocated; no sequence is running (padding reads block 0, writes nothing).
  int capture_decode_graphs();
  // Decode steps run through graphs: how many graphs were captured, how many steps replayed one.
  uint64_t graphs_captured() const { return graphs_captured_; }
  uint64_t graph_replays() const { return graph_replays_; }
  uint64_t weight_bytes() const { return weight_bytes_.total(); }
  const WeightBytes& weight_bytes_by_dtype() const { return weight_bytes_; }
  // One line for the start-up log: the weights' dtypes and bytes.
  std::string describe_weights() const;
  uint64_t kv_cache_bytes() const { return kv_cache_bytes_; }  // the main pool
  uint64_t tail_bytes() const { return tail_bytes_; }           // the window's tail pool

 private:
  // Tests read the pools back (tests/unit/engine/transformer_test_access.hpp).
  friend struct TransformerTestAccess;

  struct LayerWeights {
    const std::uint16_t* input_norm = nullptr;
    DeviceProjection qkv_proj;                // [(num_heads + 2 * num_kv_heads) * head_dim, hidden]
    const std::uint16_t* qkv_bias = nullptr;  // Qwen2
    const std::uint16_t* q_norm = nullptr;    // Qwen3
    const std::uint16_t* k_norm = nullptr;
    DeviceProjection o_proj;
    const std::uint16_t* post_norm = nullptr;
    DeviceProjection gate_up_proj;  // [2 * intermediate, hidden]: gate rows, then up
    DeviceProjection down_proj;
  };
  // Every weight through `up` into the named slots (layers_ sized).
  void upload_weights(const ModelWeights& weights, WeightUploader& up, bool quantize);

  // Byte offsets of one step's metadata inside step_meta_ (and its host image step_host_), each
  // array 16-byte aligned and sized for this step. The scales and counts come last so that what
  // a step reads back is one contiguous range.
  struct StepLayout {
    std::size_t token_ids = 0, positions = 0, slot_mapping = 0, query_start_loc = 0, context_lens = 0,
                block_tables = 0, calibrate = 0, sample_rows = 0, score_rows = 0, fp8_lens = 0, spill_starts = 0,
                tail_slots = 0, k_scales = 0, v_scales = 0, counts = 0,
                end = 0;
  };
  StepLayout step_layout(std::size_t num_tokens, std::size_t num_seqs, std::size_t max_blocks_per_seq,
                         std::size_t num_score_rows = 0) const;

  // What the host knows of a step that decides how its ops are issued (their counts and grids).
  struct StepShape {
    int64_t num_tokens = 0;
    int32_t num_seqs = 0;
    int32_t max_blocks_per_seq = 0;
    int64_t num_rows = 0;          // rows that sample
    int32_t max_spill_tokens = 0;  // kv_spill's bound; 0: no spill launched
    bool calibrates = false;       // some sequence calibrates its scales
    bool track_counts = false;     // kv_write accumulates counts into the step's metadata
  };

  // The widest block table a sequence can have: max_model_len in blocks.
  int32_t max_table_blocks() const { return (options_.max_model_len + options_.block_size - 1) / options_.block_size; }
  void validate(const ForwardBatch& batch, std::span<float> logits) const;
  // Packs the step's metadata into step_host_ and uploads it with one copy (a GPU backend
  // stages it through pinned memory and copies asynchronously on the stream).
  void upload_batch(const ForwardBatch& batch, const StepLayout& layout, bool track_counts);
  // Issues the step's ops on the stream, from the embedding to the LM head: no copy and no
  // synchronization, so that a graph can capture it.
  void enqueue(const StepLayout& layout, const StepShape& shape);
  // The final norm and the LM head over num_rows rows of the step's last hidden states (row
  // ids on the device at `rows`): logits_ gets [num_rows, vocab]. PRECOND: num_rows <= max_num_seqs.
  void enqueue_head(const int32_t* rows, int64_t num_rows, int64_t num_tokens);
  // score_rows' logits, max_num_seqs rows at a time, to `score` (after finish()).
  void score_rows(const ForwardBatch& batch, const StepLayout& layout, const ScoreFn& score);
  // Downloads the logits (the first logits.size() values) and what the step changed in its
  // metadata (scales when it calibrated, counts), synchronizes, and hands them to the caller.
  void finish(const ForwardBatch& batch, const StepLayout& layout, const StepShape& shape, std::span<float> logits,
              std::span<KvWriteCounts> counts);
  // A decode step through a graph (TransformerOptions::graphs).
  void forward_graphed(const ForwardBatch& batch, int32_t num_seqs, int32_t width, std::span<float> logits,
                       std::span<KvWriteCounts> counts);

  ModelConfig config_;
  Backend& backend_;
  TransformerOptions options_;
  Stream stream_;

  std::vector<DeviceBuffer> weight_buffers_;
  std::vector<LayerWeights> layers_;
  const std::uint16_t* embed_tokens_ = nullptr;
  const std::uint16_t* final_norm_ = nullptr;
  DeviceProjection lm_head_;  // the embedding table itself when tied and bf16
  WeightBytes weight_bytes_;

  std::vector<DeviceBuffer> kv_buffers_;  // [num_layers * 2]: K then V of each layer
  std::vector<PagedKvView> kv_views_;     // [num_layers]
  uint64_t kv_cache_bytes_ = 0;
  std::vector<DeviceBuffer> tail_buffers_;  // K (and V) of each layer's tail pool
  std::vector<PagedKvView> tail_views_;     // [num_layers], empty without a window
  uint64_t tail_bytes_ = 0;
  std::size_t act_bytes_ = 4;  // bytes per activation element (fp32 or bf16)

  // Activations, sized for max_num_tokens rows (act = the backend's activation dtype).
  DeviceBuffer hidden_;    // [max_tokens, hidden] the residual stream
  DeviceBuffer normed_;    // [max_tokens, hidden]
  DeviceBuffer qkv_;       // [max_tokens, (num_heads + 2 * num_kv_heads) * head_dim]
  DeviceBuffer attn_out_;  // [max_tokens, num_heads * head_dim]
  DeviceBuffer proj_out_;  // [max_tokens, hidden] o_proj and down_proj outputs
  DeviceBuffer gate_up_;   // [max_tokens, 2 * intermediate]
  DeviceBuffer sampled_;        // [max_seqs, hidden] the residual stream's rows that sample
  DeviceBuffer sampled_delta_;  // [max_seqs, hidden] the last block's output on those rows
  DeviceBuffer logits_;         // [max_seqs, vocab]
  HostArray<float> score_logits_;  // host, pinned on a GPU: [max_seqs, vocab] one group of score rows
  DeviceBuffer greedy_picks_;          // [max_seqs] GreedyRow, sample_greedy()'s output
  HostArray<GreedyRow> greedy_host_;   // pinned: the picks come back with one DMA
  DeviceBuffer candidates_;             // [max_seqs] CandidateRow, ids [max_seqs, K], logits [max_seqs, K], 1/T [max_seqs]
  HostArray<std::byte> candidates_host_;  // pinned image of candidates_
  DeviceBuffer process_;                  // process_logits()'s inputs: mask_index, edit_begin, masks, edits
  HostArray<std::byte> process_host_;     // pinned image of process_ (grown as needed)
  int64_t last_sample_rows_ = -1;       // the last forward()'s sample rows in logits_; -1: none (scored rows overwrote them)

  // Step metadata (StepLayout): one device buffer sized for the largest step, and its host image.
  DeviceBuffer step_meta_;
  HostArray<std::byte> step_host_;  // pinned on a GPU: the metadata moves with one DMA each way

  // Decode graphs by (padded batch size, block-table width).
  std::vector<int32_t> graph_buckets_;
  std::map<std::pair<int32_t, int32_t>, std::unique_ptr<Backend::Graph>> graphs_;
  uint64_t graphs_captured_ = 0;
  uint64_t graph_replays_ = 0;
};

}  // namespace fp8serve
