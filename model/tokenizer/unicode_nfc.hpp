#pragma once
// Unicode Normalization Form C, as the NFC normalizer of HF tokenizers (Qwen2/3 declare it).
#include <string>
#include <string_view>

namespace fp8serve {

// PRECOND: text is valid UTF-8 (invalid bytes are passed through as U+FFFD).
std::string nfc(std::string_view text);

}  // namespace fp8serve
