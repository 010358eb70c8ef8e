// linear_cpu: shape checks, the ISA choice, the bf16 rounding of x for the bf16 dot, and the split
// of the output into work items. The kernels themselves are in linear_{scalar,avx2,avx512,
// avx512bf16}.cpp. See kernels/cpu/linear.hpp.
#include "kernels/cpu/linear.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_features.hpp"

namespace fp8serve::cpu {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

bool linear_isa_supported(LinearIsa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case LinearIsa::avx512bf16:
      return f.avx512f && f.avx512bw && f.avx512vbmi && f.avx512bf16 && f.avx2 && f.fma && f.f16c;
    case LinearIsa::avx512:
      return f.avx512f && f.avx512bw && f.avx2 && f.fma && f.f16c;
    case LinearIsa::avx2:
      return f.avx2 && f.fma && f.f16c;
    case LinearIsa::scalar:
    case LinearIsa::best:
      return true;
  }
  return false;
}

LinearIsa linear_best_isa() {
  return linear_isa_supported(LinearIsa::avx512bf16) ? LinearIsa::avx512bf16 : linear_fp32_dot_isa();
}

LinearIsa linear_fp32_dot_isa() {
  for (const LinearIsa isa : {LinearIsa::avx512, LinearIsa::avx2}) {
    if (linear_isa_supported(isa)) return isa;
  }
  return LinearIsa::scalar;
}

const char* linear_isa_name(LinearIsa isa) {
  switch (isa) {
    case LinearIsa::best:
      return linear_isa_name(linear_best_isa());
    case LinearIsa::avx512bf16:
      return "avx512bf16";
    case LinearIsa::avx512:
      return "avx512";
    case LinearIsa::avx2:
      return "avx2";
    case LinearIsa::scalar:
      return "scalar";
  }
  return "?";
}

void linear_cpu(const LinearParams& params, ThreadPool& pool, LinearIsa isa) {
  LinearWorkspace workspace;
  linear_cpu(params, pool, workspace, isa);
}

void linear_cpu(const LinearParams& params, ThreadPool& pool, LinearWorkspace& workspace,
                LinearIsa isa) {
  detail::LinearJob job;
  LinearParams& p = job.p;
  p = params;
  if (p.num_tokens < 0 || p.in_features < 1 || p.out_features < 1) {
    throw std::invalid_argument("linear_cpu: need num_tokens >= 0 and in/out features >= 1");
  }
  if (p.x_stride == 0) p.x_stride = p.in_features;
  if (p.y_stride == 0) p.y_stride = p.out_features;
  if (p.x_stride < p.in_features || p.y_stride < p.out_features) {
    throw std::invalid_argument("linear_cpu: row stride smaller than the row");
  }
  if (p.weight_dtype == WeightDtype::fp8_e4m3) {
    if (p.weight_scales == nullptr) throw std::invalid_argument("linear_cpu: FP8 weights need weight_scales");
    if (p.weight_block_k < 0 || p.weight_block_k % 64 != 0) {
      throw std::invalid_argument("linear_cpu: weight_block_k must be 0 or a multiple of 64, got " +
                                  std::to_string(p.weight_block_k));
    }
    if (p.weight_block_k == 0 || p.weight_block_k > p.in_features) p.weight_block_k = p.in_features;
  } else {
    p.weight_block_k = p.in_features;
  }
  job.num_k_blocks = ceil_div(p.in_features, p.weight_block_k);
  if (p.num_tokens == 0) return;
  if (isa == LinearIsa::best) isa = linear_best_isa();
  if (!linear_isa_supported(isa)) {
    throw std::runtime_error(std::string("linear_cpu: this CPU cannot run the ") +
                             linear_isa_name(isa) + " path");
  }
  auto* block = isa == LinearIsa::avx512bf16 ? detail::linear_block_avx512bf16
                : isa == LinearIsa::avx512   ? detail::linear_block_avx512
                : isa == LinearIsa::avx2     ? detail::linear_block_avx2
                                             : detail::linear_block_scalar;

  if (isa == LinearIsa::avx512bf16) {
    // x rounded to bf16 once, every row zero-padded to whole 64-input chunks.
    job.x_bf16_stride = ceil_div(p.in_features, 64) * 64;
    const auto size = static_cast<std::size_t>(p.num_tokens * job.x_bf16_stride);
    if (workspace.x_bf16.size() < size) workspace.x_bf16.resize(size);
    std::uint16_t* x_bf16 = workspace.x_bf16.data();
    job.x_bf16 = x_bf16;
    const int64_t rows_per_item = std::max<int64_t>(1, 16384 / job.x_bf16_stride);
    if (p.num_tokens <= rows_per_item) {
      detail::linear_round_x_avx512bf16(job, x_bf16, 0, p.num_tokens);
    } else {
      pool.parallel_for(ceil_div(p.num_tokens, rows_per_item), [&](int64_t item) {
        const int64_t begin = item * rows_per_item;
        detail::linear_round_x_avx512bf16(job, x_bf16, begin, std::min(begin + rows_per_item, p.num_tokens));
      });
    }
  }

  // Work items: token blocks whose activations stay in L2 (~256 KiB) while the weight rows of
  // the item stream past them, times output blocks small enough to give every thread several
  // items (dynamic hand-out evens out the load). None of this changes any result.
  const int64_t token_block = std::clamp<int64_t>(65536 / p.in_features, 4, 128) / 4 * 4;
  const int64_t num_token_blocks = ceil_div(p.num_tokens, token_block);
  const int64_t wanted_items = 8 * static_cast<int64_t>(pool.num_threads());
  int64_t out_block =
      ceil_div(p.out_features, std::max<int64_t>(1, wanted_items / num_token_blocks));
  out_block = std::clamp<int64_t>(ceil_div(out_block, 24) * 24, 24, 384);
  const int64_t num_out_blocks = ceil_div(p.out_features, out_block);

  pool.parallel_for(num_token_blocks * num_out_blocks, [&](int64_t item) {
    const int64_t tb = item / num_out_blocks;
    const int64_t ob = item - tb * num_out_blocks;
    const int64_t t_begin = tb * token_block;
    const int64_t o_begin = ob * out_block;
    block(job, t_begin, std::min(t_begin + token_block, p.num_tokens), o_begin,
          std::min(o_begin + out_block, p.out_features));
  });
}

}  // namespace fp8serve::cpu
