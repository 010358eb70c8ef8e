// Both parsers treat files as hostile: every truncation of a small valid file, and many random
// bit flips and byte splats, must give a FormatError or a file that parses consistently, never a
// crash or an out-of-bounds read (the sanitizer build runs these too).
#include <catch2/catch.hpp>
#include <random>

#include "model/formats/dequant.hpp"
#include "model/formats/gguf.hpp"
#include "model/formats/model_config.hpp"
#include "model/formats/safetensors.hpp"
#include "model/formats/weights.hpp"
#include "tests/unit/formats/format_test_util.hpp"

using namespace fp8serve;
using fp8serve::test::formats_fixture;

namespace {

// Parses a GGUF image and, when it parses, touches every metadata value and every tensor byte
// (dequantizing what can be), so a bad bounds check would read out of bounds here.
bool exercise_gguf(std::vector<uint8_t> bytes) {
  try {
    const GgufFile f = GgufFile::from_bytes(std::move(bytes));
    for (const auto& key : f.metadata_keys()) (void)f.describe(key);
    std::vector<float> out;
    for (const auto& t : f.tensors()) {
      const auto data = f.tensor_data(t);
      uint32_t sum = 0;
      for (uint8_t b : data) sum += b;
      (void)sum;
      if (can_dequantize(t.type) && t.num_elements() < (1 << 20)) {
        out.resize(static_cast<size_t>(t.num_elements()));
        dequantize_ggml(t.type, data, out);
      }
    }
    return true;
  } catch (const FormatError&) {
    return false;
  }
}

bool exercise_safetensors(std::vector<uint8_t> bytes) {
  try {
    const SafetensorsFile f = SafetensorsFile::from_bytes(std::move(bytes));
    for (const auto& t : f.tensors()) {
      uint32_t sum = 0;
      for (uint8_t b : t.data) sum += b;
      (void)sum;
      CHECK(t.data.size() == static_cast<size_t>(t.num_elements() *
                                                 safetensors_dtype_size(t.dtype)));
    }
    return true;
  } catch (const FormatError&) {
    return false;
  }
}

}  // namespace

TEST_CASE("GGUF: every truncation of a valid file is a FormatError", "[gguf][hostile]") {
  const auto bytes = test::read_bytes(formats_fixture("small.gguf"));
  REQUIRE(bytes.size() > 100);
  REQUIRE(exercise_gguf(bytes));
  // A cut file fails until the cut lies in the alignment padding after the last tensor; from
  // there on every longer prefix parses.
  size_t first_ok = bytes.size();
  for (size_t len = 0; len < bytes.size(); ++len) {
    const bool ok = exercise_gguf({bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(len)});
    if (ok && first_ok == bytes.size()) first_ok = len;
    INFO("truncated to " << len << " bytes");
    CHECK(ok == (len >= first_ok));
  }
  CHECK(first_ok + 32 > bytes.size());  // only padding (alignment 32) may be missing
}

TEST_CASE("GGUF: random bit flips never crash", "[gguf][hostile]") {
  std::mt19937_64 rng(1234);
  for (const char* name : {"small.gguf", "all_types.gguf"}) {
    const auto original = test::read_bytes(formats_fixture(name));
    // Flips in the header region matter most; all_types.gguf is mostly tensor data.
    const size_t region = std::min<size_t>(original.size(), 2048);
    int parsed = 0, rejected = 0;
    for (int trial = 0; trial < 3000; ++trial) {
      auto bytes = original;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < flips; ++i) bytes[rng() % region] ^= static_cast<uint8_t>(1u << (rng() % 8));
      (exercise_gguf(std::move(bytes)) ? parsed : rejected)++;
    }
    INFO(name << ": parsed " << parsed << ", rejected " << rejected);
    CHECK(rejected > 0);  // the checks do fire
    CHECK(parsed + rejected == 3000);
  }
}

TEST_CASE("GGUF: random byte splats and garbage never crash", "[gguf][hostile]") {
  std::mt19937_64 rng(99);
  const auto original = test::read_bytes(formats_fixture("small.gguf"));
  for (int trial = 0; trial < 3000; ++trial) {
    auto bytes = original;
    const size_t at = rng() % bytes.size();
    const size_t n = 1 + rng() % 8;
    for (size_t i = at; i < std::min(bytes.size(), at + n); ++i) {
      // 0xff runs make huge lengths and counts; other values random.
      bytes[i] = (rng() % 2) ? 0xff : static_cast<uint8_t>(rng());
    }
    exercise_gguf(std::move(bytes));
  }
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<uint8_t> junk(rng() % 256);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    if (junk.size() >= 4 && trial % 2 == 0) std::memcpy(junk.data(), "GGUF\3\0\0\0", std::min<size_t>(8, junk.size()));
    exercise_gguf(std::move(junk));
  }
}

TEST_CASE("safetensors: every truncation of a valid file is a FormatError",
          "[safetensors][hostile]") {
  const auto bytes = test::read_bytes(formats_fixture("tiny.safetensors"));
  REQUIRE(exercise_safetensors(bytes));
  for (size_t len = 0; len < bytes.size(); ++len) {
    INFO("truncated to " << len << " bytes");
    CHECK_FALSE(exercise_safetensors({bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(len)}));
  }
}

TEST_CASE("safetensors: random bit flips never crash", "[safetensors][hostile]") {
  std::mt19937_64 rng(4321);
  const auto original = test::read_bytes(formats_fixture("tiny.safetensors"));
  int rejected = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    auto bytes = original;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < flips; ++i) {
      // Mostly in the 8-byte size and the JSON header, where the checks live.
      const size_t region = (rng() % 4 == 0) ? bytes.size() : std::min<size_t>(bytes.size(), 400);
      bytes[rng() % region] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    if (!exercise_safetensors(std::move(bytes))) ++rejected;
  }
  CHECK(rejected > 0);
}

TEST_CASE("GGUF: bit-flipped model headers never crash the config and weight loaders",
          "[gguf][hostile]") {
  const std::string path = std::string(FP8SERVE_FIXTURES_DIR) + "/models/tiny-llama.gguf";
  if (!test::file_exists(path)) {
    WARN("tiny-llama.gguf not present yet; skipping");
    return;
  }
  const auto original = test::read_bytes(path);
  const GgufFile clean = GgufFile::from_bytes(original);
  // Flip anywhere before the tensor data: config keys, tokenizer arrays, tensor infos.
  const uint64_t header_end = clean.data_offset();
  REQUIRE(header_end > 1000);
  std::mt19937_64 rng(77);
  int loaded = 0;
  for (int trial = 0; trial < 400; ++trial) {
    auto bytes = original;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < flips; ++i) {
      // Half the flips among the tensor infos (the last 2 KiB of the header), half anywhere.
      const size_t at = (rng() % 2) ? header_end - 1 - rng() % 2048 : rng() % header_end;
      bytes[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    try {
      const auto f = std::make_shared<const GgufFile>(GgufFile::from_bytes(std::move(bytes)));
      const ModelConfig c = parse_gguf_config(*f);
      // Tensors are decoded when uploaded: decode them all here.
      for (const auto& [name, t] : load_gguf_weights(f, c).tensors) (void)t.to_bf16();
      ++loaded;
    } catch (const FormatError&) {
    }
  }
  CHECK(loaded < 400);  // some flips must be caught
}
