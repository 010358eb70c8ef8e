#pragma once
// What the model benchmarks read: the default model and natural English text from the
// repository's README and docs (the README's text before it moved into docs/: the same words,
// about the same length), located from this file so that a bench runs from any directory.
#include <algorithm>
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

// README.md, docs/*.md by name, tests/fixtures/README.md (tests/scripts/kv_scale_study.py: TEXTS).
inline std::vector<std::string> default_text_files() {
  std::vector<std::string> docs;
  for (const auto& entry : std::filesystem::directory_iterator(repo_root() / "docs"))
    if (entry.path().extension() == ".md") docs.push_back(entry.path().string());
  std::sort(docs.begin(), docs.end());
  std::vector<std::string> files{(repo_root() / "README.md").string()};
  files.insert(files.end(), docs.begin(), docs.end());
  files.push_back((repo_root() / "tests/fixtures/README.md").string());
  return files;
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
