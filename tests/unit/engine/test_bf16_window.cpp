// The bf16 recent window through the whole engine (scheduler, block manager, transformer, CPU
// kernels): batch invariance (bitwise), chunked prefill across the boundary, preemption and
// recompute (layer 0's KV byte for byte), n > 1 forks (their own rings), prefix hits (stopping
// before the window), the tail pool in the memory budget. After every step a watcher reads the
// pools back and checks the contract: a token's FP8 bytes, once written, never change, and a
// token that leaves the tail is FP8 of exactly the bf16 value the tail held.
#include <array>
#include <cstring>

#include "engine_test_access.hpp"
#include "engine_test_util.hpp"
#include "transformer_test_access.hpp"
#include "kernels/bf16.hpp"
#include "kernels/fp8.hpp"

using namespace fp8serve;
using namespace fp8serve::test;

namespace {

EngineOptions window_options(int window, bool values, int block_size = 16) {
  EngineOptions o = small_options(KvDtype::fp8_e4m3);
  o.block_size = block_size;
  o.kv_bf16_window = window;
  o.kv_bf16_window_values = values;
  return o;
}

// What the pools hold for one position of one layer: K and V elements (FP8 codes or bf16 bits).
struct PositionKv {
  bool k_fp8 = false, v_fp8 = false;
  std::vector<uint16_t> k, v;
  bool operator==(const PositionKv&) const = default;
};

// Sequence id's computed positions at `layer`, read from the engine's pools through its block
// table and tail ring by the test's own arithmetic (kernels/paged_kv.hpp's layouts).
std::vector<PositionKv> read_kv(const Engine& engine, SeqId id, int layer) {
  const BlockManager& blocks = engine.block_manager();
  const PagedKvView& pool = TransformerTestAccess::kv_view(engine.transformer(), layer);
  const int bs = pool.block_size, hd = pool.head_dim, nkv = pool.num_kv_heads;
  const auto table = blocks.block_table(id);
  const int num_fp8 = blocks.num_fp8_tokens(id);
  const KvWindow& window = blocks.window();
  std::vector<PositionKv> out(static_cast<std::size_t>(blocks.num_computed_tokens(id)));
  for (int p = 0; p < static_cast<int>(out.size()); ++p) {
    PositionKv& kv = out[static_cast<std::size_t>(p)];
    kv.k_fp8 = p < num_fp8;
    kv.v_fp8 = p < num_fp8 || !window.values;
    const int64_t block = table[static_cast<std::size_t>(p / bs)];
    const int64_t tail_block = window.enabled()
                                   ? static_cast<int64_t>(blocks.tail_ring(id)) * window.ring_blocks() + (p / bs) % window.ring_blocks()
                                   : -1;
    for (int h = 0; h < nkv; ++h) {
      for (int d = 0; d < hd; ++d) {
        const int64_t in_head = (static_cast<int64_t>(block) * nkv + h) * bs * hd;
        const int64_t tail_head = (tail_block * nkv + h) * bs * hd;
        if (kv.k_fp8) {
          kv.k.push_back(static_cast<const uint8_t*>(pool.k)[in_head + (d / 4) * bs * 4 + (p % bs) * 4 + d % 4]);
        } else {
          kv.k.push_back(static_cast<const uint16_t*>(TransformerTestAccess::tail_view(engine.transformer(), layer).k)
                             [tail_head + (d / 2) * bs * 2 + (p % bs) * 2 + d % 2]);
        }
        if (kv.v_fp8) {
          kv.v.push_back(static_cast<const uint8_t*>(pool.v)[in_head + (p % bs) * hd + d]);
        } else {
          kv.v.push_back(static_cast<const uint16_t*>(TransformerTestAccess::tail_view(engine.transformer(), layer).v)[tail_head + (p % bs) * hd + d]);
        }
      }
    }
  }
  return out;
}

// FP8 of a bf16 value with a frozen scale: what kv_spill writes.
uint16_t fp8_of_bf16(uint16_t bits, float scale) { return fp8_e4m3_encode(bf16_decode(bits) / scale); }

// Whether `tail` (bf16) and `fp8` hold the same token: the FP8 bytes are the tail values' codes.
bool same_token(const PositionKv& tail, const PositionKv& fp8, float k_scale, float v_scale) {
  for (std::size_t i = 0; i < fp8.k.size(); ++i) {
    const uint16_t k = tail.k_fp8 ? tail.k[i] : fp8_of_bf16(tail.k[i], k_scale);
    const uint16_t v = tail.v_fp8 ? tail.v[i] : fp8_of_bf16(tail.v[i], v_scale);
    if ((fp8.k_fp8 ? fp8.k[i] : fp8_of_bf16(fp8.k[i], k_scale)) != k) return false;
    if ((fp8.v_fp8 ? fp8.v[i] : fp8_of_bf16(fp8.v[i], v_scale)) != v) return false;
  }
  return true;
}

// Reads every live sequence's KV after each step and checks the window's contract against
// what it saw before: FP8 bytes never change once written; a position that left the tail holds
// the FP8 codes of the bf16 values the tail held.
class KvWatcher {
 public:
  void observe(const Engine& engine, SeqId max_id) {
    const int layers = engine.model_config().num_layers;
    for (SeqId id = 0; id < max_id; ++id) {
      if (!engine.block_manager().contains(id)) {
        seen_.erase(id);  // finished, or preempted: a recompute starts over
        continue;
      }
      const KvScales& scales = engine.block_manager().scales(id);
      auto& layers_seen = seen_[id];
      layers_seen.resize(static_cast<std::size_t>(layers));
      for (int l = 0; l < layers; ++l) {
        std::vector<PositionKv> now = read_kv(engine, id, l);
        const std::vector<PositionKv>& before = layers_seen[static_cast<std::size_t>(l)];
        for (std::size_t p = 0; p < std::min(before.size(), now.size()); ++p) {
          const PositionKv& b = before[p];
          const PositionKv& n = now[p];
          INFO("sequence " << id << " layer " << l << " position " << p);
          if (b.k_fp8) REQUIRE(n == b);  // written once, never again
          if (!b.k_fp8 && n.k_fp8) {
            REQUIRE(same_token(b, n, scales.k[static_cast<std::size_t>(l)], scales.v[static_cast<std::size_t>(l)]));
            ++spills_checked;
          }
          if (!b.k_fp8 && !n.k_fp8) REQUIRE(n == b);  // the tail holds it unchanged
        }
        layers_seen[static_cast<std::size_t>(l)] = std::move(now);
      }
    }
  }
  int spills_checked = 0;

