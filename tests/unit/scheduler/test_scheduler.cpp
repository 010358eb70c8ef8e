// The scheduler against a real BlockManager with fake sequences: no model, tokens are a
// function of (sequence, position), so every outcome is predictable by hand.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "server/engine/scheduler.hpp"

using namespace fp8serve;

namespace {

std::vector<int32_t> make_prompt(int length, int32_t first) {
  std::vector<int32_t> prompt(static_cast<std::size_t>(length));
  std::iota(prompt.begin(), prompt.end(), first);
  return prompt;
}

BlockManager make_blocks(int num_blocks, bool prefix_caching = false, int block_size = 4) {
  BlockManagerOptions options;
  options.block_size = block_size;
  options.num_layers = 2;
  options.num_blocks = num_blocks;
  options.enable_prefix_caching = prefix_caching;
  return BlockManager(options);
}

// What the engine does after a forward pass: calibrated scales are written (a fake value per
// sequence), the plan is committed, sampled tokens appended unless the sequence is done.
struct FakeEngine {
  BlockManager& blocks;
  Scheduler& scheduler;
  std::map<SeqId, int> max_tokens;  // generated tokens each sequence wants
  std::map<SeqId, std::vector<int32_t>> generated;
  std::map<SeqId, std::vector<float>> calibrated;  // k scales seen at calibration

  static int32_t token_for(SeqId id, std::size_t position) {
    return static_cast<int32_t>(1000 + id * 100 + static_cast<int64_t>(position));
  }

  StepPlan step() {
    StepPlan plan = scheduler.schedule();
    for (const ScheduledSeq& s : plan.seqs) {
      if (!s.calibrate) continue;
      KvScales* scales = blocks.scales_to_calibrate(s.id);
      REQUIRE(scales != nullptr);
      std::fill(scales->k.begin(), scales->k.end(), 0.5f + static_cast<float>(s.id));
      std::fill(scales->v.begin(), scales->v.end(), 0.25f + static_cast<float>(s.id));
      calibrated[s.id] = scales->k;
    }
    scheduler.on_step_done(plan);
    for (const ScheduledSeq& s : plan.seqs) {
      if (!s.samples) continue;
      std::vector<SeqId> ids{s.id};
      ids.insert(ids.end(), s.forks.begin(), s.forks.end());
      for (const SeqId id : ids) {
        auto& out = generated[id];
        out.push_back(token_for(id, scheduler.tokens(id).size()));
        if (static_cast<int>(out.size()) >= max_tokens[id]) {
          scheduler.finish(id);
        } else {
          scheduler.append_token(id, out.back());
        }
      }
    }
    scheduler.check_integrity();
    return plan;
  }
};

}  // namespace

TEST_CASE("chunked prefill: a long prompt takes several steps, calibrating only on the first", "[scheduler]") {
  BlockManager blocks = make_blocks(64);
  Scheduler scheduler({8, 8}, blocks);
  FakeEngine engine{blocks, scheduler, {{0, 3}}, {}, {}};
  scheduler.add(0, make_prompt(20, 1));

  StepPlan p1 = engine.step();
  REQUIRE(p1.seqs.size() == 1);
  CHECK(p1.seqs[0].start == 0);
  CHECK(p1.seqs[0].num_tokens == 8);
  CHECK(p1.seqs[0].calibrate);
  CHECK_FALSE(p1.seqs[0].samples);
  StepPlan p2 = engine.step();
  CHECK(p2.seqs[0].start == 8);
  CHECK(p2.seqs[0].num_tokens == 8);
  CHECK_FALSE(p2.seqs[0].calibrate);
  CHECK_FALSE(p2.seqs[0].samples);
  StepPlan p3 = engine.step();
  CHECK(p3.seqs[0].start == 16);
  CHECK(p3.seqs[0].num_tokens == 4);
  CHECK(p3.seqs[0].samples);
  CHECK(blocks.scales(0).frozen);
  // Decodes: one token each, at the position of the token sampled last.
  StepPlan p4 = engine.step();
  CHECK(p4.seqs[0].start == 20);
  CHECK(p4.seqs[0].num_tokens == 1);
  engine.step();
  CHECK_FALSE(scheduler.has_work());
  CHECK(engine.generated[0].size() == 3);
  CHECK(blocks.num_free_blocks() == blocks.num_blocks());
}

