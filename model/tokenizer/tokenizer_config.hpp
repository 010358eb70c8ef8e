#pragma once
// The few facts of tokenizer_config.json the tokenizers need: special token names and whether
// BOS/EOS are added. Absent file or keys leave the fields empty.
#include <filesystem>
#include <optional>
#include <string>

namespace fp8serve {

struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, unk_token;
  std::optional<bool> add_bos_token, add_eos_token;
};

TokenizerConfig read_tokenizer_config(const std::filesystem::path& path);  // throws TokenizerError

// Whole file into memory, with a size cap: tokenizer files are tens of MB at most.
std::string read_tokenizer_file(const std::filesystem::path& path);

}  // namespace fp8serve
