// The FP8 E4M3FN codec (kernels/fp8.hpp) against an independent reference: the table that
// tests/scripts/make_fp8_table.py generated with ml_dtypes.float8_e4m3fn (committed in
// tests/fixtures/fp8/). ml_dtypes rounds to nearest even like CUDA but turns overflow into NaN;
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) saturates to ±448 instead, so those
// entries are checked against the saturation rule, and that ml_dtypes overflows exactly where
// CUDA starts to saturate (|x| > 464 = 448 + half an ulp) is checked too.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/fp8_encode_avx512.hpp"
#include "kernels/fp8.hpp"

namespace {

using fp8serve::fp8_bits_float;
using fp8serve::fp8_e4m3_decode;
using fp8serve::fp8_e4m3_encode;
using fp8serve::fp8_float_bits;

struct EncodeCase {
  uint32_t float_bits;
  uint8_t ml_code;  // ml_dtypes' answer: NaN (0x7f / 0xff) on overflow
};

struct Fp8Table {
  std::array<uint32_t, 256> decode_bits{};
  std::vector<EncodeCase> encode;
};

const Fp8Table& table() {
  static const Fp8Table loaded = [] {
    Fp8Table t;
    const std::string path = std::string(FP8SERVE_FIXTURES_DIR) + "/fp8/e4m3fn_table.txt";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("missing fixture " + path + " (tests/scripts/make_fp8_table.py)");
    std::array<bool, 256> seen{};
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream fields(line);
      std::string kind;
      uint32_t a = 0, b = 0;
      fields >> kind >> std::hex >> a >> b;
      if (!fields) throw std::runtime_error("bad fixture line: " + line);
      if (kind == "decode" && a < 256) {
        t.decode_bits[a] = b;
        seen[a] = true;
      } else if (kind == "encode" && b < 256) {
        t.encode.push_back({a, static_cast<uint8_t>(b)});
      } else {
        throw std::runtime_error("bad fixture line: " + line);
      }
    }
    if (!std::all_of(seen.begin(), seen.end(), [](bool s) { return s; }))
      throw std::runtime_error("fixture lacks some decode lines");
    return t;
  }();
  return loaded;
}

bool is_nan_code(uint8_t code) { return (code & 0x7fu) == 0x7fu; }

// The saturating reference built only from the table's decoded values: the nearest of the 127
// non-negative finite codes (codes 0x00..0x7e, increasing), ties to the even code, everything
// beyond 448 (infinity included) clamped to 448, NaN to 0x7f, the sign bit copied.
class TableEncoder {
 public:
  TableEncoder() {
    for (int c = 0; c <= 0x7e; ++c) values_[c] = fp8_bits_float(table().decode_bits[c]);
    for (int c = 0; c < 0x7e; ++c) midpoints_[c] = (double(values_[c]) + double(values_[c + 1])) / 2;
  }

  uint8_t encode(float x) const {
    const uint8_t sign = (fp8_float_bits(x) >> 24) & 0x80u;
    if (std::isnan(x)) return sign | 0x7fu;
    const double a = std::fabs(double(x));
    // First midpoint >= a: codes below it are strictly closer to a than to anything above.
    const auto it = std::lower_bound(midpoints_.begin(), midpoints_.end(), a);
    auto code = static_cast<uint8_t>(it - midpoints_.begin());
    if (it != midpoints_.end() && *it == a && (code & 1u)) ++code;  // exact tie: the even code
    return sign | code;  // a beyond the last midpoint gives 0x7e = 448: saturation
  }

 private:
  std::array<float, 127> values_{};
  std::array<double, 126> midpoints_{};
};

}  // namespace

TEST_CASE("decode matches ml_dtypes for all 256 codes", "[fp8]") {
  for (int c = 0; c < 256; ++c) {
    INFO("code 0x" << std::hex << c);
    const uint32_t expected = table().decode_bits[c];
    const float got = fp8_e4m3_decode(static_cast<uint8_t>(c));
    if (is_nan_code(static_cast<uint8_t>(c))) {
      CHECK(std::isnan(got));
      CHECK(std::signbit(got) == bool(expected >> 31));
    } else {
      CHECK(fp8_float_bits(got) == expected);  // bit equality: -0 stays -0
    }
  }
  // The contract's anchor points, spelled out.
  CHECK(fp8_e4m3_decode(0x7e) == 448.0f);
  CHECK(fp8_e4m3_decode(0x01) == std::ldexp(1.0f, -9));
  CHECK(fp8_e4m3_decode(0x08) == std::ldexp(1.0f, -6));
  CHECK(fp8_float_bits(fp8_e4m3_decode(0x80)) == 0x80000000u);
}

