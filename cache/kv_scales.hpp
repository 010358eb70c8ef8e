#pragma once
// The host containers of the FP8 KV scales (docs/design.md, "The FP8 KV contract"): one sequence's per-layer scales,
// and the per-layer saturation totals the engine exports. The arithmetic they hold the results
// of (calibration, the saturation rule, KvWriteCounts) is the kernels': kernels/kv_scale_math.hpp.
//
// A sequence that maps cached prefix blocks inherits the scales those blocks were written with
// (BlockManager stores them with the chain). The engine reads these containers to fill a
// kernel's per-layer scale arrays.
#include <cstddef>
#include <stdexcept>
#include <vector>

#include "kernels/kv_scale_math.hpp"

namespace fp8serve {

// One sequence's scales. The engine hands kernels &k[layer] / &v[layer]; kv_write writes the
// calibrated value there while `frozen` is false (the sequence's first prefill chunk).
struct KvScales {
  std::vector<float> k;  // [num_layers]
  std::vector<float> v;  // [num_layers]
  bool frozen = false;

  KvScales() = default;
  explicit KvScales(int num_layers)
      : k(static_cast<std::size_t>(num_layers), 1.0f), v(static_cast<std::size_t>(num_layers), 1.0f) {}
  int num_layers() const { return static_cast<int>(k.size()); }
  bool operator==(const KvScales&) const = default;
};

// Per-layer running totals over the server's lifetime, exported as a metric. Owned by the
// engine loop (single thread): no atomics.
class KvSaturationCounters {
 public:
  explicit KvSaturationCounters(int num_layers)
      : layers_(num_layers > 0 ? static_cast<std::size_t>(num_layers) : 0) {
    if (num_layers <= 0) throw std::invalid_argument("KvSaturationCounters: num_layers must be > 0");
  }

  void add(int layer, const KvWriteCounts& counts) { layers_[index(layer)] += counts; }
  const KvWriteCounts& layer(int layer) const { return layers_[index(layer)]; }
  int num_layers() const { return static_cast<int>(layers_.size()); }

  KvWriteCounts total() const {
    KvWriteCounts sum;
    for (const KvWriteCounts& c : layers_) sum += c;
    return sum;
  }

 private:
  std::size_t index(int layer) const {
    if (layer < 0 || static_cast<std::size_t>(layer) >= layers_.size()) {
      throw std::out_of_range("KvSaturationCounters: layer out of range");
    }
    return static_cast<std::size_t>(layer);
  }

  std::vector<KvWriteCounts> layers_;  // [num_layers]
};

}  // namespace fp8serve
