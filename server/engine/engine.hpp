#pragma once
// The engine loop's state and one step of it (docs/design.md, "One request"): the Transformer on its
// Backend, the BlockManager, the Scheduler, and per sequence a Sampler, an
// IncrementalDetokenizer and a StopChecker. Single-threaded: the HTTP server reaches it only
// through AsyncEngine (server/async_engine.hpp), the offline `generate` command drives it directly.
//
//   add_request(request, sink)   validate, queue (n > 1: one sequence per choice, forked
//                                from the prompt's blocks after prefill)
//   step()                       schedule -> step inputs -> forward -> commit the KV -> step
//                                outputs (sample, verify, stop checks, outputs to each sink)
//                                -> proposals for the next step (speculative decoding)
//   abort(request_id)            frees the request's blocks now
//
// The step's stages live in one file each: step_inputs.cpp (the forward batch), engine.cpp
// (the step itself, requests in and out), step_outputs.cpp (sampling and verification),
// structured_sampling.cpp (grammar masks and the token budget), engine_startup.cpp (the
// constructor: device, weights, KV budget, start-up log).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/block_manager.hpp"
#include "cache/kv_cache_spec.hpp"
#include "cache/kv_scales.hpp"
#include "model/loader.hpp"
#include "model/tokenizer/detokenizer.hpp"
#include "model/transformer.hpp"
#include "server/engine/device_select.hpp"
#include "server/engine/draft_model.hpp"
#include "server/engine/engine_api.hpp"
#include "server/engine/engine_options.hpp"
#include "server/engine/prompt_scoring.hpp"
#include "server/engine/sampling.hpp"
#include "server/engine/scheduler.hpp"
#include "server/engine/speculation.hpp"
#include "server/engine/step_inputs.hpp"
#include "server/engine/stop_checker.hpp"
#include "server/grammar/matcher.hpp"

