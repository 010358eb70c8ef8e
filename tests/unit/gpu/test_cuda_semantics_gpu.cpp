// [gpu] CUDA's documented semantics, checked on the device: on a GPU (test_gpu, skipped without
// one) they check the hardware; on the emulator (test_cuda_semantics_gpu_emu, always run) they
// check the emulator against the same expectations. Every expected value below is written from
// the CUDA C++ Programming Guide's wording, not from the emulator's code.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/cuda/device_runtime.hpp"
#include "tests/unit/gpu/cuda_semantics.hpp"

using namespace fp8serve;
using namespace fp8serve::cuda::semantics;

namespace {

bool have_gpu() {
  if (cuda::device_count() > 0) return true;
  WARN("no CUDA device: [gpu] test skipped");
  return false;
}

int mod(int a, int m) { return ((a % m) + m) % m; }

// The lane whose value lane `lane` receives (Programming Guide, "Warp Shuffle Functions"):
//   __shfl_sync: lane srcLane of the caller's width-wide subsection, srcLane taken modulo width;
//   __shfl_up_sync: caller - delta, unless that leaves the subsection (the lower delta lanes keep
//   their value); __shfl_down_sync: caller + delta, likewise for the upper lanes;
//   __shfl_xor_sync: caller ^ laneMask, which may read an earlier subsection; a later one gives
//   the caller its own value.
int expected_source(Shuffle kind, int lane, int arg, int width) {
  const int base = lane - lane % width, local = lane % width;
  switch (kind) {
    case Shuffle::idx: return base + mod(arg, width);
    case Shuffle::up: return local - arg >= 0 ? lane - arg : lane;
    case Shuffle::down: return local + arg < width ? lane + arg : lane;
    case Shuffle::xor_lanes: {
      const int source = lane ^ arg;
      return source / width <= lane / width ? source : lane;
    }
  }
  return lane;
}

struct ShuffleCase {
  Shuffle kind;
  int base_arg, lane_step;
};

}  // namespace

