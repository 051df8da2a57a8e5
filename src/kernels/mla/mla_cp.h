// kernels/mla/mla_cp.h: MLA attention under decode context parallelism (DCP): the
// latent cache of a sequence is split over the cp ranks of the tensor-parallel group by token
// (position p lives on rank p % cp at LOCAL position p / cp of that rank's pages), so each rank
// stores 1/cp of every context and attention becomes four ops around three collective calls:
//
//   1. mla_q_absorb        (each rank, its H own heads)   qc = [round(W_UK^T q_nope); q_pe]
//      all_gather(qc, first)                               -> qc of the whole group [cp, T, H, E]
//   2. mla_partial_attention (each rank, every head of the group, over ITS tokens only)
//                                                          -> o_part [cp, T, H, L], lse [cp, T, H]
//      all_gather(lse, first)                              -> lse of every rank [cp, cp, T, H]
//   3. mla_lse_rescale     o_part *= exp(lse_mine - logsumexp over ranks)   (in place)
//      reduce_scatter_sum(o_part) over the owner axis      -> o_lat [T, H, L] of this rank's heads
//   4. mla_w_uv            o = round(W_UV round(o_lat)) [T, H * v], and with the layer's output gate
//                          out = round(o * round(sigmoid(gate))) in the same op (one CUDA launch)
//
// E = kv_lora + rope, L = kv_lora, H = heads per rank. The "owner axis" g of [cp, T, H, ...] is the
// rank that owns the heads (head g * H + h of the group); reduce_scatter_sum's rank-order fp32 sum
// makes the combine deterministic and the same on every device. With cp = 1 the four steps compute
// mla_absorbed_reference's function (spec §6.2) up to the fp32 summation order of the softmax
// normaliser (the partial is normalised by its own sum, then rescaled; fp32 mode agrees to ~1e-6
// relative, bf16 mode rounds q_lat, o_lat and o at the same points as the absorbed form).
//
// Row / sequence conventions are MlaAttentionArgs's (mla.h): sequence s owns activation rows
// row_begin[s] .. + num_rows[s] - 1, its row i is the token at GLOBAL position position[s] + i and
// attends to global positions 0 .. position[s] + i. On a rank, block_table[s] maps LOCAL positions
// (page = block_table[s][local / block_size]); local position j holds global position
// j * cp + cp_rank, so the row at global position P sees local positions j with j * cp + cp_rank <= P
// (possibly none: then its lse is -inf and its o_part row is 0, and the rescale gives it weight 0).
// SeqBatch::max_tokens bounds LOCAL positions (<= max_blocks * block_size).
//
// CUDA strategies of mla_partial_attention (the step that reads the cache; every other step has one):
//   "cuda_partial_splitkv_mma" (20, kernels/mla/cuda_partial_via_decode.cu): the fused decode op's
//       tensor-core split-KV (mma.sync m16n8k16, 64-position cp.async stages) with a head-group grid
//       dimension (G * H heads in ceil(G * H / 16) balanced groups of <= 16, each CTA streaming its split
//       once for its group) and the LOCAL visibility rule above, then the CUDA-core strategy's combine.
//       Only for precision = bf16 (qc holds bf16 values, exact as mma operands) over fp8 / bf16 pages,
//       kv_lora % 64 == 0 (<= 512), (kv_lora + rope) % 16 == 0 (<= 576), 16-byte cache rows; P is rounded
//       to f16 (fp8 pages) or bf16 (bf16 pages) for the P.V mma, as in the decode op.
//   "cuda_partial_splitkv" (10, kernels/mla/cuda_mla_cp.cu): the absorbed form's CUDA-core split-KV and
//       combine, fp32 throughout: every shape, and the only one for precision = fp32.
#pragma once
#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

// qc[t, h, :] = [round(W_UK[h]^T q_nope[t, h]) (L values) ; q_pe[t, h] (rope values, as given)].
// Rows of q outside `rows` (row_begin..row_begin+num_rows of `seqs`) are not read; their qc rows
// are left as they are.
struct MlaQAbsorbArgs {
  core::TensorView q;                  // activations [T, H * (nope + rope)] (f32; bf16 on CUDA in bf16 mode)
  SeqBatch seqs;                       // only row_begin / num_rows are used
  const LinearWeight* kv_b = nullptr;  // [H * (nope + v), kv_lora]
  core::TensorView qc;                 // f32 [T, H, kv_lora + rope]
  int num_heads = 0, qk_nope = 0, qk_rope = 0, v_head_dim = 0, kv_lora = 0;
  Precision precision = Precision::bf16;
};
core::Status mla_q_absorb_check(const MlaQAbsorbArgs& a);
void mla_q_absorb_reference(const MlaQAbsorbArgs& a, backends::cpu::ThreadPool* pool = nullptr);

