// kernels/attn_res/attn_res_fused.h: the AttnRes stream of the latency_specialized decode
// path (fastpath/), split as engines split it (spec §3.1, last note): the bank part of every Mix
// computed once per block (attn_res_bank), and a per-sublayer merge fused with the residual add
// and the RMSNorm that follows (attn_res_merge).
//
// Why: the bank changes only at write layers (l % 12 == 0), so between two bank writes the same
// bank rows feed 24 Mix operators (the FFN side of the write layer, both sides of the 11 layers
// after it, the attention side of the next write layer, which still sees the old bank) plus the
// final output Mix after the last layer. The standard path (model/model.cpp layer_forward) runs
// add -> attn_res_mix -> rmsnorm per sublayer and re-reads every bank row in each Mix.
//
// The two ops together compute, for a mix with query q, norm weight n, bank rows R_0..R_{n-1} and
// prefix P (the standard attn_res_mix over bank ++ [P], spec §3.1):
//   c        = n * q                                   fp32 (exact: product of two bf16)
//   s_j      = rho_j * sum_h R_j[h] c[h],  rho_j = 1 / sqrt(sum_h R_j[h]^2 / D + eps)
//              (fp32, both sums sequential over h, exactly the attn_res_mix reference order)
//   bank:    max_b = max_j s_j,  sum_b = sum_j e_j,  acc[h] = sum_j e_j R_j[h],  e_j = expf(s_j - max_b)
//   merge:   m = max(max_b, s_P),  B = expf(max_b - m),  E = expf(s_P - m)
//            h = round((B * acc[h] + E * P[h]) / (B * sum_b + E))
// which is the standard Mix in real arithmetic; in fp32 it differs from attn_res_mix by a few
// fp32 ulps (a merged softmax), so h and x = RMSNorm(h) equal the standard path to ~1e-6
// relative in Precision::fp32 and to within 1 bf16 ulp on a few elements in Precision::bf16.
// The prefix update P_new is bit for bit the standard add (or the plain copy on a restart), and
// the bank scores s_j are bit for bit the standard ones.
//
// CUDA design (kernels/attn_res/cuda_fused.cu), K3 TP8 shapes (hidden D = 7168, replicated on
// every rank: AttnRes is not sharded, spec §11), bf16 activations, n = 9 bank rows (the most the
// kernel is built for is kAttnResFusedMaxBankRows), M = 24 mixes, T = 1..64 rows:
//   attn_res_bank: ONE launch, grid (T, ceil(M / G)), 256 threads; CTA (t, g) runs G mixes in turn
//     (G = clamp(T * M / (2 * SMs), 1, M): 1 up to T = 11, 5 at T = 64): for each it reduces the n
//     rows of token t (sum R^2 and R.c_m, fixed order), takes the softmax stats and writes
//     acc[m, t, :]. Bank rows come from DRAM once, then from L1/L2 (L2 traffic n*T*D*2 * M/G).
//     DRAM bytes per call: read n*T*D*2 (bank) + M*D*4 (q, n bf16) + write M*T*D*4 (acc) + M*T*8:
//     T = 1: 129 KB + 688 KB + 688 KB = 1.5 MB (floor ~0.35 us at 4.3 TB/s; launch-bound);
//     T = 64: 8.3 MB + 0.7 MB + 44 MB = 53 MB (floor ~12 us), once per 12 layers (~1 us per layer).
//   attn_res_merge: ONE launch, grid (T), one CTA per row with one 16-byte vector per thread (896
//     threads at D = 7168; at most 1024, looping beyond); the row
//     (P_new, then h) lives in shared memory as f32 (D * 4 bytes): pass 1 forms P_new and its
//     score, pass 2 forms h and its sum of squares, pass 3 writes x. Bytes per row: read P_old,
//     a (2 * D * 2), acc (D * 4), stats 8; write P_new, x (and h) (2-3 * D * 2); plus the three
//     weight vectors q, n, rmsnorm weight (3 * D * 2, shared by all rows through L2):
//     T = 1: 57 KB + 43 KB + 43 KB = 143 KB; T = 64: 64 * 100 KB + 43 KB = 6.5 MB (h written).
//     At T = 1 one CTA moves all 143 KB, so one SM's bandwidth (not DRAM's) bounds it, twice per
//     layer (measurements: docs/perf/kernel-notes.md, attn_res_fused). Hence, for T <= 32:
//   attn_res_merge, cluster form (kernels/attn_res/cuda_merge_cluster.cu, "cuda_merge_cluster",
//     chosen over the one-CTA form "cuda_merge_rowwise" for T <= 32 by tuning/*.json):
//     grid (S, T), one thread block cluster of S CTAs per row (S = min(8, ceil(V / 32)) for V
//     N-vectors per row: S = 8 at D = 7168, 112 16-byte vectors per CTA, 128 threads), one
//     N-vector per thread, so the row stays in registers and all six loads of a thread (P_old, a,
//     norm, query, acc, the RMSNorm weight) are in flight at once: one DRAM round trip, ~18 KB per
//     SM at T = 1. The two row-wide sums (pass 1: sum P_new^2 and P_new.c for s_P; pass 2: sum h^2
//     for the RMSNorm) are reduced per CTA, published in the CTA's shared memory, and after a
//     cluster barrier every CTA adds all S partials in rank order (distributed shared memory):
//     identical scalars in every CTA, deterministic run to run; the same per-element arithmetic
//     and rounding as the one-CTA form, so h and x differ from it only by the sums' order, P_new
//     not at all. Up to 32 rows (S = 8: 256 CTAs of 128 threads, ~2 per SM); wider rows than
//     256 vectors per CTA (D > 16384 on the vector path, D > 2048 on the scalar one) and rows of
//     fewer than 64 vectors take the one-CTA form.
#pragma once
#include <span>

