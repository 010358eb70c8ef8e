// The CUDA runtime-API subset of the emulator, defined under NVIDIA's own extern "C" declarations
// from <cuda_runtime_api.h> (so the compiler checks every signature against them): memory,
// copies and memsets, the device's properties, errors. Device memory is host memory allocated to
// exactly the size asked for, 0xFF-filled; every API error also sets the calling thread's last
// error, as CUDA does. Work on the device is queued on streams (streams.cpp) and copies follow
// CUDA's documented synchronisation rules ("API synchronization behavior"):
// - cudaMemcpy from pageable host memory to the device first completes the legacy stream's work,
//   takes its own copy of the source (the driver's staging) and returns before the bytes land:
//   the destination reads 0xFF until the legacy stream reaches the copy. The same for
//   cudaMemcpyAsync from pageable memory, on its stream. A kernel on a non-blocking stream that
//   reads such a destination without synchronising sees 0xFF, every run.
// - cudaMemcpy to the host, and cudaMemcpyAsync to pageable host memory, return once the bytes
//   are there (completing the stream's work up to the copy); from pinned memory to the device
//   cudaMemcpy is synchronous.
// - cudaMemcpyAsync between the device and pinned memory, device to device, and cudaMemset(Async)
//   on device memory are queued: the source is read when the stream reaches the copy.
// - cudaFree and cudaFreeHost complete all queued work first (they synchronise the device).
// - A copy from or to pageable memory on a stream being captured is refused (a graph cannot hold
//   it) and invalidates the capture.
// An emulated binary never links libcudart (the build refuses to, and a process holding both
// aborts at start).
#include "tests/cuda_emu/runtime.hpp"

#include "tests/cuda_emu/emu.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

namespace fp8serve::emu::detail {
namespace {

enum class Memory : uint8_t { device, pinned_host };

struct Allocation {
  size_t bytes;
  Memory kind;
};

// Everything the runtime keeps, behind one mutex: host threads may call it concurrently.
struct State {
  std::mutex mutex;
  std::map<uintptr_t, Allocation> allocations;  // by start address
  size_t device_bytes = 0;
  size_t device_capacity = size_t{8} << 30;
  std::map<const void*, size_t> max_dynamic_shared;  // by kernel, from cudaFuncSetAttribute

  // The allocation holding `p` (one past its end too when `end_inclusive`), or none.
  const std::pair<const uintptr_t, Allocation>* find(const void* p, bool end_inclusive) const {
    const auto address = reinterpret_cast<uintptr_t>(p);
    auto it = allocations.upper_bound(address);
    if (it == allocations.begin()) return nullptr;
    --it;
    const uintptr_t end = it->first + it->second.bytes;
    return address < end || (end_inclusive && address == end) ? &*it : nullptr;
  }
};

State& state() {
  static State* s = new State;  // never destroyed: buffers may be freed from static destructors
  return *s;
}

thread_local cudaError_t t_last_error = cudaSuccess;

// Where a copy's range lies: in one device allocation, in host memory, or across a device
// allocation's end.
enum class Place { device, host, broken };

Place place(const State& s, const void* p, size_t bytes) {
  const auto* hit = s.find(p, false);
  if (hit == nullptr || hit->second.kind != Memory::device) return Place::host;
  return reinterpret_cast<uintptr_t>(p) + bytes <= hit->first + hit->second.bytes ? Place::device : Place::broken;
}

cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  const Place to = place(s, dst, bytes), from = place(s, src, bytes);
  if (to == Place::broken || from == Place::broken) return cudaErrorInvalidValue;
  switch (kind) {
    case cudaMemcpyHostToHost: return to == Place::host && from == Place::host ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyHostToDevice: return to == Place::device && from == Place::host ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return to == Place::host && from == Place::device ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice: return to == Place::device && from == Place::device ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault: return cudaSuccess;
  }
  return cudaErrorInvalidMemcpyDirection;
}

cudaError_t allocate(void** out, size_t bytes, Memory kind) {
  if (out == nullptr) return cudaErrorInvalidValue;
  if (bytes == 0) {
    *out = nullptr;
    return cudaSuccess;
  }
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (kind == Memory::device && bytes > s.device_capacity - std::min(s.device_capacity, s.device_bytes))
    return cudaErrorMemoryAllocation;
  void* data = nullptr;
  if (posix_memalign(&data, 256, bytes) != 0) return cudaErrorMemoryAllocation;  // cudaMalloc aligns to 256
  std::memset(data, 0xff, bytes);  // reads as NaN until written (a GPU gives whatever was there)
  s.allocations.emplace(reinterpret_cast<uintptr_t>(data), Allocation{bytes, kind});
  if (kind == Memory::device) s.device_bytes += bytes;
  *out = data;
  return cudaSuccess;
}

cudaError_t release(void* data, Memory kind) {
  if (data == nullptr) return cudaSuccess;
  State& s = state();
  std::lock_guard lock(s.mutex);
  const auto it = s.allocations.find(reinterpret_cast<uintptr_t>(data));
  if (it == s.allocations.end() || it->second.kind != kind) return cudaErrorInvalidValue;
  if (kind == Memory::device) s.device_bytes -= it->second.bytes;
  s.allocations.erase(it);
  std::free(data);
  return cudaSuccess;
}

// A process must not hold libcudart and the emulator at once: they would answer the same calls.
[[maybe_unused]] const bool g_no_cudart = [] {
  if (dlsym(RTLD_DEFAULT, "__cudaRegisterFatBinary") != nullptr)
    die("this process loads libcudart and the CUDA emulator: link an emulated binary with fp8serve_cuda_emu only");
  return true;
}();

}  // namespace

