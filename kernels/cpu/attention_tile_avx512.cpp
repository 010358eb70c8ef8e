// Paged attention work item, AVX-512 build (16 lanes); the same structure and the same
// conversions as attention_tile_avx2.cpp (read the comments there). Called only when
// cpu_features() reports avx512f, avx512bw, avx2, fma and f16c.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's own AVX-512 intrinsics start from _mm512_undefined_*() (`__m512i __Y = __Y;`) and
// -Wmaybe-uninitialized (or -Wuninitialized, depending on the inlining) reports that inside
// avx512fintrin.h wherever they are inlined (GCC bug 105593): not our code, so silenced for
// this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cpu/attention_item.hpp"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
#endif

namespace fp8serve::cpu {
namespace {

#include "kernels/cpu/attention_vec_avx512.hpp"

}  // namespace
}  // namespace fp8serve::cpu

#include "kernels/cpu/attention_tile_impl.hpp"

namespace fp8serve::cpu {

void attend_item_avx512(const AttentionItem& item) { tile::attend_item_dispatch<VecAvx512>(item); }

}  // namespace fp8serve::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