namespace fp8serve {

class Engine {
 public:
  // Uploads the weights to the backend and drops the host copy. Logs the start-up summary.
  Engine(LoadedModel model, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // A request the engine cannot serve (empty prompt, a token id outside the vocabulary, too
  // long for --max-model-len or for the whole KV pool, n > --max-num-seqs, a duplicate id) is
  // answered at once through `sink` with finish = error and a message; never an exception.
  void add_request(GenerationRequest request, OutputSink sink);
  // Finishes every choice of the request with finish = abort; unknown ids are ignored.
  void abort(const std::string& request_id);
  // Aborts every request (shutdown).
  void abort_all();
  // One iteration: no-op when there is nothing to run.
  void step();
  bool has_work() const { return scheduler_->has_work(); }
  EngineStats stats() const;
  // KV-cache events (cache/kv_events.hpp) of the prefix cache, from now on; the draft model's
  // pool never has any. take_kv_events(): those recorded since the last call.
  void enable_kv_events() { blocks_->enable_events(); }
  std::vector<KvCacheEvent> take_kv_events() { return blocks_->take_events(); }
  // Nothing cached stays hittable; running sequences keep their blocks (POST /reset_prefix_cache).
  void reset_prefix_cache() { blocks_->reset_prefix_cache(); }

  const ModelConfig& model_config() const { return transformer_->config(); }
  const Tokenizer& tokenizer() const { return *model_.tokenizer; }
  const LoadedModel& model() const { return model_; }  // weights already dropped
  const EngineOptions& options() const { return options_; }
  const BlockManager& block_manager() const { return *blocks_; }
  const KvSaturationCounters& saturation() const { return saturation_; }
  uint64_t kv_cache_bytes() const { return transformer_->kv_cache_bytes(); }  // the main pool
  uint64_t kv_tail_bytes() const { return transformer_->tail_bytes(); }       // the bf16 window's
  const Transformer& transformer() const { return *transformer_; }
  uint64_t weight_bytes() const { return transformer_->weight_bytes(); }
  int num_requests() const { return static_cast<int>(requests_.size()); }
  // The ids that end a sequence (the model's EOS): structured outputs allow them once complete.
  const std::vector<int32_t>& stop_token_ids() const { return stop_ids_; }
  // Time spent computing and applying token masks (structured outputs), and how many.
  double grammar_mask_seconds() const { return grammar_mask_seconds_; }
  // Budget checks of structured outputs (token-level shortest closing), summed over steps.
  double grammar_budget_seconds() const { return grammar_budget_seconds_; }
  int64_t grammar_mask_count() const { return grammar_mask_count_; }
  const SpecDecodeCounters& spec_decode() const { return spec_counters_; }
  const DraftModel* draft() const { return draft_.get(); }  // --speculative-method draft, else null

 private:
  friend struct EngineTestAccess;
  static constexpr const char* kNoContinuation = "structured output: no token can continue the text the schema requires";
  struct RequestState {
    GenerationRequest request;
    OutputSink sink;
    std::vector<SeqId> seq_ids;  // per choice
    int num_unfinished = 0;
    double queue_s = -1;  // set when one of its sequences is first scheduled
    // Prompt logprobs (num_prompt_logprobs >= 0): [prompt tokens - 1], filled in prefill;
    // positions [0, num_scored) are done (a recompute after preemption skips them).
    std::vector<SampleResult> prompt_logprobs;
    int num_scored = 0;
  };
  struct SeqState {
    std::string request_id;
    int index = 0;
    Sampler sampler;
    IncrementalDetokenizer detokenizer;
    StopChecker stop_checker;
    int num_generated = 0;
    bool scheduled = false;  // has run in a step (its request's queue time is then known)
    std::unique_ptr<grammar::GrammarMatcher> matcher;  // structured output, else null
    bool prompt_logprobs_sent = false;  // with the choice's first output
    bool budget_free = false;  // no complete document fits in the budget: it cuts the text
    AcceptanceGate gate;       // speculative decoding: proposals pause while rarely accepted
  };
  // A speculating sequence's rows in the step's logits: row, row + 1, ... one per proposal + 1.
  struct Verify {
    SeqId id;
    std::size_t row;
    const std::vector<int32_t>* proposals;
  };

  // Requests in and out (engine.cpp).
  void reject(const GenerationRequest& request, const OutputSink& sink, const std::string& message);
  std::string validate(const GenerationRequest& request) const;
  void on_token(SeqId id, const SampleResult& sample);
  void finish_seq(SeqId id, RequestOutput& out, FinishReason reason);
  void fail_all(const std::string& message);
  // A request's prompt logprobs go out with each choice's first output.
  void attach_prompt_logprobs(SeqState& seq, RequestOutput& out);

  // The step's stages, in order.
  // 1. Step inputs: the plan's chunks over the block tables (inputs_), the rows that score
  //    prompt tokens (scorer_), the queue time of requests seen for the first time.
  void prepare_inputs(const StepPlan& plan);
  // How the step's tokens are sampled: from the logits on the host (none), or on a backend that
  // samples: greedy picks, or the top-k prefilter's candidates (rows they cannot decide come back).
  enum class DeviceSampling : uint8_t { none, greedy, candidates };
  // 2. Forward: copy-on-write, the model, then (device sampling) the logit processing and the
  //    picks or candidates where the logits are.
  DeviceSampling run_forward(const StepPlan& plan);
  // 3. The step's KV is committed: calibrated scales to the block manager, the tokens computed
  //    (Scheduler::on_step_done: scales freeze, forks happen), the forks' window rings copied.
  void commit_kv(const StepPlan& plan);
  // 4. Step outputs: every sampling row's token (step_outputs.cpp), handed on in plan order.
  void process_outputs(const StepPlan& plan, DeviceSampling sampling);

  // Sampling and verification (step_outputs.cpp).
  DeviceSampling device_sampling(const StepPlan& plan) const;
  // Adds the rows of `s` that score prompt tokens, its first token row being first_row.
  void add_score_rows(const ScheduledSeq& s, int32_t first_row);
  // The token of one of the step's rows, drawn from the device's picks or candidates: nullopt
  // when the candidates cannot decide it (the caller samples the downloaded row itself).
  std::optional<SampleResult> sample_on_device(DeviceSampling sampling, Sampler& sampler, std::size_t row);
  // Samples a speculating sequence's rows in order (sample_row: the token of one row of the
  // step, nullopt when the grammar ends the sequence), handing out each token, up to the first
  // one that differs from its proposal (server/engine/speculation.hpp); the rest are rolled back.
  using VerifySampleFn = std::function<std::optional<SampleResult>(SeqId id, SeqState& seq, std::size_t row)>;
  void verify(const Verify& v, const VerifySampleFn& sample_row);
  // 5. Speculative decoding: proposals for the next step's decodes (Scheduler::draft_candidates),
  //    ngram or the draft model's (batched), handed to the scheduler.
  void propose_drafts();

  // Structured outputs (structured_sampling.cpp).
  // A structured output's next token, sampled from row_ (a copy of `logits`) among those the
  // grammar allows and the token budget can still finish; the accepted token, or nullopt once
  // the sequence has finished (complete, or an error).
  std::optional<SampleResult> sample_structured(SeqId id, SeqState& seq, std::span<const float> logits);
  // The same for a row the device sampled after the grammar's mask joined its processing
  // (run_forward): `sample`, the device's token (nullopt: its candidates could not decide), and
  // `row`, the step's row to download for what the host must sample itself.
  std::optional<SampleResult> sample_structured_on_device(SeqId id, SeqState& seq, std::optional<SampleResult> sample,
                                                          int64_t row);
  // The budget check that ends both: `sample` stands if the document can still end within the
  // budget after it, else it is sampled again (resample(mask): among the tokens of `mask`).
  std::optional<SampleResult> check_structured(SeqId id, SeqState& seq, SampleResult sample,
                                               const std::function<SampleResult(std::span<const uint64_t>)>& resample);
  std::nullopt_t fail_structured(SeqId id, const char* message);
  // The grammar's next-token bitmask into token_mask_ (timed for the metrics), applied to `row`
  // if given; false when no token can continue.
  bool fill_token_mask(SeqState& seq, std::span<float> row = {});
  int64_t tokens_left(const SeqState& seq) const;  // tokens the sequence may still generate

  // The constructor's parts (engine_startup.cpp).
  void size_kv_cache();
  void log_speculation() const;
  void log_startup();  // and captures the decode graphs, between its device and model lines

  // The KV budget (bytes) as start-up split it (size_kv_cache), for the start-up log.
  struct KvSizing {
    KvCacheSpec spec;     // the pool's, with the window that fit
    KvWindow asked_window;  // the window asked for (--kv-bf16-window)
    uint64_t ring_bytes = 0;  // one ring of the asked window
    uint64_t bytes = 0;       // the KV budget: the pool and the tail (the draft's share taken out)
    std::string bytes_source;  // what set it, for the log
    int num_blocks = 0;
    int num_rings = 0;
  };

  LoadedModel model_;
  EngineOptions options_;
  KvSizing kv_;
  // Off (tests only, tests/unit/engine/engine_test_access.hpp): the host samples every row, so
  // that tests compare device sampling with it.
  bool device_sampling_ = true;
  Device device_;
  std::unique_ptr<Transformer> transformer_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<DraftModel> draft_;
  KvSaturationCounters saturation_;
  std::vector<int32_t> stop_ids_;  // the model's EOS ids

  std::map<std::string, RequestState> requests_;
  std::unordered_map<SeqId, SeqState> seqs_;
  SeqId next_seq_id_ = 0;
  std::mt19937_64 seed_rng_;  // fallback seeds for requests without one

  // Step scratch, reused so a decode step allocates little.
  std::unique_ptr<StepInputs> inputs_;  // over blocks_
  std::vector<int32_t> batch_index_;  // [plan.seqs]: the sequence's first row in the forward batch
  std::vector<BlockCopy> tail_copies_;
  PromptScorer scorer_;
  std::vector<float> row_, inv_temperature_;
  std::vector<uint8_t> raw_sum_wanted_;  // per candidates row: its request asks for logprobs
  LogitProcessingBatch processing_;  // device sampling: the step's logit processing (sampling.hpp)
  HostArray<float> logits_;  // the sampled rows' logits: pinned on a GPU, one DMA per step
  std::span<const GreedyRow> picks_;        // device sampling, greedy: the step's picks
  Transformer::Candidates candidates_;      // device sampling, candidates: the step's
  std::vector<uint64_t> token_mask_;
  std::vector<SeqId> dead_ends_;  // device sampling: structured outputs no token can continue
  double grammar_mask_seconds_ = 0;
  double grammar_budget_seconds_ = 0;
  int64_t grammar_mask_count_ = 0;
  std::vector<KvWriteCounts> step_counts_;
  std::vector<std::vector<int32_t>> proposals_;  // propose_drafts(): [draft candidates]
  SpecDecodeCounters spec_counters_;
};

}  // namespace fp8serve
