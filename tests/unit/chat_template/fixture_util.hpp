#pragma once
// Shared by the chat template tests that compare with the committed jinja2 renderings.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "model/chat_template/chat_template.hpp"

namespace fp8serve::test {

inline std::string read_fixture_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The fixture scripts pin strftime_now to 2025-03-07 14:05:09 (a Friday, day 66 of the year).
inline ChatTemplateOptions fixed_time_options() {
  ChatTemplateOptions options;
  options.now.tm_year = 2025 - 1900;
  options.now.tm_mon = 2;
  options.now.tm_mday = 7;
  options.now.tm_hour = 14;
  options.now.tm_min = 5;
  options.now.tm_sec = 9;
  options.now.tm_wday = 5;
  options.now.tm_yday = 65;
  return options;
}

}  // namespace fp8serve::test
