// fp8serve: the command-line entry point. Parses the configuration (config/), then runs one
// command. Every error a user can cause ends here as one line on stderr and exit code 2.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "server/generate.hpp"
#include "server/inspect.hpp"
#include "server/serve.hpp"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(fp8serve::usage().c_str(), stderr);
    return 2;
  }
  if (args[0] == "--version" || args[0] == "version") {
    // The build: set by CMake (server/CMakeLists.txt) for this file alone.
    std::printf("fp8serve %s (%s, %s)\n", FP8SERVE_VERSION, FP8SERVE_BUILD_BACKENDS, FP8SERVE_BUILD_TYPE);
    return 0;
  }
  if (const auto help = fp8serve::help_requested(args)) {
    std::fputs(help->c_str(), stdout);
    return 0;
  }
  fp8serve::Config config;
  try {
    config = fp8serve::parse_command_line(args, fp8serve::flag_environment());
  } catch (const fp8serve::ConfigError& e) {
    std::fprintf(stderr, "fp8serve: %s\n", e.what());
    return 2;
  }
  // Logs go to stderr for every command: stdout carries only what a command produces (the text
  // of `generate`, the summary of `inspect`), so pipes and scripts can rely on it.
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  try {
    switch (config.command) {
      case fp8serve::Command::inspect:
        return fp8serve::run_inspect(config);
      case fp8serve::Command::serve:
        return fp8serve::run_serve(config);
      case fp8serve::Command::generate:
        return fp8serve::run_generate(config);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8serve: %s\n", e.what());
    return 2;
  }
  return 0;
}