void die(const char* format, ...) {
  std::fputs("fp8serve CUDA emulator: ", stderr);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::abort();
}

cudaError_t record_error(cudaError_t error) {
  if (error != cudaSuccess) t_last_error = error;
  return error;
}

cudaError_t check_launch(const void* function, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream) {
  if (check_stream(stream) != cudaSuccess) return cudaErrorInvalidResourceHandle;
  State& s = state();
  std::lock_guard lock(s.mutex);
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0 || threads > kMaxThreadsPerBlock || block.x > 1024 ||
      block.y > 1024 || block.z > 64 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    return cudaErrorInvalidConfiguration;
  const auto it = s.max_dynamic_shared.find(function);
  if (shared_bytes > (it == s.max_dynamic_shared.end() ? kSharedPerBlock : it->second)) return cudaErrorInvalidValue;
  return cudaSuccess;
}

bool is_device_range(const void* pointer, size_t bytes) {
  if (bytes == 0) return is_device_accessible(pointer);
  State& s = state();
  std::lock_guard lock(s.mutex);
  const auto* hit = s.find(pointer, false);
  return hit != nullptr && reinterpret_cast<uintptr_t>(pointer) + bytes <= hit->first + hit->second.bytes;
}

bool is_device_accessible(const void* pointer) {
  if (pointer == nullptr) return true;
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.find(pointer, true) != nullptr;
}

}  // namespace fp8serve::emu::detail

namespace fp8serve::emu {
void set_device_memory_bytes(size_t bytes) {
  detail::State& s = detail::state();
  std::lock_guard lock(s.mutex);
  s.device_capacity = bytes;
}
}  // namespace fp8serve::emu

using fp8serve::emu::detail::record_error;
using fp8serve::emu::detail::state;

// Memory.
cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (const cudaError_t err = fp8serve::emu::detail::refuse_during_capture(); err != cudaSuccess) return record_error(err);
  return record_error(fp8serve::emu::detail::allocate(ptr, size, fp8serve::emu::detail::Memory::device));
}
cudaError_t cudaFree(void* ptr) {
  if (const cudaError_t err = fp8serve::emu::detail::refuse_during_capture(); err != cudaSuccess) return record_error(err);
  fp8serve::emu::detail::complete_all();  // cudaFree synchronises the device
  return record_error(fp8serve::emu::detail::release(ptr, fp8serve::emu::detail::Memory::device));
}
cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (const cudaError_t err = fp8serve::emu::detail::refuse_during_capture(); err != cudaSuccess) return record_error(err);
  return record_error(fp8serve::emu::detail::allocate(ptr, size, fp8serve::emu::detail::Memory::pinned_host));
}
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) { return cudaMallocHost(ptr, size); }
cudaError_t cudaFreeHost(void* ptr) {
  if (const cudaError_t err = fp8serve::emu::detail::refuse_during_capture(); err != cudaSuccess) return record_error(err);
  fp8serve::emu::detail::complete_all();
  return record_error(fp8serve::emu::detail::release(ptr, fp8serve::emu::detail::Memory::pinned_host));
}

