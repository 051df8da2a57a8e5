// kernels/dspark/dspark.h: the DSpark draft model's own ops (draft/draft_model.h, spec §13.2), so
// its forward runs through the registry on the CPU and on the target's GPU alike. Every tensor is
// f32 (the draft stores its activations in f32 and rounds them at each op's output in bf16 mode).
//
// rope_pairs           interleaved RoPE in place over head slices of rows at consecutive positions:
//                      row r (position p = position + r), head h: the dim values at columns
//                      offset + h * head_stride + [0, dim), pairs (x[2i], x[2i+1]) rotated by the
//                      angle p * inv_freq[i] (fp32 cos/sin; products then sum, no FMA), rounded
//                      as activations (draft/rope.h's apply_rope, with inv_freq given).
// mla_block_attention  the draft's absorbed MLA, non-causal: every query row sees the P context
//                      rows then the T block rows' own latents (rows [c_n | k_pe], L + dr wide).
//                      Per head h, with W_UK / W_UV the head's first dn / last dv rows of kv_b:
//                        q_lat = round(W_UK^T q_nope)          fp32 over the nope dims in order
//                        s_j   = scale * (q_lat . c_n,j + q_pe . k_pe,j)
//                        o_lat = round(sum_j softmax(s)_j c_n,j)   max-subtracted
//                        out   = round(W_UV o_lat)
//                      The reference sums in index order; the CUDA kernels split rows over warps
//                      and dims over lanes (within fp32 rounding of it).
// markov_draft         the sequential low-rank Markov head over a block's base logits, for B
//                      requests and n <= K steps: prev_0 = x0[b];
//                        z_k[v] = U[b*K + k][v] + sum_i W1[prev_k][i] * W2[v][i]   fp32, i in order
//                        x_k = argmax_v z_k (ties: the lowest v), prev_{k+1} = d2t-mapped x_k
//                      writing each step's z row and its token (a target id). The CUDA version
//                      keeps the chain on the device (no host round trip per step).
#pragma once
#include <cstdint>

#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

struct RopePairsArgs {
  core::TensorView x;         // f32 [n, cols], unit inner stride: rotated in place
  core::TensorView inv_freq;  // f32 [dim / 2], contiguous
  int64_t offset = 0;         // column of head 0's slice
  int64_t head_stride = 0;    // columns from one head's slice to the next
  int heads = 1, dim = 0;
  int64_t position = 0;  // row r is at position + r
  Precision precision = Precision::bf16;
};
core::Status rope_pairs_check(const RopePairsArgs& a);
void rope_pairs_reference(const RopePairsArgs& a);

struct MlaBlockAttentionArgs {
  core::TensorView q;                  // f32 [T, NH * (dn + dr)], per head q_nope then q_pe (rotated)
  core::TensorView context;            // f32 [P, L + dr] latent rows (P may be 0), unit inner stride
  core::TensorView block;              // f32 [T, L + dr]: the block rows' own latents
  const LinearWeight* kv_b = nullptr;  // [NH * (dn + dv), L], dense: per head W_UK rows then W_UV rows
  core::TensorView out;                // f32 [T, NH * dv]
  int num_heads = 0, nope_dim = 0, rope_dim = 0, v_dim = 0;
  float scale = 1.0f;
  Precision precision = Precision::bf16;
};
core::Status mla_block_attention_check(const MlaBlockAttentionArgs& a);
void mla_block_attention_reference(const MlaBlockAttentionArgs& a);

struct MarkovDraftArgs {
  core::TensorView base_logits;      // f32 [B * K, Vd]: row b * K + j is U_{j+1} of request b
  core::TensorView x0;               // i32 [B]: each request's newest token (a target id)
  core::TensorView w1;               // f32 or bf16 [V, R], indexed by the previous target id
  const LinearWeight* w2 = nullptr;  // [Vd, R], dense
  core::TensorView d2t;              // i64 [Vd] (target id = d + d2t[d]), or undefined when Vd == V
  core::TensorView tokens;           // i32 [B, n] out: the drafted target ids
  core::TensorView logits;           // f32 [B * n, Vd] out: row b * n + k is z_{k+1} of request b
  int block_size = 0;                // K; 1 <= n <= K
};
core::Status markov_draft_check(const MarkovDraftArgs& a);
void markov_draft_reference(const MarkovDraftArgs& a);

}  // namespace k3::kernels
