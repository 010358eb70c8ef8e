// CUDA graphs and stream capture in the emulator. While a stream is captured, what is issued on
// it (kernel launches, cudaMemcpyAsync, cudaMemsetAsync, cuBLASLt calls) is recorded as a node
// instead of queued; cudaGraphLaunch queues the nodes as one operation on its stream
// (streams.cpp), which runs them in order with the arguments they had at capture, reading memory
// as it is when the stream gets there - which is what a real graph does, so a caller that forgets
// to rewrite its metadata in place before a replay, or rewrites it before the last replay ran,
// gets the stale step here too. As in cudaStreamCaptureModeGlobal, a call that could synchronise
// (an allocation, a free, a synchronous copy or memset, a copy of pageable memory, a stream /
// device / event synchronize) while any capture is open fails with
// cudaErrorStreamCaptureUnsupported and invalidates the capture, whose cudaStreamEndCapture then
// returns cudaErrorStreamCaptureInvalidated (and leaves it as the thread's last error).
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "tests/cuda_emu/emu.hpp"
#include "tests/cuda_emu/runtime.hpp"

namespace fp8serve::emu::detail {
namespace {

using Node = std::function<void()>;

struct Capture {
  std::vector<Node> nodes;
  bool invalidated = false;
};

struct Graphs {
  std::mutex mutex;
  std::map<const void*, Capture> captures;  // by stream
};

Graphs& graphs() {
  static Graphs* g = new Graphs;  // never destroyed, like the runtime's state
  return *g;
}

}  // namespace

// A graph and its executable form: the recorded nodes.
struct EmulatedGraph {
  std::vector<Node> nodes;
};

bool is_capturing(cudaStream_t stream) {
  Graphs& g = graphs();
  std::lock_guard lock(g.mutex);
  return g.captures.count(stream) != 0;
}

void record_node(cudaStream_t stream, std::function<void()> node) {
  Graphs& g = graphs();
  std::lock_guard lock(g.mutex);
  const auto it = g.captures.find(stream);
  if (it == g.captures.end()) die("record_node on a stream that is not being captured");
  it->second.nodes.push_back(std::move(node));
}

cudaError_t refuse_during_capture() {
  Graphs& g = graphs();
  std::lock_guard lock(g.mutex);
  if (g.captures.empty()) return cudaSuccess;
  for (auto& [stream, capture] : g.captures) capture.invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}

cudaError_t refuse_on_capturing(cudaStream_t stream) {
  Graphs& g = graphs();
  std::lock_guard lock(g.mutex);
  const auto it = g.captures.find(stream);
  if (it == g.captures.end()) return cudaSuccess;
  it->second.invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}

}  // namespace fp8serve::emu::detail

using fp8serve::emu::detail::EmulatedGraph;
using fp8serve::emu::detail::record_error;

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return record_error(cudaErrorInvalidValue);
  if (const cudaError_t err = fp8serve::emu::detail::check_stream(stream); err != cudaSuccess) return record_error(err);
  *status = fp8serve::emu::detail::is_capturing(stream) ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  if (const cudaError_t err = fp8serve::emu::detail::check_stream(stream); err != cudaSuccess) return record_error(err);
  // The legacy default stream cannot be captured.
  if (stream == nullptr || stream == cudaStreamLegacy) return record_error(cudaErrorStreamCaptureUnsupported);
  auto& g = fp8serve::emu::detail::graphs();
  std::lock_guard lock(g.mutex);
  if (!g.captures.emplace(stream, fp8serve::emu::detail::Capture{}).second) return record_error(cudaErrorIllegalState);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return record_error(cudaErrorInvalidValue);
  *graph = nullptr;
  auto& g = fp8serve::emu::detail::graphs();
  std::lock_guard lock(g.mutex);
  const auto it = g.captures.find(stream);
  if (it == g.captures.end()) return record_error(cudaErrorIllegalState);
  fp8serve::emu::detail::Capture capture = std::move(it->second);
  g.captures.erase(it);
  if (capture.invalidated) return record_error(cudaErrorStreamCaptureInvalidated);
  *graph = reinterpret_cast<cudaGraph_t>(new EmulatedGraph{std::move(capture.nodes)});
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (exec == nullptr || graph == nullptr) return record_error(cudaErrorInvalidValue);
  *exec = reinterpret_cast<cudaGraphExec_t>(new EmulatedGraph(*reinterpret_cast<const EmulatedGraph*>(graph)));
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return record_error(cudaErrorInvalidValue);
  if (const cudaError_t err = fp8serve::emu::detail::check_stream(stream); err != cudaSuccess) return record_error(err);
  if (fp8serve::emu::detail::is_capturing(stream)) return record_error(cudaErrorNotSupported);  // no nested graphs here
  // One operation on the stream: the nodes in order (a captured stream is a chain).
  return record_error(fp8serve::emu::detail::enqueue(stream, [nodes = reinterpret_cast<const EmulatedGraph*>(exec)->nodes] {
    for (const auto& node : nodes) node();
  }));
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<EmulatedGraph*>(exec);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<EmulatedGraph*>(graph);
  return cudaSuccess;
}
