#pragma once
// What tests may see of a Transformer beyond its interface: one layer's KV pools (device
// pointers), to read back what the kernels stored. A friend of Transformer, so the product's
// interface carries no accessor that only tests call.
#include <cstddef>

#include "model/transformer.hpp"

namespace fp8serve {

struct TransformerTestAccess {
  static const PagedKvView& kv_view(const Transformer& t, int layer) {
    return t.kv_views_.at(static_cast<std::size_t>(layer));
  }
  // The bf16 window's tail pool.
  static const PagedKvView& tail_view(const Transformer& t, int layer) {
    return t.tail_views_.at(static_cast<std::size_t>(layer));
  }
};

}  // namespace fp8serve
