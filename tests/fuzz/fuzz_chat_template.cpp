// libFuzzer target: any byte string as a chat template. Parsing may throw TemplateError;
// rendering against a fixed, realistic context must return (text or error value) without
// crashing, hanging or tripping ASan/UBSan. Limits are small so each input runs fast.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/chat_template/chat_template.hpp"

namespace {

const nlohmann::ordered_json& fuzz_context() {
  static const nlohmann::ordered_json ctx = fp8serve::make_chat_context(
      nlohmann::ordered_json::parse(R"([
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Hi \u00e9 \ud83d\ude00 {{ x }}"},
        {"role": "assistant", "content": "<think>r</think>ok", "tool_calls": [
          {"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [true, null, 2.5]}}}]},
        {"role": "tool", "content": "42"}])"),
      nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])"),
      true, nlohmann::ordered_json{{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"enable_thinking", false}});
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1 << 16) return 0;
  const std::string source(reinterpret_cast<const char*>(data), size);
  fp8serve::ChatTemplateOptions options;
  options.limits.max_output_bytes = 1 << 16;
  options.limits.max_loop_iterations = 20000;
  options.limits.max_call_depth = 16;
  options.now.tm_year = 125;
  options.now.tm_mday = 1;
  try {
    const fp8serve::ChatTemplate tmpl = fp8serve::ChatTemplate::parse(source);
    const auto result = tmpl.render(fuzz_context(), options);
    if (result.ok() && result.text.size() > options.limits.max_output_bytes) __builtin_trap();
  } catch (const fp8serve::TemplateError&) {
  }
  return 0;
}
