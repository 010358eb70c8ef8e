// [gpu] CUDA graphs for decode steps (model/decode_graphs.hpp): the tiny fixture models run the
// same schedule three times on the CUDA backend - op by op (graphs off), padded op by op
// (graphs padded), and through graphs (on) - with fixed input tokens, so every run sees the same
// steps. Sequences join and leave, so decode batches of 5, 2 and 3 sequences are padded to the
// buckets 8, 2 and 4 and replayed with other contents than at their capture; contexts cross
// block boundaries, so the block-table width changes; with the bf16 window, blocks leave the
// window (kv_spill) during replays.
//  - on vs padded: bit for bit. A replay runs the launches of the padded step with the metadata
//    rewritten in place; any argument frozen at capture that should have followed the step (a
//    stale count, a pointer to a staging copy, a grid sized for the captured step) changes the
//    logits.
//  - on vs off: padding sequences and the wider block table only change how the decode attention
//    splits the batch's context (its fp32 summation order) and, on a GPU, which cuBLASLt
//    algorithm a projection gets: asserted within 1e-3 of the row's largest |logit| in the
//    emulator (2e-2 on a GPU) and equal greedy tokens unless near a tie. A padding sequence that
//    wrote the pool, or read a real sequence's rows as its own, moves them by far more.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cuda_test_util.hpp"
#include "model/decode_graphs.hpp"
#include "model/loader.hpp"
#include "model/transformer.hpp"

using namespace fp8serve;
using namespace fp8serve::gpu_test;

