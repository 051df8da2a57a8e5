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

// Causal attention for the sequences of `seqs`: sequence s owns activation rows
// row_begin[s] .. row_begin[s] + num_rows[s] - 1 of q and out; its row i is the token at cache
// position position[s] + i (already written to the cache) and attends to positions
// 0 .. position[s] + i, found through block_table[s]. Rows of q / out that belong to no sequence
// are neither read nor written (a mixed batch runs its prefill and decode subsets as two calls).
struct MlaAttentionArgs {
  core::TensorView q;              // f32 [T, H * (nope + rope)]: per head nope then rope part
  core::TensorView pages;          // f32 / f8_e4m3 (bf16 on CUDA) [num_blocks, block_size, kv_lora + rope]
  SeqBatch seqs;                   // row_begin, num_rows, position, block_table (slot unused)
  float k_scale = 1.0f;            // dequant: value = fp8 * k_scale
  const LinearWeight* kv_b = nullptr;  // [H * (nope + v), kv_lora]: per head W_UK rows then W_UV rows
  core::TensorView out;            // f32 [T, H * v] = round(o)
  int num_heads = 0, qk_nope = 0, qk_rope = 0, v_head_dim = 0, kv_lora = 0;
  float scale = 0.0f;              // (nope + rope)^-1/2
  Precision precision = Precision::bf16;
};
core::Status mla_attention_check(const MlaAttentionArgs& a);
// Naive form (prefill): k_nope = round(W_UK c_n), v = round(W_UV c_n) per position, then softmax.
void mla_naive_reference(const MlaAttentionArgs& a);
// Absorbed form (decode, spec §6.2): q_lat = round(W_UK^T q_nope), scores against [c_n; k_pe],
// o_lat = round(sum p c_n), o = round(W_UV o_lat).
void mla_absorbed_reference(const MlaAttentionArgs& a);

}  // namespace k3::kernels
