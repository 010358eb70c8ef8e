// The kernels of cuda_semantics.hpp: valid CUDA with defined results, for nvcc and the emulator.
#include "tests/unit/gpu/cuda_semantics.hpp"

#include "kernels/cuda/device_runtime.hpp"
#include "kernels/cuda/launch.hpp"

namespace fp8serve::cuda::semantics {
namespace {

constexpr unsigned kFull = 0xffffffffu;

// The lane of a thread: its linear index in the block, modulo 32.
__device__ __forceinline__ unsigned linear_thread() {
  return threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
}

__device__ __forceinline__ unsigned global_thread() {
  return blockIdx.x * blockDim.x * blockDim.y * blockDim.z + linear_thread();
}

template <class T, int kWidth>
__global__ void shuffle_kernel(const T* in, T* out, int kind, int base_arg, int lane_step) {
  const unsigned g = global_thread();
  const int arg = base_arg + static_cast<int>(linear_thread() % 32) * lane_step;
  const T v = in[g];
  T r = v;
  switch (kind) {
    case 0: r = __shfl_sync(kFull, v, arg, kWidth); break;
    case 1: r = __shfl_up_sync(kFull, v, static_cast<unsigned>(arg), kWidth); break;
    case 2: r = __shfl_down_sync(kFull, v, static_cast<unsigned>(arg), kWidth); break;
    default: r = __shfl_xor_sync(kFull, v, arg, kWidth); break;
  }
  out[g] = r;
}

template <class T, int kWidth>
void launch_shuffle(const T* in, T* out, int kind, int base_arg, int lane_step, Grid grid) {
  FP8SERVE_LAUNCH((shuffle_kernel<T, kWidth>), grid.blocks, dim3(grid.block_x, grid.block_y), 0, nullptr, in, out,
                  kind, base_arg, lane_step);
}

template <class T>
std::vector<T> shuffle(Shuffle kind, int width, int base_arg, int lane_step, Grid grid, T first) {
  const size_t n = grid.threads();
  std::vector<T> values(n);
  for (size_t g = 0; g < n; ++g) values[g] = first + static_cast<T>(g);
  DeviceBuffer in(n * sizeof(T)), out(n * sizeof(T));
  in.copy_from_host(values.data(), n * sizeof(T));
  const T* d_in = static_cast<const T*>(in.data());
  T* d_out = static_cast<T*>(out.data());
  const int k = static_cast<int>(kind);
  switch (width) {
    case 32: launch_shuffle<T, 32>(d_in, d_out, k, base_arg, lane_step, grid); break;
    case 16: launch_shuffle<T, 16>(d_in, d_out, k, base_arg, lane_step, grid); break;
    case 8: launch_shuffle<T, 8>(d_in, d_out, k, base_arg, lane_step, grid); break;
    case 4: launch_shuffle<T, 4>(d_in, d_out, k, base_arg, lane_step, grid); break;
    case 2: launch_shuffle<T, 2>(d_in, d_out, k, base_arg, lane_step, grid); break;
    default: launch_shuffle<T, 1>(d_in, d_out, k, base_arg, lane_step, grid); break;
  }
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  out.copy_to_host(values.data(), n * sizeof(T));
  return values;
}

__global__ void votes_kernel(const int* predicate, unsigned* ballot, int* any, int* all, bool split) {
  const unsigned g = global_thread();
  const unsigned lane = linear_thread() % 32;
  const unsigned mask = !split ? kFull : (lane < 16 ? 0x0000ffffu : 0xffff0000u);
  ballot[g] = __ballot_sync(mask, predicate[g]);
  any[g] = __any_sync(mask, predicate[g]);
  all[g] = __all_sync(mask, predicate[g]);
}

__global__ void block_sum_kernel(const int* values, int* sums) {
  FP8SERVE_SHARED(int[8], partial);
  const unsigned t = threadIdx.x, lane = t % 32, warp = t / 32;
  int v = values[blockIdx.x * blockDim.x + t];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(kFull, v, offset);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < blockDim.x / 32 ? partial[lane] : 0;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(kFull, v, offset);
    if (lane == 0) sums[blockIdx.x] = v;
  }
}

__global__ void unequal_trips_kernel(const int* lengths, int* out) {
  FP8SERVE_SHARED(int[4], warp_totals);
  const int b = static_cast<int>(blockIdx.x), lane = static_cast<int>(threadIdx.x % 32);
  const int w = static_cast<int>(threadIdx.x / 32);
  int total = 0;
  for (int i = 0; i < lengths[b] + w; ++i) {
    int v = (b * 131 + w * 17 + i * 7 + lane) % 23;
    for (int mask = 16; mask > 0; mask /= 2) v += __shfl_xor_sync(kFull, v, mask);
    total += v;  // every lane holds the warp's sum
  }
  if (lane == 0) warp_totals[w] = total;
  __syncthreads();
  if (threadIdx.x < 4) out[b * 5 + threadIdx.x] = warp_totals[threadIdx.x];
  if (threadIdx.x == 0) out[b * 5 + 4] = warp_totals[0] + warp_totals[1] + warp_totals[2] + warp_totals[3];
}

__global__ void exits_kernel(unsigned active, int* out) {
  FP8SERVE_SHARED(int[1024], values);
  const unsigned t = threadIdx.x;
  if (t >= active) return;
  values[t] = static_cast<int>(t * 3 + 1);
  __syncthreads();
  out[2 * t] = values[(t + 1) % active];
  out[2 * t + 1] = __syncthreads_count(t % 3 == 0);
}

__global__ void barrier_reductions_kernel(int* out) {
  const unsigned t = threadIdx.x;
  const int predicates[4] = {1, t == 5, 0, t % 2 == 0};
  for (int p = 0; p < 4; ++p) {
    out[t * 12 + p * 3 + 0] = __syncthreads_count(predicates[p]);
    out[t * 12 + p * 3 + 1] = __syncthreads_and(predicates[p]);
    out[t * 12 + p * 3 + 2] = __syncthreads_or(predicates[p]);
  }
}

struct AtomicTargets {
  int* counter;
  int* cas_counter;
  float* float_sum;
  unsigned long long* id_sum;
  int* max;
  int* min;
  unsigned* bits;
  unsigned* sub;
  int* slot;
  int* exchanged;
};

__global__ void atomics_kernel(AtomicTargets at) {
  const unsigned g = global_thread();
  const int value = static_cast<int>((g * 37) % 1001) - 500;
  atomicAdd(at.counter, 1);
  int seen = atomicAdd(at.cas_counter, 0), assumed = 0;
  do {
    assumed = seen;
    seen = atomicCAS(at.cas_counter, assumed, assumed + 1);
  } while (seen != assumed);
  atomicAdd(at.float_sum, 1.0f);
  atomicAdd(at.id_sum, static_cast<unsigned long long>(g));
  atomicMax(at.max, value);
  atomicMin(at.min, value);
  atomicOr(at.bits, 1u << (g % 32));
  atomicSub(at.sub, 1u);
  at.exchanged[g] = atomicExch(at.slot, static_cast<int>(g));
}

__global__ void isolation_kernel(int* wrong) {
  FP8SERVE_SHARED(int[256], tile);
  FP8SERVE_DYNAMIC_SHARED(int, mirror);
  const unsigned t = threadIdx.x, n = blockDim.x;
  const int b = static_cast<int>(blockIdx.x);
  tile[t] = b * 1000 + static_cast<int>(t);
  mirror[t] = -b;
  int bad = 0;
  for (unsigned round = 0; round < 16; ++round) {
    __syncthreads();
    const unsigned u = (t + round * 17) % n;
    bad += tile[u] != b * 1000 + static_cast<int>(u);
    bad += mirror[u] != -b;
    __syncthreads();
    if (t == round) tile[t] = b * 1000 + static_cast<int>(t);  // a write between barriers
  }
  if (bad != 0) atomicAdd(wrong, bad);
}

__global__ void large_shared_kernel(unsigned n, long long* sum) {
  FP8SERVE_DYNAMIC_SHARED(int, values);
  for (unsigned i = threadIdx.x; i < n; i += blockDim.x) values[i] = static_cast<int>(i);
  __syncthreads();
  if (threadIdx.x == 0) {
    long long s = 0;
    for (unsigned i = 0; i < n; ++i) s += values[i];
    *sum = s;
  }
}

template <class T>
std::vector<T> download(const DeviceBuffer& buffer, size_t n) {
  std::vector<T> host(n);
  buffer.copy_to_host(host.data(), n * sizeof(T));
  return host;
}

template <class T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer buffer(host.size() * sizeof(T));
  buffer.copy_from_host(host.data(), host.size() * sizeof(T));
  return buffer;
}

