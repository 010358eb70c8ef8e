// [gpu] The device side of the FP8 contract: CUDA's own conversion, fp8serve's codec compiled
// for the device, and the host codec agree bit for bit (but for the sign of NaN, below). Skips
// cleanly without a device; the emulated build (test_fp8_codec_gpu_emu) always runs it, with
// NVIDIA's host implementation of __nv_cvt_float_to_fp8 as the independent reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/device_runtime.hpp"
#include "kernels/fp8.hpp"

using namespace fp8serve;

namespace {

bool have_gpu() {
  if (cuda::device_count() > 0) return true;
  WARN("no CUDA device: [gpu] test skipped");
  return false;
}

// Every boundary that matters: all codes, the midpoints between neighbours and one float ulp
// either side, beyond-range values, infinities, NaN, plus random bit patterns.
std::vector<float> probe_values() {
  std::vector<float> values;
  for (int code = 0; code < 256; ++code) {
    const float x = fp8_e4m3_decode(static_cast<uint8_t>(code));
    if (std::isnan(x)) continue;
    const float next = fp8_e4m3_decode(static_cast<uint8_t>(code + 1));
    values.push_back(x);
    if ((code & 0x7f) < 0x7e && !std::isnan(next)) {
      const float mid = 0.5f * (x + next);
      values.insert(values.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f),
                                   std::nextafter(mid, -1e30f)});
    }
  }
  for (float x : {448.0f, 463.99f, 464.0f, 464.01f, 1e6f, INFINITY, -INFINITY, NAN, -NAN, 0.0f, -0.0f})
    values.push_back(x);
  std::mt19937 rng(7);
  for (int i = 0; i < 1 << 20; ++i) {
    const uint32_t bits = rng();
    float x;
    std::memcpy(&x, &bits, sizeof x);
    values.push_back(x);
  }
  return values;
}

}  // namespace

TEST_CASE("device FP8 encode is bit-identical to CUDA's and to the host codec", "[gpu]") {
  if (!have_gpu()) return;
  INFO(cuda::describe_device(0));
  const std::vector<float> values = probe_values();
  std::vector<uint8_t> by_cuda(values.size()), by_ours(values.size());
  cuda::Stream stream;
  cuda::encode_fp8_e4m3_on_device(values.data(), by_cuda.data(), values.size(), true, stream);
  cuda::encode_fp8_e4m3_on_device(values.data(), by_ours.data(), values.size(), false, stream);
  // NVIDIA's conversion in software (cuda_fp8.hpp: the host, the emulator, sm_80) returns the
  // canonical NaN 0x7f for a NaN of either sign; fp8serve's codec keeps the sign (0xff for -NaN).
  // Both are NaN codes, so that difference is counted apart; any other one fails.
  const auto is_nan_code = [](uint8_t code) { return (code & 0x7fu) == 0x7fu; };
  size_t mismatches = 0, nan_sign_differences = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const uint8_t host = fp8_e4m3_encode(values[i]);
    const bool nan_sign_only = by_cuda[i] != host && is_nan_code(by_cuda[i]) && is_nan_code(host);
    nan_sign_differences += nan_sign_only;
    if ((by_cuda[i] != host && !nan_sign_only) || by_ours[i] != host) {
      if (++mismatches <= 10)
        UNSCOPED_INFO("x=" << values[i] << " cuda=" << int(by_cuda[i]) << " device-ours=" << int(by_ours[i])
                           << " host=" << int(host));
    }
  }
  CHECK(mismatches == 0);
  if (nan_sign_differences > 0)
    WARN(nan_sign_differences << " NaN inputs: CUDA's conversion gives the other NaN sign than fp8serve's codec");
}
