// Transformer::forward's score rows (prompt logprobs): every prompt row's logits, handed over in
// groups of max_num_seqs rows, are those the same row gives as a sample row - the LM head runs on
// the step's final hidden states, whatever the group - and the sample rows' logits are unchanged
// by scoring. Against the reference, the transformers check is test_prompt_logprobs.py's.
#include <numeric>

#include "engine_test_util.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "model/transformer.hpp"

using namespace fp8serve;
using namespace fp8serve::test;

TEST_CASE("score rows give each row's sample logits, max_num_seqs rows at a time", "[engine][forward]") {
  const LoadedModel model = load_model(fixture("models/tiny-llama"));
  const nlohmann::json ref = load_reference("tiny-llama");
  const std::vector<int32_t> ids = ids_of(ref["prompts"][1]["prompt_ids"]);  // the long prompt
  const auto n = static_cast<int32_t>(ids.size());
  const auto vocab = static_cast<std::size_t>(model.config.vocab_size);
  const auto layers = static_cast<std::size_t>(model.config.num_layers);
  REQUIRE(n > 64);

  cpu::ThreadPool pool(2);
  cpu::CpuBackend backend(pool);
  TransformerOptions options;
  options.kv_dtype = KvDtype::fp8_e4m3;
  options.max_model_len = 256;
  options.num_blocks = 16;
  options.max_num_tokens = 256;
  options.max_num_seqs = 3;  // groups of 3 rows: the last one partial
  Transformer transformer(model.config, model.weights, backend, options);

  std::vector<int32_t> positions(ids.size()), table(static_cast<std::size_t>((n + 15) / 16));
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(table.begin(), table.end(), 0);
  std::vector<int64_t> slots(positions.begin(), positions.end());
  const std::vector<int32_t> qsl{0, n}, context{n};
  const std::vector<uint8_t> calibrate{1};
  // Rows 0, 5, ..., then the last row: scored, and two of them also sampled.
  std::vector<int32_t> score_rows;
  for (int32_t r = 0; r < n; r += 5) score_rows.push_back(r);
  score_rows.push_back(n - 1);
  const std::vector<int32_t> sample_rows{n - 1, 10};

  auto run = [&](std::span<const int32_t> score, std::vector<float>& logits, std::vector<std::vector<float>>& scored) {
    std::vector<float> k_scales(layers, 1.0f), v_scales(layers, 1.0f);
    ForwardBatch batch;
    batch.token_ids = ids;
    batch.positions = positions;
    batch.query_start_loc = qsl;
    batch.context_lens = context;
    batch.block_tables = table;
    batch.max_blocks_per_seq = static_cast<int32_t>(table.size());
    batch.slot_mapping = slots;
    batch.k_scales = k_scales;
    batch.v_scales = v_scales;
    batch.calibrate = calibrate;
    batch.sample_rows = sample_rows;
    batch.score_rows = score;
    logits.assign(sample_rows.size() * vocab, 0.0f);
    std::vector<int64_t> group_sizes;
    transformer.forward(batch, logits, {}, [&](int64_t first, int64_t num_rows, std::span<const float> rows) {
      CHECK(first == static_cast<int64_t>(scored.size()));
      CHECK(rows.size() == static_cast<std::size_t>(num_rows) * vocab);
      group_sizes.push_back(num_rows);
      for (int64_t i = 0; i < num_rows; ++i)
        scored.emplace_back(rows.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * vocab),
                            rows.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i + 1) * vocab));
    });
    for (std::size_t g = 0; g + 1 < group_sizes.size(); ++g) CHECK(group_sizes[g] == 3);
  };
  std::vector<float> plain, with_scores;
  std::vector<std::vector<float>> none, scored;
  run({}, plain, none);
  CHECK(none.empty());
  run(score_rows, with_scores, scored);
  CHECK(with_scores == plain);  // scoring does not touch the sample rows' logits
  REQUIRE(scored.size() == score_rows.size());
  // The last row scored equals the last row sampled, and row 10 as sampled equals what the
  // forward pass of the sample gives at that row: one LM head, any group.
  CHECK(scored.back() == std::vector<float>(plain.begin(), plain.begin() + static_cast<std::ptrdiff_t>(vocab)));
  CHECK(scored[2] == std::vector<float>(plain.begin() + static_cast<std::ptrdiff_t>(vocab), plain.end()));

  // A score row outside the step is refused before anything runs.
  const std::vector<int32_t> bad{n};
  std::vector<std::vector<float>> ignored;
  CHECK_THROWS_AS(run(bad, with_scores, ignored), std::invalid_argument);
}
