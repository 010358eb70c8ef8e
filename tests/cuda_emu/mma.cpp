// mma.sync in the emulator: mma.sync.aligned.m16n8k16.row.col.f32.{bf16.bf16,f16.f16}.f32 as a warp
// collective (warp_scheduler.cpp waits for the 32 lanes at one call site), D computed from the
// lanes' fragments by the PTX ISA's tables (ptx.cuh repeats them), summed in the run's MmaOrder.
#include <array>
#include <bit>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "tests/cuda_emu/ptx.hpp"
#include "tests/cuda_emu/runtime.hpp"
#include "tests/cuda_emu/warp_scheduler.hpp"

namespace fp8serve::emu {
namespace {

MmaOrder order_from_environment() {
  const char* name = std::getenv("FP8SERVE_EMU_MMA_ORDER");
  if (name == nullptr || *name == '\0') return MmaOrder::sequential;
  for (MmaOrder o : {MmaOrder::sequential, MmaOrder::pairwise, MmaOrder::reversed, MmaOrder::wide})
    if (std::strcmp(name, mma_order_name(o)) == 0) return o;
  detail::die("FP8SERVE_EMU_MMA_ORDER=%s: use sequential, pairwise, reversed or wide", name);
}

std::atomic<int>& order_setting() {
  static std::atomic<int> setting{static_cast<int>(order_from_environment())};
  return setting;
}

float bf16_lo(uint32_t pair) { return std::bit_cast<float>(pair << 16); }
float bf16_hi(uint32_t pair) { return std::bit_cast<float>(pair & 0xffff0000u); }
float f16_lo(uint32_t pair) {
  __half_raw h;
  h.x = static_cast<unsigned short>(pair & 0xffffu);
  return __half2float(__half(h));
}
float f16_hi(uint32_t pair) { return f16_lo(pair >> 16); }

// c + the 16 products (each exact in fp32: 8-bit (bf16) or 11-bit (f16) significands), in `order`.
float accumulate(float c, const std::array<float, 16>& p, MmaOrder order) {
  switch (order) {
    case MmaOrder::sequential: {
      float acc = c;
      for (float x : p) acc += x;
      return acc;
    }
    case MmaOrder::reversed: {
      float acc = p[15];
      for (int k = 14; k >= 0; --k) acc += p[static_cast<size_t>(k)];
      return acc + c;
    }
    case MmaOrder::pairwise: {
      std::array<float, 16> level = p;
      for (size_t n = 16; n > 1; n /= 2)
        for (size_t i = 0; i < n / 2; ++i) level[i] = level[2 * i] + level[2 * i + 1];
      return c + level[0];
    }
    case MmaOrder::wide: {
      double acc = c;
      for (float x : p) acc += x;  // exact: 17 terms within fp32's range fit a double's significand
      return static_cast<float>(acc);
    }
  }
  return c;
}

// D = A B + C over the 32 lanes' fragments, their registers' halves read by lo / hi.
template <float (*lo)(uint32_t), float (*hi)(uint32_t)>
void complete_mma_m16n8k16(const void* const* lanes) {
  float a[16][16], b[16][8], c[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const auto& l = *static_cast<const detail::MmaLane*>(lanes[lane]);
    const int g = lane / 4, t = lane % 4;
    const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int i = 0; i < 4; ++i) {
      a[rows[i]][cols[i]] = lo(l.a[i]);
      a[rows[i]][cols[i] + 1] = hi(l.a[i]);
    }
    b[2 * t][g] = lo(l.b[0]);
    b[2 * t + 1][g] = hi(l.b[0]);
    b[2 * t + 8][g] = lo(l.b[1]);
    b[2 * t + 9][g] = hi(l.b[1]);
    c[g][2 * t] = l.d[0];
    c[g][2 * t + 1] = l.d[1];
    c[g + 8][2 * t] = l.d[2];
    c[g + 8][2 * t + 1] = l.d[3];
  }
  const MmaOrder order = mma_order();
  for (int lane = 0; lane < 32; ++lane) {
    const auto& l = *static_cast<const detail::MmaLane*>(lanes[lane]);
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
      std::array<float, 16> products;
      for (int k = 0; k < 16; ++k) products[static_cast<size_t>(k)] = a[row][k] * b[k][col];
      l.d[e] = accumulate(c[row][col], products, order);
    }
  }
}

}  // namespace

void set_mma_order(MmaOrder order) { order_setting().store(static_cast<int>(order)); }
MmaOrder mma_order() { return static_cast<MmaOrder>(order_setting().load()); }

const char* mma_order_name(MmaOrder order) {
  switch (order) {
    case MmaOrder::sequential: return "sequential";
    case MmaOrder::pairwise: return "pairwise";
    case MmaOrder::reversed: return "reversed";
    case MmaOrder::wide: return "wide";
  }
  return "?";
}

namespace detail {

void mma_m16n8k16_bf16(const MmaLane& lane, Site site) {
  warp_collective(&complete_mma_m16n8k16<bf16_lo, bf16_hi>, &lane, "mma.sync.m16n8k16.bf16", site);
}

void mma_m16n8k16_f16(const MmaLane& lane, Site site) {
  warp_collective(&complete_mma_m16n8k16<f16_lo, f16_hi>, &lane, "mma.sync.m16n8k16.f16", site);
}

}  // namespace detail
}  // namespace fp8serve::emu