 private:
  std::map<SeqId, std::vector<std::vector<PositionKv>>> seen_;
};

// Runs the engine to completion, the watcher looking after every step.
void run_watched(Engine& engine, KvWatcher& watcher, SeqId max_id) {
  for (int i = 0; i < 100000 && engine.has_work(); ++i) {
    engine.step();
    EngineTestAccess::check_integrity(engine);
    watcher.observe(engine, max_id);
  }
  REQUIRE_FALSE(engine.has_work());
}

}  // namespace

TEST_CASE("bf16 window: alone == in a batch of 8 with mixed prefill and decode, bitwise", "[engine][window]") {
  const int max_tokens = kSanitized ? 8 : 40;
  const auto prompts = eight_prompts();
  for (const bool values : {true, false}) {
    const EngineOptions options = window_options(16, values);
    auto engine = make_engine(fixture("models/tiny-qwen3"), options);
    Outputs batched;
    KvWatcher watcher;
    for (int i = 4; i < 8; ++i) engine->add_request(greedy_request(std::to_string(i), prompts[i], max_tokens), collect(batched));
    engine->step();
    engine->step();
    for (int i = 0; i < 4; ++i) engine->add_request(greedy_request(std::to_string(i), prompts[i], max_tokens), collect(batched));
    run_watched(*engine, watcher, 8);
    CHECK(watcher.spills_checked > (kSanitized ? 50 : 100));  // 96 measured under the sanitizers (8 tokens)
    for (int i = 0; i < 8; ++i) {
      const Choice alone = run_alone(fixture("models/tiny-qwen3"), options, prompts[i], max_tokens);
      const Choice& in_batch = batched.at(std::to_string(i)).at(0);
      INFO("prompt " << i << " (" << prompts[i].size() << " tokens)" << (values ? ", K+V" : ", K only"));
      CHECK(in_batch.tokens.size() == static_cast<std::size_t>(max_tokens));
      CHECK(in_batch.tokens == alone.tokens);
      CHECK(in_batch.logprobs == alone.logprobs);
    }
    CHECK(engine->block_manager().num_free_tail_rings() == options.max_num_seqs);
  }
}

