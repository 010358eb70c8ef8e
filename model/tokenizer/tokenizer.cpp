#include "model/tokenizer/tokenizer.hpp"

#include "model/text/utf8.hpp"

namespace fp8serve {

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  bool at_start = true;
  for (int32_t id : ids) append_token_bytes(id, skip_special_tokens, at_start, bytes);
  return utf8::to_valid_lossy(bytes);
}

}  // namespace fp8serve
