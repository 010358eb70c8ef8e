// The emulator runs the GPU's fast paths (kernels/cuda/ptx.cuh) strictly enough that the usual
// bugs fail: each case is a small kernel with one bug injected, next to the same kernel without
// it. cp.async: a missing wait_group, a wait for too few groups, a missing barrier after the wait,
// a stage refilled while another lane still reads it, a write into another thread's unpublished
// copy, a copy into bytes still in flight. mma.sync: lanes at different calls, an exited lane. The
// thread order: code that assumes a warp runs in lockstep. Aborts run in a forked child.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/ptx.cuh"
#include "tests/unit/cuda_emu/child_process.hpp"
#include "tests/unit/cuda_emu/device_memory.hpp"

using fp8serve::test::ChildResult;
using fp8serve::test::device_alloc;
using fp8serve::test::download;
using fp8serve::test::run_in_child;
namespace ptx = fp8serve::cuda::ptx;

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kLanes = 32;
constexpr uint32_t kPoison = 0xffffffffu;

enum Bug : int {
  kNone = 0,
  kNoWait,          // no cp.async.wait_group before the data is read
  kWaitTooFew,      // wait_group 1 with the group read still in flight
  kNoBarrier,       // the wait, then another lane's data read without __syncwarp
  kRefillEarly,     // the stage refilled without __syncwarp after the reads of the last chunk
  kWriteLanded,     // a lane writes into its neighbour's landed, unpublished copy
  kIssueInFlight,   // a second copy into bytes a copy still holds
};

// Each lane copies 16 bytes (4 words) of chunk c of `in` into the warp's stage, then every lane
// reads its right neighbour's words: out[c][lane] = in[c][lane + 1]. Two chunks through one stage
// (one where the bug leaves copies in flight).
__global__ void stage_kernel(const uint32_t* in, uint32_t* out, int bug) {
  FP8SERVE_SHARED(uint32_t[kLanes * 4], stage);
  const int lane = static_cast<int>(threadIdx.x);
  const int next = (lane + 1) % kLanes;
  const int chunks = bug == kNoWait || bug == kWaitTooFew ? 1 : 2;
  for (int c = 0; c < chunks; ++c) {
    if (bug == kWaitTooFew) ptx::cp_async_commit();  // an older, empty group: wait_group 1 waits for it alone
    ptx::cp_async_cg16(&stage[4 * lane], in + (c * kLanes + lane) * 4, 16);
    if (bug == kIssueInFlight) ptx::cp_async_cg16(&stage[4 * lane], in + lane * 4, 16);
    ptx::cp_async_commit();
    if (bug == kWaitTooFew) {
      ptx::cp_async_wait<1>();
    } else if (bug != kNoWait) {
      ptx::cp_async_wait<0>();
    }
    if (bug == kWriteLanded) {
      (void)__shfl_sync(kFull, 0, 0);  // every lane has waited (a shuffle makes nothing visible)
      if (lane == 3) stage[4 * next] = 7u;
    }
    if (bug != kNoBarrier) __syncwarp();
    for (int w = 0; w < 4; ++w) out[(c * kLanes + lane) * 4 + w] = stage[4 * next + w];
    if (bug != kRefillEarly) __syncwarp();
  }
  if (bug == kNoWait) return;  // with its copy in flight
  ptx::cp_async_wait<0>();
  __syncwarp();
}

