// The fp32 vector primitives of the AVX-512 attention tiles (16 lanes), shared by
// attention_tile_avx512.cpp and attention_tile_avx512bf16.cpp. Not a normal header, like
// attention_tile_impl.hpp: the including file opens its target region (AVX-512 F/BW/DQ/VL,
// AVX2, FMA, F16C at least) and an anonymous namespace inside fp8serve::cpu, then includes
// this file there; it includes nothing itself.

struct VecAvx512 {
  using Reg = __m512;
  static constexpr int W = 16;
  static constexpr int kNumRegs = 32;
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg x) { _mm512_storeu_ps(p, x); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static float reduce_add(Reg x) { return _mm512_reduce_add_ps(x); }
  static float reduce_max(Reg x) { return _mm512_reduce_max_ps(x); }
  // Per 128-bit lane: [a0+a1, a2+a3, b0+b1, b2+b3].
  static Reg hadd(Reg a, Reg b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  static Reg exp2(Reg x) {
    const Reg xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-126.0f)), _mm512_set1_ps(127.0f));
    const Reg n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const Reg f = _mm512_sub_ps(xc, n);
    Reg p = _mm512_set1_ps(kExp2Poly[0]);
#pragma GCC unroll 8
    for (int i = 1; i < kExp2PolyTerms; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[i]));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    const Reg result = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
    return _mm512_maskz_mov_ps(keep, result);
  }
  static constexpr float kFp8Unit = 256.0f;  // load_kv(FP8) returns value * 2^-8 (see avx2)
  static Reg load_kv(const uint8_t* p) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    __m256i halves = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7);
    halves = _mm256_and_si256(halves, _mm256_set1_epi16(static_cast<short>(0xbf80)));
    return _mm512_cvtph_ps(halves);
  }
  static Reg load_kv(const uint16_t* p) {
    const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
  }

  // 16 keys' 4-byte K groups (one per 32-bit lane; lanes >= `lanes` read as 0).
  static __m512i load_groups(const void* p, int lanes) {
    if (lanes >= W) return _mm512_loadu_si512(p);
    return _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << lanes) - 1), p);
  }
  // FP8: load_kv's fp16 trick on each byte of a 16-bit word (see attention_tile_avx2.cpp),
  // then vpmovdw gathers each element's 16 halves.
  static void load_k_group(const uint8_t* p, int lanes, Reg (&out)[4]) {
    const __m512i x = load_groups(p, lanes);
    const __m512i mask = _mm512_set1_epi16(static_cast<short>(0xbf80));
    const __m512i even = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(x, 8), 1), mask);  // bytes 0, 2
    const __m512i odd = _mm512_and_si512(_mm512_srai_epi16(x, 1), mask);                         // bytes 1, 3
    out[0] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(even));
    out[1] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(odd));
    out[2] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(even, 16)));
    out[3] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(odd, 16)));
  }
  // bf16: each lane holds two elements; the low one moves up, the high one is masked.
  static void load_k_group(const uint16_t* p, int lanes, Reg (&out)[2]) {
    const __m512i x = load_groups(p, lanes);
    out[0] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    out[1] = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};