namespace fp8serve::emu::detail {
namespace {

enum class HostMemory { none, pageable, pinned };

// The host side of a copy: none (device to device), pageable, or pinned (cudaMallocHost).
HostMemory host_side(const void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto kind_of = [&](const void* p) {
    if (place(s, p, bytes) == Place::device) return HostMemory::none;
    const auto* hit = s.find(p, false);
    return hit != nullptr && hit->second.kind == Memory::pinned_host ? HostMemory::pinned : HostMemory::pageable;
  };
  const HostMemory d = kind_of(dst), h = kind_of(src);
  if (kind == cudaMemcpyHostToHost || (d != HostMemory::none && h != HostMemory::none)) return HostMemory::pageable;
  return d != HostMemory::none ? d : h;
}

bool to_device(const void* dst, size_t bytes) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return place(s, dst, bytes) == Place::device;
}

// The copy as an operation on `stream` (or, when the stream is captured, a graph node). Pageable
// host memory: to the device, the source is staged now and the destination poisoned until the
// copy runs; to the host, the copy is waited for. `synchronous`: cudaMemcpy's rules instead of
// cudaMemcpyAsync's.
cudaError_t copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream, bool synchronous) {
  if (count == 0) return cudaSuccess;
  if (const cudaError_t err = check_copy(dst, src, count, kind); err != cudaSuccess) return err;
  const HostMemory host = host_side(dst, src, count, kind);
  const bool device_dst = to_device(dst, count);
  if (host == HostMemory::pageable && !device_dst && !to_device(src, count)) {  // host to host
    std::memcpy(dst, src, count);
    return cudaSuccess;
  }
  if (is_capturing(stream)) {
    if (host == HostMemory::pageable) return refuse_on_capturing(stream);
    record_node(stream, [=] { std::memcpy(dst, src, count); });
    return cudaSuccess;
  }
  // cudaMemcpy (the legacy stream) and copies of pageable memory may synchronise: refused while
  // any capture is open (cudaStreamCaptureModeGlobal).
  if (synchronous || host == HostMemory::pageable) {
    if (const cudaError_t err = refuse_during_capture(); err != cudaSuccess) return err;
  }
  if (host == HostMemory::pageable && device_dst) {
    complete_stream(stream);  // "a stream sync is performed before the copy is initiated"
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + count);
    std::memset(dst, 0xff, count);  // in flight: what reads it before the stream gets there sees 0xFF
    return enqueue(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  }
  if (const cudaError_t err = enqueue(stream, [=] { std::memcpy(dst, src, count); }); err != cudaSuccess) return err;
  const bool waits = synchronous ? host != HostMemory::none : host == HostMemory::pageable;
  if (waits) complete_stream(stream);
  return cudaSuccess;
}

cudaError_t fill(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (!to_device(ptr, count)) return cudaErrorInvalidValue;
  if (is_capturing(stream)) {
    record_node(stream, [=] { std::memset(ptr, value, count); });
    return cudaSuccess;
  }
  return enqueue(stream, [=] { std::memset(ptr, value, count); });
}

}  // namespace
}  // namespace fp8serve::emu::detail

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return record_error(fp8serve::emu::detail::copy(dst, src, count, kind, cudaStreamLegacy, true));
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  if (const cudaError_t err = fp8serve::emu::detail::check_stream(stream); err != cudaSuccess) return record_error(err);
  return record_error(fp8serve::emu::detail::copy(dst, src, count, kind, stream, false));
}

// Memsets of device memory are asynchronous with respect to the host, on the legacy stream.
cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  if (const cudaError_t err = fp8serve::emu::detail::refuse_during_capture(); err != cudaSuccess) return record_error(err);
  return record_error(fp8serve::emu::detail::fill(ptr, value, count, cudaStreamLegacy));
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (const cudaError_t err = fp8serve::emu::detail::check_stream(stream); err != cudaSuccess) return record_error(err);
  return record_error(fp8serve::emu::detail::fill(ptr, value, count, stream));
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (free == nullptr || total == nullptr) return record_error(cudaErrorInvalidValue);
  auto& s = state();
  std::lock_guard lock(s.mutex);
  *total = s.device_capacity;
  *free = s.device_capacity - std::min(s.device_capacity, s.device_bytes);
  return cudaSuccess;
}