TEST_CASE("running sequences decode first; the leftover budget admits waiting prompts FCFS", "[scheduler]") {
  BlockManager blocks = make_blocks(64);
  Scheduler scheduler({3, 6}, blocks);
  FakeEngine engine{blocks, scheduler, {{0, 10}, {1, 10}, {2, 10}, {3, 10}}, {}, {}};
  scheduler.add(0, make_prompt(5, 1));
  engine.step();  // prefill of 0 (5 tokens)
  scheduler.add(1, make_prompt(9, 1));
  scheduler.add(2, make_prompt(2, 1));
  scheduler.add(3, make_prompt(2, 1));

  StepPlan p = engine.step();
  REQUIRE(p.seqs.size() == 2);
  CHECK(p.seqs[0].id == 0);  // decode first
  CHECK(p.seqs[0].num_tokens == 1);
  CHECK(p.seqs[1].id == 1);  // then 5 tokens of 1's prefill: the budget is 6
  CHECK(p.seqs[1].num_tokens == 5);
  CHECK(p.num_tokens == 6);
  CHECK(scheduler.num_waiting() == 2);  // 2 waits behind 1 (FCFS), even though it is short

  p = engine.step();  // 0 decodes, 1 finishes its prefill (4), 2 gets admitted (budget 1)
  REQUIRE(p.seqs.size() == 3);
  CHECK(p.seqs[1].id == 1);
  CHECK(p.seqs[1].num_tokens == 4);
  CHECK(p.seqs[1].samples);
  CHECK(p.seqs[2].id == 2);
  CHECK(p.seqs[2].num_tokens == 1);
  // max_num_seqs = 3 keeps 3 waiting while 0, 1 and 2 run.
  for (int i = 0; i < 5; ++i) {
    p = engine.step();
    CHECK(p.num_tokens <= 6);
    CHECK(scheduler.num_running() <= 3);
    CHECK(std::none_of(p.seqs.begin(), p.seqs.end(), [](const ScheduledSeq& s) { return s.id == 3; }));
  }
  while (scheduler.has_work()) engine.step();
  for (SeqId id = 0; id < 4; ++id) CHECK(engine.generated[id].size() == 10);
  CHECK(blocks.num_free_blocks() == blocks.num_blocks());
}

TEST_CASE("preemption: the newest running sequence is recomputed later with its frozen scales", "[scheduler]") {
  // 6 blocks of 4 tokens. Two sequences of 8-token prompts (2 blocks each) grow until the pool
  // runs out; the newer one must give way and come back with the same tokens and scales.
  BlockManager blocks = make_blocks(6);
  Scheduler scheduler({4, 64}, blocks);
  FakeEngine engine{blocks, scheduler, {{0, 9}, {1, 9}}, {}, {}};
  scheduler.add(0, make_prompt(8, 1));
  scheduler.add(1, make_prompt(8, 50));
  engine.step();
  const std::vector<float> scales_1 = blocks.scales(1).k;

  bool saw_preemption = false;
  bool saw_recompute = false;
  while (scheduler.has_work()) {
    const std::vector<int32_t> tokens_before =
        scheduler.contains(1) ? std::vector<int32_t>(scheduler.tokens(1).begin(), scheduler.tokens(1).end())
                              : std::vector<int32_t>{};
    StepPlan p = engine.step();
    if (!p.preempted.empty()) {
      saw_preemption = true;
      CHECK(p.preempted == std::vector<SeqId>{1});
      CHECK_FALSE(blocks.contains(1));
      CHECK(scheduler.num_waiting() == 1);
    }
    for (const ScheduledSeq& s : p.seqs) {
      if (s.id == 1 && s.start == 0 && saw_preemption) {
        saw_recompute = true;
        CHECK(s.num_tokens == static_cast<int>(tokens_before.size()));  // prompt + generated
        CHECK_FALSE(s.calibrate);                                      // scales restored
        CHECK(s.samples);
        CHECK(blocks.scales(1).k == scales_1);
      }
    }
  }
  CHECK(saw_preemption);
  CHECK(saw_recompute);
  CHECK(scheduler.num_preemptions() >= 1);
  // Same tokens as if nothing had happened: token_for depends only on (id, position).
  for (SeqId id : {0, 1}) {
    REQUIRE(engine.generated[id].size() == 9);
    for (std::size_t i = 0; i < 9; ++i) CHECK(engine.generated[id][i] == FakeEngine::token_for(id, 8 + i));
  }
  CHECK(engine.calibrated.size() == 2);  // each sequence calibrated exactly once
  CHECK(blocks.num_free_blocks() == blocks.num_blocks());
}

