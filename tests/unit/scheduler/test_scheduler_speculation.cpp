// Speculative decoding's scheduling and rollback against a real BlockManager, no model: proposals
// take 1 + K of the budget and only blocks no decode needs; accepted proposals count as computed
// (their full blocks reach the prefix cache); rejected ones leave no token, block, key or slot
// behind (Scheduler::check_integrity after every call, and the free count is checked).
#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

#include "server/engine/scheduler.hpp"

using namespace fp8serve;

namespace {

BlockManager make_blocks(int num_blocks, bool prefix_caching, KvWindow window = {}, int num_rings = 0) {
  BlockManagerOptions options;
  options.block_size = 4;
  options.num_layers = 2;
  options.num_blocks = num_blocks;
  options.enable_prefix_caching = prefix_caching;
  options.window = window;
  options.num_tail_rings = num_rings;
  return BlockManager(options);
}

std::vector<int32_t> iota_prompt(int length) {
  std::vector<int32_t> prompt(static_cast<std::size_t>(length));
  std::iota(prompt.begin(), prompt.end(), 100);
  return prompt;
}

// Prefills sequence 0 and appends its first token: the next step decodes.
void prefill(Scheduler& scheduler, int32_t first_token) {
  StepPlan plan = scheduler.schedule();
  REQUIRE(plan.seqs.size() == 1);
  scheduler.on_step_done(plan);
  scheduler.check_integrity();
  scheduler.append_token(0, first_token);
}

// What the engine does after each step: proposals for every sequence that may speculate next.
void propose(Scheduler& scheduler, const std::vector<int32_t>& tokens) {
  for (const SeqId id : scheduler.draft_candidates()) scheduler.set_draft_tokens(id, tokens);
}

}  // namespace

TEST_CASE("speculation: proposals take 1 + K of the budget; rejected ones are rolled back exactly", "[scheduler][spec]") {
  BlockManager blocks = make_blocks(16, /*prefix_caching=*/true);
  Scheduler scheduler(SchedulerOptions{4, 64, 5, 4}, blocks);
  std::vector<int32_t> proposed{7, 8, 9, 10, 11, 12};  // more than K: the scheduler keeps K
  scheduler.add(0, iota_prompt(6));
  prefill(scheduler, 6);
  const int free_before = blocks.num_free_blocks();  // 7 tokens: 2 blocks

  CHECK(scheduler.draft_candidates() == std::vector<SeqId>{0});
  propose(scheduler, proposed);
  StepPlan plan = scheduler.schedule();
  REQUIRE(plan.seqs.size() == 1);
  const ScheduledSeq& s = plan.seqs[0];
  CHECK(s.start == 6);
  CHECK(s.num_tokens == 6);
  CHECK(s.proposals == std::vector<int32_t>{7, 8, 9, 10, 11});
  CHECK(plan.num_tokens == 6);
  CHECK(blocks.num_tokens(0) == 12);  // 3 blocks now
  CHECK(blocks.num_free_blocks() == free_before - 1);
  scheduler.on_step_done(plan);
  scheduler.check_integrity();
  CHECK(blocks.num_computed_tokens(0) == 7);

  // The engine samples 7 (= proposal 0), 8 (= proposal 1), then 42 instead of 9.
  scheduler.append_token(0, 7);
  scheduler.accept_proposed(0);
  scheduler.check_integrity();
  scheduler.append_token(0, 8);
  scheduler.accept_proposed(0);  // 9 tokens computed: blocks 0 and 1 full and cached
  scheduler.append_token(0, 42);
  CHECK_THROWS_AS(scheduler.accept_proposed(0), std::logic_error);  // 42 was not proposed
  scheduler.end_speculation(0);
  scheduler.check_integrity();
  CHECK(blocks.num_tokens(0) == 9);
  CHECK(blocks.num_computed_tokens(0) == 9);
  CHECK(blocks.num_free_blocks() == free_before - 1);  // the third block holds token 8
  const std::vector<int32_t> expected{100, 101, 102, 103, 104, 105, 6, 7, 8};
  std::vector<int32_t> with_42 = expected;  // the scheduler's tokens: the verified ones, then 42
  with_42.push_back(42);
  CHECK(std::vector<int32_t>(scheduler.tokens(0).begin(), scheduler.tokens(0).end()) == with_42);
  // Another prompt with the verified prefix hits the cached blocks (8 tokens: 2 full blocks).
  std::vector<int32_t> hit = expected;
  hit.push_back(55);
  CHECK(blocks.num_cached_prefix_tokens(hit) == 8);
  // ... and one that follows the rejected proposals does not get past them.
  std::vector<int32_t> rejected{100, 101, 102, 103, 104, 105, 6, 7, 8, 9, 10, 11, 12};
  CHECK(blocks.num_cached_prefix_tokens(rejected) == 8);

  // The next decode places 42 where 9 was proposed (the proposals were for token 7's decode).
  plan = scheduler.schedule();
  REQUIRE(plan.seqs.size() == 1);
  CHECK(plan.seqs[0].start == 9);
  CHECK(plan.seqs[0].num_tokens == 1);
  CHECK(plan.seqs[0].proposals.empty());
  CHECK(blocks.num_tokens(0) == 10);  // 42's slot, where 9's was
  scheduler.on_step_done(plan);
  scheduler.check_integrity();
  scheduler.finish(0);
  scheduler.check_integrity();
  CHECK(blocks.num_free_blocks() == 16);
}

