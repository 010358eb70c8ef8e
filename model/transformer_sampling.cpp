// Sampling where the logits are (Transformer::sample_greedy / sample_candidates): the last
// step's logits stay in logits_ on the device, the backend's sampling kernels read them there, and
// only their results come back, into pinned memory (kernels/sampling_ops.hpp says what they hold).
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "model/transformer.hpp"

namespace fp8serve {

std::span<const GreedyRow> Transformer::sample_greedy() {
  if (last_sample_rows_ < 0) throw std::logic_error("Transformer::sample_greedy: no forward() left its logits on the device");
  const auto num_rows = static_cast<std::size_t>(last_sample_rows_);
  if (num_rows == 0) return {};
  if (greedy_picks_.data() == nullptr) {
    const auto seqs = static_cast<std::size_t>(options_.max_num_seqs);
    greedy_picks_ = DeviceBuffer(backend_, seqs * sizeof(GreedyRow));
    greedy_host_ = HostArray<GreedyRow>(backend_);
    greedy_host_.resize(seqs);
  }
  GreedySampleParams p;
  p.logits = logits_.as<float>();
  p.num_rows = last_sample_rows_;
  p.vocab_size = config_.vocab_size;
  p.out = greedy_picks_.as<GreedyRow>();
  backend_.sample_greedy(p, stream_);
  backend_.copy_to_host(greedy_host_.data(), greedy_picks_.data(), num_rows * sizeof(GreedyRow), stream_);
  backend_.synchronize(stream_);
  return {greedy_host_.data(), num_rows};
}

Transformer::Candidates Transformer::sample_candidates(std::span<const float> inv_temperature,
                                                      std::span<const uint8_t> raw_sum_wanted) {
  if (last_sample_rows_ < 0) throw std::logic_error("Transformer::sample_candidates: no forward() left its logits on the device");
  const auto num_rows = static_cast<std::size_t>(last_sample_rows_);
  if (inv_temperature.size() != num_rows || raw_sum_wanted.size() != num_rows)
    throw std::invalid_argument("Transformer::sample_candidates: one 1/T and one raw_sum_wanted per row");
  const auto seqs = static_cast<std::size_t>(options_.max_num_seqs);
  const int32_t k = std::min<int32_t>(kMaxSampleCandidates, config_.vocab_size);
  const auto ks = static_cast<std::size_t>(k);
  // Layout of candidates_ and its host image: rows, ids, logits, 1/T, raw_sum_wanted (each 16-byte
  // aligned).
  auto align = [](std::size_t bytes) { return (bytes + 15) / 16 * 16; };
  const std::size_t ids_at = align(seqs * sizeof(CandidateRow));
  const std::size_t logits_at = ids_at + align(seqs * ks * sizeof(int32_t));
  const std::size_t inv_t_at = logits_at + align(seqs * ks * sizeof(float));
  const std::size_t wanted_at = inv_t_at + align(seqs * sizeof(float));
  const std::size_t bytes = wanted_at + seqs * sizeof(uint8_t);
  if (candidates_.data() == nullptr) {
    candidates_ = DeviceBuffer(backend_, bytes);
    candidates_host_ = HostArray<std::byte>(backend_);
    candidates_host_.resize(bytes);
  }
  auto* dev = static_cast<std::byte*>(candidates_.data());
  std::byte* host = candidates_host_.data();
  Candidates out;
  out.k = k;
  out.rows = {reinterpret_cast<const CandidateRow*>(host), num_rows};
  out.ids = reinterpret_cast<const int32_t*>(host + ids_at);
  out.logits = reinterpret_cast<const float*>(host + logits_at);
  if (num_rows == 0) return out;
  std::copy(inv_temperature.begin(), inv_temperature.end(), reinterpret_cast<float*>(host + inv_t_at));
  std::copy(raw_sum_wanted.begin(), raw_sum_wanted.end(), reinterpret_cast<uint8_t*>(host + wanted_at));
  backend_.copy_to_device(dev + inv_t_at, host + inv_t_at, wanted_at - inv_t_at + num_rows * sizeof(uint8_t), stream_);
  CandidateSampleParams p;
  p.logits = logits_.as<float>();
  p.num_rows = last_sample_rows_;
  p.vocab_size = config_.vocab_size;
  p.inv_temperature = reinterpret_cast<const float*>(dev + inv_t_at);
  p.raw_sum_wanted = reinterpret_cast<const uint8_t*>(dev + wanted_at);
  p.num_candidates = k;
  p.rows = reinterpret_cast<CandidateRow*>(dev);
  p.ids = reinterpret_cast<int32_t*>(dev + ids_at);
  p.candidate_logits = reinterpret_cast<float*>(dev + logits_at);
  backend_.sample_candidates(p, stream_);
  backend_.copy_to_host(host, dev, num_rows * sizeof(CandidateRow), stream_);
  backend_.copy_to_host(host + ids_at, dev + ids_at, num_rows * ks * sizeof(int32_t), stream_);
  backend_.copy_to_host(host + logits_at, dev + logits_at, num_rows * ks * sizeof(float), stream_);
  backend_.synchronize(stream_);
  return out;
}

void Transformer::process_logits(std::span<const int32_t> mask_index, std::span<const uint32_t> masks,
                                 std::span<const int32_t> edit_begin, std::span<const LogitEdit> edits) {
  if (last_sample_rows_ < 0) throw std::logic_error("Transformer::process_logits: no forward() left its logits on the device");
  const auto num_rows = static_cast<std::size_t>(last_sample_rows_);
  const int64_t mask_words = (config_.vocab_size + 31) / 32;
  const bool bad = mask_index.size() != num_rows || edit_begin.size() != num_rows + 1 ||
                   masks.size() % static_cast<std::size_t>(mask_words) != 0 ||
                   static_cast<std::size_t>(edit_begin.back()) != edits.size();
  if (bad) throw std::invalid_argument("Transformer::process_logits: inconsistent rows, masks or edits");
  if (num_rows == 0) return;
  // Layout of process_ and its host image: mask_index, edit_begin, masks, edits (16-byte aligned).
  auto align = [](std::size_t bytes) { return (bytes + 15) / 16 * 16; };
  const std::size_t begin_at = align(mask_index.size_bytes());
  const std::size_t masks_at = begin_at + align(edit_begin.size_bytes());
  const std::size_t edits_at = masks_at + align(masks.size_bytes());
  const std::size_t bytes = edits_at + edits.size_bytes();
  if (process_.bytes() < bytes) {
    process_ = DeviceBuffer(backend_, bytes * 2);  // room to grow: rows' edits change every step
    process_host_ = HostArray<std::byte>(backend_);
    process_host_.resize(bytes * 2);
  }
  std::byte* host = process_host_.data();
  auto* dev = static_cast<std::byte*>(process_.data());
  std::memcpy(host, mask_index.data(), mask_index.size_bytes());
  std::memcpy(host + begin_at, edit_begin.data(), edit_begin.size_bytes());
  if (!masks.empty()) std::memcpy(host + masks_at, masks.data(), masks.size_bytes());
  if (!edits.empty()) std::memcpy(host + edits_at, edits.data(), edits.size_bytes());
  backend_.copy_to_device(dev, host, bytes, stream_);
  LogitProcessParams p;
  p.logits = logits_.as<float>();
  p.num_rows = last_sample_rows_;
  p.vocab_size = config_.vocab_size;
  p.mask_index = reinterpret_cast<const int32_t*>(dev);
  p.masks = reinterpret_cast<const uint32_t*>(dev + masks_at);
  p.mask_words = mask_words;
  p.edit_begin = reinterpret_cast<const int32_t*>(dev + begin_at);
  p.edits = reinterpret_cast<const LogitEdit*>(dev + edits_at);
  backend_.process_logits(p, stream_);
  // The pinned image is rewritten by the next step's call: its copy must have landed by then,
  // which the sample_* call that follows (it synchronizes the stream) ensures.
}

void Transformer::download_logits_row(int64_t row, std::span<float> out) {
  if (row < 0 || row >= last_sample_rows_ || out.size() != static_cast<std::size_t>(config_.vocab_size))
    throw std::invalid_argument("Transformer::download_logits_row: no such row of the last step");
  backend_.copy_to_host(out.data(), logits_.as<float>() + row * config_.vocab_size, out.size_bytes(), stream_);
  backend_.synchronize(stream_);
}

}  // namespace fp8serve