namespace {

constexpr int kBlockSize = 16;
constexpr int kMaxModelLen = 256;
constexpr int kMaxBlocks = kMaxModelLen / kBlockSize;

struct Run {
  std::vector<std::vector<float>> logits;  // per step: [sampled rows, vocab]
  uint64_t captured = 0;
  uint64_t replays = 0;
  int at_startup = 0;  // captured by capture_decode_graphs() before the schedule
};

// Step 0 prefills every sequence; then decode steps over the active sets below.
const std::vector<std::vector<int32_t>> kActive{
    {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, {0, 2}, {0, 2}, {0, 1, 2}, {0, 1, 2}, {0, 1, 2, 3, 4}, {0, 2}, {0, 1, 2, 3, 4},
    {1, 3, 4}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}};

Run run_schedule(const LoadedModel& model, KvDtype dtype, KvWindow window, TransformerOptions::Graphs graphs,
               bool capture_at_startup = false) {
  Run run;
  std::unique_ptr<Backend> backend = cuda_backend_or_skip();
  if (!backend) return run;
  const ModelConfig& c = model.config;
  TransformerOptions options;
  options.kv_dtype = dtype;
  options.block_size = kBlockSize;
  options.num_blocks = 5 * kMaxBlocks;
  options.max_num_tokens = 256;
  options.max_num_seqs = 8;
  options.max_model_len = kMaxModelLen;
  options.window = window;
  options.graphs = graphs;
  Transformer transformer(c, model.weights, *backend, options);
  if (capture_at_startup) run.at_startup = transformer.capture_decode_graphs();

  const int32_t num_seqs = 5;
  const std::vector<int32_t> prompt_lens{30, 14, 47, 3, 16};
  // Sequence s owns blocks [s * kMaxBlocks, (s + 1) * kMaxBlocks), in reverse order.
  auto block_of = [](int32_t s, int32_t b) { return (s + 1) * kMaxBlocks - 1 - b; };
  std::vector<int32_t> lengths(num_seqs, 0), fp8(num_seqs, 0);
  const auto layers = static_cast<std::size_t>(c.num_layers);
  std::vector<float> k_scales(layers * num_seqs, 1.0f), v_scales(k_scales.size(), 1.0f);
  uint32_t next_token = 17;
  auto token = [&] { return static_cast<int32_t>((next_token = next_token * 1103515245u + 12345u) >> 8) % c.vocab_size; };

  for (std::size_t step = 0; step <= kActive.size(); ++step) {
    std::vector<int32_t> active(num_seqs);
    for (int32_t s = 0; s < num_seqs; ++s) active[static_cast<std::size_t>(s)] = s;
    if (step > 0) active = kActive[step - 1];
    const auto n = active.size();
    HostBatch h;
    h.query_start_loc.push_back(0);
    int32_t width = 1;
    for (const int32_t s : active) {
      const int32_t fresh = step == 0 ? prompt_lens[static_cast<std::size_t>(s)] : 1;
      for (int32_t i = 0; i < fresh; ++i) {
        const int32_t pos = lengths[static_cast<std::size_t>(s)]++;
        h.token_ids.push_back(token());
        h.positions.push_back(pos);
        h.slot_mapping.push_back(static_cast<int64_t>(block_of(s, pos / kBlockSize)) * kBlockSize + pos % kBlockSize);
      }
      h.query_start_loc.push_back(static_cast<int32_t>(h.token_ids.size()));
      h.context_lens.push_back(lengths[static_cast<std::size_t>(s)]);
      h.sample_rows.push_back(static_cast<int32_t>(h.token_ids.size()) - 1);
      h.calibrate.push_back(step == 0 ? 1 : 0);
      width = std::max(width, (lengths[static_cast<std::size_t>(s)] + kBlockSize - 1) / kBlockSize);
      if (window.enabled()) {
        h.spill_starts.push_back(fp8[static_cast<std::size_t>(s)]);
        fp8[static_cast<std::size_t>(s)] = std::max(fp8[static_cast<std::size_t>(s)], window.fp8_len(h.context_lens.back()));
        h.fp8_lens.push_back(fp8[static_cast<std::size_t>(s)]);
        h.tail_slots.push_back(s);
      }
    }
    h.max_blocks_per_seq = width;
    h.block_tables.assign(n * static_cast<std::size_t>(width), -1);
    h.k_scales.resize(layers * n);
    h.v_scales.resize(layers * n);
    for (std::size_t i = 0; i < n; ++i) {
      const int32_t s = active[i];
      for (int32_t b = 0; b < (lengths[static_cast<std::size_t>(s)] + kBlockSize - 1) / kBlockSize; ++b)
        h.block_tables[i * static_cast<std::size_t>(width) + static_cast<std::size_t>(b)] = block_of(s, b);
      for (std::size_t l = 0; l < layers; ++l) {
        h.k_scales[l * n + i] = k_scales[l * num_seqs + static_cast<std::size_t>(s)];
        h.v_scales[l * n + i] = v_scales[l * num_seqs + static_cast<std::size_t>(s)];
      }
    }
    std::vector<float> logits(n * static_cast<std::size_t>(c.vocab_size));
    std::vector<KvWriteCounts> counts(layers);
    transformer.forward(h.view(), logits, counts);
    for (std::size_t i = 0; i < n; ++i) {  // calibrated scales back into the sequences' own
      const auto s = static_cast<std::size_t>(active[i]);
      for (std::size_t l = 0; l < layers; ++l) {
        k_scales[l * num_seqs + s] = h.k_scales[l * n + i];
        v_scales[l * num_seqs + s] = h.v_scales[l * n + i];
      }
    }
    run.logits.push_back(std::move(logits));
  }
  run.captured = transformer.graphs_captured();
  run.replays = transformer.graph_replays();
  return run;
}

// The emulator's cuBLASLt stand-in gives each row the same sums at any batch size; the real
// cuBLASLt may choose another algorithm for 8 rows than for 5, which moves bf16 activations by an
// ulp here and there.
constexpr double kTolerance = kEmulated ? 1e-3 : 2e-2;

int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

void check_model(const std::string& name, KvDtype dtype, KvWindow window) {
  const LoadedModel model = load_model(std::string(FP8SERVE_FIXTURES_DIR) + "/models/" + name);
  const Run off = run_schedule(model, dtype, window, TransformerOptions::Graphs::off);
  if (off.logits.empty()) return;  // no device
  const Run padded = run_schedule(model, dtype, window, TransformerOptions::Graphs::padded);
  const Run on = run_schedule(model, dtype, window, TransformerOptions::Graphs::on);
  const int64_t vocab = model.config.vocab_size;
  INFO(name << (dtype == KvDtype::fp8_e4m3 ? " fp8" : " bf16") << " window " << window.tokens);
  // Buckets met: 8 (5 sequences), 2, 4 (3 sequences) at two or more widths; most steps replay.
  CHECK(on.captured >= 3);
  CHECK(on.captured + on.replays == kActive.size());  // every decode step went through a graph
  CHECK(padded.captured == 0);
  double worst = 0.0;
  REQUIRE(on.logits.size() == off.logits.size());
  for (std::size_t step = 0; step < on.logits.size(); ++step) {
    INFO("step " << step);
    REQUIRE(on.logits[step].size() == padded.logits[step].size());
    CHECK(std::memcmp(on.logits[step].data(), padded.logits[step].data(), on.logits[step].size() * sizeof(float)) == 0);
    const std::size_t rows = on.logits[step].size() / static_cast<std::size_t>(vocab);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* a = on.logits[step].data() + r * static_cast<std::size_t>(vocab);
      const float* b = off.logits[step].data() + r * static_cast<std::size_t>(vocab);
      double max_abs = 0.0, max_err = 0.0;
      for (int64_t i = 0; i < vocab; ++i) {
        max_abs = std::max(max_abs, std::fabs(static_cast<double>(b[i])));
        max_err = std::max(max_err, std::fabs(static_cast<double>(a[i]) - b[i]));
      }
      worst = std::max(worst, max_err / max_abs);
      CHECK(max_err <= kTolerance * max_abs);
      if (argmax(a, vocab) != argmax(b, vocab)) {  // only a near-tie may go the other way
        std::vector<float> sorted(b, b + vocab);
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
        CHECK(sorted[0] - sorted[1] < 0.05f);
      }
    }
  }
  std::printf("[graphs cuda] %-12s %-5s window %3d: %llu graphs captured, %llu replays; worst |on - off| %.2e of "
              "max |logit|\n",
              name.c_str(), dtype == KvDtype::fp8_e4m3 ? "fp8" : "bf16", window.tokens,
              static_cast<unsigned long long>(on.captured), static_cast<unsigned long long>(on.replays), worst);
}

}  // namespace