TEST_CASE("speculation: the budget, the pool and the batch size cap the proposals", "[scheduler][spec]") {
  SECTION("budget") {
    BlockManager blocks = make_blocks(16, false);
    Scheduler scheduler(SchedulerOptions{4, 16, 8, 4}, blocks);
    scheduler.add(0, iota_prompt(6));
    prefill(scheduler, 6);
    propose(scheduler, std::vector<int32_t>(8, 5));
    scheduler.add(1, iota_prompt(12));  // waits: the decode's proposals take the budget first
    const StepPlan plan = scheduler.schedule();
    REQUIRE(plan.seqs.size() == 2);
    CHECK(plan.seqs[0].proposals.size() == 8);
    CHECK(plan.seqs[1].num_tokens == 16 - 9);
    CHECK(plan.num_tokens == 16);
  }
  SECTION("pool: proposals stop where the pool does, never preempting") {
    BlockManager blocks = make_blocks(3, false);
    Scheduler scheduler(SchedulerOptions{4, 64, 8, 4}, blocks);
    scheduler.add(0, iota_prompt(6));
    prefill(scheduler, 6);
    propose(scheduler, std::vector<int32_t>(8, 5));
    const StepPlan plan = scheduler.schedule();
    REQUIRE(plan.seqs.size() == 1);
    CHECK(plan.preempted.empty());
    CHECK(plan.seqs[0].proposals.size() == 5);  // 12 tokens fill the 3 blocks
    CHECK(blocks.num_free_blocks() == 0);
  }
  SECTION("batch size: no proposals above disable_by_batch_size decoding sequences") {
    BlockManager blocks = make_blocks(32, false);
    Scheduler scheduler(SchedulerOptions{4, 64, 3, 1}, blocks);
    scheduler.add(0, iota_prompt(5));
    scheduler.add(1, iota_prompt(5));
    StepPlan plan = scheduler.schedule();
    scheduler.on_step_done(plan);
    scheduler.append_token(0, 1);
    scheduler.append_token(1, 1);
    CHECK(scheduler.draft_candidates().empty());  // nobody is asked for proposals
    for (const SeqId id : {0, 1}) scheduler.set_draft_tokens(id, std::vector<int32_t>{1});  // and any made are not used
    plan = scheduler.schedule();
    CHECK(plan.seqs.size() == 2);
    CHECK(plan.num_tokens == 2);
  }
}

TEST_CASE("speculation with the bf16 window: proposals never move the step's FP8 boundary", "[scheduler][spec][window]") {
  const KvWindow window{8, true, 4};  // fp8_len(n) = (n - 8) / 4 * 4
  BlockManager blocks = make_blocks(16, true, window, 2);
  Scheduler scheduler(SchedulerOptions{4, 64, 6, 4}, blocks);
  scheduler.add(0, iota_prompt(9));
  prefill(scheduler, 9);
  for (int step = 0; step < 12; ++step) {
    const int n = static_cast<int>(scheduler.tokens(0).size());
    propose(scheduler, std::vector<int32_t>(6, 5));
    const StepPlan plan = scheduler.schedule();
    REQUIRE(plan.seqs.size() == 1);
    const int k = static_cast<int>(plan.seqs[0].proposals.size());
    INFO("step " << step << ", " << n << " tokens, " << k << " proposals");
    CHECK(blocks.fp8_len_after(0, n + k) == blocks.fp8_len_after(0, n));
    CHECK((k == 6 || blocks.fp8_len_after(0, n + k + 1) != blocks.fp8_len_after(0, n)));
    scheduler.on_step_done(plan);
    scheduler.check_integrity();
    // Accept the first proposal when there is one, reject the rest.
    scheduler.append_token(0, 5);
    if (k > 0) {
      scheduler.accept_proposed(0);
      scheduler.append_token(0, 6);
    }
    scheduler.end_speculation(0);
    scheduler.check_integrity();
  }
}

TEST_CASE("speculation on a backend batch invariant up to N tokens: no proposal beside a prefill, at most N tokens",
          "[scheduler][spec]") {
  BlockManager blocks = make_blocks(32, /*prefix_caching=*/false);
  // K = 5, speculation at any batch size, steps of at most 4 tokens when they carry proposals.
  Scheduler scheduler(SchedulerOptions{4, 64, 5, 4, /*max_speculative_step_tokens=*/4}, blocks);
  const std::vector<int32_t> proposed{7, 8, 9, 10, 11};
  scheduler.add(0, iota_prompt(6));
  prefill(scheduler, 6);

  // A waiting request's prefill shares the step: no proposals.
  propose(scheduler, proposed);
  scheduler.add(1, iota_prompt(5));
  StepPlan plan = scheduler.schedule();
  REQUIRE(plan.seqs.size() == 2);
  CHECK(plan.seqs[0].proposals.empty());
  CHECK(plan.num_tokens == 1 + 5);
  scheduler.on_step_done(plan);
  scheduler.append_token(0, 7);
  scheduler.append_token(1, 20);
  scheduler.check_integrity();

  // Two decodes and no prefill: proposals fill the step up to 4 tokens, in plan order.
  propose(scheduler, proposed);
  plan = scheduler.schedule();
  REQUIRE(plan.seqs.size() == 2);
  // 4 - the two decodes' tokens, all to the first sequence
  CHECK(plan.seqs[0].proposals == std::vector<int32_t>{7, 8});
  CHECK(plan.seqs[1].proposals.empty());
  CHECK(plan.num_tokens == 4);
  scheduler.on_step_done(plan);
  scheduler.append_token(0, 99);  // proposal 0 rejected
  scheduler.end_speculation(0);
  scheduler.append_token(1, 21);
  scheduler.check_integrity();
  CHECK(blocks.num_tokens(0) == 8);  // the prompt, 6 and 7: both proposals rolled back (99 decodes next)
}