TEST_CASE("encode matches ml_dtypes at every rounding boundary, saturating like CUDA", "[fp8]") {
  const Fp8Table& t = table();
  REQUIRE(t.encode.size() > 1000);
  int num_midpoints = 0, num_saturated = 0;
  for (const EncodeCase& c : t.encode) {
    const float x = fp8_bits_float(c.float_bits);
    INFO("x = " << x << " (bits 0x" << std::hex << c.float_bits << ")");
    uint8_t expected = c.ml_code;
    if (std::isnan(x)) {
      CHECK(is_nan_code(c.ml_code));
    } else if (is_nan_code(c.ml_code)) {
      // ml_dtypes overflowed. CUDA SATFINITE saturates exactly where RNE would leave the
      // format: |x| > 464. Inside (448, 464] ml_dtypes itself must round to 448.
      CHECK(std::fabs(x) > 464.0f);
      expected = static_cast<uint8_t>((c.ml_code & 0x80u) | 0x7eu);
      ++num_saturated;
    } else if (std::fabs(x) > 448.0f) {
      CHECK(std::fabs(x) <= 464.0f);
      CHECK((c.ml_code & 0x7fu) == 0x7eu);
    }
    CHECK(fp8_e4m3_encode(x) == expected);
    CHECK(TableEncoder().encode(x) == expected);  // the sweep's reference agrees with ml_dtypes
    const uint8_t code = c.ml_code;
    if (!is_nan_code(code) && (code & 0x7fu) < 0x7eu) {
      const double mid = (double(fp8_e4m3_decode(code & 0x7fu)) + double(fp8_e4m3_decode((code & 0x7fu) + 1))) / 2;
      if (std::fabs(double(x)) == mid) ++num_midpoints;
    }
  }
  CHECK(num_midpoints >= 100);  // the table holds the ties, not only easy points
  CHECK(num_saturated >= 10);
}

TEST_CASE("saturation, infinities, NaN and signed zero follow __NV_SATFINITE", "[fp8]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(fp8_e4m3_encode(inf) == 0x7e);
  CHECK(fp8_e4m3_encode(-inf) == 0xfe);
  CHECK(fp8_e4m3_encode(448.0f) == 0x7e);
  CHECK(fp8_e4m3_encode(464.0f) == 0x7e);                             // tie 448|480: even = 448
  CHECK(fp8_e4m3_encode(std::nextafter(464.0f, inf)) == 0x7e);        // would round to 480: clamp
  CHECK(fp8_e4m3_encode(-1e30f) == 0xfe);
  CHECK(fp8_e4m3_encode(std::numeric_limits<float>::max()) == 0x7e);
  CHECK(fp8_e4m3_encode(std::nanf("")) == 0x7f);
  CHECK(fp8_e4m3_encode(-std::nanf("")) == 0xff);  // sign kept, as ml_dtypes/torch (CUDA: 0x7f)
  CHECK(fp8_e4m3_encode(fp8_bits_float(0x7f800001u)) == 0x7f);        // signalling NaN
  CHECK(fp8_e4m3_encode(0.0f) == 0x00);
  CHECK(fp8_e4m3_encode(-0.0f) == 0x80);
  CHECK(fp8_e4m3_encode(std::ldexp(1.0f, -10)) == 0x00);              // half the min subnormal
  CHECK(fp8_e4m3_encode(-std::ldexp(1.0f, -10)) == 0x80);             // tiny negative: -0
  CHECK(fp8_e4m3_encode(std::nextafter(std::ldexp(1.0f, -10), inf)) == 0x01);
  CHECK(fp8_e4m3_encode(std::numeric_limits<float>::denorm_min()) == 0x00);
  CHECK(fp8_e4m3_encode(std::ldexp(1.0f, -9) * 1.5f) == 0x02);        // tie 1|2: even
  CHECK(fp8_e4m3_encode(std::ldexp(1.0f, -9) * 2.5f) == 0x02);        // tie 2|3: even
  CHECK(fp8_e4m3_encode(std::ldexp(1.0f, -9) * 7.5f) == 0x08);        // subnormal carries to 2^-6
}

