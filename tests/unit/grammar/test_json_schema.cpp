// JSON Schema -> grammar, checked byte by byte: what a schema's grammar accepts and rejects.
#include <catch2/catch.hpp>

#include <random>

#include "grammar_test_util.hpp"

using namespace fp8serve::grammar;
using namespace fp8serve::grammar::test;

TEST_CASE("object: required, optional, order, commas, no extra properties") {
  const auto g = compile(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                             "c": {"type": "boolean"}}, "required": ["a"]})");
  CHECK(accepts(g, R"({"a": 1})"));
  CHECK(accepts(g, R"({"a":1,"b":"x"})"));
  CHECK(accepts(g, R"({"a": 1, "c": true})"));
  CHECK(accepts(g, R"({"a": -12, "b": "hi", "c": false})"));
  CHECK(accepts(g, "{\n  \"a\": 1,\n  \"b\": \"x\"\n}"));
  CHECK_FALSE(accepts(g, R"({"b": "x"})"));          // a is required
  CHECK_FALSE(accepts(g, R"({"b": "x", "a": 1})"));  // schema order
  CHECK_FALSE(accepts(g, R"({"a": 1, "d": 2})"));    // no additional properties
  CHECK_FALSE(accepts(g, R"({"a": 1,})"));
  CHECK_FALSE(accepts(g, R"({"a": 1 "b": "x"})"));
  CHECK_FALSE(accepts(g, R"({"a": "1"})"));
  CHECK_FALSE(accepts(g, R"({"a": 1})" " "));         // nothing after the value
  CHECK_FALSE(accepts(g, "{\n\n\n\"a\": 1}"));        // whitespace is bounded
}

TEST_CASE("object: additionalProperties schema and a bare object") {
  const auto g = compile(R"({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
                             "additionalProperties": {"type": "string"}})");
  CHECK(accepts(g, R"({"id": 3})"));
  CHECK(accepts(g, R"({"id": 3, "x": "y", "idx": "z", "i": ""})"));
  CHECK_FALSE(accepts(g, R"({"id": 3, "id": "again"})"));  // a declared name is not "additional"
  CHECK_FALSE(accepts(g, R"({"id": 3, "x": 1})"));
  const auto any = compile(R"({"type": "object"})");
  CHECK(accepts(any, R"({})"));
  CHECK(accepts(any, R"({"k": [1, {"n": null}], "s": "t"})"));
  CHECK_FALSE(accepts(any, R"([])"));
}