TEST_CASE("decode graphs replay exactly the padded step, and the padded step is the plain one [gpu]", "[gpu]") {
  check_model("tiny-llama", KvDtype::bf16, KvWindow{});
  check_model("tiny-qwen3", KvDtype::fp8_e4m3, KvWindow{});
}

TEST_CASE("decode graphs with the bf16 window: blocks leave the window during replays [gpu]", "[gpu]") {
  check_model("tiny-qwen2", KvDtype::fp8_e4m3, KvWindow{16, false, kBlockSize});
  check_model("tiny-llama", KvDtype::fp8_e4m3, KvWindow{16, true, kBlockSize});
}

TEST_CASE("decode graphs captured at start-up: the schedule captures nothing more and replays the same [gpu]",
          "[gpu]") {
  const LoadedModel model = load_model(std::string(FP8SERVE_FIXTURES_DIR) + "/models/tiny-qwen2");
  const KvWindow window{16, false, kBlockSize};  // the window's arrays shape the captured launches too
  const Run lazy = run_schedule(model, KvDtype::fp8_e4m3, window, TransformerOptions::Graphs::on);
  if (lazy.logits.empty()) return;  // no device
  const Run eager = run_schedule(model, KvDtype::fp8_e4m3, window, TransformerOptions::Graphs::on, true);
  // Buckets 1, 2, 4, 8 (max_num_seqs 8) x widths 1, 2, 4, 8, 16 (256 tokens of 16-token blocks).
  CHECK(eager.at_startup == 4 * 5);
  CHECK(eager.captured == static_cast<uint64_t>(eager.at_startup));  // serving captured none
  CHECK(eager.replays == kActive.size());
  REQUIRE(eager.logits.size() == lazy.logits.size());
  for (std::size_t step = 0; step < lazy.logits.size(); ++step) {
    INFO("step " << step);
    CHECK(std::memcmp(eager.logits[step].data(), lazy.logits[step].data(), lazy.logits[step].size() * sizeof(float)) ==
          0);
  }
}
