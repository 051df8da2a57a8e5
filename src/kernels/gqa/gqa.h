// kernels/gqa/gqa.h: grouped-query attention with rotate-half RoPE over one sequence's cache, as the
// EAGLE-3 draft's Llama layer computes it (draft/eagle3_model.h).
//
// One call appends n new rows of one sequence and attends from them:
//   for new row i (absolute position p = position + i) and each head h of its dims [h*d, (h+1)*d):
//     rotate q[i, head h] and k[i, kv head] by p (rotate-half: the pair (x[j], x[j + d/2]) by the
//       angle p * inv_freq[j], fp32 cos/sin, the result rounded as an activation), in place
//   k_cache[past + i] = rotated k[i];  v_cache[past + i] = v[i]
//   out[i, head h] = round( sum_{j <= past + i} softmax_j(q . k_cache[j] / sqrt(d)) v_cache[j] )
//     over KV head h / (NH / NKV): causal over the cache and the new rows; fp32 scores, max
//     subtracted, keys in order (the reference; the CUDA kernel splits keys over warps and merges
//     their partial softmaxes, within fp32 rounding of it)
#pragma once
#include <cstdint>

#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

struct RopeGqaAttentionArgs {
  core::TensorView q;         // f32 [n, NH*d] (bf16 on CUDA): the new rows' queries, rotated in place
  core::TensorView k;         // f32 [n, NKV*d]: the new rows' keys, rotated in place
  core::TensorView v;         // f32 [n, NKV*d]
  core::TensorView k_cache;   // f32 [capacity, NKV*d], contiguous: rows [0, past) hold earlier keys
  core::TensorView v_cache;   // f32 [capacity, NKV*d], contiguous
  core::TensorView inv_freq;  // f32 [d/2], contiguous
  core::TensorView out;       // f32 [n, NH*d]
  int64_t past = 0;           // cached rows before this call; past + n <= capacity
  int64_t position = 0;       // absolute position of new row 0
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  Precision precision = Precision::bf16;
};
core::Status rope_gqa_attention_check(const RopeGqaAttentionArgs& a);
void rope_gqa_attention_reference(const RopeGqaAttentionArgs& a);

}  // namespace k3::kernels
