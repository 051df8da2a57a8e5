// kernels/mla/mla_decode.h: fused gated-MLA decode (fastpath/, decode_backend:
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
// The standard op mla_absorbed runs the same launches without a gate ("cuda_absorbed_splitkv_mma",
// cuda_absorbed_via_decode.cu), so both decode paths attend on the tensor cores.
// CUDA design: three launches per call (sm_90: the third is a thread-block cluster), grids from host
// integers only (num_seqs, max_rows, max_tokens, dims), so a captured CUDA graph replays for any positions,
// row counts and block tables. Query slots qi = s * max_rows + i (Q = num_seqs * max_rows); slots with
// i >= num_rows[s] do nothing. Two strategies share launches 1 and 3 (cuda_mla_decode_stages.cu) and differ
// in split_kv:
//   "cuda_decode_splitkv_mma" (cuda_mla_decode_mma.cu): bf16 activations, fp8 / bf16 cache,
//        heads <= 16, kv_lora % 64 == 0 (<= 512), (kv_lora + rope) % 16 == 0 (<= 576), 16-byte cache rows.
//   "cuda_decode_splitkv"     (cuda_mla_decode.cu): everything else the op allows, in particular
//        f32 activations (Precision::fp32, the exact-ish fp32 CUDA-core path) and odd dims.
//   1. q_absorb  grid (H, ceil(kv_lora / 32), ceil(Q / 16)), 128 threads: W_UK[h]'s [nope x 32] column tile
//                (16-byte loads) staged once, a quarter of a column per thread in registers, against the
//                q_nope of 16 slots: Qc[qi][h] = [round(W_UK[h]^T q_nope); q_pe] (workspace). 192 CTAs at
//                TP8 batch 1 (132 SMs), 768 at batch 64; W_UK read once from DRAM (1.5 MB), then from L2.
//   2. split_kv  grid (splits, Q): a CTA per (slot, split) streams the split's cache entries (576 values:
//                512 c_n + 64 k_pe; 576 B per token in fp8) ONCE for ALL local heads (MQA; <= 16 heads)
//                with an online softmax per head, and writes the unnormalised partial o [kv_lora] and
//                (max, sum) per head. Splits past the slot's last visible position exit at once.
//                mma: 256 threads, stages of 64 positions by cp.async (2 stages, 37 KB each in fp8), scores
//                and P.V on tensor cores (mma.sync m16n8k16, heads padded to M = 16; exact bf16 / f16
//                operands, fp32 sums; P rounded to f16 (fp8 cache) or bf16 (bf16 cache)). 96.6 KB of shared
//                memory (fp8): 2 CTAs per SM. CUDA-core: 32-position tiles dequantised to f32 in shared
//                memory, fp32 FMA (12 x (576 + 512) per position, issue-bound: docs/perf/fastpath.md, 9ddbe58).
//   3. combine_w_uv_gate  grid (H * 8, ceil(Q / 8)), clusters of 8 CTAs, 256 threads: the cluster of (head h,
//                chunk of 8 slots) splits kv_lora in 8 column slices (rank r: [r L/8, (r+1) L/8)) for
//                o_lat = round(sum_s w_s o_s / sum_s w_s l_s), w_s = e^{m_s - max m} over the non-empty splits
//                (min(16, splits) split groups), each slice in its CTA's shared memory; after a cluster
//                barrier every CTA copies the whole o_lat [8][L] from the others' shared memory (DSMEM) and
//                computes W_UV rows [r v/8, (r+1) v/8) (registers, 16-byte loads before the PDL wait):
//                o = round(W_UV o_lat), out = round(o * round(sigmoid(gate))) or o. A second cluster barrier
//                keeps every CTA's shared memory alive until no other CTA reads it. o_lat never reaches
//                global memory; 48 KB of shared memory per CTA at TP8 batch 1 (16 split groups).
//   Verify rows of one sequence are separate query slots (each reads the sequence's cache; L2 serves the
//   repeats).
// Splits (mla_decode_split_len; MlaDecodeArgs::split_len overrides): splits = floor(kMlaDecodeTargetCtas / Q)
// (>= 1), so Q * splits stays within one wave of about 2 CTAs per SM of an H200 (132 SMs), and
// split_len = ceil(max_tokens / splits) rounded up to the kernel's granularity: whole 64-position stages
// (>= 64) for the tensor-core rule, whole 32-position tiles (>= 32) for the CUDA-core rule. The rule follows
// the activation dtype (bf16: tensor_core, f32: cuda_core), so the workspace (mla_decode_workspace_floats)
// always matches whichever strategy runs. At 8K context: batch 1 -> 128 splits of 64 (tensor core; the
// CUDA-core rule 256 of 32), batch 8 -> 32 of 256, batch 64 -> 4 of 2048: 128-256 CTAs. The 64-position
// floor bounds the partials (written by split_kv, read by combine_w_uv_gate, L2-resident) at batch 1 to
// 128 x 12 x 514 x 4 B = 3.2 MB, against 4.7 MB of cache from DRAM (the 32-position rule wrote 6.3 MB).
// Bytes per call at TP8 (12 heads, kv_lora 512, rope 64, fp8 cache 576 B/token, 8K context, bf16 kv_b):
//   batch 1:  cache 4.72 MB + W_UK/W_UV 3.15 MB = 7.9 MB from DRAM (floor 1.8 us at 4.3 TB/s); partials 3.2 MB (L2).
//             Expected (model, to confirm with k3bench_ops_gpu --only mla): q_absorb ~2 us, split_kv ~3 us
//             (128 CTAs x 1 stage: a DRAM round trip + ~1.2K cycles of issue), combine_w_uv_gate ~3-4 us: 96
//             CTAs, each with its 16 W_UV rows (16 KB) in flight before the PDL wait, then after it a chain of
//             ~5 L2 round trips (tables; max m; sum w l; 8 float4 of part_o per thread; the gate) and two
//             cluster barriers: ~8 us in all (measured times: docs/perf/fastpath.md, docs/perf/ops_gpu.md).
//   batch 8:  cache 37.7 MB (floor 8.8 us) + W 3.15 MB; split_kv 256 CTAs x 4 stages, memory-bound: ~10 us;
//             ~15 us total (combine_w_uv_gate: 96 CTAs, each 8 slots x 32 splits x 64 columns of partials from L2).
//   batch 64: cache 302 MB + W 3.15 MB = 305 MB (floor 71 us at 4.3 TB/s); partials 4 x 64 x 12 x 514 x 4 B = 6.3 MB.
//             The tensor-core split_kv issues ~4.9K warp instructions per 64-position stage per CTA (exact
//             fp8 -> bf16 conversions dominate), ~38 us per SM of work at 62 stages per SM: under the memory
//             time, so ~75-90 us total.
//             combine_w_uv_gate: 768 CTAs (8 slot chunks), each 8 slots x 4 splits x 64 columns of partials
//             and 16 W_UV rows (L2 after the first chunk).
#pragma once
#include <cstdint>