TEST_CASE("bf16 window: the window changes the output, and window 0 is the plain FP8 engine", "[engine][window]") {
  const auto prompts = eight_prompts();
  const Choice fp8 = run_alone(fixture("models/tiny-llama"), small_options(KvDtype::fp8_e4m3), prompts[0], 24);
  const Choice off = run_alone(fixture("models/tiny-llama"), window_options(0, true), prompts[0], 24);
  const Choice on = run_alone(fixture("models/tiny-llama"), window_options(32, true), prompts[0], 24);
  CHECK(off.logprobs == fp8.logprobs);
  CHECK(on.logprobs != fp8.logprobs);  // the window does something
}

TEST_CASE("bf16 window: chunked prefill across the boundary, every spilled token FP8 of its tail value", "[engine][window]") {
  // Window 64: the 125-token prompt in chunks of 48 goes 48 tokens to the tail, then 48 more
  // (the first 32 spilled), then 29 (16 more spilled); decoding spills a block every 16 steps.
  for (const bool values : {true, false}) {
    EngineOptions options = window_options(64, values);
    options.max_num_batched_tokens = 48;
    auto engine = make_engine(fixture("models/tiny-llama"), options);
    Outputs out;
    engine->add_request(greedy_request("long", eight_prompts()[0], 40), collect(out));
    KvWatcher watcher;
    const int expected_fp8[] = {0, 32, 48};  // after each prefill chunk
    for (const int fp8 : expected_fp8) {
      engine->step();
      CHECK(engine->block_manager().num_fp8_tokens(0) == fp8);
      watcher.observe(*engine, 1);
    }
    run_watched(*engine, watcher, 1);
    CHECK(out.at("long").at(0).tokens.size() == 40);
    // [0, 48) spilled in the prefill, [48, 96) while decoding (at 128, 144 and 160 tokens; the
    // sequence ends at 164): all seen leaving the tail, in every layer.
    CHECK(watcher.spills_checked == 96 * engine->model_config().num_layers);
  }
}

namespace {

// The tail pool's bytes for these options and model (what the engine takes off the budget).
uint64_t tail_bytes_of(const Engine& engine) {
  KvCacheSpec spec;
  const ModelConfig& c = engine.model_config();
  spec = KvCacheSpec{engine.options().block_size, c.num_layers, c.num_kv_heads, c.head_dim, KvDtype::fp8_e4m3,
                     KvWindow{engine.options().kv_bf16_window, engine.options().kv_bf16_window_values,
                              engine.options().block_size}};
  return spec.tail_bytes(engine.options().max_num_seqs);
}

std::vector<std::vector<PositionKv>> read_all_layers(const Engine& engine, SeqId id) {
  std::vector<std::vector<PositionKv>> layers;
  for (int l = 0; l < engine.model_config().num_layers; ++l) layers.push_back(read_kv(engine, id, l));
  return layers;
}

// The fraction of K and V elements of a and b (the same positions) that hold different values,
// both brought to FP8 where one is in the tail.
double fraction_differing(const std::vector<PositionKv>& a, const std::vector<PositionKv>& b, float k_scale, float v_scale) {
  uint64_t differ = 0, total = 0;
  for (std::size_t p = 0; p < a.size(); ++p) {
    for (std::size_t i = 0; i < a[p].k.size(); ++i) {
      for (const bool is_k : {true, false}) {
        const bool fa = is_k ? a[p].k_fp8 : a[p].v_fp8, fb = is_k ? b[p].k_fp8 : b[p].v_fp8;
        uint16_t xa = is_k ? a[p].k[i] : a[p].v[i], xb = is_k ? b[p].k[i] : b[p].v[i];
        const float scale = is_k ? k_scale : v_scale;
        if (fa != fb) {
          if (!fa) xa = fp8_of_bf16(xa, scale);
          if (!fb) xb = fp8_of_bf16(xb, scale);
        }
        differ += xa != xb;
        ++total;
      }
    }
  }
  return total ? static_cast<double>(differ) / static_cast<double>(total) : 0.0;
}

void check_same_kv(const std::vector<PositionKv>& a, const std::vector<PositionKv>& b, float k_scale, float v_scale) {
  for (std::size_t p = 0; p < a.size(); ++p) {
    INFO("position " << p << (a[p].k_fp8 ? " FP8" : " tail") << " vs " << (b[p].k_fp8 ? "FP8" : "tail"));
    if (a[p].k_fp8 == b[p].k_fp8 && a[p].v_fp8 == b[p].v_fp8) {
      REQUIRE(a[p] == b[p]);
    } else {
      REQUIRE(same_token(a[p].k_fp8 ? b[p] : a[p], a[p].k_fp8 ? a[p] : b[p], k_scale, v_scale));
    }
  }
}

}  // namespace

