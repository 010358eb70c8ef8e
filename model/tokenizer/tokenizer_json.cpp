// tokenizer.json (HF tokenizers' serialization) -> BpeConfig, and the directory loader.
// Only what byte-level BPE models declare is accepted; anything else fails by name, so a
// tokenizer we would run wrongly never loads.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/tokenizer/bpe_tokenizer.hpp"
#include "model/tokenizer/tokenizer_config.hpp"

namespace fp8serve {
namespace {

using json = nlohmann::json;

constexpr std::uintmax_t kMaxTokenizerFileBytes = 256u << 20;

std::optional<std::string> token_name(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  throw TokenizerError(std::string("tokenizer_config.json: \"") + key + "\" is neither a string nor {\"content\": ...}");
}

std::string type_of(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    throw TokenizerError("tokenizer.json: " + where + " has no \"type\"");
  }
  return j["type"].get<std::string>();
}

void parse_normalizer(const json& j, BpeConfig& config) {
  if (j.is_null()) return;
  const std::string type = type_of(j, "normalizer");
  if (type == "NFC") {
    config.nfc = true;
  } else if (type == "Sequence" && j.contains("normalizers") && j["normalizers"].is_array()) {
    for (const json& n : j["normalizers"]) parse_normalizer(n, config);
  } else {
    throw TokenizerError("tokenizer.json: normalizer \"" + type + "\" is not supported (only NFC)");
  }
}

void parse_decoder(const json& j, BpeConfig& config) {
  if (j.is_null()) {
    config.byte_level_decoder = false;
    return;
  }
  const std::string type = type_of(j, "decoder");
  if (type == "ByteLevel") {
    config.byte_level_decoder = true;
  } else if (type == "Sequence" && j.contains("decoders") && j["decoders"].is_array() && j["decoders"].size() == 1) {
    parse_decoder(j["decoders"][0], config);
  } else {
    throw TokenizerError("tokenizer.json: decoder \"" + type + "\" is not supported (only ByteLevel)");
  }
}

// Returns false when the post-processor declares nothing about special tokens (ByteLevel).
bool parse_post_processor(const json& j, const std::unordered_map<std::string, int32_t>& ids,
                          BpeConfig& config) {
  if (j.is_null()) return false;
  const std::string type = type_of(j, "post_processor");
  if (type == "ByteLevel") return false;
  if (type == "Sequence" && j.contains("processors") && j["processors"].is_array()) {
    bool any = false;
    for (const json& p : j["processors"]) any = parse_post_processor(p, ids, config) || any;
    return any;
  }
  if (type != "TemplateProcessing") {
    throw TokenizerError("tokenizer.json: post-processor \"" + type + "\" is not supported");
  }
  bool seen_sequence = false;
  for (const json& item : j.at("single")) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name = item["SpecialToken"].at("id").get<std::string>();
      const json& specials = j.at("special_tokens");
      if (!specials.contains(name)) throw TokenizerError("tokenizer.json: post-processor token \"" + name + "\" undefined");
      for (const json& id : specials[name].at("ids")) (seen_sequence ? config.suffix_ids : config.prefix_ids).push_back(id.get<int32_t>());
    }
  }
  return true;
}

std::optional<int32_t> lookup(const std::unordered_map<std::string, int32_t>& ids, const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  auto it = ids.find(*name);
  return it == ids.end() ? std::nullopt : std::optional<int32_t>(it->second);
}

