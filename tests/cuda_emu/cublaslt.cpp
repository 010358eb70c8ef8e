// The CPU emulator's cuBLASLt stand-in: the cuBLASLt entry points fp8serve calls, defined under
// NVIDIA's own declarations from the toolkit's <cublasLt.h> (so the compiler checks every
// signature against them), as runtime.cpp does for the runtime API. An emulated binary links no
// libcublasLt. Calls outside this subset are link errors; attributes it does not model give
// CUBLAS_STATUS_NOT_SUPPORTED, never a silently ignored setting.
//
// It validates each call as cuBLASLt's documentation states (cublaslt_checks.cpp lists the rules
// and their sources): the shapes of op(A), op(B), C and D against the layouts and transposes,
// leading dimensions, the type / compute type / scale type combination, the epilogue and its
// bias type and pointer, the FP8 requirements and scale modes of sm_90, the alignment of the real
// pointers against what the heuristic's algorithm was chosen for (the preference's
// MIN_ALIGNMENT_*_BYTES, and the bias pointer's alignment at the heuristic), the workspace against
// what that algorithm needs, and the stream. A call cuBLASLt would refuse returns the status the
// documentation gives, and fp8serve::emu::cublaslt_last_failure() says which rule refused it.
// A matrix, scale or bias that spans past its cudaMalloc allocation aborts the process with the
// operand named: a GPU would fault there. A null or destroyed handle gives NOT_INITIALIZED.
//
// The work - the reference loop of cublaslt_reference.cpp - goes through detail::enqueue: it is
// recorded into a graph while its stream is captured (real cuBLASLt calls are captured too) and
// otherwise runs before the call returns, reading device memory only then.
#include "tests/cuda_emu/cublaslt.hpp"

#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "tests/cuda_emu/cublaslt_internal.hpp"
#include "tests/cuda_emu/runtime.hpp"

namespace fp8serve::emu {

namespace cublaslt {
namespace {

thread_local std::string t_failure;

struct Handle {
  int device = 0;
};

// The stand-in's live objects, so that a destroyed or foreign pointer is named instead of read.
enum class Kind { handle, desc, layout, preference };
const char* const kKindNames[] = {"handle", "matmul descriptor", "matrix layout", "matmul preference"};

struct Registry {
  std::mutex mutex;
  std::set<std::pair<Kind, const void*>> live;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed, like the runtime's state
  return *r;
}

template <class Object, class Opaque>
Opaque create(Kind kind, Object* object) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.live.emplace(kind, object);
  return reinterpret_cast<Opaque>(object);
}

// The object behind a non-null pointer; aborts on one that is not a live object of `kind`.
template <class Object>
Object* lookup(Kind kind, const void* pointer, const char* who) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (r.live.count({kind, pointer}) == 0)
    detail::die("%s: %p is not a live cuBLASLt %s (destroyed, or never created)", who, pointer,
                kKindNames[static_cast<int>(kind)]);
  return const_cast<Object*>(static_cast<const Object*>(pointer));
}

bool is_live_handle(const void* handle) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.live.count({Kind::handle, handle}) != 0;
}

template <class Object>
cublasStatus_t destroy(Kind kind, const void* pointer, const char* who) {
  if (pointer == nullptr) return CUBLAS_STATUS_SUCCESS;
  delete lookup<Object>(kind, pointer, who);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.live.erase({kind, pointer});
  return CUBLAS_STATUS_SUCCESS;
}

// An attribute's storage: where it lives in a descriptor and its size (null: not modelled).
struct Field {
  void* data = nullptr;
  size_t size = 0;
};
template <class T>
Field field(T& value) {
  return {&value, sizeof value};
}

cublasStatus_t set_field(Field f, int attribute, const void* buf, size_t size, const char* who) {
  if (f.data == nullptr)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, std::string(who) + ": attribute " + std::to_string(attribute) +
                                                 " is not modelled by the stand-in");
  if (buf == nullptr || size != f.size)
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": attribute " + std::to_string(attribute) + " takes " +
                                                 std::to_string(f.size) + " bytes, got " + std::to_string(size) +
                                                 (buf == nullptr ? " and a null buffer" : ""));
  std::memcpy(f.data, buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t get_field(Field f, int attribute, void* buf, size_t size, size_t* written, const char* who) {
  if (f.data == nullptr)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, std::string(who) + ": attribute " + std::to_string(attribute) +
                                                 " is not modelled by the stand-in");
  if (size == 0) {
    if (written == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": size 0 and no sizeWritten");
    *written = f.size;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (buf == nullptr || size != f.size)
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": attribute " + std::to_string(attribute) + " takes " +
                                                 std::to_string(f.size) + " bytes, got " + std::to_string(size));
  std::memcpy(buf, f.data, size);
  if (written != nullptr) *written = size;
  return CUBLAS_STATUS_SUCCESS;
}