TEST_CASE("a sequence alone that outgrows the pool preempts itself only when nothing else can go", "[scheduler]") {
  BlockManager blocks = make_blocks(3);
  Scheduler scheduler({4, 64}, blocks);
  FakeEngine engine{blocks, scheduler, {{0, 4}}, {}, {}};
  scheduler.add(0, make_prompt(6, 1));
  while (scheduler.has_work()) {
    const StepPlan p = engine.step();
    CHECK(p.preempted.empty());
  }
  CHECK(engine.generated[0].size() == 4);  // 6 + 4 = 10 tokens <= 12 slots
}

TEST_CASE("n > 1: forks share the prompt's blocks and copy the partial last block on write", "[scheduler]") {
  BlockManager blocks = make_blocks(16);
  Scheduler scheduler({4, 64}, blocks);
  FakeEngine engine{blocks, scheduler, {{0, 3}, {1, 3}, {2, 3}}, {}, {}};
  const std::vector<SeqId> forks{1, 2};
  scheduler.add(0, make_prompt(6, 1), forks);  // 6 tokens: one full block, one partial
  StepPlan p = engine.step();
  REQUIRE(p.seqs.size() == 1);
  CHECK(p.seqs[0].forks == forks);
  CHECK(scheduler.num_running() == 3);
  CHECK(blocks.block_table(1)[0] == blocks.block_table(0)[0]);
  CHECK(blocks.num_free_blocks() == 16 - 2);  // shared, not copied yet
  CHECK(blocks.scales(1) == blocks.scales(0));

  const int32_t shared_partial = blocks.block_table(0)[1];
  p = engine.step();  // three decodes; the first two copy the shared partial block, the last
                      // holder keeps it
  CHECK(p.seqs.size() == 3);
  CHECK(p.block_copies.size() == 2);
  for (const BlockCopy& c : p.block_copies) CHECK(c.src == shared_partial);
  CHECK(blocks.block_table(2)[1] == shared_partial);
  CHECK(blocks.block_table(0)[1] != blocks.block_table(1)[1]);
  while (scheduler.has_work()) engine.step();
  CHECK(engine.generated[1].size() == 3);
  CHECK(blocks.num_free_blocks() == blocks.num_blocks());
}

TEST_CASE("finish() of a waiting or running sequence returns its blocks", "[scheduler]") {
  BlockManager blocks = make_blocks(16);
  Scheduler scheduler({1, 64}, blocks);
  scheduler.add(0, make_prompt(5, 1));
  scheduler.add(1, make_prompt(5, 1));
  StepPlan p = scheduler.schedule();
  scheduler.on_step_done(p);
  CHECK(scheduler.num_running() == 1);
  scheduler.finish(1);  // waiting
  scheduler.finish(0);  // running
  scheduler.finish(7);  // unknown: ignored
  CHECK_FALSE(scheduler.has_work());
  CHECK(blocks.num_free_blocks() == blocks.num_blocks());
  scheduler.check_integrity();
}