BpeConfig parse_tokenizer_json(const std::string& text, const TokenizerConfig& tc) {
  json j = json::parse(text);
  BpeConfig config;
  const json& model = j.at("model");
  if (model.value("type", std::string("BPE")) != "BPE") {
    throw TokenizerError("tokenizer.json: model type \"" + model["type"].get<std::string>() + "\" is not supported (only BPE)");
  }
  if (!model.value("continuing_subword_prefix", json(nullptr)).is_null() && !model["continuing_subword_prefix"].get<std::string>().empty()) {
    throw TokenizerError("tokenizer.json: BPE continuing_subword_prefix is not supported");
  }
  if (!model.value("end_of_word_suffix", json(nullptr)).is_null() && !model["end_of_word_suffix"].get<std::string>().empty()) {
    throw TokenizerError("tokenizer.json: BPE end_of_word_suffix is not supported");
  }
  if (model.value("byte_fallback", false)) {
    throw TokenizerError("tokenizer.json: BPE byte_fallback (SentencePiece-style) is not supported; use tokenizer.model");
  }
  config.ignore_merges = model.value("ignore_merges", false);
  std::unordered_map<std::string, int32_t> ids;
  for (auto& [token, id] : model.at("vocab").items()) {
    config.vocab.emplace_back(token, id.get<int32_t>());
    ids.emplace(token, id.get<int32_t>());
  }
  for (const json& m : model.at("merges")) {
    if (m.is_string()) {  // legacy "left right"
      const std::string s = m.get<std::string>();
      const auto space = s.find(' ', 1);
      if (space == std::string::npos) throw TokenizerError("tokenizer.json: malformed merge \"" + s + "\"");
      config.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2) {
      config.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      throw TokenizerError("tokenizer.json: malformed merge " + m.dump());
    }
  }
  if (auto unk = model.find("unk_token"); unk != model.end() && unk->is_string()) config.unk_id = lookup(ids, unk->get<std::string>());
  if (j.contains("added_tokens")) {
    for (const json& t : j["added_tokens"]) {
      AddedToken a;
      a.content = t.at("content").get<std::string>();
      a.id = t.at("id").get<int32_t>();
      a.special = t.value("special", false);
      a.lstrip = t.value("lstrip", false);
      a.rstrip = t.value("rstrip", false);
      a.single_word = t.value("single_word", false);
      a.normalized = t.value("normalized", !a.special);
      ids[a.content] = a.id;
      config.added_tokens.push_back(std::move(a));
    }
  }
  parse_normalizer(j.value("normalizer", json(nullptr)), config);
  config.pre_tokenizer = parse_pre_tokenizer_json(j.value("pre_tokenizer", json(nullptr)));
  parse_decoder(j.value("decoder", json(nullptr)), config);
  const bool has_template = parse_post_processor(j.value("post_processor", json(nullptr)), ids, config);
  config.bos_id = lookup(ids, tc.bos_token);
  config.eos_id = lookup(ids, tc.eos_token);
  // Without a template the tokenizer_config flags decide (how transformers treats them).
  if (!has_template) {
    if (tc.add_bos_token.value_or(false) && config.bos_id) config.prefix_ids = {*config.bos_id};
    if (tc.add_eos_token.value_or(false) && config.eos_id) config.suffix_ids = {*config.eos_id};
  }
  return config;
}

}  // namespace

std::string read_tokenizer_file(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw TokenizerError("tokenizer: cannot read " + path.string() + ": " + ec.message());
  if (size > kMaxTokenizerFileBytes) throw TokenizerError("tokenizer: " + path.string() + " is implausibly large");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in) throw TokenizerError("tokenizer: cannot read " + path.string());
  return ss.str();
}

TokenizerConfig read_tokenizer_config(const std::filesystem::path& path) {
  TokenizerConfig tc;
  if (path.empty() || !std::filesystem::exists(path)) return tc;
  try {
    const json j = json::parse(read_tokenizer_file(path));
    tc.bos_token = token_name(j, "bos_token");
    tc.eos_token = token_name(j, "eos_token");
    tc.unk_token = token_name(j, "unk_token");
    if (j.contains("add_bos_token") && j["add_bos_token"].is_boolean()) tc.add_bos_token = j["add_bos_token"].get<bool>();
    if (j.contains("add_eos_token") && j["add_eos_token"].is_boolean()) tc.add_eos_token = j["add_eos_token"].get<bool>();
  } catch (const json::exception& e) {
    throw TokenizerError("tokenizer: " + path.string() + ": " + e.what());
  }
  return tc;
}

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::filesystem::path& tokenizer_json,
                                               const std::filesystem::path& tokenizer_config) {
  const TokenizerConfig tc = read_tokenizer_config(tokenizer_config);
  try {
    return std::make_unique<BpeTokenizer>(parse_tokenizer_json(read_tokenizer_file(tokenizer_json), tc));
  } catch (const json::exception& e) {
    throw TokenizerError("tokenizer: " + tokenizer_json.string() + ": " + e.what());
  }
}

std::unique_ptr<Tokenizer> load_tokenizer_dir(const std::filesystem::path& dir) {
  const auto config = dir / "tokenizer_config.json";
  const auto json_path = dir / "tokenizer.json", model_path = dir / "tokenizer.model";
  if (std::filesystem::exists(json_path)) {
    try {
      return load_tokenizer_json(json_path, config);
    } catch (const TokenizerError&) {
      // A SentencePiece-style tokenizer.json (Metaspace, byte_fallback) next to the model it
      // was converted from: the original is the exact one.
      if (!std::filesystem::exists(model_path)) throw;
    }
  }
  if (std::filesystem::exists(model_path)) return load_sentencepiece(model_path, config);
  throw TokenizerError("tokenizer: " + dir.string() + " has neither tokenizer.json nor tokenizer.model");
}

}  // namespace fp8serve