void finish_launch() {
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

std::vector<int> shuffle_ints(Shuffle kind, int width, int base_arg, int lane_step, Grid grid) {
  return shuffle<int>(kind, width, base_arg, lane_step, grid, 1000);
}

std::vector<double> shuffle_doubles(Shuffle kind, int width, int base_arg, int lane_step, Grid grid) {
  return shuffle<double>(kind, width, base_arg, lane_step, grid, 0.5);
}

Votes warp_votes(const std::vector<int>& predicate, bool split_halves) {
  const size_t n = predicate.size();
  DeviceBuffer d_predicate = upload(predicate), ballot(n * sizeof(unsigned)), any(n * sizeof(int)),
               all(n * sizeof(int));
  FP8SERVE_LAUNCH(votes_kernel, static_cast<unsigned>(n / 64), 64, 0, nullptr,
                  static_cast<const int*>(d_predicate.data()), static_cast<unsigned*>(ballot.data()),
                  static_cast<int*>(any.data()), static_cast<int*>(all.data()), split_halves);
  finish_launch();
  return {download<unsigned>(ballot, n), download<int>(any, n), download<int>(all, n)};
}

std::vector<int> block_sums(const std::vector<int>& values) {
  const unsigned blocks = static_cast<unsigned>(values.size() / 256);
  DeviceBuffer d_values = upload(values), sums(blocks * sizeof(int));
  FP8SERVE_LAUNCH(block_sum_kernel, blocks, 256, 0, nullptr, static_cast<const int*>(d_values.data()),
                  static_cast<int*>(sums.data()));
  finish_launch();
  return download<int>(sums, blocks);
}

std::vector<int> unequal_trip_counts(const std::vector<int>& lengths) {
  const unsigned blocks = static_cast<unsigned>(lengths.size());
  DeviceBuffer d_lengths = upload(lengths), out(blocks * 5 * sizeof(int));
  FP8SERVE_LAUNCH(unequal_trips_kernel, blocks, 128, 0, nullptr, static_cast<const int*>(d_lengths.data()),
                  static_cast<int*>(out.data()));
  finish_launch();
  return download<int>(out, blocks * 5);
}

std::vector<int> barrier_with_exits(unsigned threads, unsigned active) {
  DeviceBuffer out = upload(std::vector<int>(2 * threads, -1));
  FP8SERVE_LAUNCH(exits_kernel, 1, threads, 0, nullptr, active, static_cast<int*>(out.data()));
  finish_launch();
  return download<int>(out, 2 * threads);
}

std::vector<int> barrier_reductions() {
  DeviceBuffer out(256 * 12 * sizeof(int));
  FP8SERVE_LAUNCH(barrier_reductions_kernel, 1, 256, 0, nullptr, static_cast<int*>(out.data()));
  finish_launch();
  return download<int>(out, 256 * 12);
}

AtomicResults atomics() {
  constexpr unsigned kBlocks = 64, kThreads = 128, kN = kBlocks * kThreads;
  DeviceBuffer ints = upload(std::vector<int>{0, 0, -1000, 1000, -7}), float_sum = upload(std::vector<float>{0.0f}),
               id_sum = upload(std::vector<unsigned long long>{0}),
               words = upload(std::vector<unsigned>{0, 1'000'000}), exchanged(kN * sizeof(int));
  int* i = static_cast<int*>(ints.data());
  unsigned* w = static_cast<unsigned*>(words.data());
  const AtomicTargets targets{i,     i + 1, static_cast<float*>(float_sum.data()), static_cast<unsigned long long*>(id_sum.data()),
                              i + 2, i + 3, w,     w + 1, i + 4, static_cast<int*>(exchanged.data())};
  FP8SERVE_LAUNCH(atomics_kernel, kBlocks, kThreads, 0, nullptr, targets);
  finish_launch();
  const std::vector<int> r = download<int>(ints, 5);
  const std::vector<unsigned> words_host = download<unsigned>(words, 2);
  AtomicResults results{r[0], r[1], download<float>(float_sum, 1)[0], download<unsigned long long>(id_sum, 1)[0],
                        r[2], r[3], words_host[0], words_host[1], download<int>(exchanged, kN)};
  results.exchanged.push_back(r[4]);
  return results;
}

int shared_memory_isolation() {
  DeviceBuffer wrong = upload(std::vector<int>{0});
  FP8SERVE_LAUNCH(isolation_kernel, 32, 256, 256 * sizeof(int), nullptr, static_cast<int*>(wrong.data()));
  finish_launch();
  return download<int>(wrong, 1)[0];
}

LargeShared large_dynamic_shared(unsigned bytes) {
  DeviceBuffer sum = upload(std::vector<long long>{-1});
  const unsigned n = bytes / sizeof(int);
  FP8SERVE_LAUNCH(large_shared_kernel, 1, 256, bytes, nullptr, n, static_cast<long long*>(sum.data()));
  const cudaError_t without = cudaGetLastError();
  CUDA_CHECK(cudaFuncSetAttribute(large_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)));
  FP8SERVE_LAUNCH(large_shared_kernel, 1, 256, bytes, nullptr, n, static_cast<long long*>(sum.data()));
  finish_launch();
  return {static_cast<int>(without), download<long long>(sum, 1)[0]};
}

}  // namespace fp8serve::cuda::semantics