TEST_CASE("strings: escapes, UTF-8, lengths in characters") {
  const auto g = compile(R"({"type": "string"})");
  CHECK(accepts(g, R"("")"));
  CHECK(accepts(g, R"("a \"quoted\" \\ \/ \n \t \u00e9 \uFFFF")"));
  CHECK(accepts(g, "\"caf\xC3\xA9 \xF0\x9F\x98\x80\""));
  CHECK_FALSE(accepts(g, "\"a\nb\""));             // raw control character
  CHECK_FALSE(accepts(g, R"("\x")"));
  CHECK_FALSE(accepts(g, R"("\ud800")"));           // lone surrogate escape
  CHECK_FALSE(accepts(g, "\"\xC3\""));              // cut UTF-8
  CHECK_FALSE(accepts(g, "\"\xED\xA0\x80\""));      // encoded surrogate
  CHECK_FALSE(accepts(g, "\"\xC0\xAF\""));          // overlong
  const auto len = compile(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  CHECK_FALSE(accepts(len, R"("a")"));
  CHECK(accepts(len, R"("ab")"));
  CHECK(accepts(len, "\"\xC3\xA9\xC3\xA9\xC3\xA9\""));  // three characters, six bytes
  CHECK(accepts(len, R"("\n\t")"));
  CHECK_FALSE(accepts(len, R"("abcd")"));
}

TEST_CASE("strings: pattern with search semantics, classes and anchors") {
  const auto anchored = compile(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"})");
  CHECK(accepts(anchored, R"("AB-123")"));
  CHECK_FALSE(accepts(anchored, R"("AB-1234")"));
  CHECK_FALSE(accepts(anchored, R"("ab-123")"));
  const auto search = compile(R"({"type": "string", "pattern": "cat|dog"})");
  CHECK(accepts(search, R"("my dog")"));
  CHECK(accepts(search, R"("cat")"));
  CHECK_FALSE(accepts(search, R"("bird")"));
  const auto quote = compile(R"({"type": "string", "pattern": "^[^a-z]+$"})");
  CHECK(accepts(quote, R"("\"X\\")"));  // a quote and a backslash, escaped in JSON
  CHECK_FALSE(accepts(quote, R"("Xy")"));
  const auto bounded = compile(R"({"type": "string", "pattern": "^a+$", "maxLength": 3})");
  CHECK(accepts(bounded, R"("aaa")"));
  CHECK_FALSE(accepts(bounded, R"("aaaa")"));
}

TEST_CASE("strings: formats") {
  const auto date = compile(R"({"type": "string", "format": "date"})");
  CHECK(accepts(date, R"("2024-02-28")"));
  CHECK_FALSE(accepts(date, R"("2024-02-30")"));
  CHECK_FALSE(accepts(date, R"("2024-13-01")"));
  CHECK(accepts(compile(R"({"type": "string", "format": "date-time"})"), R"("2024-06-01T12:30:00Z")"));
  CHECK(accepts(compile(R"({"type": "string", "format": "time"})"), R"("23:59:59.5+02:00")"));
  CHECK(accepts(compile(R"({"type": "string", "format": "uuid"})"), R"("123e4567-e89b-12d3-a456-426614174000")"));
  CHECK(accepts(compile(R"({"type": "string", "format": "email"})"), R"("ada.lovelace@example.org")"));
  CHECK(accepts(compile(R"({"type": "string", "format": "ipv4"})"), R"("192.168.0.255")"));
  CHECK_FALSE(accepts(compile(R"({"type": "string", "format": "ipv4"})"), R"("192.168.0.256")"));
  CHECK(error_keyword(R"({"type": "string", "format": "iri-reference"})") == "format");
}

TEST_CASE("integers: exact ranges against a brute-force check") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> bound(-250, 250);
  for (int trial = 0; trial < 30; ++trial) {
    int lo = bound(rng), hi = bound(rng);
    if (lo > hi) std::swap(lo, hi);
    const bool ex_lo = trial % 3 == 0, ex_hi = trial % 4 == 0;
    Json schema = {{"type", "integer"}};
    schema[ex_lo ? "exclusiveMinimum" : "minimum"] = lo;
    schema[ex_hi ? "exclusiveMaximum" : "maximum"] = hi;
    const auto g = compile(schema);
    for (int x = -300; x <= 300; ++x) {
      const bool want = (ex_lo ? x > lo : x >= lo) && (ex_hi ? x < hi : x <= hi);
      INFO(schema.dump() << " x=" << x);
      REQUIRE(accepts(g, std::to_string(x)) == want);
    }
    CHECK_FALSE(accepts(g, "-0"));
    CHECK_FALSE(accepts(g, "007"));
  }
  const auto unbounded = compile(R"({"type": "integer"})");
  CHECK(accepts(unbounded, "-1234567890123456"));
  CHECK_FALSE(accepts(unbounded, "12345678901234567"));  // more than 16 digits
  CHECK_FALSE(accepts(unbounded, "1.0"));
}

TEST_CASE("numbers: decimal bounds against exact rational comparison") {
  // Values and bounds in thousandths, so the comparison below is exact.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> milli(-3000, 3000);
  auto text = [](int m) {
    std::string s = m < 0 ? "-" : "";
    const int a = std::abs(m);
    s += std::to_string(a / 1000);
    if (a % 1000) {
      char frac[8];
      std::snprintf(frac, sizeof frac, "%03d", a % 1000);
      std::string f = frac;
      while (f.back() == '0') f.pop_back();
      s += "." + f;
    }
    return s;
  };
  for (int trial = 0; trial < 24; ++trial) {
    int lo = milli(rng), hi = milli(rng);
    if (lo > hi) std::swap(lo, hi);
    const bool ex_lo = trial % 2 == 0, ex_hi = trial % 3 == 0;
    const std::string schema_text = std::string(R"({"type": "number", ")") + (ex_lo ? "exclusiveMinimum" : "minimum") +
                                     "\": " + text(lo) + ", \"" + (ex_hi ? "exclusiveMaximum" : "maximum") + "\": " + text(hi) + "}";
    const auto g = compile(schema_text);
    for (int x = -3500; x <= 3500; x += 7) {
      const bool want = (ex_lo ? x > lo : x >= lo) && (ex_hi ? x < hi : x <= hi);
      INFO(schema_text << " x=" << text(x));
      REQUIRE(accepts(g, text(x)) == want);
      if (x % 1000 != 0) REQUIRE(accepts(g, text(x) + "0") == want);  // a trailing zero is the same value
    }
  }
  const auto plain = compile(R"({"type": "number"})");
  CHECK(accepts(plain, "-0.5e-3"));
  CHECK(accepts(plain, "12E+7"));
  CHECK_FALSE(accepts(plain, ".5"));
  CHECK_FALSE(accepts(plain, "01"));
  CHECK_FALSE(accepts(plain, "1."));
  const auto positive = compile(R"({"type": "number", "exclusiveMinimum": 0})");
  CHECK_FALSE(accepts(positive, "0"));
  CHECK_FALSE(accepts(positive, "0.000"));
  CHECK(accepts(positive, "0.001"));
  CHECK_FALSE(accepts(positive, "-0.5"));
}

TEST_CASE("arrays: items, counts, tuples") {
  const auto g = compile(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})");
  CHECK_FALSE(accepts(g, "[]"));
  CHECK(accepts(g, "[1]"));
  CHECK(accepts(g, "[1, 2, 3]"));
  CHECK_FALSE(accepts(g, "[1, 2, 3, 4]"));
  CHECK_FALSE(accepts(g, "[1, \"2\"]"));
  const auto tuple = compile(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}], "items": false})");
  CHECK(accepts(tuple, R"(["a", 1.5])"));
  CHECK(accepts(tuple, R"(["a"])"));
  CHECK_FALSE(accepts(tuple, R"(["a", 1.5, 2])"));
  CHECK_FALSE(accepts(tuple, R"([1.5, "a"])"));
  const auto any = compile(R"({"type": "array"})");
  CHECK(accepts(any, R"([1, "x", [true, null], {"a": {}}])"));
  // Counts beyond any integer type are refused by name, not converted (the fuzzer's find: a
  // minItems of 5.6e127 reached a double -> int64 conversion, undefined behaviour).
  CHECK(error_keyword(R"({"type": "array", "minItems": 5555555555555555555555555555555555555555, "maxItems": 4})") == "minItems");
  CHECK(error_keyword(R"({"type": "array", "maxItems": 1e300})") == "maxItems");
  CHECK(error_keyword(R"({"type": "string", "maxLength": 18446744073709551615})") == "maxLength");
  CHECK(error_keyword(R"({"type": "object", "maxProperties": -1})") == "maxProperties");
  CHECK(error_keyword(R"({"type": "array", "minItems": 2.5})") == "minItems");
}

