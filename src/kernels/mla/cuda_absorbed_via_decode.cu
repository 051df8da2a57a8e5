// kernels/mla/cuda_absorbed_via_decode.cu: the standard op `mla_absorbed` (kernels/mla/mla.h) on the
// tensor cores, strategy "cuda_absorbed_splitkv_mma" (above kernels/mla's CUDA-core
// "cuda_split_kv" at 10): it runs the fused op mla_decode's "cuda_decode_splitkv_mma" launches without a gate.
//
// Why here: mla_decode WITHOUT a gate computes exactly mla_absorbed's function with the same rounding points
// (mla_decode.h: out = o = round(W_UV round(sum_j softmax(s)_j c_n,j))), and its tensor-core split_kv streams
// the cache once per query slot for all heads at memory speed, where kernels/mla's CUDA-core split_kv is
// issue-bound at long contexts (8 sequences x 50K positions, TP8: docs/perf/serving_h200.md). So the
// standard decode path gets the same kernels as the latency_specialized one. kernels_mla_decode depends on
// kernels_mla, so this registration into Registry::mla_absorbed lives in this module; nothing is
// duplicated: the three launches are cuda_mla_decode_stages.cu's decode_run with cuda_mla_decode_mma.cu's
// launch_split_kv_mma.
//
// Per call (Q = num_seqs * max_rows query slots, H heads, L = kv_lora, E = L + rope; TP8: H 12, L 512, E 576):
//   1. q_absorb  Qc [Q][H][E] = [round(W_UK^T q_nope); q_pe]
//   2. split_kv  grid (splits, Q), tensor cores, 64-position cp.async stages; partials [Q][H][splits][L + 2]
//   3. combine_w_uv_gate  o_lat = round(sum_s w_s o_s / sum_s w_s l_s) per (slot, head) in a cluster's shared
//                memory, then out [T, H * v] = round(W_UV o_lat)  (no gate)
// The workspace (mla_decode_workspace_floats: Q*H*E + Q*H*splits*(L + 2) floats; TP8 batch 1 at 8K: 128
// splits, 3.2 MB, L2-resident) comes from the context's scratch pool, like cuda_split_kv's: under a CUDA-graph
// capture the pool hands the graph its own block and keeps it for the graph's lifetime
// (backends/cuda/memory_pool.h). The split count comes from host integers only (mla_decode_split_len: Q and
// max_tokens, the tensor-core rule for bf16 q), so the grids and the workspace size are the same for every
// replay whatever the device tables hold.
#include <string>

#include "kernels/mla/cuda_mla_decode.cuh"
#include "kernels/mla/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

// The fused op's arguments for the same call: no gate (out = o), no caller workspace (scratch from the
// context), the automatic split length (the tensor-core rule for bf16 activations).
MlaDecodeArgs decode_args_of(const MlaAttentionArgs& a) {
  MlaDecodeArgs d;
  d.q = a.q;
  d.pages = a.pages;
  d.seqs = a.seqs;
  d.k_scale = a.k_scale;
  d.kv_b = a.kv_b;
  d.out = a.out;
  d.num_heads = a.num_heads;
  d.qk_nope = a.qk_nope;
  d.qk_rope = a.qk_rope;
  d.v_head_dim = a.v_head_dim;
  d.kv_lora = a.kv_lora;
  d.scale = a.scale;
  d.precision = a.precision;
  return d;
}

// Exactly what mla_decode accepts for "cuda_decode_splitkv_mma" (its check, then that strategy's
// supports()); a refusal leaves the call to cuda_split_kv.
core::Status absorbed_mma_supports(const CudaOps& ops, const MlaAttentionArgs& a) {
  const MlaDecodeArgs d = decode_args_of(a);
  // Devices, dtypes, out vs q, grid and head limits (mla_supports among them: the GPU itself first).
  if (auto s = decode_supports_common(ops, d); !s) return s;
  // The tensor-core split_kv would refuse f32 q too, but its reason names mla_decode's fallback.
  if (d.q.dtype != core::DType::bf16)
    return core::Status::fail("tensor-core split_kv: needs bf16 activations (Precision::bf16), got " +
                              std::string(core::dtype_name(d.q.dtype)) + " q (f32 activations run on cuda_split_kv)");
  // Cache dtype (fp8 / bf16), heads <= 16, kv_lora % 64 == 0 (<= 512), (kv_lora + rope) % 16 == 0 (<= 576),
  // 16-byte cache rows, shared memory.
  if (auto s = split_kv_mma_supports(ops, d); !s) return s;
  // What mla_decode's check adds to mla_attention_check for a call without gate or workspace: out must
  // not overlap pages (the fused kernels read the cache while combine_w_uv_gate writes out).
  return mla_decode_check(d);
}

}  // namespace

void register_mla_absorbed_mma_cuda(MlaOps& r, const CudaOps& ops) {
  r.mla_absorbed.add({"cuda_absorbed_splitkv_mma", core::Device::cuda,
                      [ops](const MlaAttentionArgs& a) { return absorbed_mma_supports(ops, a); },
                      [ops](const MlaAttentionArgs& a) { decode_run(ops, decode_args_of(a), launch_split_kv_mma); }});
}

}  // namespace k3::kernels
