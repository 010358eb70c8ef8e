#include "model/tokenizer/detokenizer.hpp"

#include "model/text/utf8.hpp"

namespace fp8serve {

std::string IncrementalDetokenizer::push(int32_t id) {
  tokenizer_.append_token_bytes(id, skip_special_tokens_, at_start_, pending_);
  const std::size_t ready = pending_.size() - utf8::incomplete_tail_length(pending_);
  std::string out = utf8::to_valid_lossy(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

}  // namespace fp8serve
