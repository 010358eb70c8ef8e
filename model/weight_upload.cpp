#include "model/weight_upload.hpp"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593 (_mm512_undefined_*)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/bf16.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/fp8_encode_avx512.hpp"
#include "kernels/fp8_quantize.hpp"

namespace fp8serve {

namespace {

// Rows converted per round trip: a few hundred KiB of floats, whatever the tensor.
int64_t rows_per_chunk(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(cols, 1)); }

// bf16_encode (kernels/bf16.hpp) on n floats, 16 at a time where the CPU has AVX-512F
// (fp8_encode_avx512.hpp's bf16_encode16, bitwise the scalar codec).
__attribute__((target("avx512f"))) void encode_bf16_avx512(const float* in, std::size_t n, std::uint16_t* out) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i codes = cpu::bf16_encode16(_mm512_loadu_si512(in + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(codes));
  }
  for (; i < n; ++i) out[i] = bf16_encode(in[i]);
}

std::vector<const HostTensor*> parts_of(const ModelWeights& weights, std::initializer_list<std::string> names) {
  std::vector<const HostTensor*> parts;
  for (const std::string& name : names) parts.push_back(&weights.at(name));
  return parts;
}

}  // namespace

WeightUploader::WeightUploader(Backend& backend, Stream stream, std::vector<DeviceBuffer>& buffers, bool planning,
                               std::size_t arena_bytes)
    : backend_(backend), stream_(stream), buffers_(buffers), planning_(planning) {
  if (!planning && arena_bytes > 0) {
    buffers_.emplace_back(backend_, arena_bytes);
    arena_ = static_cast<char*>(buffers_.back().data());
    arena_size_ = arena_bytes;
  }
}

