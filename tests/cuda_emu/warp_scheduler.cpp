#include "tests/cuda_emu/warp_scheduler.hpp"

#include "tests/cuda_emu/ptx.hpp"
#include "tests/cuda_emu/runtime.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>

namespace fp8serve::emu::detail {
namespace {

constexpr unsigned kWarpSize = 32;

// The block runner and the CUDA thread of the fiber running on this OS thread.
thread_local BlockRunner* t_runner = nullptr;
thread_local CudaThread* t_thread = nullptr;

std::mutex& report_mutex() {
  static std::mutex* mutex = new std::mutex;  // held until abort: reports never interleave
  return *mutex;
}

const char* op_name(Wait wait, uint8_t op) {
  static const char* const warp_ops[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                                         "__ballot_sync", "__any_sync", "__all_sync", "__syncwarp",
                                         "__activemask", "a warp collective"};
  static const char* const barriers[] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and",
                                         "__syncthreads_or"};
  return wait == Wait::warp ? warp_ops[op] : barriers[op];
}

bool is_shuffle(WarpOp op) { return op <= WarpOp::shfl_xor; }

bool same_site(Site a, Site b) { return a.line == b.line && std::strcmp(a.file, b.file) == 0; }

const char* thread_op_name(const CudaThread& t) {
  if (t.wait == Wait::warp && static_cast<WarpOp>(t.op) == WarpOp::collective) return t.collective_name;
  return op_name(t.wait, t.op);
}

// Whether two lanes waiting at warp ops wait at the same one: the same op and mask, and for a
// collective the same instruction (.aligned: one call site).
bool same_warp_op(const CudaThread& a, const CudaThread& b) {
  if (a.op != b.op || a.mask != b.mask) return false;
  if (static_cast<WarpOp>(a.op) != WarpOp::collective) return true;
  return a.collective == b.collective && same_site(a.site, b.site);
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The lane a shuffle reads, by the PTX ISA's definition of shfl.sync with the operand c that
// CUDA's __shfl*_sync pass: segment mask 32 - width in c[12:8], clamp 0 (up) or 31 (the others).
// A source outside the lane's segment (below it for up, above it otherwise) gives the lane its
// own value; xor may read a lower segment.
unsigned shuffle_source(WarpOp op, unsigned lane, int lane_arg, int width) {
  const int self = static_cast<int>(lane);
  const int b = lane_arg & 31;
  const int segment_mask = 32 - width;
  const int min_lane = self & segment_mask;
  const int max_lane = op == WarpOp::shfl_up ? min_lane : (min_lane | (31 & ~segment_mask));
  int source = self;
  bool valid = false;
  switch (op) {
    case WarpOp::shfl_idx: source = min_lane | (b & ~segment_mask); valid = source <= max_lane; break;
    case WarpOp::shfl_up: source = self - b; valid = source >= max_lane; break;
    case WarpOp::shfl_down: source = self + b; valid = source <= max_lane; break;
    case WarpOp::shfl_xor: source = self ^ b; valid = source <= max_lane; break;
    default: break;
  }
  return static_cast<unsigned>(valid ? source : self);
}

void* allocate_poisoned(size_t bytes, size_t align) {
  void* data = ::operator new(bytes, std::align_val_t(align));
  std::memset(data, 0xff, bytes);  // reads as NaN (fp32, bf16, E4M3) until written
  return data;
}

constexpr size_t kSharedAlign = 16;

}  // namespace

BlockRunner::BlockRunner(const Launch& launch)
    : launch_(launch), threads_(size_t{launch.block.x} * launch.block.y * launch.block.z) {
  for (unsigned i = 0; i < threads_.size(); ++i) {
    CudaThread& t = threads_[i];
    t.linear = i;
    t.index = {i % launch.block.x, (i / launch.block.x) % launch.block.y, i / (launch.block.x * launch.block.y)};
  }
}

BlockRunner::~BlockRunner() { free_shared(); }

void BlockRunner::run(uint64_t block_linear) {
  const dim3 grid = launch_.grid;
  block_index_ = {static_cast<unsigned>(block_linear % grid.x), static_cast<unsigned>(block_linear / grid.x % grid.y),
                  static_cast<unsigned>(block_linear / (uint64_t{grid.x} * grid.y))};
  block_idx = block_index_;
  block_dim = launch_.block;
  grid_dim = grid;
  dynamic_shared_ = allocate_poisoned(launch_.shared_bytes, kSharedAlign);
  for (CudaThread& t : threads_) {
    t.wait = Wait::runnable;
    t.landed.clear();  // an exited thread's copies that no barrier published
    t.fiber.reset(&BlockRunner::thread_body);
  }
  num_exited_ = 0;
  copies_held_.clear();
  t_runner = this;
  // Run every runnable thread until it waits or exits; then complete what can complete: warp
  // groups first (a barrier needs every live thread, so none can be in a warp op), then the
  // barrier. When nothing can, the block is deadlocked. CUDA leaves the order of threads open,
  // within a warp too: each round runs them in a new seeded permutation, so code that reads what
  // another thread writes without a barrier between (or assumes a warp runs in lockstep without
  // __syncwarp) sees unwritten memory in some round, and the seed reproduces it.
  for (uint64_t round = 0;; ++round) {
    next_round_order(block_linear, round);
    for (unsigned i : order_) {
      CudaThread& t = threads_[i];
      if (t.wait != Wait::runnable) continue;
      t_thread = &t;
      thread_idx = t.index;
      if (!t.landed.empty()) restore_landed(t);
      t.fiber.resume();
      if (!t.landed.empty()) hide_landed(t);
    }
    t_thread = nullptr;
    if (release_warp_groups()) continue;
    if (num_exited_ == threads_.size()) break;
    if (release_barrier()) continue;
    report_deadlock();
  }
  t_runner = nullptr;
  free_shared();
}

void BlockRunner::thread_body() {
  BlockRunner& runner = *t_runner;
  try {
    runner.launch_.call.invoke(runner.launch_.call.args);
  } catch (const std::exception& e) {
    runner.fail(*t_thread, {"?", 0}, "kernel", std::string("threw ") + e.what());
  } catch (...) {
    runner.fail(*t_thread, {"?", 0}, "kernel", "threw an exception");
  }
  runner.check_no_copies_in_flight(*t_thread);
  t_thread->wait = Wait::exited;
  ++runner.num_exited_;
}

// A permutation of the threads for this round, from the run's seed, the launch and the block.
void BlockRunner::next_round_order(uint64_t block_linear, uint64_t round) {
  const auto n = static_cast<unsigned>(threads_.size());
  if (order_.size() != n) order_.resize(n);
  for (unsigned i = 0; i < n; ++i) order_[i] = i;
  uint64_t state = thread_order_seed() ^ (launch_.sequence * 0x9e3779b97f4a7c15ull) ^
                   (block_linear * 0xc2b2ae3d27d4eb4full) ^ (round * 0x165667b19e3779f9ull);
  for (unsigned i = n; i > 1; --i) std::swap(order_[i - 1], order_[splitmix64(state) % i]);
}

uint64_t BlockRunner::warp_op(CudaThread& self, WarpOp op, unsigned mask, uint64_t value, int lane_arg, int width,
                              Site site) {
  const unsigned lane = self.linear % kWarpSize;
  const char* name = op_name(Wait::warp, static_cast<uint8_t>(op));
  char text[96];
  if (((mask >> lane) & 1u) == 0) {
    std::snprintf(text, sizeof text, "mask 0x%08x does not name the calling lane %u", mask, lane);
    fail(self, site, name, text);
  }
  if (is_shuffle(op) && (width < 1 || width > 32 || (width & (width - 1)) != 0)) {
    std::snprintf(text, sizeof text, "width %d is not a power of 2 in [1, 32]", width);
    fail(self, site, name, text);
  }
  self.op = static_cast<uint8_t>(op);
  self.mask = mask;
  self.value = value;
  self.lane_arg = lane_arg;
  self.width = width;
  self.site = site;
  self.wait = Wait::warp;
  self.fiber.suspend();
  return self.result;
}

void BlockRunner::warp_collective(CudaThread& self, CollectiveFn fn, const void* payload, const char* name,
                                  Site site) {
  const unsigned first = self.linear - self.linear % kWarpSize;
  if (first + kWarpSize > threads_.size()) {
    char text[128];
    std::snprintf(text, sizeof text, "needs all 32 lanes of the warp, and this block's last warp has %zu",
                  threads_.size() - first);
    fail(self, site, name, text);
  }
  self.op = static_cast<uint8_t>(WarpOp::collective);
  self.mask = 0xffffffffu;
  self.collective = fn;
  self.payload = payload;
  self.collective_name = name;
  self.site = site;
  self.wait = Wait::warp;
  self.fiber.suspend();
}

int BlockRunner::barrier(CudaThread& self, BarrierOp op, int predicate, Site site) {
  self.op = static_cast<uint8_t>(op);
  self.value = predicate != 0;
  self.site = site;
  self.wait = Wait::barrier;
  self.fiber.suspend();
  return static_cast<int>(self.result);
}

// __activemask completes first, on its own, once nothing can run: the lanes of the warp that
// have not exited. Then a warp group completes when every lane its mask names waits at the same
// op with the same mask. A lane at another op may get there later (its own group completing
// first), so a disagreement is an error only once nothing else can move (report_deadlock); a mask
// naming a lane that has exited, or that the block does not have, is one at once.
bool BlockRunner::release_warp_groups() {
  bool released = false;
  const unsigned n = static_cast<unsigned>(threads_.size());
  for (CudaThread& t : threads_) {
    if (t.wait != Wait::warp || static_cast<WarpOp>(t.op) != WarpOp::activemask) continue;
    const unsigned first = t.linear - t.linear % kWarpSize;
    unsigned mask = 0;
    for (unsigned k = 0; k < kWarpSize && first + k < n; ++k)
      if (threads_[first + k].wait != Wait::exited) mask |= 1u << k;
    t.result = mask;
    t.wait = Wait::runnable;
    released = true;
  }
  if (released) return true;
  for (unsigned first = 0; first < n; first += kWarpSize) {
    const unsigned lanes = std::min(kWarpSize, n - first);
    for (unsigned l = 0; l < lanes; ++l) {
      const CudaThread& t = lane(first, l);
      if (t.wait != Wait::warp) continue;
      bool ready = true;
      for (unsigned k = 0; k < kWarpSize; ++k) {
        if (((t.mask >> k) & 1u) == 0) continue;
        char text[160];
        if (k >= lanes) {
          std::snprintf(text, sizeof text, "mask 0x%08x names lane %u, which this block does not have (%u threads)",
                        t.mask, k, n);
          fail(t, t.site, thread_op_name(t), text);
        }
        const CudaThread& u = lane(first, k);
        if (u.wait == Wait::exited) {
          std::snprintf(text, sizeof text, "mask 0x%08x names lane %u, which has exited", t.mask, k);
          fail(t, t.site, thread_op_name(t), text);
        }
        ready = ready && u.wait == Wait::warp && same_warp_op(u, t);
      }
      if (!ready) continue;
      complete_warp_group(first, t.mask);
      released = true;
    }
  }
  return released;
}

// Called when nothing can move: a lane whose mask's lanes all wait at warp ops, not all at its
// own op and mask, waits for ever (CUDA: undefined). Returns having found none.
void BlockRunner::check_warp_groups_agree() const {
  const unsigned n = static_cast<unsigned>(threads_.size());
  for (const CudaThread& t : threads_) {
    if (t.wait != Wait::warp) continue;
    const unsigned first = t.linear - t.linear % kWarpSize;
    const CudaThread* differing = nullptr;
    bool all_at_warp_ops = true;
    for (unsigned k = 0; k < kWarpSize && first + k < n; ++k) {
      const CudaThread& u = threads_[first + k];
      if (((t.mask >> k) & 1u) == 0) continue;
      all_at_warp_ops = all_at_warp_ops && u.wait == Wait::warp;
      if (differing == nullptr && !same_warp_op(u, t)) differing = &u;
    }
    if (!all_at_warp_ops || differing == nullptr) continue;
    char text[512];
    std::snprintf(text, sizeof text, "mask 0x%08x names lane %u, which waits at %s with mask 0x%08x (%s:%u)", t.mask,
                  differing->linear % kWarpSize, thread_op_name(*differing), differing->mask,
                  differing->site.file, differing->site.line);
    fail(t, t.site, thread_op_name(t), text);
  }
}

void BlockRunner::complete_warp_group(unsigned first, unsigned mask) {
  const auto op = static_cast<WarpOp>(lane(first, std::countr_zero(mask)).op);
  if (op == WarpOp::collective) {
    const void* lanes[kWarpSize];
    for (unsigned k = 0; k < kWarpSize; ++k) lanes[k] = lane(first, k).payload;
    lane(first, 0).collective(lanes);
    for (unsigned k = 0; k < kWarpSize; ++k) lane(first, k).wait = Wait::runnable;
    return;
  }
  if (op == WarpOp::syncwarp) {  // bar.warp.sync orders memory among its lanes: cp.async bytes too
    for (unsigned k = 0; k < kWarpSize; ++k)
      if (((mask >> k) & 1u) != 0) publish_landed(lane(first, k));
  }
  unsigned ballot = 0;
  for (unsigned k = 0; k < kWarpSize; ++k)
    if (((mask >> k) & 1u) != 0 && lane(first, k).value != 0) ballot |= 1u << k;
  for (unsigned k = 0; k < kWarpSize; ++k) {
    if (((mask >> k) & 1u) == 0) continue;
    CudaThread& u = lane(first, k);
    if (is_shuffle(op)) {
      const unsigned source = shuffle_source(op, k, u.lane_arg, u.width);
      if (((mask >> source) & 1u) == 0) {
        char text[96];
        std::snprintf(text, sizeof text, "lane %u reads lane %u, which is not in the mask 0x%08x", k, source, mask);
        fail(u, u.site, thread_op_name(u), text);
      }
      u.result = lane(first, source).value;
    } else if (op == WarpOp::ballot) {
      u.result = ballot;
    } else if (op == WarpOp::any) {
      u.result = ballot != 0;
    } else if (op == WarpOp::all) {
      u.result = ballot == mask;
    } else {
      u.result = 0;
    }
  }
  for (unsigned k = 0; k < kWarpSize; ++k)
    if (((mask >> k) & 1u) != 0) lane(first, k).wait = Wait::runnable;
}

// The barrier completes when every thread that has not exited waits at it, from one call site.
bool BlockRunner::release_barrier() {
  const CudaThread* leader = nullptr;
  unsigned arrived = 0, count = 0;
  for (const CudaThread& t : threads_) {
    if (t.wait == Wait::exited) continue;
    if (t.wait != Wait::barrier) return false;
    if (leader == nullptr) {
      leader = &t;
    } else if (t.op != leader->op || !same_site(t.site, leader->site)) {
      char text[512];
      std::snprintf(text, sizeof text, "thread %u waits at %s (%s:%u): a block must meet at one barrier", leader->linear,
                    op_name(Wait::barrier, leader->op), leader->site.file, leader->site.line);
      fail(t, t.site, op_name(Wait::barrier, t.op), text);
    }
    ++arrived;
    count += static_cast<unsigned>(t.value);
  }
  const auto op = static_cast<BarrierOp>(leader->op);
  const uint64_t result = op == BarrierOp::count ? count
                          : op == BarrierOp::all ? (count == arrived)
                          : op == BarrierOp::any ? (count > 0)
                                                 : 0;
  for (CudaThread& t : threads_) {
    publish_landed(t);  // exited threads' too
    if (t.wait == Wait::exited) continue;
    t.result = result;
    t.wait = Wait::runnable;
  }
  return true;
}

std::string BlockRunner::where(const CudaThread& t) const {
  if (t.wait == Wait::exited) return "exited";
  if (t.wait == Wait::runnable) return "runnable";
  char text[512];
  if (t.wait == Wait::warp)
    std::snprintf(text, sizeof text, "%s mask 0x%08x (%s:%u)", thread_op_name(t), t.mask, t.site.file, t.site.line);
  else
    std::snprintf(text, sizeof text, "%s (%s:%u)", op_name(t.wait, t.op), t.site.file, t.site.line);
  return text;
}

void BlockRunner::report_deadlock() const {
  check_warp_groups_agree();
  std::lock_guard lock(report_mutex());
  std::fprintf(stderr,
               "fp8serve CUDA emulator: deadlock in kernel %s, block (%u,%u,%u): no thread can continue (thread "
               "order seed %llu)\n",
               launch_.call.name, block_index_.x, block_index_.y, block_index_.z,
               static_cast<unsigned long long>(thread_order_seed()));
  for (size_t i = 0; i < threads_.size();) {
    const std::string state = where(threads_[i]);
    size_t end = i + 1;
    while (end < threads_.size() && where(threads_[end]) == state) ++end;
    std::fprintf(stderr, "  threads %zu-%zu (warps %zu-%zu): %s\n", i, end - 1, i / kWarpSize, (end - 1) / kWarpSize,
                 state.c_str());
    i = end;
  }
  std::abort();
}

void BlockRunner::fail(const CudaThread& t, Site site, const char* op, const std::string& message) const {
  std::lock_guard lock(report_mutex());
  std::fprintf(stderr,
               "fp8serve CUDA emulator: kernel %s, block (%u,%u,%u), thread (%u,%u,%u) (warp %u, lane %u): %s (%s:%u): "
               "%s (thread order seed %llu)\n",
               launch_.call.name, block_index_.x, block_index_.y, block_index_.z, t.index.x, t.index.y, t.index.z,
               t.linear / kWarpSize, t.linear % kWarpSize, op, site.file, site.line, message.c_str(),
               static_cast<unsigned long long>(thread_order_seed()));
  std::abort();
}

void* BlockRunner::static_shared(const CudaThread& self, const void* key, size_t bytes, size_t align, Site site) {
  for (const SharedVariable& v : static_shared_)
    if (v.key == key) return v.data;
  static_shared_bytes_ += bytes;
  char text[160];
  if (static_shared_bytes_ > kSharedPerBlock) {
    std::snprintf(text, sizeof text, "static shared memory reaches %zu bytes, over the 48 KiB nvcc allows",
                  static_shared_bytes_);
    fail(self, site, "FP8SERVE_SHARED", text);
  }
  if (static_shared_bytes_ + launch_.shared_bytes > kSharedPerBlockOptin) {
    std::snprintf(text, sizeof text, "static (%zu) + dynamic (%zu) shared memory is over the device's %zu bytes",
                  static_shared_bytes_, launch_.shared_bytes, kSharedPerBlockOptin);
    fail(self, site, "FP8SERVE_SHARED", text);
  }
  align = std::max(align, kSharedAlign);
  static_shared_.push_back({key, allocate_poisoned(bytes, align), bytes, align});
  return static_shared_.back().data;
}

void BlockRunner::free_shared() {
  for (const SharedVariable& v : static_shared_) ::operator delete(v.data, std::align_val_t(v.align));
  static_shared_.clear();
  static_shared_bytes_ = 0;
  if (dynamic_shared_ != nullptr) ::operator delete(dynamic_shared_, std::align_val_t(kSharedAlign));
  dynamic_shared_ = nullptr;
}

// The device functions of emu.hpp: the calling fiber's runner and thread, or an abort when
// called outside a kernel.
namespace {
CudaThread& current_thread(const char* op) {
  if (t_thread == nullptr) die("%s called outside a kernel", op);
  return *t_thread;
}
}  // namespace

uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int lane_arg, int width, Site site) {
  CudaThread& self = current_thread(op_name(Wait::warp, static_cast<uint8_t>(op)));
  return t_runner->warp_op(self, op, mask, value, lane_arg, width, site);
}

