#pragma once
// The device building blocks of the paged attention (kernels/cuda/attention_device.cuh, ptx.cuh),
// each run by a small kernel so that test_attention_primitives_gpu.cpp checks them on their own:
// the same code on a GPU and on the emulator (which implements the PTX).
// Plain C++: each function launches, waits and returns what the kernel wrote.
#include <array>
#include <cstdint>
#include <vector>

namespace fp8serve::cuda::attn_test {

// fp8x4_to_float_bits (bits) or fp8x4_to_float_cvt over all 256 codes (code c is element c % 4 of
// word c / 4): the float bits.
std::array<uint32_t, 256> decode_fp8_codes(bool bits);

// pack_bf16x2 of n pairs: out[i] = pack(a[i], b[i]).
std::vector<uint32_t> pack_bf16_pairs(const std::vector<float>& a, const std::vector<float>& b);

// ptx::cvt_f16x2_f32 of n pairs: out[i] = pack(a[i], b[i]) (fp16 bits).
std::vector<uint32_t> pack_f16_pairs(const std::vector<float>& a, const std::vector<float>& b);

// One mma.sync m16n8k16 by one warp: D = A B + C with A [16][16], B [16][8] (bf16 bits, or f16 bits
// when f16, row-major), C [16][8] f32, loaded into PTX's fragments; returns D [16][8] row-major.
// fault 1: one lane loads one fragment register from the wrong row (an injected bug).
std::vector<float> mma_16816(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                             const std::vector<float>& c, int fault = 0, bool f16 = false);

// block_exclusive_scan of counts (one block of 128 threads); returns the n + 1 prefix sums.
std::vector<int> block_scan(const std::vector<int>& counts);

}  // namespace fp8serve::cuda::attn_test
