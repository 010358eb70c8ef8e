#include <catch2/catch.hpp>

#include "server/engine/stop_checker.hpp"

using fp8serve::StopChecker;

namespace {

// Feeds pieces one by one; returns everything emitted and whether it stopped.
std::pair<std::string, bool> feed(std::vector<std::string> stops, std::vector<std::string> pieces) {
  StopChecker checker(std::move(stops));
  std::string out;
  for (const auto& piece : pieces) {
    auto r = checker.push(piece);
    out += r.emit;
    if (r.stopped) return {out, true};
  }
  return {out + checker.flush(), false};
}

}  // namespace

TEST_CASE("a stop string across token boundaries ends the text before it", "[stop]") {
  CHECK(feed({"END"}, {"hello E", "N", "D more"}) == std::pair<std::string, bool>{"hello ", true});
  CHECK(feed({"\n\n"}, {"a\n", "\nb"}) == std::pair<std::string, bool>{"a", true});
}

TEST_CASE("text that could start a stop string is held back, then released", "[stop]") {
  StopChecker checker({"STOP"});
  auto r = checker.push("abc ST");
  CHECK(r.emit == "abc ");
  CHECK_FALSE(r.stopped);
  r = checker.push("AR");  // "STAR" is not "STOP": release it
  CHECK(r.emit == "STAR");
  r = checker.push("S");
  CHECK(r.emit == "");
  CHECK(checker.flush() == "S");
}

TEST_CASE("the earliest of several stops wins", "[stop]") {
  CHECK(feed({"xyz", "b"}, {"a", "bxyz"}) == std::pair<std::string, bool>{"a", true});
  CHECK(feed({"cd", "abcde"}, {"abcdef"}) == std::pair<std::string, bool>{"", true});  // abcde starts first
}

TEST_CASE("held-back text never splits a UTF-8 character", "[stop]") {
  // "é" is C3 A9; a stop starting with A9 (not valid UTF-8 alone) must not cut the character.
  StopChecker checker({"\xA9z"});
  auto r = checker.push("caf\xC3\xA9");
  CHECK(r.emit == "caf");
  CHECK(checker.flush() == "\xC3\xA9");
}

TEST_CASE("no stops: everything passes through; empty stops are ignored", "[stop]") {
  CHECK(feed({}, {"a", "b"}) == std::pair<std::string, bool>{"ab", false});
  CHECK(feed({""}, {"a", "b"}) == std::pair<std::string, bool>{"ab", false});
}

TEST_CASE("include_stop_str_in_output: the text ends with the stop string that matched first", "[stop]") {
  StopChecker checker({"END", "ND!"}, /*include_stop=*/true);
  auto r = checker.push("hello E");
  CHECK(r.emit == "hello ");
  r = checker.push("ND! and more");
  CHECK(r.stopped);
  CHECK(r.emit == "END");
  // Several stops starting at one place: the shortest, as the text is cut without include.
  StopChecker both({"abcd", "ab"}, true);
  CHECK(both.push("xxabcd").emit == "xxab");
}

TEST_CASE("text pushed without matching (min_tokens not reached) goes out whole, stops looked for after", "[stop]") {
  StopChecker checker({"ab"});
  auto r = checker.push("xa", /*match=*/false);
  CHECK(r.emit == "xa");
  CHECK_FALSE(r.stopped);
  r = checker.push("ab a", /*match=*/false);  // a stop string, not looked for yet
  CHECK(r.emit == "ab a");
  r = checker.push("b", /*match=*/true);  // "a" + "b" across the switch: not a match (the "a" went out)
  CHECK(r.emit == "b");
  CHECK_FALSE(r.stopped);
  r = checker.push("c ab", /*match=*/true);
  CHECK(r.emit == "c ");
  CHECK(r.stopped);
}
