// Paged attention work item, portable build: one lane, the codec's own decoders. The reference
// the vector builds are tested against, and the path for CPUs without AVX2 or odd head_dims.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/bf16.hpp"
#include "kernels/cpu/attention_item.hpp"
#include "kernels/fp8.hpp"

namespace fp8serve::cpu {
namespace {

struct VecScalar {
  using Reg = float;
  static constexpr int W = 1;
  static constexpr int kNumRegs = 16;
  static Reg zero() { return 0.0f; }
  static Reg set1(float x) { return x; }
  static Reg load(const float* p) { return *p; }
  static void store(float* p, Reg x) { *p = x; }
  static Reg add(Reg a, Reg b) { return a + b; }
  static Reg mul(Reg a, Reg b) { return a * b; }
  static Reg fma(Reg a, Reg b, Reg c) { return a * b + c; }
  static Reg max(Reg a, Reg b) { return std::max(a, b); }
  static float reduce_add(Reg x) { return x; }
  static float reduce_max(Reg x) { return x; }
  static Reg exp2(Reg x) { return std::exp2(x); }
  static constexpr float kFp8Unit = 1.0f;  // exact decode
  static Reg load_kv(const uint8_t* p) { return fp8_e4m3_decode(*p); }
  static Reg load_kv(const uint16_t* p) { return bf16_decode(*p); }
  template <class T>
  static void load_k_group(const T* p, int /*lanes*/, Reg (&out)[kKPack<T>]) {
    for (int i = 0; i < kKPack<T>; ++i) out[i] = load_kv(p + i);
  }
};

}  // namespace
}  // namespace fp8serve::cpu

#include "kernels/cpu/attention_tile_impl.hpp"

namespace fp8serve::cpu {

void attend_item_scalar(const AttentionItem& item) { tile::attend_item_dispatch<VecScalar>(item); }

}  // namespace fp8serve::cpu
