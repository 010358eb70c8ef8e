#pragma once
// CUDA graphs for decode steps (Transformer, TransformerOptions::graphs). A graph replays its
// launches with the arguments they had at capture - grid sizes, strides, the batch's counts,
// every pointer - so a step may replay a graph only if all of those are the same. A decode step
// (one new token per sequence, none calibrating, every sequence sampling) is therefore padded to
// a bucket of sequences and to a bucketed block-table width; the metadata is rewritten in place
// before each replay, and the kernels take everything else from it on the device. Padding
// sequences are inert: their token has slot -1 (kv_write skips padding), and they attend over one
// position of block 0 with context 1, so they read valid memory and write nothing; their logits
// are computed and dropped. decode_graphs.cpp holds the Transformer's side too:
// capture_decode_graphs() and forward_graphed().
#include <cstdint>
#include <optional>
#include <vector>

#include "model/transformer.hpp"

namespace fp8serve {

// The batch-size buckets graphs are captured for: 1, 2, 4, 8, then every multiple of 8 up to
// max_num_seqs, at most 256 (larger decode batches run op by op; there a launch is a small part
// of a step).
std::vector<int32_t> graph_batch_sizes(int32_t max_num_seqs);

// The graph a step can replay: its padded batch size and block-table width.
struct GraphKey {
  int32_t num_seqs = 0;
  int32_t width = 0;
  auto operator<=>(const GraphKey&) const = default;
};

// The key for `b` when it is a decode step that a graph can run, else nullopt. width: the
// power of two at or above b.max_blocks_per_seq, at most max_blocks (the widest table).
// max_spill_tokens: kv_spill's bound this step (graphs launch it with block_size, one whole
// block leaving the window, the most a one-token step normally spills).
std::optional<GraphKey> graph_key(const ForwardBatch& b, const std::vector<int32_t>& buckets, int32_t max_blocks,
                                  int32_t max_spill_tokens, int32_t block_size);

// `b` padded to key.num_seqs sequences and key.width-wide block tables.
HostBatch pad_decode(const ForwardBatch& b, GraphKey key, int32_t num_layers);

}  // namespace fp8serve