TEST_CASE("enum, const, anyOf, type lists, booleans and null") {
  const auto e = compile(R"({"enum": ["red", "green", 3, null, {"a": [1]}]})");
  for (const char* ok : {R"("red")", R"("green")", "3", "null", R"({"a":[1]})"}) CHECK(accepts(e, ok));
  CHECK_FALSE(accepts(e, R"("blue")"));
  CHECK_FALSE(accepts(e, R"("re")"));
  const auto typed = compile(R"({"type": "string", "enum": ["a", 1, "b"]})");
  CHECK(accepts(typed, R"("a")"));
  CHECK_FALSE(accepts(typed, "1"));
  CHECK(accepts(compile(R"({"const": "fixed"})"), R"("fixed")"));
  const auto any = compile(R"({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "null"}, {"type": "integer", "minimum": 5}]})");
  CHECK(accepts(any, R"("ab")"));
  CHECK(accepts(any, "null"));
  CHECK(accepts(any, "7"));
  CHECK_FALSE(accepts(any, "4"));
  CHECK_FALSE(accepts(any, R"("abc")"));
  const auto list = compile(R"({"type": ["boolean", "null"]})");
  CHECK(accepts(list, "true"));
  CHECK(accepts(list, "null"));
  CHECK_FALSE(accepts(list, "0"));
}