#include "core/error.h"
#include "kernels/common.h"
#include "kernels/norm/rmsnorm.h"

namespace k3::kernels {

inline constexpr int kAttnResFusedMaxBankRows = 16;  // K3 banks hold at most 8 (spec §3); 9 with a margin
inline constexpr int kAttnResFusedMaxMixes = 32;     // K3: 24 mixes share one bank (+ the final mix)

// The bank part of M mixes over the same bank rows. Nothing is rounded: acc and stats are fp32
// partial sums that attn_res_merge finishes. Reads: bank, queries, norms. Writes: acc, stats
// (every element). acc and stats must not overlap any input.
struct AttnResBankArgs {
  std::span<const core::TensorView> bank;     // n views (1 <= n <= 16), each act [T, D] (unit inner
                                              // stride, any row stride): R_0..R_{n-1} in bank order
  std::span<const core::TensorView> queries;  // M views (1 <= M <= 32), bf16/f32 [D] or [1, D]: mix m's res_proj.weight
  std::span<const core::TensorView> norms;    // M views, bf16/f32 [D]: mix m's res_norm.weight
  core::TensorView acc;                       // f32 [M, T, D] contiguous (f32 also on CUDA in bf16 mode):
                                              //   acc[m, t, h] = sum_j expf(s_{m,j} - max_{m}) R_j[t, h] (j in order)
  core::TensorView stats;  // f32 [M, T, 2] contiguous: (max_j s_{m,j}, sum_j expf(s_{m,j} - max)) per (m, t)
  float eps = 1e-5f;       // the Mix eps (rms_norm_eps)
  Precision precision = Precision::bf16;  // dtype rule only (bf16 CUDA rows need bf16); nothing is rounded
};
core::Status attn_res_bank_check(const AttnResBankArgs& a);
// Per (m, t): scores in the attn_res_mix reference order (bit for bit its s_j), max via
// std::max over j in order, sum and acc in bank order, e_0 * R_0 first.
void attn_res_bank_reference(const AttnResBankArgs& a, backends::cpu::ThreadPool* pool = nullptr);

// One sublayer tail: replaces add + attn_res_mix + rmsnorm of the standard path.
//   P_new = P_old                           when sublayer_out is absent (layer 0's attention side,
//                                           the final mix: nothing to add)
//         = a                               when restart (FFN side of a bank write layer; a copy)
//         = round(P_old + a)                otherwise (exactly the standard add)
//   s_P   = rho(P_new) * sum_h P_new[h] c[h]       (c = norm * query; the attn_res_mix order)
//   h     = P_new                           when the bank is absent (no rounding: h IS the prefix)
//         = round((B acc + E P_new) / (B sum_b + E)) otherwise (see the top of this file)
//   x     = RMSNorm(h; rmsnorm_weight, rmsnorm_eps, rmsnorm_style), rounded exactly as
//           rmsnorm_reference rounds (x_hat rounded first in the moonshot style).
// "Absent" means a default TensorView{} (data == nullptr). Reads: prefix, sublayer_out,
// bank_acc, bank_stats, query, norm, rmsnorm_weight. Writes: prefix_out (if present), mixed_out
// (if present), normed_out: every element of each.
// Aliasing: prefix_out may be the very same view as prefix (in-place prefix update) or as
// sublayer_out; no other overlap between outputs and inputs, or between outputs, is allowed.
struct AttnResMergeArgs {
  core::TensorView prefix;          // act [T, D]: P_old, the running prefix before this sublayer's add
  core::TensorView sublayer_out;    // act [T, D]: a (attention or FFN output), or absent
  bool restart = false;             // P_new = a (needs sublayer_out)
  core::TensorView bank_acc;        // f32 [T, D]: this mix's acc[m] from attn_res_bank, or absent (empty bank)
  core::TensorView bank_stats;      // f32 [T, 2]: this mix's stats[m]; absent exactly when bank_acc is
  core::TensorView query;           // bf16/f32 [D] or [1, D]: this mix's res_proj.weight
  core::TensorView norm;            // bf16/f32 [D]: this mix's res_norm.weight
  core::TensorView rmsnorm_weight;  // bf16/f32 [D]: the sublayer input norm that follows
                                    //   (input_layernorm / post_attention_layernorm / the final norm)
  core::TensorView prefix_out;      // act [T, D]: P_new; absent allowed only when sublayer_out is absent
  core::TensorView mixed_out;       // act [T, D]: h (traces, drafter taps), or absent to skip it
  core::TensorView normed_out;      // act [T, D]: x = RMSNorm(h), the sublayer input
  float mix_eps = 1e-5f;            // the Mix eps (rms_norm_eps)
  float rmsnorm_eps = 1e-5f;        // the RMSNorm eps (rms_norm_eps)
  RmsNormStyle rmsnorm_style = RmsNormStyle::moonshot;
  Precision precision = Precision::bf16;
};
core::Status attn_res_merge_check(const AttnResMergeArgs& a);
void attn_res_merge_reference(const AttnResMergeArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