Field desc_field(MatmulDesc& d, cublasLtMatmulDescAttributes_t attribute) {
  switch (attribute) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return field(d.compute_type);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return field(d.scale_type);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return field(d.pointer_mode);
    case CUBLASLT_MATMUL_DESC_TRANSA: return field(d.transa);
    case CUBLASLT_MATMUL_DESC_TRANSB: return field(d.transb);
    case CUBLASLT_MATMUL_DESC_TRANSC: return field(d.transc);
    case CUBLASLT_MATMUL_DESC_FILL_MODE: return field(d.fill_mode);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return field(d.epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return field(d.bias);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return field(d.bias_batch_stride);
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: return field(d.sm_count_target);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return field(d.scale[kA]);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return field(d.scale[kB]);
    case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER: return field(d.scale[kC]);
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return field(d.scale[kD]);
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return field(d.amax_d);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return field(d.fast_accum);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return field(d.bias_type);
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: return field(d.scale_mode[kA]);
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: return field(d.scale_mode[kB]);
    case CUBLASLT_MATMUL_DESC_C_SCALE_MODE: return field(d.scale_mode[kC]);
    case CUBLASLT_MATMUL_DESC_D_SCALE_MODE: return field(d.scale_mode[kD]);
    default: return {};
  }
}

Field layout_field(Layout& l, cublasLtMatrixLayoutAttribute_t attribute) {
  switch (attribute) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return field(l.type);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return field(l.order);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return field(l.rows);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return field(l.cols);
    case CUBLASLT_MATRIX_LAYOUT_LD: return field(l.ld);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return field(l.batch_count);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return field(l.batch_stride);
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET: return field(l.plane_offset);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE: return field(l.batch_mode);
    default: return {};
  }
}

Field preference_field(Preference& p, cublasLtMatmulPreferenceAttributes_t attribute) {
  switch (attribute) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return field(p.search_mode);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return field(p.max_workspace);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: return field(p.reduction_scheme_mask);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return field(p.min_alignment[kA]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return field(p.min_alignment[kB]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return field(p.min_alignment[kC]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return field(p.min_alignment[kD]);
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: return field(p.max_waves);
    case CUBLASLT_MATMUL_PREF_IMPL_MASK: return field(p.impl_mask);
    default: return {};
  }
}

// Set / GetAttribute of every descriptor kind: a null object is INVALID_VALUE.
template <class Object, class Attribute>
cublasStatus_t set_attribute(Kind kind, const void* object, Field (*field_of)(Object&, Attribute), Attribute attribute,
                             const void* buf, size_t size, const char* who) {
  if (object == nullptr)
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": null " + kKindNames[static_cast<int>(kind)]);
  return set_field(field_of(*lookup<Object>(kind, object, who), attribute), attribute, buf, size, who);
}

template <class Object, class Attribute>
cublasStatus_t get_attribute(Kind kind, const void* object, Field (*field_of)(Object&, Attribute), Attribute attribute,
                             void* buf, size_t size, size_t* written, const char* who) {
  if (object == nullptr)
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": null " + kKindNames[static_cast<int>(kind)]);
  return get_field(field_of(*lookup<Object>(kind, object, who), attribute), attribute, buf, size, written, who);
}

}  // namespace

cublasStatus_t fail(cublasStatus_t status, const std::string& reason) {
  t_failure = reason;
  return status;
}

void clear_failure() { t_failure.clear(); }

}  // namespace cublaslt

std::string cublaslt_last_failure() { return cublaslt::t_failure; }

}  // namespace fp8serve::emu

using namespace fp8serve::emu::cublaslt;  // NOLINT: the entry points below are global, as NVIDIA declares them

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: null handle pointer");
  *handle = create<Handle, cublasLtHandle_t>(Kind::handle, new Handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtDestroy: null handle");
  return destroy<Handle>(Kind::handle, handle, "cublasLtDestroy");
}