// Attention of every group's heads over THIS rank's tokens. For owner g, row t, head h:
//   s(j)  = scale * (qc[g,t,h,:L] . c_n,j + qc[g,t,h,L:] . k_pe,j)   one fp32 sum, latent then rope
//   m = max_j s(j), Z = sum_j e^{s(j) - m} (j in local order), lse = m + log(Z)
//   o_part[g,t,h,:] = sum_j (e^{s(j)-m} / Z) c_n,j   (fp32, j order, NOT rounded)
// over the visible local positions j (see above); none visible: lse = -inf, o_part = 0.
struct MlaPartialAttentionArgs {
  core::TensorView qc;      // f32 [G, T, H, kv_lora + rope] (G = cp: the all-gathered qc)
  core::TensorView pages;   // f32 / f8_e4m3 (bf16 on CUDA) [num_blocks, block_size, kv_lora + rope]: local
  SeqBatch seqs;            // row_begin, num_rows, position (GLOBAL), block_table (LOCAL), max_tokens (LOCAL)
  float k_scale = 1.0f;     // dequant: value = fp8 * k_scale
  core::TensorView o_part;  // f32 [G, T, H, kv_lora]
  core::TensorView lse;     // f32 [G, T, H]
  int cp_size = 1, cp_rank = 0;
  float scale = 0.0f;                     // (nope + rope)^-1/2
  Precision precision = Precision::fp32;  // bf16: qc holds bf16 values (mla_q_absorb in bf16 mode), which lets
                                          // CUDA use tensor cores; fp32 (the safe default) keeps the fp32 path.
                                          // The CPU reference ignores it (o_part / lse are never rounded).
};
core::Status mla_partial_attention_check(const MlaPartialAttentionArgs& a);
void mla_partial_attention_reference(const MlaPartialAttentionArgs& a, backends::cpu::ThreadPool* pool = nullptr);

// In place, for the rows of `seqs`: o_part[g,t,h,:] *= w where
//   M = max_r lse_all[r,g,t,h], w = e^{lse_all[cp_rank,g,t,h] - M} / sum_r e^{lse_all[r,g,t,h] - M}
// (sum over r in rank order, fp32; every lse -inf cannot happen: position 0 is on rank 0 and
// every row sees it). After the reduce-scatter over g, o_lat = sum_r w_r o_part_r.
struct MlaLseRescaleArgs {
  core::TensorView o_part;   // f32 [G, T, H, kv_lora], scaled in place
  core::TensorView lse_all;  // f32 [cp, G, T, H]: every rank's lse, rank-major (all_gather first)
  SeqBatch seqs;             // only row_begin / num_rows are used
  int cp_rank = 0;
};
core::Status mla_lse_rescale_check(const MlaLseRescaleArgs& a);
void mla_lse_rescale_reference(const MlaLseRescaleArgs& a);

// For the rows t of `seqs`, head h, e < v (fp32 sum over kv_lora in index order, as the absorbed form):
//   o[t, h*v + e]   = round(W_UV[h][e] . round(o_lat[t, h, :]))
//   out[t, h*v + e] = round(o * round(sigmoid(gate[t, h*v + e])))   with a gate (the layer's output gate)
//                   = o                                              without one
// exactly the rounding points of mla_w_uv without a gate followed by sigmoid_gate (the standard op pair):
// the CPU reference equals that pair bit for bit in both precisions. Under DCP the gate is applied after
// the reduce-scatter, so the layer's W_UV and gate are one launch (the combine fused with W_UV and the
// gate, as in the decode op; the collective itself cannot join them).
// Reads the o_lat and gate rows and writes the out rows of the sequences only; other rows are neither read
// nor written. out must not overlap o_lat; it may be exactly the gate view (each element's gate is read
// before its out is written), no other overlap with gate.
struct MlaWUvArgs {
  core::TensorView o_lat;              // f32 [T, H, kv_lora]
  SeqBatch seqs;                       // only row_begin / num_rows are used
  const LinearWeight* kv_b = nullptr;  // [H * (nope + v), kv_lora]
  core::TensorView gate;               // activations [T, H * v] (out's dtype): gate logits (the rounded W_g x),
                                       //   or undefined (data null): no gate
  core::TensorView out;                // activations [T, H * v] (f32; bf16 on CUDA in bf16 mode)
  int num_heads = 0, qk_nope = 0, v_head_dim = 0, kv_lora = 0;
  Precision precision = Precision::bf16;
};
core::Status mla_w_uv_check(const MlaWUvArgs& a);
void mla_w_uv_reference(const MlaWUvArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
