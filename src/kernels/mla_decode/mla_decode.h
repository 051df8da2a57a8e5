// kernels/mla_decode/mla_decode.h: fused gated-MLA decode (fastpath/, decode_backend:
// latency_specialized): the standard path's `mla_absorbed` followed by the output gate
// `sigmoid_gate` (src/model/layers/mla.cpp), as ONE op computing the same function.
//
// Math per sequence s, query row i (token at cache position position[s] + i, q row
// row_begin[s] + i), head h (spec §6.2, §6.1), exactly the rounding points of the two standard ops:
//   q_lat  = round(W_UK[h]^T q_nope)                         [kv_lora]   (mla_absorbed)
//   s(j)   = scale * (q_lat . c_n,j + q_pe . k_pe,j),  j = 0 .. position[s] + i  (causal / verify)
//   o_lat  = round(sum_j softmax(s)_j c_n,j)                 [kv_lora]
//   o      = round(W_UV[h] o_lat)                            [v]
//   out    = round(o * round(sigmoid(gate)))  with a gate   (sigmoid_gate; gate = the rounded g_proj
//   out    = o                                without one    output, the layer input's W_g x)
// round = kernels::round_act (bf16 in Precision::bf16, identity in Precision::fp32). The CPU
// reference composes mla_absorbed_reference and sigmoid_gate_reference, so on the CPU this op equals
// the standard op pair bit for bit in both precisions. CUDA is compared at attention tolerance (split
// softmax, FMA contraction, device expf).
//
// CUDA design (cuda_mla_decode.cu, strategy "cuda_decode_splitkv"): four launches per call, grids from
// host integers only (num_seqs, max_rows, max_tokens, dims), so a captured CUDA graph replays for any
// positions, row counts and block tables. Query slots qi = s * max_rows + i (Q = num_seqs * max_rows);
// slots with i >= num_rows[s] exit at once.
//   1. q_absorb  grid (H, kv_lora / 64, ceil(Q / 16)): W_UK[h]'s [nope x 64] column tile staged in shared
//                memory, then its 16 slots: Qc[qi][h] = [round(W_UK[h]^T q_nope); q_pe]   (workspace)
//   2. split_kv  grid (splits, Q): a CTA streams its split's cache entries (576 values: 512 c_n + 64 k_pe;
//                576 B per token in fp8) through shared memory (dequantised to f32, 32 entries a tile)
//                ONCE for ALL local heads (MQA: the entry is shared by the heads; <= 16 heads), keeps an
//                online softmax per head and writes the unnormalised partial o [kv_lora] plus (max, sum)
//                per head. Splits past the slot's last visible position exit at once.
//   3. combine   grid (Q * H, kv_lora / 64): o_lat = round(sum_s w_s o_s / sum_s w_s l_s) with
//                log-sum-exp weights w_s = e^{m_s - max m} over the slot's non-empty splits.
//   4. w_uv_gate grid (H * v / 8, ceil(Q / 8)): a warp per W_UV row (in registers) against the o_lat of 8
//                slots (shared memory): o = round(W_UV o_lat), out = round(o * round(sigmoid(gate))) or o.
//   Splits: split_len = max_tokens / floor(kMlaDecodeTargetCtas / Q) rounded up to whole 32-position
//   tiles (mla_decode_split_len), so about 2 CTAs per SM of an H200 (132 SMs), one wave, at any batch.
//   Verify rows of one sequence are separate query slots (each reads the sequence's cache; L2 serves
//   the repeats). Scores and P.V run on CUDA cores in fp32 (tensor cores: a later step).
// Bytes per call at TP8 (12 heads, kv_lora 512, rope 64, fp8 cache 576 B/token, 8K context, bf16 kv_b):
//   batch 1:  cache 4.72 MB + W_UK/W_UV 3.15 MB = 7.9 MB from DRAM (1.8 us at 4.3 TB/s), plus partials
//             256 splits x 12 heads x 514 x 4 B = 6.3 MB written and read back (L2-resident).
//   batch 64: cache 302 MB + W 3.15 MB = 305 MB (71 us at 4.3 TB/s), plus partials 64 x 12 x 4 splits
//             x 514 x 4 B = 6.3 MB (L2). The fp32 CUDA-core arithmetic (12 x (576 + 512) FMA per cached
//             token per query row: 6.9 GFMA at batch 64, 0.11 GFMA at batch 1) bounds it near 200 us at
//             batch 64 and a few us at batch 1 on an H200; tensor cores are what closes that gap.
#pragma once
#include <cstdint>

