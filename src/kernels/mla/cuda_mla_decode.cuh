// kernels/mla/cuda_mla_decode.cuh: internal to kernels/mla_decode on CUDA: what the two split_kv
// strategies of the fused MLA decode op share. Both run the same three launches (mla_decode.h):
// q_absorb, split_kv, combine_w_uv_gate; only split_kv differs:
//   cuda_mla_decode.cu      "cuda_decode_splitkv"     : fp32 CUDA-core split_kv, any dims, any
//                                                       activation dtype; the exact-ish mode for f32 activations
//   cuda_mla_decode_mma.cu  "cuda_decode_splitkv_mma" : tensor-core (mma.sync m16n8k16) split_kv
//                                                       for bf16 activations over fp8 / bf16 caches
//   cuda_mla_decode_stages.cu: q_absorb, combine_w_uv_gate, the shared checks and the launch sequence.
// The tensor-core split_kv also serves mla_partial_attention under decode context parallelism
// (kernels/mla/mla_cp.h) in its DCP form: cuda_partial_via_decode.cu, "cuda_partial_splitkv_mma".
#pragma once
#include "kernels/mla/cuda_mla_common.cuh"
#include "kernels/mla/mla_decode.h"

namespace k3::kernels {
struct MlaPartialAttentionArgs;  // kernels/mla/mla_cp.h
}

namespace k3::kernels::cuda_detail {

// Query slot qi = s * max_rows + i of sequence s, row i; false for a slack slot (i >= num_rows[s]).
__device__ __forceinline__ bool slot_used(const SeqTables& sq, int64_t qi, int& seq, int& i_row) {
  seq = static_cast<int>(qi / sq.max_rows);
  i_row = static_cast<int>(qi % sq.max_rows);
  return i_row < sq.num_rows[seq];
}

constexpr int kDecodeMaxHeads = 16;  // all heads of a query slot share one split_kv CTA (MQA entry)
constexpr int kDecodeMaxNope = 256;  // q_absorb keeps a quarter of a W_UK column (<= 64 values) per thread

// One call's split sizing and workspace layout (f32, device). Q = num_seqs * max_rows query slots.
struct DecodePlan {
  int64_t Q = 0;
  int H = 0, nope = 0, rope = 0, vd = 0, L = 0, E = 0;  // E = L + rope: a cache entry's width
  int64_t split_len = 0;
  int splits = 0;
  float* qc = nullptr;      // [Q][H][E]: [round(W_UK^T q_nope); q_pe] (values of the activation dtype)
  float* part_o = nullptr;  // [Q][H][splits][L]: unnormalised partial o of each split (k_scale applied)
  float* part_m = nullptr;  // [Q][H][splits]: running max of the scaled scores
  float* part_l = nullptr;  // [Q][H][splits]: sum of e^{s - m}
};

using SplitKvLaunch = void (*)(const CudaOps& ops, const MlaDecodeArgs& a, const DecodePlan& plan);

// Checks shared by both strategies (devices, compute capability 9.0, dtypes, aliasing, grid and head limits).
core::Status decode_supports_common(const CudaOps& ops, const MlaDecodeArgs& a);
// q_absorb, then split_kv(plan), then combine_w_uv_gate, all on the context's stream.
void decode_run(const CudaOps& ops, const MlaDecodeArgs& a, SplitKvLaunch split_kv);

// The two split_kv kernels: what each refuses beyond decode_supports_common, and its launch.
core::Status split_kv_cuda_core_supports(const CudaOps& ops, const MlaDecodeArgs& a);
void launch_split_kv_cuda_core(const CudaOps& ops, const MlaDecodeArgs& a, const DecodePlan& plan);
core::Status split_kv_mma_supports(const CudaOps& ops, const MlaDecodeArgs& a);
void launch_split_kv_mma(const CudaOps& ops, const MlaDecodeArgs& a, const DecodePlan& plan);

// ---- the DCP form of the tensor-core split_kv (mla_partial_attention, kernels/mla/mla_cp.h)

// One mla_partial_attention call's split sizing and partials, from host integers only (graph-replayable).
// Q = num_seqs * max_rows query slots; heads = G * H (every owner's heads: the cache is one MQA entry)
// in `groups` balanced groups of group_heads <= 16 (24 -> 2 x 12, 17 -> 9 + 8, 96 -> 6 x 16).
struct PartialMmaPlan {
  int64_t Q = 0;
  int heads = 0, groups = 0, group_heads = 0;
  int L = 0, E = 0;  // kv_lora, kv_lora + rope
  int splits = 0;
  int64_t split_len = 0;    // LOCAL positions per split: a multiple of kMlaDecodeMmaStage (64)
  float* part_o = nullptr;  // [Q][heads][splits][L]: unnormalised partial o (k_scale applied)
  float* part_m = nullptr;  // [Q][heads][splits]: running max of the scaled scores
  float* part_l = nullptr;  // [Q][heads][splits]: sum of e^{s - m} (the rounded P the P.V applied)
};
// What the tensor-core kernel refuses in a (checked) mla_partial_attention call: precision fp32, caches
// other than fp8 / bf16, kv_lora / rope / row alignment / shared memory as split_kv_mma_supports.
core::Status partial_split_kv_mma_supports(const CudaOps& ops, const MlaPartialAttentionArgs& a);
// split_kv_mma_kernel<CacheT, true> over grid (splits, Q, groups) into plan's partials (PDL launch).
void launch_partial_split_kv_mma(const CudaOps& ops, const MlaPartialAttentionArgs& a, const PartialMmaPlan& plan);

}  // namespace k3::kernels::cuda_detail
