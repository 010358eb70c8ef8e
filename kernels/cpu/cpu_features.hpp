#pragma once
// What the CPU can do, read once at start-up; kernels pick their vectorized path from it
// (runtime dispatch: one binary runs on any x86-64 and uses AVX2 / AVX-512 where present).
#include <cstdint>
#include <string>

namespace fp8serve::cpu {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vbmi = false;
  bool avx512bf16 = false;
};

const CpuFeatures& cpu_features();
std::string describe(const CpuFeatures& features);  // "avx2 fma f16c avx512f ..."

}  // namespace fp8serve::cpu