TEST_CASE("random workloads: budgets hold, every sequence completes, no block leaks", "[scheduler]") {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    const int num_blocks = 8 + static_cast<int>(rng() % 24);
    const bool caching = trial % 2 == 0;
    BlockManager blocks = make_blocks(num_blocks, caching);
    const SchedulerOptions options{1 + static_cast<int>(rng() % 6), 4 + static_cast<int>(rng() % 30)};
    Scheduler scheduler(options, blocks);
    FakeEngine engine{blocks, scheduler, {}, {}, {}};
    const int num_seqs = 1 + static_cast<int>(rng() % 10);
    for (SeqId id = 0; id < num_seqs; ++id) {
      const int prompt = 1 + static_cast<int>(rng() % 20);
      const int max_tokens = 1 + static_cast<int>(rng() % 12);
      if ((prompt + max_tokens + 3) / 4 > num_blocks) continue;  // the engine rejects these
      engine.max_tokens[id] = max_tokens;
      // Shared prefixes (same first token) exercise the prefix cache.
      scheduler.add(id, make_prompt(prompt, static_cast<int32_t>(rng() % 2)));
    }
    int steps = 0;
    while (scheduler.has_work() && steps < 2000) {
      const StepPlan p = engine.step();
      CHECK(p.num_tokens <= options.max_num_batched_tokens);
      CHECK(scheduler.num_running() <= options.max_num_seqs);
      ++steps;
    }
    REQUIRE_FALSE(scheduler.has_work());
    for (const auto& [id, wanted] : engine.max_tokens) {
      REQUIRE(static_cast<int>(engine.generated[id].size()) == wanted);
      for (std::size_t i = 0; i < engine.generated[id].size(); ++i) {
        // Position of generated token i is prompt + i whatever preemptions happened.
        CHECK(engine.generated[id][i] - engine.generated[id][0] == static_cast<int32_t>(i));
      }
    }
    CHECK(blocks.num_seqs() == 0);
    CHECK(blocks.num_free_blocks() == blocks.num_blocks());
  }
}

TEST_CASE("bf16 window: a recompute replays the original steps' FP8 lengths, from a hit it can use", "[scheduler][window]") {
  // Blocks of 4, window 4: a step ending at n tokens reads floor((n - 4) / 4) * 4 from FP8.
  // Sequence 1 (8-token prompt) decodes next to 0 (16 tokens) until the 12-block pool runs out
  // and 1 is preempted with 20 tokens computed: its prompt step and its decode steps ending at
  // 9, 10 and 11 read [0, 4) from FP8, those ending at 12-15 [0, 8), 16-19 [0, 12), 20 [0, 16).
  // Its recompute replays that: chunks ending at 11, 15, 19 and 20 with those FP8 lengths as
  // floors (one prefill would read [0, 16) for all of them), then the token sampled last, as a
  // decode would. With prefix caching its hit is 4 tokens: the step that computed token 4
  // read only [0, 4) from FP8 (a hit of 8 would have it read [0, 8)).
  for (const bool prefix_caching : {false, true}) {
    BlockManagerOptions options;
    options.block_size = 4;
    options.num_layers = 2;
    options.num_blocks = 12;
    options.enable_prefix_caching = prefix_caching;
    options.window = KvWindow{4, true, 4};
    options.num_tail_rings = 4;
    BlockManager blocks(options);
    Scheduler scheduler({4, 64}, blocks);
    FakeEngine engine{blocks, scheduler, {{0, 20}, {1, 20}}, {}, {}};
    scheduler.add(0, make_prompt(16, 1));
    scheduler.add(1, make_prompt(8, 500));
    std::vector<ScheduledSeq> recompute;
    int num_preempted = 0;
    while (scheduler.has_work() && (recompute.empty() || !recompute.back().samples)) {
      const StepPlan plan = engine.step();
      num_preempted += static_cast<int>(plan.preempted.size());
      for (const ScheduledSeq& s : plan.seqs) {
        if (s.id == 1 && num_preempted > 0) recompute.push_back(s);
      }
    }
    INFO("prefix caching " << prefix_caching);
    REQUIRE(num_preempted == 1);
    struct Chunk {
      int start, end, floor;
    };
    const std::vector<Chunk> expected{{prefix_caching ? 4 : 0, 11, 4}, {11, 15, 8}, {15, 19, 12}, {19, 20, 16}, {20, 21, 0}};
    REQUIRE(recompute.size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      INFO("recompute step " << i);
      CHECK(recompute[i].start == expected[i].start);
      CHECK(recompute[i].start + recompute[i].num_tokens == expected[i].end);
      CHECK(recompute[i].fp8_floor == expected[i].floor);
      CHECK(recompute[i].samples == (i + 1 == expected.size()));
    }
    CHECK(blocks.num_fp8_tokens(1) == 16);  // the step ending at 21 reads [0, 16): the decode's rule
  }
}