void* WeightUploader::allocate(std::size_t bytes) {
  constexpr std::size_t kAlignment = 256;  // every tensor starts on its own cache lines
  const std::size_t offset = bytes_.arena;
  bytes_.arena += (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (planning_) return nullptr;
  if (arena_ == nullptr) {
    buffers_.emplace_back(backend_, bytes);
    return buffers_.back().data();
  }
  if (bytes_.arena > arena_size_) throw std::logic_error("WeightUploader: the arena is smaller than planned");
  return arena_ + offset;
}

const std::uint16_t* WeightUploader::bf16(const ModelWeights& weights, std::initializer_list<std::string> names) {
  const std::vector<const HostTensor*> parts = parts_of(weights, names);
  std::size_t elements = 0;
  for (const HostTensor* t : parts) elements += static_cast<std::size_t>(t->num_elements());
  auto* device = static_cast<std::uint16_t*>(allocate(elements * sizeof(std::uint16_t)));
  bytes_.bf16 += elements * sizeof(std::uint16_t);
  if (planning_) return device;
  std::size_t offset = 0;
  std::vector<float> rows;
  std::vector<std::uint16_t> staged;
  for (const HostTensor* t : parts) {
    const int64_t cols = t->cols(), chunk = rows_per_chunk(cols);
    for (int64_t r = 0; r < t->rows(); r += chunk) {
      const int64_t end = std::min(t->rows(), r + chunk);
      const auto n = static_cast<std::size_t>((end - r) * cols);
      rows.resize(n);
      staged.resize(n);
      t->read_rows(r, end, rows.data());
      if (cpu::cpu_features().avx512f) {
        encode_bf16_avx512(rows.data(), n, staged.data());
      } else {
        for (std::size_t i = 0; i < n; ++i) staged[i] = bf16_encode(rows[i]);
      }
      backend_.copy_to_device(device + offset, staged.data(), n * sizeof(std::uint16_t), stream_);
      backend_.synchronize(stream_);  // `staged` is reused
      offset += n;
    }
  }
  return device;
}

DeviceProjection WeightUploader::projection(const ModelWeights& weights, std::initializer_list<std::string> names,
                                            bool quantize) {
  const std::vector<const HostTensor*> parts = parts_of(weights, names);
  DeviceProjection p;
  p.in_features = parts.front()->cols();
  bool any_fp8 = quantize;
  for (const HostTensor* t : parts) {
    p.out_features += t->rows();
    if (const Fp8Weight* f = t->fp8()) {
      any_fp8 = true;
      if (f->block_k > 0) {
        if (p.block_k > 0 && p.block_k != f->block_k) {
          throw FormatError("weights: '" + t->name + "' has FP8 blocks of " + std::to_string(f->block_k) +
                            " inputs, the tensors fused with it " + std::to_string(p.block_k));
        }
        p.block_k = f->block_k;
      }
    }
  }
  if (!any_fp8) {
    p.weight = bf16(weights, names);
    return p;
  }

  // FP8: codes [out, in], scales [out, num_k_blocks] (a per-row scale repeated over the blocks).
  p.dtype = WeightDtype::fp8_e4m3;
  const int64_t in = p.in_features;
  const int64_t num_k_blocks = weight_num_k_blocks(in, p.block_k);
  auto* codes = static_cast<std::uint8_t*>(allocate(static_cast<std::size_t>(p.out_features * in)));
  std::vector<float> scales(static_cast<std::size_t>(p.out_features * num_k_blocks));
  bytes_.fp8 += static_cast<uint64_t>(p.out_features * in);
  bytes_.fp8_scales += scales.size() * sizeof(float);
  bytes_.fp8_as_bf16 += static_cast<uint64_t>(p.out_features * in) * sizeof(std::uint16_t);
  if (planning_) {
    (void)allocate(scales.size() * sizeof(float));
    return p;
  }
  int64_t row = 0;
  std::vector<float> rows;
  std::vector<std::uint8_t> staged;
  for (const HostTensor* t : parts) {
    if (const Fp8Weight* f = t->fp8()) {
      // As stored: the codes straight from the mapped file, the scales re-laid per block.
      backend_.copy_to_device(codes + row * in, f->codes.data(), f->codes.size(), stream_);
      const int64_t stored_blocks = weight_num_k_blocks(in, f->block_k);
      for (int64_t r = 0; r < t->rows(); ++r) {
        for (int64_t b = 0; b < num_k_blocks; ++b) {
          scales[static_cast<std::size_t>((row + r) * num_k_blocks + b)] =
              f->scales[static_cast<std::size_t>(r * stored_blocks + (stored_blocks == 1 ? 0 : b))];
        }
      }
    } else {
      const int64_t chunk = rows_per_chunk(in);
      for (int64_t r = 0; r < t->rows(); r += chunk) {
        const int64_t end = std::min(t->rows(), r + chunk);
        rows.resize(static_cast<std::size_t>((end - r) * in));
        staged.resize(rows.size());
        t->read_rows(r, end, rows.data());
        for (int64_t i = 0; i < end - r; ++i) {
          const float* src = rows.data() + i * in;
          for (int64_t k = 0; k < in; ++k) {
            if (!std::isfinite(src[k])) {
              throw FormatError("weights: '" + t->name + "' row " + std::to_string(r + i) +
                                " holds a non-finite value; it cannot be quantized to FP8");
            }
          }
          float scale = 0.0f;
          quantize_row_fp8(src, in, staged.data() + i * in, &scale);
          for (int64_t b = 0; b < num_k_blocks; ++b) scales[static_cast<std::size_t>((row + r + i) * num_k_blocks + b)] = scale;
        }
        backend_.copy_to_device(codes + (row + r) * in, staged.data(), staged.size(), stream_);
        backend_.synchronize(stream_);  // `staged` is reused
      }
    }
    row += t->rows();
  }
  auto* device_scales = static_cast<float*>(allocate(scales.size() * sizeof(float)));
  backend_.copy_to_device(device_scales, scales.data(), scales.size() * sizeof(float), stream_);
  backend_.synchronize(stream_);
  p.weight = codes;
  p.scales = device_scales;
  return p;
}

}  // namespace fp8serve