#include "core/error.h"
#include "kernels/common.h"
#include "kernels/mla/mla.h"

namespace k3::kernels {

// Split-KV tuning (part of the contract because the workspace size depends on it).
constexpr int64_t kMlaDecodeTargetCtas = 264;  // split_kv CTAs aimed for: 2 per SM of an H200
constexpr int64_t kMlaDecodeTile = 32;         // positions per staged tile; split_len is a multiple
constexpr int64_t kMlaDecodeMmaStage = 64;     // positions per stage of the tensor-core split_kv

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
  core::TensorView gate;       // f32 (bf16 on CUDA) [T, H * v] gate logits (rounded W_g x), or undefined: no gate
  core::TensorView out;        // f32 (bf16 on CUDA) [T, H * v] = round(o * round(sigmoid(gate))) or round(o)
  core::TensorView workspace;  // CUDA: f32 device [>= mla_decode_workspace_floats(*this)], or undefined:
                               //   the CUDA op takes scratch from its context's pool. The CPU ignores it.
  int num_heads = 0, qk_nope = 0, qk_rope = 0, v_head_dim = 0, kv_lora = 0;
  float scale = 0.0f;  // (nope + rope)^-1/2
  Precision precision = Precision::bf16;
  int64_t split_len = 0;  // > 0: positions per split (a multiple of kMlaDecodeTile) instead of
                          //   mla_decode_split_len's choice (benchmarks and tests; the CPU ignores it)
};

// Which split_kv kernel an automatic split length is sized for (see "Splits" above).
enum class MlaDecodeSplitRule {
  cuda_core,    // 32-position tiles: split_len a multiple of kMlaDecodeTile
  tensor_core,  // 64-position stages: split_len a multiple of kMlaDecodeMmaStage
};
// tensor_core when q is bf16 (the CUDA op's "cuda_decode_splitkv_mma" candidates), else cuda_core.
MlaDecodeSplitRule mla_decode_split_rule(const MlaDecodeArgs& a);
// Positions per split for Q = num_seqs * max_rows query slots over max_tokens: a multiple of the rule's
// granularity (both are multiples of kMlaDecodeTile), >= it; splits = ceil(max_tokens / split_len).
int64_t mla_decode_split_len(MlaDecodeSplitRule rule, int64_t query_slots, int64_t max_tokens);
int64_t mla_decode_num_splits(MlaDecodeSplitRule rule, int64_t query_slots, int64_t max_tokens);
// The split length and count one call uses: a.split_len when set, else the choice above for
// mla_decode_split_rule(a).
int64_t mla_decode_split_len(const MlaDecodeArgs& a);
int64_t mla_decode_num_splits(const MlaDecodeArgs& a);
// f32 workspace of the CUDA op: Q*H*(kv_lora + rope) (Qc) + Q*H*splits*(kv_lora + 2) (partials).
int64_t mla_decode_workspace_floats(const MlaDecodeArgs& a);

// The MlaAttentionArgs of the same call (q, pages, seqs, kv_b, dims) writing o into `out`.
MlaAttentionArgs mla_decode_attention_args(const MlaDecodeArgs& a, core::TensorView out);

core::Status mla_decode_check(const MlaDecodeArgs& a);
// The oracle: mla_absorbed_reference into an f32 temporary, then sigmoid_gate_reference (or a copy)
// for each sequence's rows.
void mla_decode_reference(const MlaDecodeArgs& a, backends::cpu::ThreadPool* pool = nullptr);
// The CPU model of the CUDA split-KV algorithm (for tests): per split of `split_len` positions an
// unnormalised partial (m, l, o = sum e^{s-m} c_n), then the log-sum-exp combine. Same rounding points
// as mla_decode_reference; equal to it only to a tolerance (different softmax summation order).
void mla_decode_split_reference(const MlaDecodeArgs& a, int64_t split_len, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