TEST_CASE("bf16 window: preemption and recompute give the same tokens and, at layer 0, the same KV bytes", "[engine][window][preemption]") {
  // As test_batching.cpp's preemption test, with a window of 16: a pool of 10 blocks (plus the
  // tail pool) for eight requests that need ~50. Before each step the test keeps every live
  // sequence's layer-0 KV; when a sequence is preempted, that is its KV before; once its
  // recompute has covered those positions again they must hold the same token, byte for byte
  // (layer 0's K and V depend on the token and its position only). What was in the tail
  // before may be FP8 after (a recompute writes the whole prompt + generated tokens as one
  // prefill, whose older part goes straight to FP8): then its bytes are those of the spill.
  const int max_tokens = kSanitized ? 12 : 32;
  const auto prompts = eight_prompts();
  for (const bool values : {true, false}) {
    for (const bool prefix_caching : {false, true}) {
      EngineOptions roomy = window_options(16, values);
      roomy.enable_prefix_caching = prefix_caching;
      auto reference = make_engine(fixture("models/tiny-llama"), roomy);
      EngineOptions tiny = roomy;
      const uint64_t block_bytes = 2ull * 2 * 2 * 16 * 16;  // layers, K+V, kv heads, head_dim, tokens: FP8
      tiny.kv_cache_memory = 10 * block_bytes + tail_bytes_of(*reference);
      tiny.max_tail_share = 1.0;  // every ring next to the 10 blocks (the default caps the rings at 1/8)
      auto engine = make_engine(fixture("models/tiny-llama"), tiny);
      REQUIRE(engine->block_manager().num_blocks() == 10);
      Outputs expected, got;
      for (int i = 0; i < 8; ++i) {
        reference->add_request(greedy_request(std::to_string(i), prompts[i], max_tokens), collect(expected));
        engine->add_request(greedy_request(std::to_string(i), prompts[i], max_tokens), collect(got));
      }
      run_to_completion(*reference);
      std::map<SeqId, std::vector<std::vector<PositionKv>>> last, before_preemption;
      KvWatcher watcher;
      int compared = 0;
      for (int step = 0; step < 100000 && engine->has_work(); ++step) {
        engine->step();
        EngineTestAccess::check_integrity(*engine);
        const BlockManager& blocks = engine->block_manager();
        watcher.observe(*engine, 8);
        for (SeqId id = 0; id < 8; ++id) {
          const bool finished = got.count(std::to_string(id)) && got.at(std::to_string(id)).at(0).finish.has_value();
          if (!blocks.contains(id)) {
            if (!finished && last.count(id)) before_preemption[id] = last[id];  // preempted this step
            last.erase(id);
            continue;
          }
          last[id] = read_all_layers(*engine, id);
          const auto it = before_preemption.find(id);
          if (it != before_preemption.end() && last[id][0].size() >= it->second[0].size()) {
            INFO("sequence " << id << (values ? ", K+V" : ", K only") << ", prefix caching " << prefix_caching);
            const int num_layers = engine->model_config().num_layers;
            for (int l = 0; l < num_layers; ++l) {
              const auto& before = it->second[static_cast<std::size_t>(l)];
              const std::vector<PositionKv> now(last[id][static_cast<std::size_t>(l)].begin(),
                                                last[id][static_cast<std::size_t>(l)].begin() + static_cast<std::ptrdiff_t>(before.size()));
              const float ks = blocks.scales(id).k[static_cast<std::size_t>(l)], vs = blocks.scales(id).v[static_cast<std::size_t>(l)];
              INFO("layer " << l);
              if (l == 0) check_same_kv(before, now, ks, vs);
              const double differ = fraction_differing(before, now, ks, vs);
              CHECK(differ < 0.01);  // the rounding of a prefill against a decode, no more
            }
            ++compared;
            before_preemption.erase(it);
          }
        }
      }
      INFO((values ? "K+V" : "K only") << ", prefix caching " << prefix_caching);
      REQUIRE_FALSE(engine->has_work());
      CHECK(engine->stats().num_preemptions > 0);
      CHECK(compared > 0);
      for (int i = 0; i < 8; ++i) {
        CHECK(got.at(std::to_string(i)).at(0).tokens == expected.at(std::to_string(i)).at(0).tokens);
      }
      CHECK(engine->block_manager().num_free_blocks() == engine->block_manager().num_blocks());
      CHECK(engine->block_manager().num_free_tail_rings() == tiny.max_num_seqs);
    }
  }
}