TEST_CASE("encode(decode(code)) == code for every non-NaN code", "[fp8]") {
  for (int c = 0; c < 256; ++c) {
    if (is_nan_code(static_cast<uint8_t>(c))) continue;
    INFO("code 0x" << std::hex << c);
    CHECK(fp8_e4m3_encode(fp8_e4m3_decode(static_cast<uint8_t>(c))) == c);
  }
}

namespace {

struct SweepSegment {
  uint64_t begin, end, stride;  // float32 bit patterns [begin, end) every `stride`
};

// Sweeps the segments on all cores against the table's midpoints. Within a sign, bit order is
// magnitude order, so the reference code only moves up: each segment walks a cursor over the
// midpoints (the decision TableEncoder::encode makes, which the test above ties to ml_dtypes)
// instead of a binary search per value. Returns the number of mismatches; the first goes to INFO.
uint64_t sweep(const std::vector<SweepSegment>& segments) {
  std::array<double, 126> midpoints{};
  for (int c = 0; c < 0x7e; ++c) {
    midpoints[c] = (double(fp8_bits_float(table().decode_bits[c])) +
                    double(fp8_bits_float(table().decode_bits[c + 1]))) / 2;
  }
  const TableEncoder reference;
  std::atomic<size_t> next_segment{0};
  std::atomic<uint64_t> mismatches{0}, num_checked{0};
  std::atomic<uint32_t> first_bad{0};
  auto work = [&] {
    for (size_t i = next_segment++; i < segments.size(); i = next_segment++) {
      const SweepSegment seg = segments[i];
      uint32_t cursor = reference.encode(fp8_bits_float(static_cast<uint32_t>(seg.begin))) & 0x7fu;
      uint64_t local_bad = 0, local_checked = 0;
      for (uint64_t b = seg.begin; b < seg.end; b += seg.stride) {
        const auto bits = static_cast<uint32_t>(b);
        const float x = fp8_bits_float(bits);
        const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
        uint8_t expected;
        if (std::isnan(x)) {
          expected = sign | 0x7fu;
        } else {
          const double a = std::fabs(double(x));
          while (cursor < 0x7e && (a > midpoints[cursor] || (a == midpoints[cursor] && (cursor & 1u)))) ++cursor;
          expected = static_cast<uint8_t>(sign | cursor);
        }
        ++local_checked;
        if (fp8_e4m3_encode(x) != expected && local_bad++ == 0) first_bad = bits;
      }
      mismatches += local_bad;
      num_checked += local_checked;
    }
  };
  std::vector<std::thread> workers;
  for (unsigned w = 1; w < std::max(1u, std::thread::hardware_concurrency()); ++w) workers.emplace_back(work);
  work();
  for (std::thread& t : workers) t.join();
  uint64_t expected_checked = 0;
  for (const SweepSegment& seg : segments) expected_checked += (seg.end - seg.begin + seg.stride - 1) / seg.stride;
  CHECK(num_checked == expected_checked);
  INFO("first mismatch at float bits 0x" << std::hex << first_bad.load());
  CHECK(mismatches == 0);
  return mismatches;
}

// Splits [begin, end) into segments that never cross the sign bit (the cursor restarts at 0).
void add_range(std::vector<SweepSegment>& segments, uint64_t begin, uint64_t end, uint64_t stride) {
  constexpr uint64_t kChunk = uint64_t{1} << 24;
  for (uint64_t b = begin; b < end; b += kChunk) segments.push_back({b, std::min(end, b + kChunk), stride});
}

}  // namespace

// Every non-negative float32 below 512 (every decision the encoder makes: all rounding
// boundaries, subnormals, the saturation edge at 464) exhaustively; the negative mirror at an
// odd stride; the rest (beyond 512: saturation, infinities, NaN payloads) at a coarse stride.
// About 1.6e9 encodes, a few seconds on two cores in Release; sanitizer builds use a stride.
TEST_CASE("dense sweep over float32 bit patterns matches the table-driven reference", "[fp8]") {
#if defined(__SANITIZE_ADDRESS__)
  constexpr uint64_t kScale = 97;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  constexpr uint64_t kScale = 97;
#else
  constexpr uint64_t kScale = 1;
#endif
#else
  constexpr uint64_t kScale = 1;
#endif
  constexpr uint64_t k512 = 0x44000000u;  // bits of 512.0f
  std::vector<SweepSegment> segments;
  add_range(segments, 0, k512, kScale);
  add_range(segments, k512, 0x80000000u, 101 * kScale);
  add_range(segments, 0x80000000u, 0x80000000u + k512, 3 * kScale);
  add_range(segments, 0x80000000u + k512, uint64_t{1} << 32, 101 * kScale);
  sweep(segments);
}

