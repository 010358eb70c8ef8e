// libFuzzer target for the GGUF reader: any byte string must parse or throw FormatError; when it
// parses, every metadata value is described and every tensor's bytes are read and dequantized,
// so a missed bounds check shows up under ASan.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/formats/dequant.hpp"
#include "model/formats/gguf.hpp"
#include "model/formats/model_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const fp8serve::GgufFile f = fp8serve::GgufFile::from_bytes({data, data + size});
    for (const auto& key : f.metadata_keys()) (void)f.describe(key);
    std::vector<float> out;
    for (const auto& t : f.tensors()) {
      const auto bytes = f.tensor_data(t);
      if (fp8serve::can_dequantize(t.type) && t.num_elements() <= (1 << 16)) {
        out.resize(static_cast<size_t>(t.num_elements()));
        fp8serve::dequantize_ggml(t.type, bytes, out);
      }
    }
    (void)fp8serve::parse_gguf_config(f);
  } catch (const fp8serve::FormatError&) {
  }
  return 0;
}