TEST_CASE("bf16 window: n > 1 greedy choices each get a copy of the prompt's tail and equal the single output", "[engine][window][fork]") {
  // 40 prompt tokens and 30 generated, window 16: the forks share the prompt's blocks and get
  // copies of its ring; at 48 and 64 tokens each spills into a shared block, which becomes its own.
  const auto prompts = eight_prompts();
  for (const bool values : {true, false}) {
    const EngineOptions options = window_options(16, values);
    const Choice single = run_alone(fixture("models/tiny-qwen2"), options, prompts[3], 30);
    auto engine = make_engine(fixture("models/tiny-qwen2"), options);
    GenerationRequest r = greedy_request("n3", prompts[3], 30);
    r.n = 3;
    Outputs out;
    engine->add_request(r, collect(out));
    KvWatcher watcher;
    run_watched(*engine, watcher, 3);
    REQUIRE(out.at("n3").size() == 3);
    for (int i = 0; i < 3; ++i) {
      INFO("choice " << i << (values ? ", K+V" : ", K only"));
      CHECK(out.at("n3").at(i).tokens == single.tokens);
      CHECK(out.at("n3").at(i).logprobs == single.logprobs);
    }
    CHECK(watcher.spills_checked > 0);
    CHECK(engine->block_manager().num_free_blocks() == engine->block_manager().num_blocks());
    CHECK(engine->block_manager().num_free_tail_rings() == options.max_num_seqs);
  }
}

TEST_CASE("bf16 window: a prefix hit stops before the new prompt's window, and changes neither its KV nor its tokens", "[engine][window][prefix]") {
  // Today's engine (no window) does not promise identical output with and without a hit: past
  // 256 tokens of context the rest of a prompt after a hit is attended through split-K
  // partitions instead of the query tiles of a whole prefill, which rounds differently (the
  // logprobs move in the last bits; measured, the tokens did not). Below that, with blocks of
  // 16 (a hit is a whole number of 16-token query tiles), the arithmetic is the same and so is
  // the output, bit for bit. The window keeps exactly that: a hit maps only FP8 blocks outside
  // the new prompt's window (64 of 100 tokens here, 256 of 300), the scales are the same
  // prompt's, the KV after the prefill is the same bytes, and the output the same.
  const auto prompts = eight_prompts();
  std::vector<int32_t> long_prompt;
  for (const auto& p : prompts) long_prompt.insert(long_prompt.end(), p.begin(), p.end());
  long_prompt.resize(300);
  struct Case {
    std::vector<int32_t> prompt;
    uint64_t hit;
    bool bitwise;
  };
  const Case cases[] = {{std::vector<int32_t>(prompts[0].begin(), prompts[0].begin() + 100), 64, true},
                        {long_prompt, 256, false}};
  for (const Case& c : cases) {
    EngineOptions options = window_options(32, true);
    auto kv_after_prefill = [&](Engine& engine, SeqId id, const std::string& request, Outputs& out) {
      engine.add_request(greedy_request(request, c.prompt, 24), collect(out));
      std::vector<std::vector<PositionKv>> kv;
      for (int i = 0; i < 100000 && engine.has_work(); ++i) {
        engine.step();
        if (kv.empty() && engine.block_manager().contains(id) &&
            engine.block_manager().num_computed_tokens(id) == static_cast<int>(c.prompt.size())) {
          for (int l = 0; l < engine.model_config().num_layers; ++l) kv.push_back(read_kv(engine, id, l));
        }
      }
      return kv;
    };
    Outputs plain_out, cached_out;
    options.enable_prefix_caching = false;
    auto plain = make_engine(fixture("models/tiny-llama"), options);
    const auto plain_kv = kv_after_prefill(*plain, 0, "plain", plain_out);
    options.enable_prefix_caching = true;
    auto cached = make_engine(fixture("models/tiny-llama"), options);
    kv_after_prefill(*cached, 0, "first", cached_out);
    CHECK(cached->stats().prefix_hits == 0);
    const auto hit_kv = kv_after_prefill(*cached, 1, "second", cached_out);
    INFO(c.prompt.size() << "-token prompt");
    CHECK(cached->stats().prefix_hits == c.hit);
    CHECK(cached_out.at("second").at(0).tokens == plain_out.at("plain").at(0).tokens);
    REQUIRE(hit_kv.size() == plain_kv.size());
    CHECK(hit_kv[0] == plain_kv[0]);  // layer 0: the token and its position only
    if (c.bitwise) {
      CHECK(hit_kv == plain_kv);
      CHECK(cached_out.at("second").at(0).logprobs == plain_out.at("plain").at(0).logprobs);
    }
  }
}

