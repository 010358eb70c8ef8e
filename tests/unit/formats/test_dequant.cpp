// Dequantization against gguf-py's quants.dequantize (bit for bit, on random blocks with
// subnormal and zero scales), f16 exhaustively, and f32 -> bf16 rounding against ml_dtypes.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "model/formats/dequant.hpp"
#include "model/formats/gguf.hpp"
#include "tests/unit/formats/format_test_util.hpp"

using namespace fp8serve;
using fp8serve::test::formats_fixture;

namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

}  // namespace

TEST_CASE("dequantize matches gguf-py bit for bit for every supported type", "[dequant]") {
  const auto expected = test::read_json(formats_fixture("all_types.expected.json"));
  const auto blob = test::read_bytes(formats_fixture("all_types.expected.bin"));
  const GgufFile f = GgufFile::open(formats_fixture("all_types.gguf"));
  int checked_types = 0;
  for (const auto& e : expected["tensors"]) {
    if (!e.contains("expected_offset")) continue;
    const GgufTensorInfo* t = f.find_tensor(e["name"].get<std::string>());
    REQUIRE(t != nullptr);
    INFO("tensor " << t->name << " type " << ggml_type_name(t->type));
    REQUIRE(can_dequantize(t->type));
    const auto count = e["expected_count"].get<size_t>();
    REQUIRE(count == static_cast<size_t>(t->num_elements()));
    std::vector<float> got(count);
    dequantize_ggml(t->type, f.tensor_data(*t), got);
    const uint8_t* want = blob.data() + e["expected_offset"].get<size_t>();
    size_t mismatches = 0, first = count;
    for (size_t i = 0; i < count; ++i) {
      uint32_t w;
      std::memcpy(&w, want + 4 * i, 4);
      const uint32_t g = bits_of(got[i]);
      // NaN payloads are not part of the contract; NaN-ness is.
      const bool same = g == w || (std::isnan(got[i]) && (w & 0x7fffffff) > 0x7f800000);
      if (!same && mismatches++ == 0) first = i;
    }
    INFO("first mismatch at element " << first);
    CHECK(mismatches == 0);
    ++checked_types;
  }
  CHECK(checked_types == 11);  // F32, F16 (all 65536 codes), BF16, Q4_0..Q8_0, Q4_K, Q5_K, Q6_K
}

TEST_CASE("dequantize rejects unsupported types and mismatched sizes", "[dequant]") {
  const GgufFile f = GgufFile::open(formats_fixture("all_types.gguf"));
  const GgufTensorInfo* q2k = f.find_tensor("q2_k");
  REQUIRE(q2k != nullptr);
  CHECK_FALSE(can_dequantize(q2k->type));
  std::vector<float> out(256);
  CHECK_THROWS_WITH(dequantize_ggml(q2k->type, f.tensor_data(*q2k), out), Catch::Contains("Q2_K"));
  const GgufTensorInfo* q41 = f.find_tensor("q4_1");
  std::vector<float> wrong(33);
  CHECK_THROWS_AS(dequantize_ggml(q41->type, f.tensor_data(*q41), wrong), FormatError);
  std::vector<float> short_dst(32);
  CHECK_THROWS_AS(dequantize_ggml(q41->type, f.tensor_data(*q41), short_dst), FormatError);
}

TEST_CASE("f32 -> bf16 rounds like ml_dtypes (nearest even, NaN kept)", "[dequant]") {
  const auto bytes = test::read_bytes(formats_fixture("bf16_rounding.bin"));
  REQUIRE(bytes.size() % 6 == 0);
  REQUIRE(bytes.size() / 6 > 10000);
  size_t mismatches = 0;
  for (size_t i = 0; i < bytes.size(); i += 6) {
    uint32_t in;
    uint16_t want;
    std::memcpy(&in, bytes.data() + i, 4);
    std::memcpy(&want, bytes.data() + i + 4, 2);
    float f;
    std::memcpy(&f, &in, 4);
    const uint16_t got = f32_to_bf16(f);
    const bool both_nan = (got & 0x7fff) > 0x7f80 && (want & 0x7fff) > 0x7f80;
    if (got != want && !both_nan) {
      if (mismatches++ < 5) WARN("f32 " << std::hex << in << " -> " << got << ", want " << want);
    } else if (both_nan) {
      CHECK((got & 0x8000) == (want & 0x8000));  // sign kept
    }
  }
  CHECK(mismatches == 0);
  CHECK(bf16_to_f32(f32_to_bf16(1.5f)) == 1.5f);
}
