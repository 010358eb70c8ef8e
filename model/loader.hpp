#pragma once
// load_model(): a Hugging Face model folder or a single .gguf file -> everything the engine
// needs: the architecture facts, the weights under HF names (still in their
// mapped files, converted when the model uploads them), the tokenizer and the chat
// template. Anything unsupported or malformed throws FormatError naming it.
#include <map>
#include <memory>
#include <string>

#include "model/formats/model_config.hpp"
#include "model/formats/weights.hpp"
#include "model/tokenizer/tokenizer.hpp"

namespace fp8serve {

struct LoadedModel {
  std::string path;
  std::string format;                     // "gguf" or "safetensors"
  std::map<std::string, int> tensor_types;  // stored tensor type -> count, as in the file
  ModelConfig config;
  ModelWeights weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string chat_template;              // empty when the model ships none
  std::string name;                       // general.name, or the folder / file name
};

LoadedModel load_model(const std::string& path);

}  // namespace fp8serve