TEST_CASE("bf16 window: the tail pool comes out of the KV budget and shows in the stats", "[engine][window]") {
  EngineOptions options = window_options(32, true);
  auto engine = make_engine(fixture("models/tiny-llama"), options);
  const uint64_t tail = tail_bytes_of(*engine);
  // tiny-llama: 2 layers x (K + V) x 2 KV heads x 16 dims x 2 bytes, 3 blocks of 16 per ring, 16 rings.
  CHECK(tail == 2u * 2 * 2 * 16 * 2 * 48 * 16);
  CHECK(engine->kv_tail_bytes() == tail);
  const uint64_t block_bytes = 2u * 2 * 2 * 16 * 16;
  CHECK(engine->block_manager().num_blocks() == static_cast<int>((options.kv_cache_memory - tail) / block_bytes));
  Outputs out;
  engine->add_request(greedy_request("a", eight_prompts()[0], 8), collect(out));
  engine->add_request(greedy_request("b", eight_prompts()[3], 8), collect(out));
  engine->step();
  const EngineStats stats = engine->stats();
  CHECK(stats.kv_tail_usage == 2.0 / 16);
  CHECK(stats.kv_tail_tokens == (125 - 80) + (40 - 0));  // tails of [80, 125) and [0, 40)
  run_to_completion(*engine);
  CHECK(engine->stats().kv_tail_usage == 0.0);

  // A budget the size of those 16 rings: the rings get an eighth of it (2 rings), the FP8 pool
  // the rest - the window never makes a budget fail that the pool alone serves.
  options.kv_cache_memory = tail;
  auto small = make_engine(fixture("models/tiny-llama"), options);
  CHECK(small->block_manager().num_tail_rings() == 2);
  CHECK(small->kv_tail_bytes() == tail / 8);
  CHECK(small->block_manager().num_blocks() == static_cast<int>((tail - tail / 8) / block_bytes));
  // Four requests at once: two run, two wait for a ring (counted). Each output is bit for bit
  // the one it gives alone: no sequence runs without a ring, so no load changes what it reads.
  Outputs together;
  for (int i = 0; i < 4; ++i) small->add_request(greedy_request(std::to_string(i), eight_prompts()[i], 4), collect(together));
  small->step();
  CHECK(small->stats().num_running == 2);
  CHECK(small->stats().num_waiting == 2);
  run_to_completion(*small);
  CHECK(small->stats().kv_ring_waits >= 1);
  CHECK(small->block_manager().num_seqs_without_ring() == 0);
  CHECK(small->block_manager().num_free_tail_rings() == 2);
  for (int i = 0; i < 4; ++i) {
    const Choice alone = run_alone(fixture("models/tiny-llama"), options, eight_prompts()[static_cast<std::size_t>(i)], 4);
    const Choice& loaded = together.at(std::to_string(i)).at(0);
    CHECK(loaded.tokens == alone.tokens);
    CHECK(loaded.logprobs == alone.logprobs);
  }
  // More choices than rings could never run at once: refused, not queued for ever.
  GenerationRequest three = greedy_request("three", eight_prompts()[0], 4);
  three.n = 3;
  small->add_request(three, collect(out));
  CHECK(out.at("three").at(0).finish == FinishReason::error);
  CHECK(out.at("three").at(0).error.find("bf16 window ring") != std::string::npos);
  CHECK_FALSE(small->has_work());
  // A share too small for one ring: no window at all, the pool takes the budget.
  options.max_tail_share = 0.01;
  auto none = make_engine(fixture("models/tiny-llama"), options);
  CHECK_FALSE(none->block_manager().window().enabled());
  CHECK(none->kv_tail_bytes() == 0);
  CHECK(none->block_manager().num_blocks() == static_cast<int>(tail / block_bytes));
  // Only a budget without room for one block fails.
  options.kv_cache_memory = block_bytes - 1;
  CHECK_THROWS_AS(make_engine(fixture("models/tiny-llama"), options), std::invalid_argument);
}

