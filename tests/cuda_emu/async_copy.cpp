// cp.async in the emulator (ptx.hpp says what it promises): deferred per thread as on the
// hardware, so that a missing wait_group, a wrong N, a missing barrier after the wait, or a stage
// refilled while another thread still reads it gives poisoned (NaN) data or an abort, every run.
//
// A copy's life: issued (the 16 destination bytes read 0xFF and are held: no other copy may
// target them), performed at the issuing thread's cp_async_wait (src read then), landed but
// visible to its thread only (while any other thread runs, the bytes are saved aside and the
// destination reads 0xFF again; they must still read 0xFF when the issuer resumes, or another
// thread wrote into them), and published by the next __syncthreads, or __syncwarp naming the
// issuer, after which they are ordinary shared memory.
#include <cstdio>
#include <cstring>

#include "tests/cuda_emu/runtime.hpp"
#include "tests/cuda_emu/warp_scheduler.hpp"

namespace fp8serve::emu::detail {
namespace {

constexpr int kCopyBytes = 16;

bool all_poison(const unsigned char* p) {
  for (int i = 0; i < kCopyBytes; ++i)
    if (p[i] != 0xff) return false;
  return true;
}

}  // namespace

bool BlockRunner::in_shared_memory(const void* p, size_t bytes) const {
  const auto* b = static_cast<const unsigned char*>(p);
  auto inside = [&](const void* base, size_t size) {
    const auto* lo = static_cast<const unsigned char*>(base);
    return base != nullptr && b >= lo && b + bytes <= lo + size;
  };
  if (inside(dynamic_shared_, launch_.shared_bytes)) return true;
  for (const SharedVariable& v : static_shared_)
    if (inside(v.data, v.bytes)) return true;
  return false;
}

void BlockRunner::cp_async_issue(CudaThread& self, void* smem, const void* gmem, int src_bytes, Site site) {
  char text[256];
  auto* dst = static_cast<unsigned char*>(smem);
  if (src_bytes < 0 || src_bytes > kCopyBytes) {
    std::snprintf(text, sizeof text, "src-size %d is outside [0, 16]", src_bytes);
    fail(self, site, "cp.async", text);
  }
  if (reinterpret_cast<uintptr_t>(dst) % kCopyBytes != 0 || !in_shared_memory(dst, kCopyBytes)) {
    std::snprintf(text, sizeof text, "destination %p is not 16 bytes of shared memory aligned to 16", smem);
    fail(self, site, "cp.async", text);
  }
  if (src_bytes > 0 && (reinterpret_cast<uintptr_t>(gmem) % kCopyBytes != 0 || !is_device_range(gmem, kCopyBytes))) {
    std::snprintf(text, sizeof text, "source %p is not 16 bytes of device memory aligned to 16", gmem);
    fail(self, site, "cp.async", text);
  }
  const auto [held, fresh] = copies_held_.emplace(dst, self.linear);
  if (!fresh) {
    const CudaThread& owner = threads_[held->second];
    std::snprintf(text, sizeof text,
                  "destination %p is still held by a cp.async of thread %u (warp %u, lane %u) that no wait_group and "
                  "barrier has completed for every thread",
                  smem, owner.linear, owner.linear / 32, owner.linear % 32);
    fail(self, site, "cp.async", text);
  }
  std::memset(dst, 0xff, kCopyBytes);
  self.open_copies.push_back({dst, static_cast<const unsigned char*>(gmem), src_bytes, site});
}

void BlockRunner::cp_async_commit(CudaThread& self) {
  self.copy_groups.push_back(std::move(self.open_copies));
  self.open_copies.clear();
}

void BlockRunner::cp_async_wait(CudaThread& self, int n, Site) {
  while (self.copy_groups.size() > static_cast<size_t>(n)) {
    for (const AsyncCopy& c : self.copy_groups.front()) {
      if (!all_poison(c.dst)) {
        char text[200];
        std::snprintf(text, sizeof text, "bytes at %p were written while this cp.async into them was in flight",
                      static_cast<void*>(c.dst));
        fail(self, c.site, "cp.async", text);
      }
      if (c.src_bytes > 0) std::memcpy(c.dst, c.src, static_cast<size_t>(c.src_bytes));
      std::memset(c.dst + c.src_bytes, 0, static_cast<size_t>(kCopyBytes - c.src_bytes));
      LandedCopy landed{c.dst, {}, c.site};
      self.landed.push_back(landed);
    }
    self.copy_groups.pop_front();
  }
}

void BlockRunner::hide_landed(CudaThread& t) {
  for (LandedCopy& c : t.landed) {
    std::memcpy(c.saved, c.dst, kCopyBytes);
    std::memset(c.dst, 0xff, kCopyBytes);
  }
}

void BlockRunner::restore_landed(CudaThread& t) {
  for (LandedCopy& c : t.landed) {
    if (!all_poison(c.dst)) {
      char text[256];
      std::snprintf(text, sizeof text,
                    "another thread wrote into bytes at %p that this thread's cp.async (%s:%u) filled, before a "
                    "barrier made them visible",
                    static_cast<void*>(c.dst), c.site.file, c.site.line);
      fail(t, c.site, "cp.async", text);
    }
    std::memcpy(c.dst, c.saved, kCopyBytes);
  }
}

void BlockRunner::publish_landed(CudaThread& t) {
  if (t.landed.empty()) return;
  restore_landed(t);
  for (const LandedCopy& c : t.landed) copies_held_.erase(c.dst);
  t.landed.clear();
}

void BlockRunner::check_no_copies_in_flight(const CudaThread& t) {
  size_t in_flight = t.open_copies.size();
  for (const auto& group : t.copy_groups) in_flight += group.size();
  if (in_flight == 0) return;
  Site site = t.open_copies.empty() ? Site{"?", 0} : t.open_copies.front().site;
  for (const auto& group : t.copy_groups)
    if (!group.empty()) {
      site = group.front().site;
      break;
    }
  char text[200];
  std::snprintf(text, sizeof text, "the thread exits with %zu cp.async copies never waited for (a missing wait_group)",
                in_flight);
  fail(t, site, "cp.async", text);
}

}  // namespace fp8serve::emu::detail