TEST_CASE("a sequence added without the prefix cache computes its whole prompt", "[scheduler][prefix]") {
  BlockManager blocks = make_blocks(64, /*prefix_caching=*/true);
  Scheduler scheduler({8, 64}, blocks);
  FakeEngine engine{blocks, scheduler, {{0, 1}, {1, 1}, {2, 1}}, {}, {}};
  scheduler.add(0, make_prompt(20, 1));
  engine.step();  // prefilled, sampled, finished: its 4 full blocks stay cached
  scheduler.add(1, make_prompt(20, 1));
  CHECK(engine.step().seqs.at(0).start == 16);  // a hit of 16 tokens
  scheduler.add(2, make_prompt(20, 1), {}, /*prefix_cache=*/false);  // prompt logprobs: no hit
  const StepPlan plan = engine.step();
  CHECK(plan.seqs.at(0).start == 0);
  CHECK(plan.seqs.at(0).num_tokens == 20);
  CHECK(plan.seqs.at(0).calibrate);  // its own scales, from its own first chunk
}

TEST_CASE("bf16 window: a sequence runs only with a ring; a group waits for rings for all its choices", "[scheduler][window]") {
  BlockManagerOptions options;
  options.block_size = 4;
  options.num_layers = 2;
  options.num_blocks = 64;
  options.window = KvWindow{4, true, 4};
  options.num_tail_rings = 3;
  BlockManager blocks(options);
  Scheduler scheduler({8, 64}, blocks);
  FakeEngine engine{blocks, scheduler, {{0, 4}, {1, 4}, {2, 4}, {3, 4}, {4, 3}, {5, 3}, {6, 3}}, {}, {}};
  scheduler.add(0, make_prompt(6, 1), std::vector<SeqId>{1, 2});  // n = 3: three rings
  scheduler.add(3, make_prompt(6, 100));  // none left: it waits, blocks to spare
  engine.step();
  CHECK(blocks.tail_ring(0) >= 0);
  CHECK(blocks.tail_ring(1) >= 0);
  CHECK(blocks.tail_ring(2) >= 0);
  CHECK_FALSE(blocks.contains(3));
  CHECK(scheduler.num_waiting() == 1);
  CHECK(scheduler.num_ring_waits() == 1);
  // Sequence 3 is admitted once the group's rings come back, with one of them.
  while (blocks.contains(0) || blocks.contains(1) || blocks.contains(2)) {
    engine.step();
    CHECK_FALSE(blocks.contains(3));
  }
  engine.step();
  REQUIRE(blocks.contains(3));
  CHECK(blocks.tail_ring(3) >= 0);
  CHECK(blocks.num_seqs_without_ring() == 0);
  // A group waits for rings for all its choices, never runs some of them without.
  scheduler.add(4, make_prompt(5, 200), std::vector<SeqId>{5, 6});  // n = 3, two rings free
  const uint64_t waits = scheduler.num_ring_waits();
  engine.step();
  CHECK_FALSE(blocks.contains(4));
  CHECK(scheduler.num_ring_waits() == waits + 1);
  while (scheduler.has_work()) engine.step();
  CHECK(engine.generated[1].size() == 4);
  CHECK(engine.generated[3].size() == 4);
  CHECK(engine.generated[6].size() == 3);
  CHECK(blocks.num_seqs_without_ring() == 0);
  CHECK(blocks.num_free_tail_rings() == 3);
  CHECK(blocks.num_free_blocks() == blocks.num_blocks());
}

namespace {

SchedulerOptions priority_options(int max_num_seqs, int max_num_batched_tokens = 64) {
  SchedulerOptions options{max_num_seqs, max_num_batched_tokens};
  options.priority = true;
  return options;
}

bool in_plan(const StepPlan& plan, SeqId id) {
  return std::any_of(plan.seqs.begin(), plan.seqs.end(), [id](const ScheduledSeq& s) { return s.id == id; });
}

}  // namespace

TEST_CASE("priority: the queue runs lower priority first, then by arrival; FCFS ignores it", "[scheduler][priority]") {
  for (const bool priority : {true, false}) {
    BlockManager blocks = make_blocks(64);
    SchedulerOptions options = priority_options(1);
    options.priority = priority;
    Scheduler scheduler(options, blocks);
    FakeEngine engine{blocks, scheduler, {{0, 2}, {1, 2}, {2, 2}, {3, 2}}, {}, {}};
    scheduler.add(0, make_prompt(5, 10), {}, true, 5);
    scheduler.add(1, make_prompt(5, 20), {}, true, 5);
    scheduler.add(2, make_prompt(5, 30), {}, true, -3);
    scheduler.add(3, make_prompt(5, 40), {}, true, 1);
    std::vector<SeqId> order;  // first scheduled
    while (scheduler.has_work()) {
      const StepPlan plan = engine.step();
      for (const ScheduledSeq& s : plan.seqs)
        if (s.calibrate) order.push_back(s.id);
    }
    INFO("priority policy " << priority);
    CHECK(order == (priority ? std::vector<SeqId>{2, 3, 0, 1} : std::vector<SeqId>{0, 1, 2, 3}));
    CHECK(scheduler.num_preemptions() == 0);  // all were waiting when the first was admitted
  }
}