TEST_CASE("bf16 window: a sequence preempted after decoding across several blocks is recomputed step by step", "[engine][window][preemption]") {
  // A (100-token prompt, 80 tokens) and B (20, 60) decode side by side in a pool of 14 blocks
  // (+ the tail pool): when both need a new block at once, B - the newer - is preempted with 64
  // tokens computed, whose decode steps read [0, 0), [0, 16), [0, 32) and [0, 48) from FP8. The
  // recompute replays those steps (one prefill would read [0, 48) from FP8 for all of them).
  // Every layer's KV afterwards is the KV before, up to the rounding of a prefill against a
  // decode; the tokens are those of a run without preemption.
  for (const bool prefix_caching : {false, true}) {
    EngineOptions roomy = window_options(16, true);
    roomy.enable_prefix_caching = prefix_caching;
    auto reference = make_engine(fixture("models/tiny-llama"), roomy);
    EngineOptions tiny = roomy;
    tiny.kv_cache_memory = 14 * 2ull * 2 * 2 * 16 * 16 + tail_bytes_of(*reference);
    tiny.max_tail_share = 1.0;  // every ring next to the 14 blocks
    auto engine = make_engine(fixture("models/tiny-llama"), tiny);
    REQUIRE(engine->block_manager().num_blocks() == 14);
    const auto prompts = eight_prompts();
    std::vector<int32_t> b_prompt(prompts[6].begin(), prompts[6].begin() + 20);
    Outputs expected, got;
    for (Engine* e : {reference.get(), engine.get()}) {
      Outputs& out = e == reference.get() ? expected : got;
      e->add_request(greedy_request("a", std::vector<int32_t>(prompts[0].begin(), prompts[0].begin() + 100), 80), collect(out));
      e->add_request(greedy_request("b", b_prompt, 60), collect(out));
    }
    run_to_completion(*reference);
    std::vector<std::vector<PositionKv>> last, before;
    for (int step = 0; step < 1000 && engine->has_work(); ++step) {
      engine->step();
      EngineTestAccess::check_integrity(*engine);
      const BlockManager& blocks = engine->block_manager();
      if (!blocks.contains(1)) {
        if (before.empty() && !last.empty()) before = last;  // B's KV when it was preempted
        continue;
      }
      last = read_all_layers(*engine, 1);
      if (!before.empty() && last[0].size() >= before[0].size() && blocks.num_computed_tokens(1) == static_cast<int>(before[0].size()) + 1) {
        INFO("prefix caching " << prefix_caching);
        for (int l = 0; l < engine->model_config().num_layers; ++l) {
          INFO("layer " << l);
          const std::vector<PositionKv> now(last[static_cast<std::size_t>(l)].begin(),
                                            last[static_cast<std::size_t>(l)].begin() + static_cast<std::ptrdiff_t>(before[0].size()));
          const float ks = blocks.scales(1).k[static_cast<std::size_t>(l)], vs = blocks.scales(1).v[static_cast<std::size_t>(l)];
          const double differ = fraction_differing(before[static_cast<std::size_t>(l)], now, ks, vs);
          CHECK(differ < 0.01);
        }
      }
    }
    CHECK(engine->stats().num_preemptions == 1);
    REQUIRE(before.size() > 0);
    CHECK(before[0].size() == 64);
    CHECK(got.at("a").at(0).tokens == expected.at("a").at(0).tokens);
    CHECK(got.at("b").at(0).tokens == expected.at("b").at(0).tokens);
  }
}
