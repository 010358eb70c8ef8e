#pragma once
// CPU kv_spill (kernels/kv_spill.hpp for the contract): the positions leaving each sequence's
// bf16 window, quantized from the tail into their FP8 slots, split over positions on the pool.
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/kv_spill.hpp"

namespace fp8serve::cpu {

// Throws std::invalid_argument when the params break the contract (no tail, a bad view, a ring
// or block id outside its pool, a spill range that the tail did not hold, a frozen scale that
// is not finite and > 0). Nothing is written when it throws.
void validate_kv_spill(const KvSpillParams& params);

// Validates first (above). The codes are bit-identical to what kv_write writes for the same
// value below fp8_lens (fp8_e4m3_encode(bf16 / scale)); counts are exact integers.
void kv_spill_cpu(const KvSpillParams& params, ThreadPool& pool);

}  // namespace fp8serve::cpu