#include "core/error.h"
#include "kernels/common.h"
#include "kernels/mla/mla.h"

namespace k3::kernels {

// Split-KV tuning (part of the contract because the workspace size depends on it).
constexpr int64_t kMlaDecodeTargetCtas = 264;  // split_kv CTAs aimed for: 2 per SM of an H200
constexpr int64_t kMlaDecodeTile = 32;         // positions per staged tile; split_len is a multiple

// Same fields as MlaAttentionArgs (same meaning, same checks) plus the gate and the workspace.
// Reads the q and gate rows and writes the out rows of the sequences only; rows of q / gate / out that
// belong to no sequence are neither read nor written. out must not overlap q, pages or the workspace; it may be
// exactly the gate view (each element's gate is read before its out is written), no other overlap.
struct MlaDecodeArgs {
  core::TensorView q;                  // f32 (bf16 on CUDA) [T, H * (nope + rope)]: per head nope then rope
  core::TensorView pages;              // f32 / f8_e4m3 (bf16 on CUDA) [num_blocks, block_size, kv_lora + rope]
  SeqBatch seqs;                       // row_begin, num_rows, position, block_table (slot unused)
  float k_scale = 1.0f;                // dequant: value = fp8 * k_scale
  const LinearWeight* kv_b = nullptr;  // [H * (nope + v), kv_lora] bf16/f32: per head W_UK rows then W_UV rows
  core::TensorView gate;               // f32 (bf16 on CUDA) [T, H * v] gate logits (rounded W_g x), or undefined: no gate
  core::TensorView out;                // f32 (bf16 on CUDA) [T, H * v] = round(o * round(sigmoid(gate))) or round(o)
  core::TensorView workspace;          // CUDA: f32 device [>= mla_decode_workspace_floats(*this)], or undefined:
                                       //   the CUDA op takes scratch from its context's pool. The CPU ignores it.
  int num_heads = 0, qk_nope = 0, qk_rope = 0, v_head_dim = 0, kv_lora = 0;
  float scale = 0.0f;                  // (nope + rope)^-1/2
  Precision precision = Precision::bf16;
  int64_t split_len = 0;               // > 0: positions per split (a multiple of kMlaDecodeTile) instead of
                                       //   mla_decode_split_len's choice (benchmarks and tests; the CPU ignores it)
};

// Positions per split for Q = num_seqs * max_rows query slots over max_tokens: a multiple of
// kMlaDecodeTile, >= kMlaDecodeTile; splits = ceil(max_tokens / split_len).
int64_t mla_decode_split_len(int64_t query_slots, int64_t max_tokens);
int64_t mla_decode_num_splits(int64_t query_slots, int64_t max_tokens);
// The split length and count one call uses: a.split_len when set, else the choice above.
int64_t mla_decode_split_len(const MlaDecodeArgs& a);
int64_t mla_decode_num_splits(const MlaDecodeArgs& a);
// f32 workspace of the CUDA op: Q*H*(kv_lora + rope) (Qc) + Q*H*splits*(kv_lora + 2) (partials).
int64_t mla_decode_workspace_floats(const MlaDecodeArgs& a);

// The MlaAttentionArgs of the same call (q, pages, seqs, kv_b, dims) writing o into `out`.
MlaAttentionArgs mla_decode_attention_args(const MlaDecodeArgs& a, core::TensorView out);

core::Status mla_decode_check(const MlaDecodeArgs& a);
// The oracle: mla_absorbed_reference into an f32 temporary, then sigmoid_gate_reference (or a copy)
// for each sequence's rows.
void mla_decode_reference(const MlaDecodeArgs& a);
// The CPU model of the CUDA split-KV algorithm (for tests): per split of `split_len` positions an
// unnormalised partial (m, l, o = sum e^{s-m} c_n), then the log-sum-exp combine. Same rounding points
// as mla_decode_reference; equal to it only to a tolerance (different softmax summation order).
void mla_decode_split_reference(const MlaDecodeArgs& a, int64_t split_len);

}  // namespace k3::kernels