TEST_CASE("priority: a more urgent request preempts the least urgent, newest running one for a seat", "[scheduler][priority]") {
  BlockManager blocks = make_blocks(64);
  Scheduler scheduler(priority_options(2), blocks);
  FakeEngine engine{blocks, scheduler, {{0, 8}, {1, 8}, {2, 3}, {3, 3}}, {}, {}};
  scheduler.add(0, make_prompt(6, 10), {}, true, 5);
  scheduler.add(1, make_prompt(6, 20), {}, true, 5);
  engine.step();
  engine.step();  // both decode
  // Equal priority: waits for a seat, preempts nobody.
  scheduler.add(3, make_prompt(6, 40), {}, true, 5);
  StepPlan plan = engine.step();
  CHECK(plan.preempted.empty());
  CHECK_FALSE(in_plan(plan, 3));
  // More urgent: sequence 1 (priority 5, the newer) is preempted, 2 runs in this very step.
  scheduler.add(2, make_prompt(6, 30), {}, true, 0);
  plan = engine.step();
  CHECK(plan.preempted == std::vector<SeqId>{1});
  CHECK(in_plan(plan, 2));
  CHECK(in_plan(plan, 0));  // the older one of priority 5 keeps decoding
  CHECK(scheduler.counts_by_priority().at(5).num_preemptions == 1);
  CHECK(scheduler.counts_by_priority().at(0).num_running == 1);
  // 1 waits ahead of 3 (same priority, earlier arrival) and is recomputed when a seat frees.
  while (scheduler.has_work()) engine.step();
  CHECK(engine.generated[1].size() == 8);
  CHECK(engine.generated[1] == std::vector<int32_t>{FakeEngine::token_for(1, 6), FakeEngine::token_for(1, 7),
                                                     FakeEngine::token_for(1, 8), FakeEngine::token_for(1, 9),
                                                     FakeEngine::token_for(1, 10), FakeEngine::token_for(1, 11),
                                                     FakeEngine::token_for(1, 12), FakeEngine::token_for(1, 13)});
  CHECK(scheduler.num_preemptions() == 1);
  CHECK(blocks.num_free_blocks() == blocks.num_blocks());
}

TEST_CASE("priority: a more urgent prompt that the pool cannot hold preempts for blocks, and keeps its scales", "[scheduler][priority]") {
  BlockManager blocks = make_blocks(8);  // 32 tokens
  Scheduler scheduler(priority_options(8), blocks);
  FakeEngine engine{blocks, scheduler, {{0, 6}, {1, 6}, {2, 2}}, {}, {}};
  scheduler.add(0, make_prompt(12, 10), {}, true, 1);  // 3 blocks, then 4
  scheduler.add(1, make_prompt(12, 30), {}, true, 2);  // 3 blocks, then 4
  engine.step();
  engine.step();
  const std::vector<float> k1 = blocks.scales(1).k;
  scheduler.add(2, make_prompt(10, 50), {}, true, 0);  // 3 blocks: only 0 or 1 free
  const StepPlan plan = engine.step();
  CHECK(plan.preempted == std::vector<SeqId>{1});  // the less urgent of the two
  CHECK(in_plan(plan, 2));
  bool recomputed = false;
  while (scheduler.has_work()) {
    const StepPlan p = engine.step();
    for (const ScheduledSeq& s : p.seqs)
      if (s.id == 1 && s.start == 0) {
        recomputed = true;
        CHECK_FALSE(s.calibrate);  // the recompute restores the frozen scales
        CHECK(blocks.scales(1).k == k1);
      }
  }
  CHECK(recomputed);
  CHECK(engine.generated[0].size() == 6);
  CHECK(engine.generated[1].size() == 6);
  CHECK(blocks.num_free_blocks() == blocks.num_blocks());
}
