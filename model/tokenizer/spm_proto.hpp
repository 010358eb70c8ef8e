#pragma once
// Just enough of SentencePiece's ModelProto wire format to (a) flip
// normalizer_spec.add_dummy_prefix in an existing model and (b) build a model from a GGUF
// "llama" vocabulary, both then loaded by libsentencepiece itself. Debian's libsentencepiece-dev
// ships no generated protobuf headers, and the format is small and stable.
#include <string>
#include <string_view>
#include <vector>

namespace fp8serve {

// Piece types, numbered as sentencepiece's and GGUF's token_type.
enum class SpmPieceType : int { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

struct SpmPiece {
  std::string piece;
  float score = 0.0f;
  SpmPieceType type = SpmPieceType::normal;
};

struct SpmModelSpec {
  std::vector<SpmPiece> pieces;
  bool bpe = true;  // false: unigram
  bool byte_fallback = false;
  int unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
  bool add_dummy_prefix = true;
};

// Throws TokenizerError on a malformed proto.
std::string spm_set_add_dummy_prefix(std::string_view model_proto, bool value);
bool spm_get_add_dummy_prefix(std::string_view model_proto);

// A serialized ModelProto: identity normalizer, whitespace escaped to "▁", no extra-whitespace
// removal (what Llama-family SentencePiece models use).
std::string spm_build_model_proto(const SpmModelSpec& spec);

}  // namespace fp8serve
