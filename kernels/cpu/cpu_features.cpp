#include "kernels/cpu/cpu_features.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace fp8serve::cpu {

namespace {

#if defined(__x86_64__) || defined(__i386__)
// Read from CPUID directly (clang's __builtin_cpu_supports lacks some names, e.g. f16c), and
// check with XGETBV that the OS saves the YMM / ZMM state: a CPU flag alone is not enough.
uint64_t xgetbv0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = ecx & (1u << 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm = (xcr0 & 0x6) == 0x6;     // SSE + AVX state
  const bool zmm = (xcr0 & 0xe6) == 0xe6;   // + opmask and ZMM state
  f.fma = ymm && (ecx & (1u << 12));
  f.f16c = ymm && (ecx & (1u << 29));
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    f.avx2 = ymm && (ebx & (1u << 5));
    f.avx512f = zmm && (ebx & (1u << 16));
    f.avx512bw = zmm && (ebx & (1u << 30));
    f.avx512vbmi = zmm && (ecx & (1u << 1));
    if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) f.avx512bf16 = zmm && (eax & (1u << 5));
  }
  return f;
}
#else
CpuFeatures detect() { return {}; }
#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::string describe(const CpuFeatures& f) {
  std::string out;
  auto add = [&out](bool on, const char* name) {
    if (!on) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vbmi, "avx512vbmi");
  add(f.avx512bf16, "avx512bf16");
  return out.empty() ? std::string("scalar") : out;
}

}  // namespace fp8serve::cpu
