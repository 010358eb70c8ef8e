#pragma once
// Kernels that pin down the CUDA semantics the emulator must reproduce: warp shuffles (every
// kind and width) and votes, divergent warps, barriers with exited threads, atomics between
// blocks, shared memory per block, dynamic shared memory above 48 KiB, kernel templates through
// FP8SERVE_LAUNCH. nvcc builds cuda_semantics.cu into test_gpu and the emulator into
// test_cuda_semantics_gpu_emu: one set of expectations (written from CUDA's documentation, in
// test_cuda_semantics_gpu.cpp) holds on both, so a GPU run checks the emulator too.
// Plain C++: every function runs one or more launches and returns what the kernels wrote.
#include <cstdint>
#include <vector>

namespace fp8serve::cuda::semantics {

enum class Shuffle { idx, up, down, xor_lanes };

struct Grid {
  unsigned block_x, block_y, blocks;
  unsigned threads() const { return block_x * block_y * blocks; }
};

// Thread g (global linear id) shuffles the value 1000 + g; lane l passes the source lane, delta or
// lane mask base_arg + l * lane_step. Full mask; grid threads a multiple of 32. width: 1..32.
std::vector<int> shuffle_ints(Shuffle kind, int width, int base_arg, int lane_step, Grid grid);
// The same with the double 0.5 + g (8-byte values).
std::vector<double> shuffle_doubles(Shuffle kind, int width, int base_arg, int lane_step, Grid grid);

// Votes of predicate[g] per warp: with split_halves, lanes 0-15 vote with mask 0x0000ffff and
// lanes 16-31 with 0xffff0000, each half on its own; else the full mask.
struct Votes {
  std::vector<unsigned> ballot;
  std::vector<int> any, all;
};
Votes warp_votes(const std::vector<int>& predicate, bool split_halves);

// Sum of each block's 256 values: every warp reduces with __shfl_down_sync, then warp 0 alone
// reduces the 8 partial sums (the divergent pattern that broke HIP-CPU).
std::vector<int> block_sums(const std::vector<int>& values);

// Warps running different trip counts: in block b, warp w (of 4) runs lengths[b] + w iterations,
// each adding the __shfl_xor_sync butterfly sum of the lanes' values
// (b * 131 + w * 17 + i * 7 + lane) % 23; then the block meets at __syncthreads and thread 0
// adds the 4 warp totals. Returns per block: {warp 0..3 totals, block total}.
std::vector<int> unequal_trip_counts(const std::vector<int>& lengths);

// A block of `threads` where threads >= `active` return first; the rest write shared memory, meet
// at __syncthreads and read their right neighbour (wrapping at `active`), then take
// __syncthreads_count(t % 3 == 0). Returns per thread {neighbour's value, count}, -1 for exited.
std::vector<int> barrier_with_exits(unsigned threads, unsigned active);

// __syncthreads_count / _and / _or in a block of 256 where every thread takes part, for the
// predicates "always", "thread 5 only", "never" and "even threads": 12 results per thread.
std::vector<int> barrier_reductions();

// 64 blocks of 128 threads each do every atomic once on global memory.
struct AtomicResults {
  int counter;                // atomicAdd(int, 1)
  int cas_counter;            // an atomicCAS loop adding 1
  float float_sum;            // atomicAdd(float, 1.0f): exact below 2^24
  unsigned long long id_sum;  // atomicAdd(unsigned long long, g)
  int max, min;               // atomicMax / atomicMin of (g * 37) % 1001 - 500
  unsigned bits;              // atomicOr(1 << (g % 32))
  unsigned sub;               // atomicSub(unsigned, 1) from 1'000'000
  std::vector<int> exchanged; // what atomicExch returned to each thread, then the final value
};
AtomicResults atomics();

// 32 blocks of 256 threads fill static and dynamic shared memory with their block id and check
// it over 16 rounds of __syncthreads. Returns the number of wrong reads (0).
int shared_memory_isolation();

// A kernel summing `bytes` of dynamic shared memory (64 KiB): launched first without
// cudaFuncSetAttribute (a launch error), then with it.
struct LargeShared {
  int error_without_attribute;  // a cudaError_t
  long long sum;                // sum of 0..n-1 over the block's n ints
};
LargeShared large_dynamic_shared(unsigned bytes);

}  // namespace fp8serve::cuda::semantics
