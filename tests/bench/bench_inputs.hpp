#pragma once
// What the model benchmarks read: the default model and natural English text from the
// repository's READMEs, located from this file so that a bench runs from any directory.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp8serve::bench {

inline std::filesystem::path repo_root() {
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
}

inline std::string default_model_path() {
  return (repo_root() / ".models/SmolLM2-135M-Instruct.Q4_1.gguf").string();
}

inline std::vector<std::string> default_text_files() {
  return {(repo_root() / "README.md").string(), (repo_root() / "tests/fixtures/README.md").string()};
}

// The files' contents, each followed by a newline.
inline std::string read_texts(const std::vector<std::string>& paths) {
  std::string text;
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + path);
    text.append(std::istreambuf_iterator<char>(in), {});
    text += '\n';
  }
  return text;
}

}  // namespace fp8serve::bench
