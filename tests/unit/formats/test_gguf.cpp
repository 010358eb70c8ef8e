// GGUF reader: metadata of every type and tensor infos against what gguf-py's own reader saw in
// the same file, then hand-crafted malformed headers, each of which must be a FormatError that
// names the problem.
#include <catch2/catch.hpp>
#include <cmath>

#include "model/formats/gguf.hpp"
#include "tests/unit/formats/format_test_util.hpp"

using namespace fp8serve;
using fp8serve::test::formats_fixture;
using fp8serve::test::GgufBytes;

namespace {

void require_format_error(std::vector<uint8_t> bytes, const std::string& needle) {
  try {
    GgufFile::from_bytes(std::move(bytes));
    FAIL("expected a FormatError mentioning '" << needle << "'");
  } catch (const FormatError& e) {
    INFO("message: " << e.what());
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("GGUF metadata of every type matches gguf-py", "[gguf]") {
  const auto expected = test::read_json(formats_fixture("all_types.expected.json"));
  const GgufFile f = GgufFile::open(formats_fixture("all_types.gguf"));
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 64);

  const auto& meta = expected["metadata"];
  CHECK(f.metadata_keys().size() == meta.size());
  for (const auto& [key, entry] : meta.items()) {
    INFO("key " << key);
    REQUIRE(f.has(key));
    const std::string type = entry["types"][0];
    const auto& value = entry["value"];
    if (type == "STRING") {
      CHECK(f.get_string(key) == value.get<std::string>());
    } else if (type == "BOOL") {
      CHECK(f.get_bool(key) == value.get<bool>());
    } else if (type == "FLOAT32" || type == "FLOAT64") {
      // gguf-py widened the f32 to double exactly as we do; compare exactly.
      CHECK(f.get_float(key) == value.get<double>());
    } else if (type == "ARRAY") {
      const std::string elem = entry["types"][1];
      if (elem == "STRING") {
        CHECK(f.get_string_array(key) == value.get<std::vector<std::string>>());
      } else if (elem == "FLOAT32" || elem == "FLOAT64") {
        CHECK(f.get_float_array(key) == value.get<std::vector<double>>());
      } else if (elem == "BOOL") {
        std::vector<int64_t> want;
        for (bool b : value) want.push_back(b ? 1 : 0);
        CHECK(f.get_int_array(key) == want);
      } else {
        CHECK(f.get_int_array(key) == value.get<std::vector<int64_t>>());
        // Integer arrays also read as floats (token scores are sometimes stored as ints).
        CHECK(f.get_float_array(key).size() == value.size());
      }
    } else {
      CHECK(f.get_int(key) == value.get<int64_t>());
      CHECK(f.get_float(key) == static_cast<double>(value.get<int64_t>()));
    }
  }
  CHECK(f.describe("t.u32") == "u32 4000000000");
  CHECK(f.describe("t.arr_str") == "[str x 4] \"a\", \"\", \"\xc3\xa9\xc3\xa8\", \"<|im_start|>\"");
  CHECK(f.describe("t.bool_true") == "bool true");
  CHECK(f.describe("absent.key") == "(absent)");
}

TEST_CASE("GGUF typed getters: absent is nullopt, wrong type is an error naming the key",
          "[gguf]") {
  const GgufFile f = GgufFile::open(formats_fixture("all_types.gguf"));
  CHECK_FALSE(f.get_string("no.such.key"));
  CHECK_FALSE(f.get_int("no.such.key"));
  CHECK(f.get_string_array("no.such.key").empty());
  CHECK_THROWS_WITH(f.get_int("t.str"), Catch::Contains("t.str"));
  CHECK_THROWS_AS(f.get_string("t.u8"), FormatError);
  CHECK_THROWS_AS(f.get_bool("t.u8"), FormatError);
  CHECK_THROWS_AS(f.get_float("t.str"), FormatError);
  CHECK_THROWS_AS(f.get_string_array("t.arr_i32"), FormatError);
  CHECK_THROWS_AS(f.get_int_array("t.arr_str"), FormatError);
  CHECK_THROWS_AS(f.get_int_array("t.arr_f32"), FormatError);
  CHECK_THROWS_AS(f.get_float_array("t.u32"), FormatError);
}

TEST_CASE("GGUF tensor infos match gguf-py and data spans stay inside the file", "[gguf]") {
  const auto expected = test::read_json(formats_fixture("all_types.expected.json"));
  const GgufFile f = GgufFile::open(formats_fixture("all_types.gguf"));
  const auto file_bytes = test::read_bytes(formats_fixture("all_types.gguf"));
  REQUIRE(f.tensors().size() == expected["tensors"].size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const auto& t = f.tensors()[i];
    const auto& e = expected["tensors"][i];
    INFO("tensor " << t.name);
    CHECK(t.name == e["name"].get<std::string>());
    CHECK(ggml_type_name(t.type) == e["type"].get<std::string>());
    // gguf-py reports shapes in ggml order too.
    CHECK(t.shape == e["ne"].get<std::vector<int64_t>>());
    CHECK(t.nbytes == e["nbytes"].get<uint64_t>());
    const auto data = f.tensor_data(t);
    CHECK(data.size() == t.nbytes);
    // gguf-py's data_offset is absolute in the file; ours is relative to the data section.
    CHECK(f.data_offset() + t.offset == e["offset"].get<uint64_t>());
    CHECK(e["offset"].get<uint64_t>() % 64 == 0);
    CHECK(std::memcmp(data.data(), file_bytes.data() + e["offset"].get<uint64_t>(), t.nbytes) == 0);
  }
  CHECK(f.find_tensor("q4_1") != nullptr);
  CHECK(f.find_tensor("nope") == nullptr);
}

TEST_CASE("GGUF hand-built file: empty strings and arrays, v2, default alignment", "[gguf]") {
  GgufBytes b;
  b.header(1, 3, /*version=*/2).kv_str("empty", "");
  b.str("arr").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(0);  // empty u32 array
  b.kv_u32("n", 7);
  b.tensor("t", {4}, 0, 0).pad_to(32).f32s({1, 2, 3, 4});
  const GgufFile f = GgufFile::from_bytes(b.bytes);
  CHECK(f.version() == 2);
  CHECK(f.get_string("empty") == std::string());
  CHECK(f.get_int_array("arr").empty());
  CHECK(f.describe("arr") == "[u32 x 0]");
  CHECK(f.get_int("n") == 7);
  const auto data = f.tensor_data(f.tensors()[0]);
  float v[4];
  std::memcpy(v, data.data(), 16);
  CHECK(v[3] == 4.0f);
}

TEST_CASE("GGUF malformed headers are FormatErrors naming the problem", "[gguf]") {
  SECTION("magic") { require_format_error({'G', 'G', 'M', 'L', 3, 0, 0, 0}, "not a GGUF file"); }
  SECTION("empty") { require_format_error({}, "truncated"); }
  SECTION("version 1") { require_format_error(GgufBytes().header(0, 0, 1).bytes, "version 1"); }
  SECTION("big endian") {
    require_format_error(GgufBytes().header(0, 0, 0x03000000).bytes, "big-endian");
  }
  SECTION("unknown version") { require_format_error(GgufBytes().header(0, 0, 9).bytes, "version 9"); }
  SECTION("absurd counts") {
    require_format_error(GgufBytes().header(0, uint64_t{1} << 60).bytes, "metadata count");
    require_format_error(GgufBytes().header(uint64_t{1} << 60, 0).bytes, "tensor count");
  }
  SECTION("string longer than the file") {
    GgufBytes b;
    b.header(0, 1).put<uint64_t>(1000).zeros(20);
    require_format_error(b.bytes, "metadata key #0");
  }
  SECTION("string length above the cap") {
    GgufBytes b;
    b.header(0, 1).put<uint64_t>(~uint64_t{0}).zeros(20);
    require_format_error(b.bytes, "limit");
  }
  SECTION("unknown value type") {
    GgufBytes b;
    b.header(0, 1).str("k").put<uint32_t>(13).zeros(8);
    require_format_error(b.bytes, "unknown value type 13");
  }
  SECTION("nested array") {
    GgufBytes b;
    b.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(1).zeros(16);
    require_format_error(b.bytes, "nested");
  }
  SECTION("array count larger than the file") {
    GgufBytes b;
    b.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(5).put<uint64_t>(1000).zeros(16);
    require_format_error(b.bytes, "claims 1000 elements");
  }
  SECTION("bool byte other than 0/1") {
    GgufBytes b;
    b.header(0, 1).str("flag").put<uint32_t>(7).put<uint8_t>(2);
    require_format_error(b.bytes, "flag");
  }
  SECTION("u64 above INT64_MAX") {
    GgufBytes b;
    b.header(0, 1).str("big").put<uint32_t>(10).put<uint64_t>(~uint64_t{0});
    require_format_error(b.bytes, "big");
  }
  SECTION("duplicate key") {
    require_format_error(GgufBytes().header(0, 2).kv_u32("a", 1).kv_u32("a", 2).bytes,
                         "duplicate metadata key 'a'");
  }
  SECTION("alignment not a power of two") {
    require_format_error(GgufBytes().header(0, 1).kv_u32("general.alignment", 48).bytes,
                         "general.alignment");
    require_format_error(GgufBytes().header(0, 1).kv_u32("general.alignment", 0).bytes,
                         "general.alignment");
  }
  SECTION("alignment of the wrong type") {
    require_format_error(GgufBytes().header(0, 1).kv_str("general.alignment", "32").bytes,
                         "general.alignment");
  }
  SECTION("too many dimensions") {
    GgufBytes b;
    b.header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0).pad_to(32).zeros(4);
    require_format_error(b.bytes, "5 dimensions");
  }
  SECTION("element count overflow") {
    GgufBytes b;
    b.header(1, 0).tensor("t", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0).pad_to(32);
    require_format_error(b.bytes, "overflows");
  }
  SECTION("unknown tensor type") {
    GgufBytes b;
    b.header(1, 0).tensor("t", {4}, 99, 0).pad_to(32).zeros(16);
    require_format_error(b.bytes, "unknown tensor type 99");
  }
  SECTION("row not a multiple of the block size") {
    GgufBytes b;
    b.header(1, 0).tensor("t", {33, 1}, 2, 0).pad_to(32).zeros(64);
    require_format_error(b.bytes, "block size 32");
  }
  SECTION("misaligned offset") {
    GgufBytes b;
    b.header(1, 0).tensor("t", {4}, 0, 4).pad_to(32).zeros(64);
    require_format_error(b.bytes, "not a multiple of the alignment");
  }
  SECTION("data past the end") {
    GgufBytes b;
    b.header(1, 0).tensor("t", {16}, 0, 0).pad_to(32).zeros(63);
    require_format_error(b.bytes, "outside the data section");
  }
  SECTION("offset near 2^64 does not wrap") {
    GgufBytes b;
    b.header(1, 0).tensor("t", {16}, 0, ~uint64_t{0} - 31).pad_to(32).zeros(64);
    require_format_error(b.bytes, "outside the data section");
  }
  SECTION("overlapping tensors") {
    GgufBytes b;
    b.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad_to(32).zeros(128);
    require_format_error(b.bytes, "overlap");
  }
  SECTION("duplicate tensor name") {
    GgufBytes b;
    b.header(2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).pad_to(32).zeros(64);
    require_format_error(b.bytes, "duplicate tensor name 'a'");
  }
}

TEST_CASE("GGUF open() names the path in errors", "[gguf]") {
  CHECK_THROWS_WITH(GgufFile::open("/nonexistent/model.gguf"),
                    Catch::Contains("/nonexistent/model.gguf"));
  CHECK_THROWS_WITH(GgufFile::open(formats_fixture("tiny.safetensors")),
                    Catch::Contains("tiny.safetensors") && Catch::Contains("not a GGUF file"));
}

TEST_CASE("GGUF tensor_data refuses infos of another file", "[gguf]") {
  const GgufFile f = GgufFile::open(formats_fixture("small.gguf"));
  GgufTensorInfo forged = f.tensors()[0];
  forged.nbytes = 1 << 30;
  CHECK_THROWS_AS(f.tensor_data(forged), FormatError);
}