// The device: one H200 (its name says it is the emulator).
cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return record_error(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return record_error(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : record_error(cudaErrorInvalidDevice); }
cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return record_error(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) { return cudaDriverGetVersion(version); }

namespace fp8serve::emu::detail {

int emulated_sm() {
  const char* text = std::getenv("FP8SERVE_EMU_SM");
  if (text == nullptr || *text == '\0') return 90;
  const std::string value = text;
  for (const char* sm : {"80", "86", "89", "90", "100", "120"})
    if (value == sm) return std::stoi(value);
  die("FP8SERVE_EMU_SM=%s: use 80, 86, 89, 90, 100 or 120", text);
}

}  // namespace fp8serve::emu::detail

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  namespace d = fp8serve::emu::detail;
  if (prop == nullptr) return record_error(cudaErrorInvalidValue);
  if (device != 0) return record_error(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  const int sm = d::emulated_sm();
  if (sm == 90) std::snprintf(prop->name, sizeof prop->name, "fp8serve CUDA emulator (H200)");
  else std::snprintf(prop->name, sizeof prop->name, "fp8serve CUDA emulator (H200 presented as sm_%d)", sm);
  size_t free = 0;
  cudaMemGetInfo(&free, &prop->totalGlobalMem);
  prop->major = sm / 10;
  prop->minor = sm % 10;
  prop->multiProcessorCount = d::kMultiProcessors;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = d::kMaxThreadsPerBlock;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->sharedMemPerBlock = d::kSharedPerBlock;
  prop->sharedMemPerBlockOptin = d::kSharedPerBlockOptin;
  prop->sharedMemPerMultiprocessor = d::kSharedPerMultiprocessor;
  prop->reservedSharedMemPerBlock = 1024;
  prop->regsPerBlock = d::kRegistersPerMultiprocessor;
  prop->regsPerMultiprocessor = d::kRegistersPerMultiprocessor;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->maxBlocksPerMultiProcessor = 32;
  prop->totalConstMem = 65536;
  prop->l2CacheSize = 50 << 20;
  prop->memoryBusWidth = 6144;
  prop->concurrentKernels = 1;
  prop->asyncEngineCount = 2;
  prop->unifiedAddressing = 1;
  prop->canMapHostMemory = 1;
  prop->managedMemory = 1;
  prop->cooperativeLaunch = 1;
  prop->streamPrioritiesSupported = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  namespace d = fp8serve::emu::detail;
  if (value == nullptr) return record_error(cudaErrorInvalidValue);
  if (device != 0) return record_error(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = d::kMultiProcessors; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = d::kMaxThreadsPerBlock; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(d::kSharedPerBlock); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = static_cast<int>(d::kSharedPerBlockOptin); break;
    case cudaDevAttrComputeCapabilityMajor: *value = d::emulated_sm() / 10; break;
    case cudaDevAttrComputeCapabilityMinor: *value = d::emulated_sm() % 10; break;
    case cudaDevAttrL2CacheSize: *value = 50 << 20; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = d::kRegistersPerMultiprocessor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = static_cast<int>(d::kSharedPerMultiprocessor); break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = 2048; break;
    default: return record_error(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  namespace d = fp8serve::emu::detail;
  if (func == nullptr) return record_error(cudaErrorInvalidDeviceFunction);
  if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
    return value >= -1 && value <= 100 ? cudaSuccess : record_error(cudaErrorInvalidValue);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return record_error(cudaErrorNotSupported);
  if (value < 0 || static_cast<size_t>(value) > d::kSharedPerBlockOptin) return record_error(cudaErrorInvalidValue);
  auto& s = state();
  std::lock_guard lock(s.mutex);
  s.max_dynamic_shared[func] = static_cast<size_t>(value);
  return cudaSuccess;
}

// Errors.
cudaError_t cudaGetLastError(void) {
  const cudaError_t error = fp8serve::emu::detail::t_last_error;
  fp8serve::emu::detail::t_last_error = cudaSuccess;
  return error;
}
cudaError_t cudaPeekAtLastError(void) { return fp8serve::emu::detail::t_last_error; }

namespace {
struct ErrorText {
  cudaError_t error;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported (by the fp8serve CUDA emulator)"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation is not permitted in this state"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
};
}  // namespace

const char* cudaGetErrorName(cudaError_t error) {
  for (const ErrorText& e : kErrors)
    if (e.error == error) return e.name;
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t error) {
  for (const ErrorText& e : kErrors)
    if (e.error == error) return e.text;
  return "unrecognized error code";
}
