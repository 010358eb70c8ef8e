#include "model/tokenizer/spm_proto.hpp"

#include <cstdint>
#include <cstring>

#include "model/tokenizer/tokenizer.hpp"

namespace fp8serve {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

struct Reader {
  std::string_view data;
  std::size_t pos = 0;

  bool done() const { return pos >= data.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= data.size()) throw TokenizerError("sentencepiece model: truncated varint");
      const auto b = static_cast<uint8_t>(data[pos++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    throw TokenizerError("sentencepiece model: varint too long");
  }
  // Skips the value of a field; returns its raw bytes (tag excluded).
  std::string_view value(uint32_t wire) {
    const std::size_t start = pos;
    switch (wire) {
      case kVarint: varint(); break;
      case kFixed64: advance(8); break;
      case kFixed32: advance(4); break;
      case kBytes: {
        const uint64_t n = varint();
        const std::size_t header = pos - start;
        advance(n);
        return data.substr(start + header, pos - start - header);
      }
      default: throw TokenizerError("sentencepiece model: unsupported wire type " + std::to_string(wire));
    }
    return data.substr(start, pos - start);
  }
  void advance(uint64_t n) {
    if (n > data.size() - pos) throw TokenizerError("sentencepiece model: truncated field");
    pos += static_cast<std::size_t>(n);
  }
};

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void put_tag(std::string& out, uint32_t field, uint32_t wire) { put_varint(out, (static_cast<uint64_t>(field) << 3) | wire); }
void put_int(std::string& out, uint32_t field, int64_t v) {
  put_tag(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(v));  // negative int32: ten-byte two's complement, as protobuf
}
void put_bytes(std::string& out, uint32_t field, std::string_view v) {
  put_tag(out, field, kBytes);
  put_varint(out, v.size());
  out += v;
}
void put_float(std::string& out, uint32_t field, float v) {
  put_tag(out, field, kFixed32);
  char buf[4];
  std::memcpy(buf, &v, 4);  // little-endian hosts only, as the rest of fp8serve
  out.append(buf, 4);
}

constexpr uint32_t kModelPieces = 1, kModelTrainerSpec = 2, kModelNormalizerSpec = 3;
constexpr uint32_t kNormName = 1, kNormAddDummyPrefix = 3, kNormRemoveExtraWhitespaces = 4, kNormEscapeWhitespaces = 5;

}  // namespace

std::string spm_set_add_dummy_prefix(std::string_view model_proto, bool value) {
  std::string out;
  out.reserve(model_proto.size() + 8);
  Reader r{model_proto};
  bool seen_normalizer = false;
  while (!r.done()) {
    const std::size_t field_start = r.pos;
    const uint64_t tag = r.varint();
    const auto field = static_cast<uint32_t>(tag >> 3), wire = static_cast<uint32_t>(tag & 7);
    const std::string_view v = r.value(wire);
    if (field != kModelNormalizerSpec || wire != kBytes) {
      out.append(model_proto.substr(field_start, r.pos - field_start));
      continue;
    }
    seen_normalizer = true;
    std::string spec;
    Reader n{v};
    while (!n.done()) {
      const std::size_t start = n.pos;
      const uint64_t t = n.varint();
      n.value(static_cast<uint32_t>(t & 7));
      if ((t >> 3) != kNormAddDummyPrefix) spec.append(v.substr(start, n.pos - start));
    }
    put_int(spec, kNormAddDummyPrefix, value ? 1 : 0);
    put_bytes(out, kModelNormalizerSpec, spec);
  }
  if (!seen_normalizer) {
    std::string spec;
    put_int(spec, kNormAddDummyPrefix, value ? 1 : 0);
    put_bytes(out, kModelNormalizerSpec, spec);
  }
  return out;
}

bool spm_get_add_dummy_prefix(std::string_view model_proto) {
  bool value = true;  // the proto default
  Reader r{model_proto};
  while (!r.done()) {
    const uint64_t tag = r.varint();
    const std::string_view v = r.value(static_cast<uint32_t>(tag & 7));
    if ((tag >> 3) != kModelNormalizerSpec || (tag & 7) != kBytes) continue;
    Reader n{v};
    while (!n.done()) {
      const uint64_t t = n.varint();
      if ((t >> 3) == kNormAddDummyPrefix && (t & 7) == kVarint) {
        value = n.varint() != 0;
      } else {
        n.value(static_cast<uint32_t>(t & 7));
      }
    }
  }
  return value;
}

std::string spm_build_model_proto(const SpmModelSpec& spec) {
  std::string out;
  for (const SpmPiece& p : spec.pieces) {
    std::string piece;
    put_bytes(piece, 1, p.piece);
    put_float(piece, 2, p.score);
    put_int(piece, 3, static_cast<int>(p.type));
    put_bytes(out, kModelPieces, piece);
  }
  std::string trainer;
  put_int(trainer, 3, spec.bpe ? 2 : 1);  // model_type: UNIGRAM = 1, BPE = 2
  put_int(trainer, 4, static_cast<int64_t>(spec.pieces.size()));
  put_int(trainer, 35, spec.byte_fallback ? 1 : 0);
  put_int(trainer, 40, spec.unk_id);
  put_int(trainer, 41, spec.bos_id);
  put_int(trainer, 42, spec.eos_id);
  put_int(trainer, 43, spec.pad_id);
  put_bytes(out, kModelTrainerSpec, trainer);
  std::string normalizer;
  put_bytes(normalizer, kNormName, "identity");
  put_int(normalizer, kNormAddDummyPrefix, spec.add_dummy_prefix ? 1 : 0);
  put_int(normalizer, kNormRemoveExtraWhitespaces, 0);
  put_int(normalizer, kNormEscapeWhitespaces, 1);
  put_bytes(out, kModelNormalizerSpec, normalizer);
  return out;
}

}  // namespace fp8serve