int barrier(BarrierOp op, int predicate, Site site) {
  CudaThread& self = current_thread(op_name(Wait::barrier, static_cast<uint8_t>(op)));
  return t_runner->barrier(self, op, predicate, site);
}

void warp_collective(CollectiveFn fn, const void* payload, const char* name, Site site) {
  t_runner->warp_collective(current_thread(name), fn, payload, name, site);
}

void cp_async_issue(void* smem, const void* gmem, int src_bytes, Site site) {
  t_runner->cp_async_issue(current_thread("cp.async"), smem, gmem, src_bytes, site);
}

void cp_async_commit(Site) { t_runner->cp_async_commit(current_thread("cp.async.commit_group")); }

void cp_async_wait(int n, Site site) { t_runner->cp_async_wait(current_thread("cp.async.wait_group"), n, site); }

void* static_shared(const void* key, size_t bytes, size_t align, Site site) {
  return t_runner->static_shared(current_thread("FP8SERVE_SHARED"), key, bytes, align, site);
}

void* dynamic_shared() {
  current_thread("FP8SERVE_DYNAMIC_SHARED");
  return t_runner->dynamic_shared();
}

void trap(Site site) {
  const CudaThread& self = current_thread("__trap");
  t_runner->fail(self, site, "__trap", "the kernel trapped");
}

bool in_kernel() { return t_runner != nullptr; }

}  // namespace fp8serve::emu::detail
