#pragma once
// CPU kv_write (kernels/kv_write.hpp for the contract): calibration of first-chunk sequences,
// then quantization of every new token into its slot, split over tokens on the pool.
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/kv_write.hpp"

namespace fp8serve::cpu {

// Throws std::invalid_argument when the params break the contract (null pointers, a slot
// outside the pool, a scale that is not finite and > 0 for a sequence that does not calibrate,
// a bad margin for one that does). Nothing is written when it throws.
void validate_kv_write(const KvWriteParams& params);

// Validates first (above). Encoding is fp8_e4m3_encode(x / scale) per element (bit-exact with
// CUDA's satfinite conversion) or bf16_encode(x). Counts are exact integers, so they and the
// pool contents do not depend on the thread count.
void kv_write_cpu(const KvWriteParams& params, ThreadPool& pool);

}  // namespace fp8serve::cpu