TEST_CASE("$ref, $defs and recursion") {
  const auto tree = compile(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"], "additionalProperties": false}}})");
  CHECK(accepts(tree, R"({"v": 1})"));
  CHECK(accepts(tree, R"({"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": [{"v": 4}]}]})"));
  CHECK_FALSE(accepts(tree, R"({"v": 1, "kids": [{"w": 2}]})"));
  const auto root = compile(R"({"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
                                "required": ["next"]})");
  CHECK(accepts(root, R"({"next": {"next": {"next": null}}})"));
  const auto legacy = compile(R"({"definitions": {"n": {"type": "number"}}, "type": "array", "items": {"$ref": "#/definitions/n"}})");
  CHECK(accepts(legacy, "[1, 2.5]"));
}

TEST_CASE("oneOf: disjoint alternatives and discriminated unions compile, overlapping ones are refused") {
  CHECK(error_keyword(R"({"oneOf": [{"type": "string"}, {"type": "integer"}]})").empty());
  CHECK(error_keyword(R"({"oneOf": [
      {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind"]},
      {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}}, "required": ["kind"]}]})")
            .empty());
  CHECK(error_keyword(R"({"oneOf": [{"type": "number"}, {"type": "integer"}]})") == "oneOf");
  CHECK(error_keyword(R"({"oneOf": [{"type": "object"}, {"type": "object", "properties": {"a": {}}}]})") == "oneOf");
}

TEST_CASE("unsupported keywords are refused by name, annotations are ignored") {
  for (const char* keyword : {"multipleOf", "not", "if", "patternProperties", "propertyNames", "contains",
                              "unevaluatedProperties", "dependentRequired"}) {
    const std::string schema = std::string(R"({"type": "integer", ")") + keyword + R"(": 2})";
    INFO(keyword);
    CHECK(error_keyword(schema) == keyword);
  }
  CHECK(error_keyword(R"({"type": "array", "uniqueItems": true})") == "uniqueItems");
  CHECK(error_keyword(R"({"type": "array", "uniqueItems": false})").empty());
  CHECK(error_keyword(R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})") == "allOf");
  CHECK(error_keyword(R"({"anyOf": [{"type": "string"}], "type": "string"})") == "type");
  CHECK(error_keyword(R"({"$ref": "http://example.com/s.json"})") == "$ref");
  CHECK(error_keyword(R"({"$ref": "#/$defs/missing"})") == "$ref");
  CHECK(error_keyword(R"({"type": "string", "pattern": "(a)\\1"})") == "pattern");
  CHECK(error_keyword(R"({"type": "string", "pattern": "(?=a)b"})") == "pattern");
  CHECK(error_keyword(R"({"title": "t", "description": "d", "examples": [1], "x-extension": 1, "type": "integer"})").empty());
}

TEST_CASE("unsatisfiable and hostile schemas fail cleanly") {
  CHECK(error_keyword(R"({"type": "string", "minLength": 5, "maxLength": 2})").rfind("<none>", 0) == 0);
  CHECK(error_keyword(R"({"type": "integer", "minimum": 10, "maximum": 9})").rfind("<none>", 0) == 0);
  CHECK(error_keyword(R"({"type": "object", "properties": {"a": false}, "required": ["a"]})").rfind("<none>", 0) == 0);
  CHECK(error_keyword(R"({"enum": []})").rfind("<none>", 0) == 0);
  // References that only lead to each other describe no value at all.
  CHECK(error_keyword(R"({"$ref": "#"})").rfind("<none>", 0) == 0);
  CHECK(error_keyword(R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})").rfind("<none>", 0) == 0);
  // ... and one that can contain itself before any byte, with a way out, is left recursion.
  CHECK(error_keyword(R"({"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": "#"}}, {"$ref": "#"}]})") == "$ref");
  CHECK(error_keyword(R"({"type": "string", "maxLength": 1000000})") == "maxLength");
  CHECK(error_keyword(R"({"type": "array", "minItems": 100000})") == "minItems");
  // Deep nesting.
  std::string deep = R"({"type": "integer"})";
  for (int i = 0; i < 60; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  CHECK(error_keyword(deep).rfind("<none>", 0) == 0);
  // A huge enum.
  Json big = {{"enum", Json::array()}};
  for (int i = 0; i < 5000; ++i) big["enum"].push_back("value" + std::to_string(i));
  CHECK(error_keyword(big.dump()) == "enum");
}
