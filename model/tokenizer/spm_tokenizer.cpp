#include "model/tokenizer/spm_tokenizer.hpp"

#include <sentencepiece_processor.h>

#include "model/text/utf8.hpp"
#include "model/tokenizer/spm_proto.hpp"
#include "model/tokenizer/tokenizer_config.hpp"

namespace fp8serve {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's escaped space

std::unique_ptr<sentencepiece::SentencePieceProcessor> load_processor(const std::string& bytes) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(bytes);
  if (!status.ok()) throw TokenizerError("sentencepiece: cannot load model: " + status.ToString());
  return sp;
}

// "<0x0A>" -> 10.
int byte_piece_value(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  return static_cast<int>(std::stoi(piece.substr(3, 2), nullptr, 16));
}

}  // namespace

SpmTokenizer::SpmTokenizer(const std::string& serialized_model, SpmOptions options)
    : with_prefix_(load_processor(serialized_model)),
      add_dummy_prefix_(spm_get_add_dummy_prefix(serialized_model)),
      add_bos_(options.add_bos.value_or(true)),
      add_eos_(options.add_eos.value_or(false)),
      kind_(std::move(options.kind)) {
  no_prefix_ = add_dummy_prefix_ ? load_processor(spm_set_add_dummy_prefix(serialized_model, false)) : nullptr;
  const int n = with_prefix_->GetPieceSize();
  pieces_.reserve(static_cast<std::size_t>(n));
  piece_kinds_.reserve(static_cast<std::size_t>(n));
  std::vector<AddedToken> specials;
  for (int id = 0; id < n; ++id) {
    std::string piece = with_prefix_->IdToPiece(id);
    PieceKind kind = PieceKind::normal;
    if (with_prefix_->IsControl(id) || with_prefix_->IsUnknown(id)) {
      kind = PieceKind::special;
      specials.push_back({piece, id, true});
    } else if (with_prefix_->IsByte(id) && byte_piece_value(piece) >= 0) {
      kind = PieceKind::byte;
    } else if (with_prefix_->IsUnused(id)) {
      kind = PieceKind::unused;
    }
    pieces_.push_back(std::move(piece));
    piece_kinds_.push_back(kind);
  }
  specials_ = AddedVocab(std::move(specials));
  auto resolve = [&](std::optional<int32_t> id, const std::optional<std::string>& name, int model_id) -> std::optional<int32_t> {
    if (id && *id >= 0 && *id < n) return id;
    if (name) {
      if (auto found = piece_to_id(*name)) return found;
    }
    return model_id >= 0 && model_id < n ? std::optional<int32_t>(model_id) : std::nullopt;
  };
  bos_id_ = resolve(options.bos_id, options.bos_token, with_prefix_->bos_id());
  eos_id_ = resolve(options.eos_id, options.eos_token, with_prefix_->eos_id());
}

SpmTokenizer::~SpmTokenizer() = default;

std::vector<int32_t> SpmTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::to_valid_lossy(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  if (add_special_tokens && add_bos_ && bos_id_) out.push_back(*bos_id_);
  std::vector<int> ids;
  for (const Fragment& f : specials_.split(text)) {
    if (f.id >= 0) {
      out.push_back(f.id);
      continue;
    }
    const bool starts_text = f.text.data() == text.data();
    const auto& sp = starts_text || !no_prefix_ ? *with_prefix_ : *no_prefix_;
    ids.clear();
    const auto status = sp.Encode(f.text, &ids);
    if (!status.ok()) throw TokenizerError("sentencepiece: encode failed: " + status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }
  if (add_special_tokens && add_eos_ && eos_id_) out.push_back(*eos_id_);
  return out;
}

// SentencePiece's decoder: "▁" -> " ", <0xXX> -> the byte, control pieces -> nothing (or their
// text, as HF prints special tokens), and the dummy-prefix space of the first piece dropped.
void SpmTokenizer::append_token_bytes(int32_t id, bool skip_special_tokens, bool& at_start,
                                      std::string& out) const {
  if (id < 0 || static_cast<std::size_t>(id) >= pieces_.size()) return;
  const std::string& piece = pieces_[static_cast<std::size_t>(id)];
  switch (piece_kinds_[static_cast<std::size_t>(id)]) {
    case PieceKind::special:
      if (!skip_special_tokens) {
        out += piece;
        at_start = false;
      }
      return;
    case PieceKind::byte:
      out += static_cast<char>(byte_piece_value(piece));
      at_start = false;
      return;
    case PieceKind::normal:
    case PieceKind::unused: {
      std::size_t pos = 0;
      if (at_start && add_dummy_prefix_ && piece.starts_with(kSpace)) pos = kSpace.size();
      at_start = false;
      while (pos < piece.size()) {
        if (piece.compare(pos, kSpace.size(), kSpace) == 0) {
          out += ' ';
          pos += kSpace.size();
        } else {
          out += piece[pos++];
        }
      }
      return;
    }
  }
}

int32_t SpmTokenizer::vocab_size() const { return static_cast<int32_t>(pieces_.size()); }

std::optional<std::string> SpmTokenizer::id_to_piece(int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= pieces_.size()) return std::nullopt;
  return pieces_[static_cast<std::size_t>(id)];
}

std::optional<int32_t> SpmTokenizer::piece_to_id(std::string_view piece) const {
  const int id = with_prefix_->PieceToId(piece);
  // PieceToId answers unk_id for an unknown piece; only the unk piece itself maps there.
  if (id < 0 || (with_prefix_->IsUnknown(id) && pieces_[static_cast<std::size_t>(id)] != piece)) return std::nullopt;
  return id;
}

bool SpmTokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<std::size_t>(id) < piece_kinds_.size() &&
         piece_kinds_[static_cast<std::size_t>(id)] == PieceKind::special;
}

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& model,
                                              const std::filesystem::path& tokenizer_config) {
  const TokenizerConfig tc = read_tokenizer_config(tokenizer_config);
  SpmOptions options;
  options.add_bos = tc.add_bos_token;
  options.add_eos = tc.add_eos_token;
  options.bos_token = tc.bos_token;
  options.eos_token = tc.eos_token;
  return std::make_unique<SpmTokenizer>(read_tokenizer_file(model), std::move(options));
}

}  // namespace fp8serve
