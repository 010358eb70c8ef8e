#include "model/loader.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "model/formats/gguf.hpp"
#include "model/formats/safetensors.hpp"

namespace fp8serve {

namespace fs = std::filesystem;

namespace {

// tokenizer_config.json's chat_template is a string, or a list of {name, template} of which
// "default" is the one a plain chat request uses; newer models ship chat_template.jinja.
std::string read_hf_chat_template(const fs::path& dir) {
  const fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja)) {
    std::ifstream in(jinja, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  const fs::path config_path = dir / "tokenizer_config.json";
  if (!fs::exists(config_path)) return {};
  std::ifstream in(config_path);
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(config_path.string() + ": not valid JSON: " + e.what());
  }
  if (!config.is_object() || !config.contains("chat_template")) return {};
  const auto& tmpl = config["chat_template"];
  if (tmpl.is_string()) return tmpl.get<std::string>();
  if (tmpl.is_array()) {
    for (const auto& entry : tmpl)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return entry["template"].get<std::string>();
    throw FormatError(config_path.string() + ": chat_template is a list without a \"default\" entry");
  }
  if (tmpl.is_null()) return {};
  throw FormatError(config_path.string() + ": chat_template must be a string or a list of {name, template}");
}

LoadedModel load_hf_folder(const fs::path& dir) {
  LoadedModel model;
  model.path = dir.string();
  model.format = "safetensors";
  model.name = dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
  model.config = load_hf_config(dir.string());
  model.weights = load_hf_weights(dir.string(), model.config);
  const SafetensorsModel files = SafetensorsModel::open_dir(dir.string());  // owns the tensors below
  for (const SafetensorsTensor* t : files.tensors()) ++model.tensor_types[std::string(safetensors_dtype_name(t->dtype))];
  model.tokenizer = load_tokenizer_dir(dir.string());
  model.chat_template = read_hf_chat_template(dir);
  return model;
}

LoadedModel load_gguf_file(const fs::path& file) {
  LoadedModel model;
  model.path = file.string();
  model.format = "gguf";
  const auto file_ptr = std::make_shared<const GgufFile>(GgufFile::open(file.string()));
  const GgufFile& gguf = *file_ptr;
  model.name = gguf.get_string("general.name").value_or(file.stem().string());
  model.config = parse_gguf_config(gguf);
  model.weights = load_gguf_weights(file_ptr, model.config);
  for (const auto& info : gguf.tensors()) ++model.tensor_types[std::string(ggml_type_name(info.type))];
  model.tokenizer = from_gguf(gguf);
  model.chat_template = gguf.get_string("tokenizer.chat_template").value_or("");
  return model;
}

}  // namespace

LoadedModel load_model(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) return load_hf_folder(p);
  if (fs::is_regular_file(p, ec)) {
    if (p.extension() == ".gguf") return load_gguf_file(p);
    throw FormatError("'" + path + "' is a file but not a .gguf; give a .gguf file or a Hugging Face model folder");
  }
  throw FormatError("model '" + path + "' not found: give a .gguf file or a Hugging Face model folder");
}

}  // namespace fp8serve
