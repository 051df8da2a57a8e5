// model/step_batches.h: the per-step sequence tables the batched attention ops read
// (kernels::SeqBatch for all / prefill / decode sequences and the MLA cache row of every token),
// built on the host from the batch's segments and copied to the model's device in one transfer.
//
// Host buffer layout (i32): per group [row_begin S | num_rows S | position S | slot S |
// block_table S x width], groups all, prefill, decode, kda_all, kda_decode, verify, then
// cache_rows [T]. Under decode context parallelism the tables are one rank's (StepBatches), and a
// step with prefill sequences adds their gather tables (StepBatches::DcpPrefill): the temporary
// cache's block tables [S x width], pack_rows [slots], place_rows [blocks * block_size].
#pragma once
#include <span>
#include <vector>

#include "core/device_memory.h"
#include "model/layers/context.h"

namespace k3::model {

// What must stay fixed for the device tables to keep their addresses and launch sizes from one
// step to the next (a replayed CUDA graph): 0 = taken from the batch.
struct StepTableShape {
  int64_t block_table_width = 0;  // block ids per sequence (>= every table's length)
  int64_t max_tokens = 0;         // SeqBatch::max_tokens (>= every position + rows)
};

class StepTables {
 public:
  // `block_size`: tokens per MLA page. Every segment's block table must cover its new tokens
  // (under decode context parallelism, `split`: their local positions on this rank).
  StepTables(std::span<const Segment> segments, int32_t block_size, core::DeviceMemory& memory,
             StepTableShape shape = {}, ContextSplit split = {});
  const StepBatches& batches() const { return batches_; }
  // Rewrites the device tables in place for a batch of the same layout (as many sequences of
  // each kind with the same row counts and the same fixed shape); throws core::Error otherwise.
  void refill(std::span<const Segment> segments);

 private:
  std::vector<int32_t> build(std::span<const Segment> segments, bool first);
  int32_t block_size_;
  StepTableShape shape_;
  ContextSplit split_;
  core::DeviceMemory& memory_;
  std::vector<int64_t> layout_;  // the offsets and sizes build() produced first (refill checks them)
  core::Tensor storage_;         // every table, one i32 buffer on the device
  StepBatches batches_;
};

}  // namespace k3::model
