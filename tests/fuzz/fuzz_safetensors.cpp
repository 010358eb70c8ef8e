// libFuzzer target for the safetensors reader (single-file image): any byte string must parse
// or throw FormatError; when it parses, every tensor is converted to bf16, reading all its bytes.
#include <cstddef>
#include <cstdint>

#include "model/formats/safetensors.hpp"
#include "model/formats/weights.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const fp8serve::SafetensorsFile f = fp8serve::SafetensorsFile::from_bytes({data, data + size});
    for (const auto& t : f.tensors()) {
      try {
        (void)fp8serve::host_tensor_from_safetensors(t);
      } catch (const fp8serve::FormatError&) {  // dtypes other than BF16/F16/F32
      }
    }
  } catch (const fp8serve::FormatError&) {
  }
  return 0;
}
