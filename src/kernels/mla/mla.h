// kernels/mla/mla.h: gated MLA (NoPE) attention over the paged latent cache (spec §6), batched
// over sequences: one call serves every sequence of a step (one launch per op on CUDA).
//
// The cache of an MLA layer is a pages tensor [num_blocks, block_size, kv_lora + rope]: page b
// holds block_size consecutive token entries [c_n | k_pe] of one sequence, and cache row
// r = page * block_size + offset names one entry (vLLM's slot_mapping). A sequence finds the page
// of its token position p through its block table: page = block_table[s][p / block_size].
//
// Tables (cache_rows, SeqBatch's i32 tensors) live on the op's device. The checks validate their
// shapes, dtypes and devices everywhere, and their VALUES only for CPU tables (rows in range, page
// ids in [0, num_blocks), position + rows <= max_tokens <= max_blocks * block_size, sequences'
// activation rows disjoint): device tables cannot be read without a synchronisation, so on CUDA
// the caller guarantees them (the kernels skip out-of-range cache rows and sequences with no rows
// rather than fault, but results are then undefined).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

// Writes T new cache entries [c_n | k_pe] (spec §6.3), one launch for all rows: row t goes to
// page cache_rows[t] / block_size at offset cache_rows[t] % block_size; a negative cache row
// (-1, vLLM's padding slot) skips row t. f32 caches store the values as given (bf16 values in
// bf16 mode); bf16 caches (CUDA only) store them rounded to bf16; f8_e4m3 caches store
// fp8(x / k_scale), saturating at +-448.
struct MlaCacheWriteArgs {
  core::TensorView c_n;         // f32 [T, kv_lora] (after kv_a_layernorm)
  core::TensorView k_pe;        // f32 [T, rope]
  core::TensorView dst;         // f32 / f8_e4m3 (bf16 on CUDA) pages [num_blocks, block_size, kv_lora + rope]
  core::TensorView cache_rows;  // i32 [T]: page * block_size + offset, or -1 to skip the row
  float k_scale = 1.0f;
};
core::Status mla_cache_write_check(const MlaCacheWriteArgs& a);
void mla_cache_write_reference(const MlaCacheWriteArgs& a);

// Copies whole cache entries between page layouts, their bytes as they are (f32, bf16 or f8_e4m3
// caches alike: fp8 codes keep their k_scale): dst cache row i = src cache row src_rows[i] for every
// i < N = dst's num_blocks * block_size; src_rows[i] = -1 leaves dst row i as it is. Under decode
// context parallelism the prefill rows gather the whole context with it (model/layers/mla.cpp):
// this rank's entries into a dense buffer [slots, 1, width] for the all-gather, then the gathered
// entries into a temporary cache in position order (MlaGatherPlan says which rows go where).
struct MlaCacheGatherArgs {
  core::TensorView src;       // f32 / bf16 / f8_e4m3 pages [num_blocks, block_size, width]
  core::TensorView src_rows;  // i32 [N]: page * block_size + offset of src, or -1 to skip dst row i
  core::TensorView dst;       // pages [num_blocks', block_size', width] of src's dtype, N rows; must not overlap src
};
core::Status mla_cache_gather_check(const MlaCacheGatherArgs& a);
void mla_cache_gather_reference(const MlaCacheGatherArgs& a);

// The host tables of the decode-context-parallel prefill gather for rank `rank` of `cp` (built once
// per step, model/step_batches.cpp). Sequence s has tokens[s] context positions (global position p
// on rank p % cp at local position p / cp, found through local_tables[s], pages of block_size):
//   pack:  each rank's buffer has `slots` = sum_s ceil(tokens[s] / cp) rows, sequence s at rows
//          off_s .. off_s + ceil(tokens[s] / cp) - 1 (row off_s + j = local position j; a rank owning
//          fewer leaves its last row unwritten): pack_rows [slots] = the local cache row, or -1;
//   all-gather (rank-major): position p of sequence s is gathered row (p % cp) * slots + off_s + p / cp;
//   place: the temporary cache [blocks, block_size, width] holds sequence s at its own pages
//          block_table[s] = [b_s, b_s + 1, ..] (position p at row b_s * block_size + p):
//          place_rows [blocks * block_size] = the gathered row of each, or -1 past a sequence's end.
struct MlaGatherPlan {
  int64_t slots = 0, blocks = 0, table_width = 0;  // table_width = max_s ceil(tokens[s] / block_size)
  std::vector<int32_t> pack_rows, place_rows;
  std::vector<int32_t> block_table;  // [S, table_width], -1 past a sequence's pages
};
MlaGatherPlan mla_gather_plan(std::span<const int64_t> tokens, std::span<const std::span<const int32_t>> local_tables,
                              int cp, int rank, int64_t block_size);

// Causal attention for the sequences of `seqs`: sequence s owns activation rows
// row_begin[s] .. row_begin[s] + num_rows[s] - 1 of q and out; its row i is the token at cache
// position position[s] + i (already written to the cache) and attends to positions
// 0 .. position[s] + i, found through block_table[s]. Rows of q / out that belong to no sequence
// are neither read nor written (a mixed batch runs its prefill and decode subsets as two calls).
struct MlaAttentionArgs {
  core::TensorView q;                  // f32 [T, H * (nope + rope)]: per head nope then rope part
  core::TensorView pages;              // f32 / f8_e4m3 (bf16 on CUDA) [num_blocks, block_size, kv_lora + rope]
  SeqBatch seqs;                       // row_begin, num_rows, position, block_table (slot unused)
  float k_scale = 1.0f;                // dequant: value = fp8 * k_scale
  const LinearWeight* kv_b = nullptr;  // [H * (nope + v), kv_lora]: per head W_UK rows then W_UV rows
  core::TensorView out;                // f32 [T, H * v] = round(o)
  int num_heads = 0, qk_nope = 0, qk_rope = 0, v_head_dim = 0, kv_lora = 0;
  float scale = 0.0f;  // (nope + rope)^-1/2
  Precision precision = Precision::bf16;
};
core::Status mla_attention_check(const MlaAttentionArgs& a);
// Naive form (prefill): k_nope = round(W_UK c_n), v = round(W_UV c_n) per position, then softmax.
void mla_naive_reference(const MlaAttentionArgs& a, backends::cpu::ThreadPool* pool = nullptr);
// Absorbed form (decode, spec §6.2): q_lat = round(W_UK^T q_nope), scores against [c_n; k_pe],
// o_lat = round(sum p c_n), o = round(W_UV o_lat).
void mla_absorbed_reference(const MlaAttentionArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
