// The paged KV pool (one K and one V buffer per layer, kernels/paged_kv.hpp layout), the bf16
// window's tail pool beside it, and the copies the block manager asks for: copy-on-write blocks
// and a fork's tail ring.
#include <stdexcept>
#include <vector>

#include "model/transformer.hpp"

namespace fp8serve {

namespace {

// Block src -> dst of every pool in `views` (one per layer), for each copy.
void copy_pool_blocks(Backend& backend, Stream stream, const std::vector<PagedKvView>& views,
                      const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
  if (src.empty()) return;
  CopyBlocksParams p;
  p.layers = views.data();
  p.num_layers = static_cast<int32_t>(views.size());
  p.src = src.data();
  p.dst = dst.data();
  p.num_copies = static_cast<int32_t>(src.size());
  backend.copy_blocks(p, stream);
}

}  // namespace

void Transformer::allocate_kv_cache(int num_blocks, int num_tail_rings) {
  if (has_kv_cache()) throw std::logic_error("Transformer: the KV pool is already allocated");
  if (num_blocks < 1) throw std::invalid_argument("Transformer: the KV pool needs num_blocks >= 1");
  const ModelConfig& c = config_;
  options_.num_blocks = num_blocks;
  // One K and one V buffer per layer.
  const std::size_t pool_elems = static_cast<std::size_t>(num_blocks) * static_cast<std::size_t>(options_.block_size) *
                                 static_cast<std::size_t>(c.num_kv_heads) * static_cast<std::size_t>(c.head_dim);
  const std::size_t pool_bytes = pool_elems * kv_dtype_size(options_.kv_dtype);
  for (int i = 0; i < c.num_layers; ++i) {
    DeviceBuffer k(backend_, pool_bytes);
    DeviceBuffer v(backend_, pool_bytes);
    kv_views_.push_back(make_paged_kv_view(k.data(), v.data(), options_.kv_dtype, num_blocks,
                                           options_.block_size, c.num_kv_heads, c.head_dim));
    kv_buffers_.push_back(std::move(k));
    kv_buffers_.push_back(std::move(v));
    kv_cache_bytes_ += 2 * pool_bytes;
  }
  // The window's tail pool: the same layout in bf16, one ring per sequence that may use one.
  if (num_tail_rings == 0) options_.window = KvWindow{};
  const KvWindow& window = options_.window;
  if (!window.enabled()) return;
  const int tail_blocks = (num_tail_rings < 0 ? options_.max_num_seqs : num_tail_rings) * window.ring_blocks();
  const std::size_t tail_bytes = static_cast<std::size_t>(tail_blocks) * static_cast<std::size_t>(options_.block_size) *
                                 static_cast<std::size_t>(c.num_kv_heads) * static_cast<std::size_t>(c.head_dim) *
                                 kv_dtype_size(KvDtype::bf16);
  for (int i = 0; i < c.num_layers; ++i) {
    DeviceBuffer k(backend_, tail_bytes);
    DeviceBuffer v = window.values ? DeviceBuffer(backend_, tail_bytes) : DeviceBuffer();
    tail_views_.push_back(make_paged_kv_view(k.data(), v.data(), KvDtype::bf16, tail_blocks, options_.block_size,
                                             c.num_kv_heads, c.head_dim));
    tail_bytes_ += k.bytes() + v.bytes();
    tail_buffers_.push_back(std::move(k));
    tail_buffers_.push_back(std::move(v));
  }
}

void Transformer::copy_blocks(std::span<const BlockCopy> copies) {
  std::vector<int32_t> src, dst;
  for (const BlockCopy& copy : copies) {
    src.push_back(copy.src);
    dst.push_back(copy.dst);
  }
  copy_pool_blocks(backend_, stream_, kv_views_, src, dst);
}

void Transformer::copy_tail_rings(std::span<const BlockCopy> copies) {
  if (copies.empty()) return;
  if (tail_views_.empty()) throw std::logic_error("Transformer::copy_tail_rings without a bf16 window");
  const int32_t ring = options_.window.ring_blocks();
  std::vector<int32_t> src, dst;
  for (const BlockCopy& copy : copies) {
    for (int32_t b = 0; b < ring; ++b) {
      src.push_back(copy.src * ring + b);
      dst.push_back(copy.dst * ring + b);
    }
  }
  copy_pool_blocks(backend_, stream_, tail_views_, src, dst);
}

}  // namespace fp8serve