// All 2^32 bit patterns (about 3x the default sweep). Hidden: run with `test_fp8 [exhaustive]`.
TEST_CASE("exhaustive sweep over all 2^32 float32 bit patterns", "[.][exhaustive]") {
  std::vector<SweepSegment> segments;
  add_range(segments, 0, uint64_t{1} << 32, 1);
  sweep(segments);
}

TEST_CASE("the 16-lane AVX-512 encoder is bitwise the scalar codec", "[fp8]") {
  if (!fp8serve::cpu::cpu_features().avx512f) {
    WARN("no AVX-512F: the vector encoder is not tested on this machine");
    return;
  }
  // Every float whose low 12 bits are zero (every exponent, sign, NaN and infinity, every E4M3
  // rounding boundary and tie, normal and subnormal), each with its two neighbours.
  std::vector<float> values;
  values.reserve(16 * 3 << 20);
  for (uint64_t hi = 0; hi < (uint64_t{1} << 20); ++hi) {
    const uint32_t bits = static_cast<uint32_t>(hi << 12);
    for (const uint32_t b : {bits, bits + 1, bits - 1}) values.push_back(fp8_bits_float(b));
  }
  values.resize(values.size() / 16 * 16);
  uint64_t mismatches = 0;
  for (std::size_t i = 0; i < values.size(); i += 16) {
    uint8_t got[16];
    fp8serve::cpu::fp8_e4m3_encode16(&values[i], got);
    for (int j = 0; j < 16; ++j) {
      if (got[j] != fp8_e4m3_encode(values[i + static_cast<std::size_t>(j)])) {
        if (++mismatches <= 5) FAIL_CHECK("bits " << fp8_float_bits(values[i + static_cast<std::size_t>(j)]));
      }
    }
  }
  CHECK(mismatches == 0);
}

// bf16_decode(bf16_encode(x)) of 16 floats given by their bits, through the vector rounding.
FP8SERVE_TARGET_AVX512F static void bf16_round16_of(const uint32_t* bits, float* out) {
  _mm512_storeu_ps(out, fp8serve::cpu::bf16_round16(_mm512_castsi512_ps(_mm512_loadu_si512(bits))));
}

TEST_CASE("the 16-lane AVX-512 bf16 rounding is bitwise the scalar bf16 codec", "[fp8][bf16]") {
  if (!fp8serve::cpu::cpu_features().avx512f) {
    WARN("no AVX-512F: the vector bf16 rounding is not tested on this machine");
    return;
  }
  // Every bf16 value (every exponent, sign, infinity and NaN payload of the kept half) with the
  // dropped half at zero, just below, at and just above one half, and at its largest: every
  // rounding case, ties to even and odd, and the carries into the exponent.
  std::vector<uint32_t> bits;
  for (uint32_t hi = 0; hi < (1u << 16); ++hi) {
    for (const uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) bits.push_back(hi << 16 | lo);
  }
  bits.resize(bits.size() / 16 * 16);
  uint64_t mismatches = 0;
  for (std::size_t i = 0; i < bits.size(); i += 16) {
    alignas(64) uint32_t lanes[16];
    alignas(64) float rounded[16];
    std::copy(bits.begin() + static_cast<std::ptrdiff_t>(i), bits.begin() + static_cast<std::ptrdiff_t>(i + 16), lanes);
    bf16_round16_of(lanes, rounded);
    for (int j = 0; j < 16; ++j) {
      const float x = fp8_bits_float(lanes[j]);
      const uint32_t want = static_cast<uint32_t>(fp8serve::bf16_encode(x)) << 16;
      if (fp8_float_bits(rounded[j]) != want && ++mismatches <= 5) FAIL_CHECK("bits " << lanes[j]);
    }
  }
  CHECK(mismatches == 0);
}