namespace {
struct StatusText {
  cublasStatus_t status;
  const char* name;
  const char* text;
};
constexpr StatusText kStatuses[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "the operation completed successfully"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED", "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE", "an invalid numeric value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH", "an absent device architectural feature is required"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR", "an access to GPU memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED", "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR", "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED", "the requested functionality is not supported"},
    {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR", "error detected trying to check the license"},
};
}  // namespace

size_t cublasLtGetVersion() { return CUBLAS_VERSION; }  // the headers it was built with

const char* cublasLtGetStatusName(cublasStatus_t status) {
  for (const StatusText& s : kStatuses)
    if (s.status == status) return s.name;
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  for (const StatusText& s : kStatuses)
    if (s.status == status) return s.text;
  return "unknown error";
}

// Matmul descriptors.
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type) {
  if (desc == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate: null descriptor pointer");
  auto* d = new MatmulDesc;
  d->compute_type = compute_type;
  d->scale_type = scale_type;
  *desc = create<MatmulDesc, cublasLtMatmulDesc_t>(Kind::desc, d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  return destroy<MatmulDesc>(Kind::desc, desc, "cublasLtMatmulDescDestroy");
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                                              const void* buf, size_t size) {
  return set_attribute(Kind::desc, desc, desc_field, attribute, buf, size, "cublasLtMatmulDescSetAttribute");
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                                              void* buf, size_t size, size_t* written) {
  return get_attribute(Kind::desc, desc, desc_field, attribute, buf, size, written, "cublasLtMatmulDescGetAttribute");
}

// Matrix layouts.
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (layout == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: null layout pointer");
  auto* l = new Layout;
  l->type = static_cast<uint32_t>(type);
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  *layout = create<Layout, cublasLtMatrixLayout_t>(Kind::layout, l);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  return destroy<Layout>(Kind::layout, layout, "cublasLtMatrixLayoutDestroy");
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attribute,
                                                const void* buf, size_t size) {
  return set_attribute(Kind::layout, layout, layout_field, attribute, buf, size, "cublasLtMatrixLayoutSetAttribute");
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attribute,
                                                void* buf, size_t size, size_t* written) {
  return get_attribute(Kind::layout, layout, layout_field, attribute, buf, size, written,
                       "cublasLtMatrixLayoutGetAttribute");
}

// Heuristic preferences.
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate: null pointer");
  *pref = create<Preference, cublasLtMatmulPreference_t>(Kind::preference, new Preference);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return destroy<Preference>(Kind::preference, pref, "cublasLtMatmulPreferenceDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attribute, const void* buf,
                                                    size_t size) {
  return set_attribute(Kind::preference, pref, preference_field, attribute, buf, size,
                       "cublasLtMatmulPreferenceSetAttribute");
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attribute, void* buf,
                                                    size_t size, size_t* written) {
  return get_attribute(Kind::preference, pref, preference_field, attribute, buf, size, written,
                       "cublasLtMatmulPreferenceGetAttribute");
}

namespace {

// The four layouts of a call (a null Cdesc is Ddesc, as cublasLtMatmul documents).
struct Layouts {
  Layout l[4];
  const Layout* ptr[4] = {&l[kA], &l[kB], &l[kC], &l[kD]};
};

cublasStatus_t read_layouts(const char* who, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                            cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, Layouts& out) {
  if (a == nullptr || b == nullptr || d == nullptr)
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": a null matrix layout");
  out.l[kA] = *lookup<Layout>(Kind::layout, a, who);
  out.l[kB] = *lookup<Layout>(Kind::layout, b, who);
  out.l[kD] = *lookup<Layout>(Kind::layout, d, who);
  out.l[kC] = c != nullptr ? *lookup<Layout>(Kind::layout, c, who) : out.l[kD];
  return CUBLAS_STATUS_SUCCESS;
}

// Bytes a column-major matrix spans from its first element.
size_t span_bytes(const Layout& l, int64_t ld) {
  if (l.rows == 0 || l.cols == 0) return 0;
  return ((l.cols - 1) * static_cast<uint64_t>(ld) + l.rows) * element_size(static_cast<cudaDataType_t>(l.type));
}

void check_range(const char* what, const void* pointer, size_t bytes) {
  if (!fp8serve::emu::detail::is_device_range(pointer, bytes))
    fp8serve::emu::detail::die("cublasLtMatmul: %s at %p spans %zu bytes, which is not inside one cudaMalloc "
                               "allocation: a GPU would fault",
                               what, pointer, bytes);
}

uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

}  // namespace

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  constexpr const char* who = "cublasLtMatmulAlgoGetHeuristic";
  clear_failure();
  if (handle == nullptr || !is_live_handle(handle))
    return fail(CUBLAS_STATUS_NOT_INITIALIZED, std::string(who) + ": no live handle");
  if (requested <= 0 || results == nullptr || returned == nullptr || desc == nullptr || pref == nullptr)
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                std::string(who) + ": requestedAlgoCount <= 0, or a null descriptor, preference or result pointer");
  *returned = 0;
  Layouts layouts;
  if (const cublasStatus_t s = read_layouts(who, a, b, c, d, layouts); s != CUBLAS_STATUS_SUCCESS) return s;
  const MatmulDesc& matmul = *lookup<MatmulDesc>(Kind::desc, desc, who);
  Problem problem;
  if (const cublasStatus_t s = check_configuration(who, matmul, layouts.ptr, problem); s != CUBLAS_STATUS_SUCCESS)
    return s;
  Algo algo;
  if (const cublasStatus_t s = choose_algo(problem, matmul, *lookup<Preference>(Kind::preference, pref, who), algo);
      s != CUBLAS_STATUS_SUCCESS)
    return s;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  encode_algo(algo, results[0].algo);
  results[0].workspaceSize = algo.workspace;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  // 128 x 128 output tiles over the H200's 132 SMs.
  results[0].wavesCount = static_cast<float>(((problem.m + 127) / 128) * ((problem.n + 127) / 128)) / 132.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t compute_desc, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t a_desc, const void* b,
                              cublasLtMatrixLayout_t b_desc, const void* beta, const void* c,
                              cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  constexpr const char* who = "cublasLtMatmul";
  clear_failure();
  if (handle == nullptr || !is_live_handle(handle))
    return fail(CUBLAS_STATUS_NOT_INITIALIZED, std::string(who) + ": no live handle");
  if (compute_desc == nullptr || alpha == nullptr || beta == nullptr)
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": a null descriptor, alpha or beta");
  Layouts layouts;
  if (const cublasStatus_t s = read_layouts(who, a_desc, b_desc, c_desc, d_desc, layouts); s != CUBLAS_STATUS_SUCCESS)
    return s;
  const MatmulDesc desc = *lookup<MatmulDesc>(Kind::desc, compute_desc, who);
  Call call;
  Problem& p = call.problem;
  if (const cublasStatus_t s = check_configuration(who, desc, layouts.ptr, p); s != CUBLAS_STATUS_SUCCESS) return s;

  // The algorithm: the heuristic's (or, for none, the one default preferences give).
  Algo chosen;
  if (algo == nullptr) {
    if (const cublasStatus_t s = choose_algo(p, desc, Preference{}, chosen); s != CUBLAS_STATUS_SUCCESS) return s;
  } else if (!decode_algo(*algo, chosen)) {
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": algo is not one cublasLtMatmulAlgoGetHeuristic returned");
  }
  if (chosen.signature != signature(p, desc))
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                std::string(who) + ": algo was chosen for other types, transposes, epilogue or scale modes");

  // Pointers: present, and aligned as the algorithm was chosen for.
  std::memcpy(&call.alpha, alpha, sizeof call.alpha);
  std::memcpy(&call.beta, beta, sizeof call.beta);
  const bool empty = p.m == 0 || p.n == 0;
  if (!empty && (d == nullptr || (p.k > 0 && (a == nullptr || b == nullptr)) || (call.beta != 0.0f && c == nullptr)))
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": a null A, B, C (beta != 0) or D");
  if (c == d && c != nullptr && (p.ld[kC] != p.ld[kD] || p.type[kC] != p.type[kD]))
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": C == D (in place) needs Cdesc == Ddesc");
  const void* const pointers[4] = {a, b, c, d};
  static const char* const kNames[] = {"A", "B", "C", "D"};
  for (int r = kA; r <= kD; ++r) {
    if (pointers[r] == nullptr || alignment_of(pointers[r]) >= chosen.alignment[r]) continue;
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": " + kNames[r] + " is " +
                                                 std::to_string(alignment_of(pointers[r])) +
                                                 "-byte aligned, the algorithm was chosen for " +
                                                 std::to_string(chosen.alignment[r]) + " (MIN_ALIGNMENT_" + kNames[r] +
                                                 "_BYTES)");
  }
  if (p.bias && desc.bias == nullptr)
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": the BIAS epilogue without a BIAS_POINTER");
  if (p.bias && alignment_of(desc.bias) < chosen.alignment[4])
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": the bias pointer is " +
                                                 std::to_string(alignment_of(desc.bias)) +
                                                 "-byte aligned, the algorithm was chosen for " +
                                                 std::to_string(chosen.alignment[4]));

  // Scales: only where the matrix types take them.
  const bool fp8_d = p.type[kD] == CUDA_R_8F_E4M3 || p.type[kD] == CUDA_R_8F_E5M2;
  for (int r = kA; r <= kD; ++r) {
    const bool allowed = r == kD ? fp8_d : p.fp8;
    if (desc.scale[r] != nullptr && !allowed)
      return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": " + kNames[r] + "_SCALE_POINTER is set but " +
                                                   (r == kD ? "D is not FP8" : "A and B are not FP8"));
    if (desc.scale[r] != nullptr && alignment_of(desc.scale[r]) < sizeof(float))
      return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": " + kNames[r] + "_SCALE_POINTER is not float aligned");
  }
  for (int r = kA; r <= kB; ++r) {
    if (desc.scale_mode[r] != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && desc.scale[r] == nullptr)
      return fail(CUBLAS_STATUS_INVALID_VALUE,
                  std::string(who) + ": " + kNames[r] + "_SCALE_MODE is a vector or block mode without a scale pointer");
  }
  if (desc.amax_d != nullptr && !p.fp8)
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": AMAX_D_POINTER is set but A and B are not FP8");

  // Workspace: as much as the algorithm needs, 256-byte aligned.
  if (workspace_bytes < chosen.workspace)
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": workspaceSizeInBytes " +
                                                 std::to_string(workspace_bytes) + " is below the " +
                                                 std::to_string(chosen.workspace) + " the algorithm needs");
  if ((chosen.workspace > 0 && workspace == nullptr) || (workspace != nullptr && alignment_of(workspace) < 256))
    return fail(CUBLAS_STATUS_INVALID_VALUE, std::string(who) + ": the workspace is null or not 256-byte aligned");

  // Every byte the work will touch lies in device memory (a GPU would fault otherwise).
  if (!empty) {
    if (p.k > 0) {
      check_range("A", a, span_bytes(layouts.l[kA], p.ld[kA]));
      check_range("B", b, span_bytes(layouts.l[kB], p.ld[kB]));
    }
    if (call.beta != 0.0f) check_range("C", c, span_bytes(layouts.l[kC], p.ld[kC]));
    check_range("D", d, span_bytes(layouts.l[kD], p.ld[kD]));
    if (p.bias) check_range("the bias", desc.bias, p.m * element_size(p.bias_type));
    const uint64_t outer[2] = {p.m, p.n};
    for (int r = kA; r <= kD; ++r) {
      if (desc.scale[r] == nullptr) continue;
      const int32_t mode = r <= kB ? desc.scale_mode[r] : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
      check_range(r == kA ? "A's scales" : r == kB ? "B's scales" : r == kC ? "C's scale" : "D's scale", desc.scale[r],
                  scale_tensor_bytes(mode, r <= kB ? outer[r] : 1, p.k));
    }
    if (desc.amax_d != nullptr) check_range("AMAX_D", desc.amax_d, sizeof(float));
  }
  if (chosen.workspace > 0) check_range("the workspace", workspace, chosen.workspace);

  call.a = a;
  call.b = b;
  call.c = c;
  call.d = d;
  call.bias = desc.bias;
  for (int r = kA; r <= kD; ++r) call.scale[r] = desc.scale[r];
  call.amax_d = desc.amax_d;
  call.workspace = workspace;
  call.workspace_bytes = chosen.workspace;
  if (fp8serve::emu::detail::enqueue(stream, [call] { run_reference(call); }) != cudaSuccess)
    return fail(CUBLAS_STATUS_EXECUTION_FAILED, std::string(who) + ": the stream is not a valid stream (the launch failed)");
  return CUBLAS_STATUS_SUCCESS;
}
