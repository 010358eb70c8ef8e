// safetensors reader: files written by the safetensors package (single and sharded), and
// crafted headers that must be rejected by name.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "model/formats/safetensors.hpp"
#include "tests/unit/formats/format_test_util.hpp"

using namespace fp8serve;
using fp8serve::test::formats_fixture;

namespace {

std::vector<uint8_t> image(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> bytes(8 + header.size() + data_bytes, 0);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  std::copy(header.begin(), header.end(), bytes.begin() + 8);
  return bytes;
}

void require_error(const std::string& header, size_t data_bytes, const std::string& needle) {
  try {
    SafetensorsFile::from_bytes(image(header, data_bytes));
    FAIL("expected a FormatError mentioning '" << needle << "'");
  } catch (const FormatError& e) {
    INFO("message: " << e.what());
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("safetensors: a file written by the safetensors package", "[safetensors]") {
  const SafetensorsFile f = SafetensorsFile::open(formats_fixture("tiny.safetensors"));
  const auto expected = test::read_json(formats_fixture("tiny.safetensors.json"));
  CHECK(f.tensors().size() == 5);
  CHECK(f.metadata().at("format") == "pt");
  const SafetensorsTensor* w = f.find("w_f16");
  REQUIRE(w != nullptr);
  CHECK(w->dtype == SafetensorsDtype::f16);
  CHECK(w->shape == expected["w_f16"]["shape"].get<std::vector<int64_t>>());
  CHECK(w->data.size() == 3 * 5 * 2);
  const SafetensorsTensor* scalar = f.find("scalar");
  REQUIRE(scalar != nullptr);
  CHECK(scalar->shape.empty());
  CHECK(scalar->num_elements() == 1);
  float v;
  std::memcpy(&v, scalar->data.data(), 4);
  CHECK(v == 1.5f);
  CHECK(f.find("w_i64")->dtype == SafetensorsDtype::i64);
  CHECK(f.find("missing") == nullptr);
}

TEST_CASE("safetensors: sharded directory with an index", "[safetensors]") {
  const SafetensorsModel m = SafetensorsModel::open_dir(formats_fixture("sharded"));
  const auto tensors = m.tensors();
  REQUIRE(tensors.size() == 3);
  CHECK(tensors[0]->name == "w_bf16");  // sorted by name
  const SafetensorsFile single = SafetensorsFile::open(formats_fixture("tiny.safetensors"));
  for (const auto* t : tensors) {
    const SafetensorsTensor* s = single.find(t->name);
    REQUIRE(s != nullptr);
    CHECK(t->shape == s->shape);
    CHECK(std::equal(t->data.begin(), t->data.end(), s->data.begin(), s->data.end()));
  }
}

TEST_CASE("safetensors: index problems are reported by name", "[safetensors]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "fp8serve_test_shards";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(formats_fixture("sharded"))) {
    fs::copy_file(e.path(), dir / e.path().filename());
  }
  auto write_index = [&](const std::string& text) {
    std::ofstream(dir / "model.safetensors.index.json") << text;
  };
  write_index(R"({"weight_map": {"w_f32": "model-00002-of-00002.safetensors"}})");
  CHECK_THROWS_WITH(SafetensorsModel::open_dir(dir.string()), Catch::Contains("w_f32"));
  write_index(R"({"weight_map": {"w_f32": "../etc/passwd"}})");
  CHECK_THROWS_WITH(SafetensorsModel::open_dir(dir.string()), Catch::Contains("not a file name"));
  write_index(R"({"weight_map": {"w_f32": "missing.safetensors"}})");
  CHECK_THROWS_WITH(SafetensorsModel::open_dir(dir.string()), Catch::Contains("missing.safetensors"));
  write_index("{not json");
  CHECK_THROWS_AS(SafetensorsModel::open_dir(dir.string()), FormatError);
  fs::remove_all(dir);
  CHECK_THROWS_WITH(SafetensorsModel::open_dir(dir.string()), Catch::Contains("model.safetensors"));
}

TEST_CASE("safetensors: crafted headers are rejected by name", "[safetensors]") {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  CHECK_NOTHROW(SafetensorsFile::from_bytes(image("{" + ok_entry + "}", 16)));
  SECTION("header size beyond the file") {
    auto bytes = image("{}", 0);
    bytes[0] = 200;
    CHECK_THROWS_WITH(SafetensorsFile::from_bytes(bytes), Catch::Contains("header size"));
  }
  SECTION("invalid json") { require_error("{\"a\":", 0, "not valid JSON"); }
  SECTION("not an object") { require_error("[1,2]", 0, "not a JSON object"); }
  SECTION("unknown dtype") {
    require_error(R"({"a":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})", 1, "'F7'");
  }
  SECTION("negative dimension") {
    require_error(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "tensor 'a'");
  }
  SECTION("byte count does not match the shape") {
    require_error(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "tensor 'a'");
  }
  SECTION("offsets outside the data") {
    require_error(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, "outside");
  }
  SECTION("begin after end") {
    require_error(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 8, "outside");
  }
  SECTION("overlap") {
    require_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  12, "overlap");
  }
  SECTION("shape overflow") {
    require_error(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
                  4, "overflows");
  }
  SECTION("missing field") {
    require_error(R"({"a":{"dtype":"F32","shape":[1]}})", 4, "data_offsets");
  }
  SECTION("metadata value not a string") {
    require_error(R"({"__metadata__":{"x":1}})", 0, "__metadata__");
  }
}