std::vector<uint32_t> run_stage(int bug) {
  std::vector<uint32_t> in(2 * kLanes * 4);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint32_t>(1000 + i);
  uint32_t* d_in = device_alloc<uint32_t>(in.size());
  uint32_t* d_out = device_alloc<uint32_t>(in.size());
  CUDA_CHECK(cudaMemcpy(d_in, in.data(), in.size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
  FP8SERVE_LAUNCH(stage_kernel, 1, kLanes, 0, nullptr, static_cast<const uint32_t*>(d_in), d_out, bug);
  CUDA_CHECK(cudaGetLastError());
  std::vector<uint32_t> out = download(d_out, in.size());
  CUDA_CHECK(cudaFree(d_in));
  CUDA_CHECK(cudaFree(d_out));
  return out;
}

// How many words of stage_kernel's output are wrong.
size_t stage_errors(const std::vector<uint32_t>& out) {
  size_t wrong = 0;
  for (int c = 0; c < 2; ++c)
    for (int lane = 0; lane < kLanes; ++lane)
      for (int w = 0; w < 4; ++w) {
        const uint32_t want = static_cast<uint32_t>(1000 + (c * kLanes + (lane + 1) % kLanes) * 4 + w);
        wrong += out[static_cast<size_t>((c * kLanes + lane) * 4 + w)] != want;
      }
  return wrong;
}

void check_message(const ChildResult& r, const std::vector<std::string>& parts) {
  INFO("child's output:\n" << r.stderr_text);
  CHECK(r.aborted);
  for (const std::string& part : parts) CHECK(r.stderr_text.find(part) != std::string::npos);
}

}  // namespace

TEST_CASE("cp.async through a stage: correct with wait_group and barriers, wrong without them") {
  CHECK(stage_errors(run_stage(kNone)) == 0);
  // The bytes are not there yet: the destination holds 0xFF until the wait performs the copy.
  const std::vector<uint32_t> too_few = run_stage(kWaitTooFew);
  CHECK(stage_errors(too_few) == too_few.size());
  CHECK(too_few[0] == kPoison);
  // Landed bytes are the issuer's alone until a barrier: every read of a neighbour's words fails,
  // whatever the order the lanes run in.
  CHECK(stage_errors(run_stage(kNoBarrier)) == too_few.size());
  // The next chunk's copy poisons the stage while lanes still read the last one: some lane reads
  // after its neighbour refilled (each round runs the lanes in a new order).
  CHECK(stage_errors(run_stage(kRefillEarly)) > 0);
}

TEST_CASE("a thread that exits with cp.async copies in flight aborts") {
  check_message(run_in_child([] { run_stage(kNoWait); }),
                {"kernel stage_kernel", "cp.async", "exits with 1 cp.async copies never waited for"});
}

TEST_CASE("writing into another thread's landed, unpublished cp.async bytes aborts") {
  check_message(run_in_child([] { run_stage(kWriteLanded); }),
                {"thread (4,0,0)", "another thread wrote into bytes", "before a barrier made them visible"});
}

TEST_CASE("a cp.async into bytes another copy still holds aborts") {
  check_message(run_in_child([] { run_stage(kIssueInFlight); }), {"cp.async", "is still held by a cp.async of thread"});
}

namespace {

__global__ void bad_copy_kernel(const uint32_t* in, int which) {
  FP8SERVE_SHARED(uint32_t[8], stage);
  uint32_t local[4];
  if (which == 0) ptx::cp_async_cg16(&stage[1], in, 16);                   // misaligned destination
  if (which == 1) ptx::cp_async_cg16(local, in, 16);                       // not shared memory
  if (which == 2) ptx::cp_async_cg16(&stage[0], in + 1, 16);               // misaligned source
  if (which == 3) ptx::cp_async_cg16(&stage[0], in + 8, 16);               // past the allocation
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
}

// Two calls of mma in two branches: the lanes of a warp are at different instructions.
__global__ void split_mma_kernel(float* out, int which) {
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint32_t a[4] = {0u, 0u, 0u, 0u}, b[2] = {0u, 0u};
  if (which == 0) {
    if (threadIdx.x < 16) {
      ptx::mma_m16n8k16_bf16(d, a, b);
    } else {
      ptx::mma_m16n8k16_bf16(d, a, b);
    }
  } else {
    if (threadIdx.x == 9) return;
    ptx::mma_m16n8k16_bf16(d, a, b);
  }
  out[threadIdx.x] = d[0];
}

}  // namespace

TEST_CASE("cp.async with a bad address aborts, naming it") {
  uint32_t* in = device_alloc<uint32_t>(8);
  const char* expected[] = {"is not 16 bytes of shared memory aligned to 16", "is not 16 bytes of shared memory",
                            "is not 16 bytes of device memory aligned to 16", "is not 16 bytes of device memory"};
  for (int which = 0; which < 4; ++which) {
    INFO("case " << which);
    check_message(run_in_child([&] {
                    FP8SERVE_LAUNCH(bad_copy_kernel, 1, 1, 0, nullptr, static_cast<const uint32_t*>(in), which);
                    cudaDeviceSynchronize();  // launches run when the host waits for them
                  }),
                  {"cp.async", expected[which]});
  }
  CUDA_CHECK(cudaFree(in));
}

TEST_CASE("mma.sync needs every lane of the warp at the same instruction") {
  float* out = device_alloc<float>(32);
  check_message(run_in_child([&] {
                  FP8SERVE_LAUNCH(split_mma_kernel, 1, 32, 0, nullptr, out, 0);
                  cudaDeviceSynchronize();
                }),
                {"mma.sync.m16n8k16.bf16", "test_fast_paths.cpp:", "which waits at mma.sync.m16n8k16.bf16"});
  check_message(run_in_child([&] {
                  FP8SERVE_LAUNCH(split_mma_kernel, 1, 32, 0, nullptr, out, 1);
                  cudaDeviceSynchronize();
                }),
                {"mma.sync.m16n8k16.bf16", "names lane 9, which has exited"});
  check_message(run_in_child([&] {
                  FP8SERVE_LAUNCH(split_mma_kernel, 1, 16, 0, nullptr, out, 2);
                  cudaDeviceSynchronize();
                }),
                {"needs all 32 lanes of the warp, and this block's last warp has 16"});
  CUDA_CHECK(cudaFree(out));
}

namespace {

// Lane i writes word i, then reads word i + 1: with `sync`, after __syncwarp; without, as code
// that assumes the warp runs in lockstep does.
__global__ void lockstep_kernel(uint32_t* out, bool sync) {
  FP8SERVE_SHARED(uint32_t[kLanes], words);
  const unsigned lane = threadIdx.x;
  words[lane] = lane;
  if (sync) __syncwarp(kFull);
  out[blockIdx.x * kLanes + lane] = words[(lane + 1) % kLanes];
}

std::vector<uint32_t> run_lockstep(bool sync, unsigned blocks) {
  uint32_t* out = device_alloc<uint32_t>(blocks * kLanes);
  FP8SERVE_LAUNCH(lockstep_kernel, blocks, kLanes, 0, nullptr, out, sync);
  CUDA_CHECK(cudaGetLastError());
  std::vector<uint32_t> host = download(out, blocks * kLanes);
  CUDA_CHECK(cudaFree(out));
  return host;
}

}  // namespace

namespace {

// The lockstep kernel's output in a child process that starts from the same state (the same
// launch sequence numbers) with thread order seed `seed`, as text.
std::string lockstep_in_child(uint64_t seed) {
  const ChildResult child = run_in_child([seed] {
    fp8serve::emu::set_thread_order_seed(seed);
    std::string text;
    for (uint32_t v : run_lockstep(false, 2)) text += std::to_string(v) + " ";
    std::printf("output %s\n", text.c_str());
    std::fflush(stdout);
  });
  const size_t at = child.stderr_text.find("output ");
  return at == std::string::npos ? child.stderr_text : child.stderr_text.substr(at);
}

}  // namespace

TEST_CASE("threads run in a seeded order: code that assumes lockstep fails, and the seed repeats it") {
  size_t stale = 0;
  for (uint32_t v : run_lockstep(false, 4)) stale += v == kPoison;
  CHECK(stale > 0);  // some lane read its neighbour's word before the neighbour wrote it
  for (uint32_t v : run_lockstep(true, 4)) CHECK(v != kPoison);
  const std::string first = lockstep_in_child(12345);
  CHECK(first.find(std::to_string(kPoison)) != std::string::npos);
  CHECK(lockstep_in_child(12345) == first);
  CHECK(lockstep_in_child(54321) != first);
}