TEST_CASE("shuffles follow CUDA's lane and width rules", "[gpu]") {
  if (!have_gpu()) return;
  // Arguments constant over the warp and varying per lane; source lanes beyond the width and
  // negative ones (taken modulo width), deltas up to 31, xor masks reaching other subsections.
  const std::vector<ShuffleCase> cases = {
      {Shuffle::idx, 3, 0},  {Shuffle::idx, 0, 1},      {Shuffle::idx, 37, 0},    {Shuffle::idx, -5, 3},
      {Shuffle::idx, 5, 7},  {Shuffle::up, 0, 0},       {Shuffle::up, 1, 0},      {Shuffle::up, 5, 0},
      {Shuffle::up, 16, 0},  {Shuffle::up, 31, 0},      {Shuffle::up, 0, 1},      {Shuffle::down, 1, 0},
      {Shuffle::down, 3, 0}, {Shuffle::down, 8, 0},     {Shuffle::down, 17, 0},   {Shuffle::down, 0, 1},
      {Shuffle::xor_lanes, 1, 0}, {Shuffle::xor_lanes, 2, 0}, {Shuffle::xor_lanes, 8, 0},
      {Shuffle::xor_lanes, 16, 0}, {Shuffle::xor_lanes, 31, 0}, {Shuffle::xor_lanes, 24, 0},
      {Shuffle::xor_lanes, 5, 0}};
  // Three warps per block, two blocks; and a 16 x 6 block whose warps span rows (lanes are
  // linear indices: thread (8, 2) is lane 8 of warp 1).
  for (const Grid grid : {Grid{96, 1, 2}, Grid{16, 6, 1}}) {
    for (const int width : {32, 16, 8, 4, 2, 1}) {
      for (const ShuffleCase& c : cases) {
        const std::vector<int> got = shuffle_ints(c.kind, width, c.base_arg, c.lane_step, grid);
        REQUIRE(got.size() == grid.threads());
        int wrong = 0;
        for (int g = 0; g < static_cast<int>(got.size()); ++g) {
          const int lane = g % 32;
          const int source = g - lane + expected_source(c.kind, lane, c.base_arg + lane * c.lane_step, width);
          if (got[g] != 1000 + source && ++wrong <= 3)
            UNSCOPED_INFO("thread " << g << " got " << got[g] - 1000 << " expected " << source);
        }
        INFO("kind " << static_cast<int>(c.kind) << " width " << width << " arg " << c.base_arg << " step "
                     << c.lane_step << " block " << grid.block_x << "x" << grid.block_y);
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("the HIP-CPU case: __shfl_sync(mask, v, 3, 32) on thread 40 reads lane 3 of warp 1", "[gpu]") {
  if (!have_gpu()) return;
  const std::vector<int> got = shuffle_ints(Shuffle::idx, 32, 3, 0, Grid{64, 1, 1});
  CHECK(got[40] == 1000 + 35);
  const std::vector<int> half = shuffle_ints(Shuffle::idx, 16, 3, 0, Grid{64, 1, 1});
  CHECK(half[40] == 1000 + 35);
  CHECK(half[56] == 1000 + 51);
}

TEST_CASE("shuffles move 8-byte values whole", "[gpu]") {
  if (!have_gpu()) return;
  const std::vector<double> got = shuffle_doubles(Shuffle::xor_lanes, 32, 7, 0, Grid{64, 1, 1});
  for (int g = 0; g < 64; ++g) CHECK(got[g] == 0.5 + (g ^ 7));
  const std::vector<double> down = shuffle_doubles(Shuffle::down, 8, 2, 0, Grid{32, 1, 1});
  for (int g = 0; g < 32; ++g) CHECK(down[g] == 0.5 + (g % 8 < 6 ? g + 2 : g));
}

TEST_CASE("votes cover the lanes of their mask only", "[gpu]") {
  if (!have_gpu()) return;
  std::vector<int> predicate(128);
  for (size_t g = 0; g < predicate.size(); ++g) predicate[g] = (g * 7 % 5 == 0) || (g >= 64 && g < 80);
  for (const bool split : {false, true}) {
    const Votes votes = warp_votes(predicate, split);
    for (size_t g = 0; g < predicate.size(); ++g) {
      const size_t warp_first = g - g % 32, lane = g % 32;
      const unsigned mask = !split ? 0xffffffffu : (lane < 16 ? 0x0000ffffu : 0xffff0000u);
      unsigned ballot = 0;
      for (unsigned k = 0; k < 32; ++k)
        if ((mask >> k & 1u) != 0 && predicate[warp_first + k] != 0) ballot |= 1u << k;
      INFO("thread " << g << " split " << split);
      CHECK(votes.ballot[g] == ballot);
      CHECK(votes.any[g] == (ballot != 0));
      CHECK(votes.all[g] == (ballot == mask));
    }
  }
}

TEST_CASE("a reduction stage run by warp 0 alone, launch after launch", "[gpu]") {
  if (!have_gpu()) return;
  for (int launch = 0; launch < 3; ++launch) {
    std::vector<int> values(256 * 6);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int>((i * 2654435761u + launch) % 1000) - 500;
    const std::vector<int> sums = block_sums(values);
    for (size_t b = 0; b < sums.size(); ++b)
      CHECK(sums[b] == std::accumulate(values.begin() + 256 * b, values.begin() + 256 * (b + 1), 0));
  }
}

TEST_CASE("warps that run different trip counts meet at one barrier", "[gpu]") {
  if (!have_gpu()) return;
  const std::vector<int> lengths = {1, 7, 0, 3, 12, 2, 5, 9};
  const std::vector<int> got = unequal_trip_counts(lengths);
  for (int b = 0; b < static_cast<int>(lengths.size()); ++b) {
    int block_total = 0;
    for (int w = 0; w < 4; ++w) {
      int total = 0;
      for (int i = 0; i < lengths[b] + w; ++i)
        for (int lane = 0; lane < 32; ++lane) total += (b * 131 + w * 17 + i * 7 + lane) % 23;
      CHECK(got[b * 5 + w] == total);
      block_total += total;
    }
    CHECK(got[b * 5 + 4] == block_total);
  }
}

TEST_CASE("__syncthreads waits for the threads that have not exited", "[gpu]") {
  if (!have_gpu()) return;
  for (const auto& [threads, active] : std::vector<std::pair<unsigned, unsigned>>{{128, 100}, {256, 33}, {64, 64}}) {
    const std::vector<int> got = barrier_with_exits(threads, active);
    int multiples_of_3 = 0;
    for (unsigned t = 0; t < active; ++t) multiples_of_3 += t % 3 == 0;
    for (unsigned t = 0; t < threads; ++t) {
      INFO("thread " << t << " of " << threads << ", " << active << " active");
      CHECK(got[2 * t] == (t < active ? static_cast<int>((t + 1) % active * 3 + 1) : -1));
      CHECK(got[2 * t + 1] == (t < active ? multiples_of_3 : -1));
    }
  }
}

TEST_CASE("__syncthreads_count, _and and _or", "[gpu]") {
  if (!have_gpu()) return;
  const std::vector<int> got = barrier_reductions();
  const int expected[12] = {256, 1, 1, 1, 0, 1, 0, 0, 0, 128, 0, 1};
  for (int t = 0; t < 256; ++t)
    for (int k = 0; k < 12; ++k) {
      INFO("thread " << t << " result " << k);
      CHECK((got[t * 12 + k] != 0) == (expected[k] != 0));
      if (k % 3 == 0) CHECK(got[t * 12 + k] == expected[k]);  // counts are exact; _and/_or only nonzero
    }
}

TEST_CASE("atomics between blocks", "[gpu]") {
  if (!have_gpu()) return;
  const AtomicResults r = atomics();
  constexpr int kN = 64 * 128;
  CHECK(r.counter == kN);
  CHECK(r.cas_counter == kN);
  CHECK(r.float_sum == static_cast<float>(kN));
  CHECK(r.id_sum == static_cast<unsigned long long>(kN) * (kN - 1) / 2);
  int max = -1000, min = 1000;
  for (int g = 0; g < kN; ++g) {
    max = std::max(max, (g * 37) % 1001 - 500);
    min = std::min(min, (g * 37) % 1001 - 500);
  }
  CHECK(r.max == max);
  CHECK(r.min == min);
  CHECK(r.bits == 0xffffffffu);
  CHECK(r.sub == 1'000'000u - kN);
  // atomicExch hands each value on exactly once: what the threads got back plus the final value
  // are the initial -7 and every thread's id.
  std::vector<int> seen = r.exchanged, expected(kN);
  std::iota(expected.begin(), expected.end(), 0);
  expected.push_back(-7);
  std::sort(seen.begin(), seen.end());
  std::sort(expected.begin(), expected.end());
  CHECK(seen == expected);
}

TEST_CASE("each block has its own static and dynamic shared memory", "[gpu]") {
  if (!have_gpu()) return;
  CHECK(shared_memory_isolation() == 0);
}

TEST_CASE("dynamic shared memory over 48 KiB needs cudaFuncSetAttribute", "[gpu]") {
  if (!have_gpu()) return;
  const LargeShared r = large_dynamic_shared(64 * 1024);
  CHECK(r.error_without_attribute != 0);
  const long long n = 64 * 1024 / 4;
  CHECK(r.sum == n * (n - 1) / 2);
}
