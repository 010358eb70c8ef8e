// Occupancy in the emulator, as an H200 computes it: how many CTAs of a kernel one SM holds, from
// the kernel's registers and static shared memory as nvcc's ptxas reported them for sm_90a
// (kernels/cuda/kernel_resources.inc: data about the product's kernels, kept beside them;
// generated and checked in CI by tests/scripts/kernel_resources.py), the block size and the
// dynamic shared memory. So a persistent grid, a split-K decision or a partition plan made from
// cudaOccupancyMaxActiveBlocksPerMultiprocessor is the H200's.
//
// A kernel is known by its function's name: the emulator reads its own executable's symbol
// table (the kernels are static functions, which dladdr does not see), demangles the symbol at
// the kernel's address and normalises it as the script normalises ptxas's names (no return type,
// no parameters, "(anonymous namespace)"). A kernel missing from the table aborts, naming it.
#include <cxxabi.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "tests/cuda_emu/runtime.hpp"

namespace fp8serve::emu::detail {
namespace {

struct KernelResources {
  const char* name;
  int registers;
  int static_shared;
  int stack;
};

constexpr KernelResources kKernelResources[] = {
#include "kernels/cuda/kernel_resources.inc"
};

// sm_90: the register file is allocated per warp in units of 256 registers; 2048 threads, 64
// warps and 32 CTAs per SM; 1 KiB of shared memory reserved per CTA.
constexpr int kRegisterUnit = 256;
constexpr int kThreadsPerSm = 2048;
constexpr int kCtasPerSm = 32;
constexpr size_t kReservedSharedPerCta = 1024;

// 'void ns::(anonymous namespace)::k<128, 4>(Args)' -> 'ns::(anonymous namespace)::k<128, 4>'.
std::string normalise(std::string name) {
  if (!name.empty() && name.back() == ')') {
    int depth = 0;
    for (size_t i = name.size(); i-- > 0;) {
      depth += name[i] == ')' ? 1 : name[i] == '(' ? -1 : 0;
      if (depth == 0) {
        name.resize(i);
        break;
      }
    }
  }
  int depth = 0;
  size_t cut = std::string::npos;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '<' || name[i] == '(') ++depth;
    if (name[i] == '>' || name[i] == ')') --depth;
    if (name[i] == ' ' && depth == 0) cut = i;
  }
  return cut == std::string::npos ? name : name.substr(cut + 1);
}

// Function symbols of the running executable by address (its .symtab: local symbols included).
class SymbolTable {
 public:
  SymbolTable() {
    const int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0) die("occupancy: cannot read /proc/self/exe");
    void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) die("occupancy: cannot map /proc/self/exe");
    const auto* base = static_cast<const unsigned char*>(map);
    const auto* header = reinterpret_cast<const Elf64_Ehdr*>(base);
    const auto* sections = reinterpret_cast<const Elf64_Shdr*>(base + header->e_shoff);
    const uintptr_t bias = load_bias();
    for (int i = 0; i < header->e_shnum; ++i) {
      if (sections[i].sh_type != SHT_SYMTAB) continue;
      const auto* symbols = reinterpret_cast<const Elf64_Sym*>(base + sections[i].sh_offset);
      const char* strings = reinterpret_cast<const char*>(base + sections[sections[i].sh_link].sh_offset);
      const size_t count = sections[i].sh_size / sizeof(Elf64_Sym);
      for (size_t k = 0; k < count; ++k)
        if (ELF64_ST_TYPE(symbols[k].st_info) == STT_FUNC && symbols[k].st_value != 0)
          by_address_.emplace(bias + symbols[k].st_value, strings + symbols[k].st_name);
    }
    if (by_address_.empty()) die("occupancy: the executable has no symbol table (stripped?)");
    // The mapping stays: by_address_ points into its string table.
  }

  // The normalised, demangled name of the function at `address`, or "" when none starts there.
  std::string name_at(const void* address) const {
    const auto it = by_address_.find(reinterpret_cast<uintptr_t>(address));
    if (it == by_address_.end()) return "";
    int status = 0;
    char* demangled = abi::__cxa_demangle(it->second, nullptr, nullptr, &status);
    std::string name = status == 0 ? demangled : it->second;
    std::free(demangled);
    return normalise(name);
  }

 private:
  // Where the executable is loaded (0 unless it is position independent).
  static uintptr_t load_bias() {
    uintptr_t bias = 0;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
          *static_cast<uintptr_t*>(out) = info->dlpi_addr;  // the first object is the executable
          return 1;
        },
        &bias);
    return bias;
  }

  std::map<uintptr_t, const char*> by_address_;
};

const KernelResources& resources_of(const void* function) {
  static std::mutex mutex;
  static std::map<const void*, const KernelResources*> known;
  std::lock_guard lock(mutex);
  if (const auto it = known.find(function); it != known.end()) return *it->second;
  static const SymbolTable* symbols = new SymbolTable;  // never destroyed, like the runtime's state
  const std::string name = symbols->name_at(function);
  for (const KernelResources& r : kKernelResources) {
    if (name == r.name) {
      known.emplace(function, &r);
      return r;
    }
  }
  die("occupancy: kernel '%s' (%p) has no entry in kernels/cuda/kernel_resources.inc: build the CUDA "
      "backend with nvcc and run tests/scripts/kernel_resources.py update OBJECT_DIR",
      name.empty() ? "?" : name.c_str(), function);
}

}  // namespace

int max_active_ctas(const void* function, int block_size, size_t dynamic_shared) {
  const KernelResources& r = resources_of(function);
  const int warps = (block_size + 31) / 32;
  const int per_warp = (r.registers * 32 + kRegisterUnit - 1) / kRegisterUnit * kRegisterUnit;
  const int by_registers = per_warp > 0 ? kRegistersPerMultiprocessor / (per_warp * warps) : kCtasPerSm;
  const size_t shared = dynamic_shared + static_cast<size_t>(r.static_shared) + kReservedSharedPerCta;
  const auto by_shared = static_cast<int>(kSharedPerMultiprocessor / shared);
  return std::max(0, std::min({by_registers, by_shared, kThreadsPerSm / block_size, kCtasPerSm}));
}

}  // namespace fp8serve::emu::detail

using fp8serve::emu::detail::record_error;

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* num_blocks, const void* func, int block_size,
                                                                   size_t dynamic_shared, unsigned int) {
  if (num_blocks == nullptr || func == nullptr || block_size <= 0 ||
      block_size > fp8serve::emu::detail::kMaxThreadsPerBlock)
    return record_error(cudaErrorInvalidValue);
  *num_blocks = fp8serve::emu::detail::max_active_ctas(func, block_size, dynamic_shared);
  return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, const void* func, int block_size,
                                                          size_t dynamic_shared) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(num_blocks, func, block_size, dynamic_shared,
                                                                cudaOccupancyDefault);
}
