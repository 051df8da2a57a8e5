// kernels/mla/cuda_partial_via_decode.cu: the DCP op `mla_partial_attention` (kernels/mla/mla_cp.h) on
// the tensor cores, strategy "cuda_partial_splitkv_mma" (above kernels/mla's CUDA-core
// "cuda_partial_splitkv" at 10): the fused decode op's tensor-core split_kv in its DCP form, then the
// CUDA-core strategy's own combine.
//
// Why: under DCP every rank attends all G * H heads of the group (TP8: 96, TP2: 24) over its share of the
// cache. The CUDA-core split_kv is issue-bound there (with it TP2 + DCP was slower per step than plain
// TP2, docs/perf/tp_gpu.md); the tensor-core one streams the cache at memory speed but takes <= 16 heads
// per CTA, so the heads run as ceil(G * H / 16) balanced groups (24 -> 2 x 12, 96 -> 6 x 16), a grid
// dimension: each CTA streams its split of the cache once for its group (L2 serves the other groups).
// kernels_mla_decode depends on kernels_mla, so this registration into Registry::mla_partial_attention lives
// in this module (as cuda_absorbed_via_decode.cu's for mla_absorbed).
//
// Per call (Q = num_seqs * max_rows query slots, heads = G * H, L = kv_lora, E = L + rope):
//   1. split_kv  split_kv_mma_kernel<CacheT, true>, grid (splits, Q, groups), 256 threads, 64-position
//                cp.async stages; LOCAL position j is global j * cp + rank, visible to the row at global
//                position P iff j * cp + rank <= P; a split with no visible position exits (after its
//                pdl_wait). Partials [Q][heads][splits][L] (k_scale applied), m and l [Q][heads][splits].
//   2. combine   cuda_absorbed_kernels.cuh's combine_kernel<true>, grid (Q * heads, ceil(L / 64)): o_part
//                [G][T][H][L] = sum_s w_s o_s / Z (unrounded), lse [G][T][H] = M + log Z; a row that sees
//                no local position gets o_part = 0 and lse = -inf, exactly as the CUDA-core strategy.
// Splits: mla_decode_split_len's tensor-core rule for Q * groups CTAs per split (about 264 CTAs, 2 per
// H200 SM) over max_tokens LOCAL positions: split_len a multiple of 64 (kMlaDecodeMmaStage), >= 64. Grids
// and the scratch (Q * heads * splits * (L + 2) floats, from the context's pool) come from host integers
// only, so a captured graph replays for any positions and tables.
// Numerics (bf16 mode only): scores are exact products of bf16 qc and the cache codes summed in fp32; P
// is rounded to f16 (fp8 cache) or bf16 (bf16 cache) for the P.V mma and l sums the same rounded P, as in
// the decode op (mla_decode.h, kernels/mla/mla_decode_ops_test.cpp): o_part within ~2e-3 relative.
#include <algorithm>
#include <limits>
#include <string>

#include "kernels/mla/cuda_absorbed_kernels.cuh"
#include "kernels/mla/cuda_mla_decode.cuh"
#include "kernels/mla/mla_cp.h"
#include "kernels/mla/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kMmaGroupHeads = kDecodeMaxHeads;  // heads per CTA: one mma M tile (16)

std::string str(int64_t v) { return std::to_string(v); }
int64_t slots_of(const SeqBatch& b) { return static_cast<int64_t>(b.num_seqs) * b.max_rows; }

PartialMmaPlan plan_of(const MlaPartialAttentionArgs& a) {
  PartialMmaPlan p;
  p.Q = slots_of(a.seqs);
  p.heads = static_cast<int>(a.qc.dim(0) * a.qc.dim(2));
  p.groups = (p.heads + kMmaGroupHeads - 1) / kMmaGroupHeads;
  p.group_heads = (p.heads + p.groups - 1) / p.groups;  // balanced: every group has group_heads or one less
  p.L = static_cast<int>(a.o_part.dim(3));
  p.E = static_cast<int>(a.qc.dim(3));
  const int64_t ctas_per_split = std::max<int64_t>(1, p.Q * p.groups);
  p.split_len = mla_decode_split_len(MlaDecodeSplitRule::tensor_core, ctas_per_split, a.seqs.max_tokens);
  p.splits = static_cast<int>(
      mla_decode_num_splits(MlaDecodeSplitRule::tensor_core, ctas_per_split, a.seqs.max_tokens));
  return p;
}

core::Status partial_mma_supports(const CudaOps& ops, const MlaPartialAttentionArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"qc", &a.qc}, {"pages", &a.pages}, {"o_part", &a.o_part}, {"lse", &a.lse}}); !s) return s;
  if (auto s = seq_tables_on_cuda(a.seqs); !s) return s;
  // Precision, cache dtype, kv_lora % 64 (<= 512), (kv_lora + rope) % 16 (<= 576), 16-byte rows, shared memory.
  if (auto s = partial_split_kv_mma_supports(ops, a); !s) return s;
  const auto no = [](const std::string& why) { return core::Status::fail("tensor-core partial split_kv: " + why); };
  const int64_t Q = slots_of(a.seqs), heads = a.qc.dim(0) * a.qc.dim(2);
  const int64_t groups = (heads + kMmaGroupHeads - 1) / kMmaGroupHeads;
  if (Q > kMaxGridYZ) return no("num_seqs * max_rows = " + str(Q) + " is above the CUDA grid limit " + str(kMaxGridYZ));
  if (groups > kMaxGridYZ)
    return no("G * H = " + str(heads) + " heads make " + str(groups) +
              " head groups of <= 16, above the CUDA grid limit " + str(kMaxGridYZ));
  if (Q * heads > std::numeric_limits<int32_t>::max())
    return no("num_seqs * max_rows * G * H = " + str(Q * heads) + " is above the combine's grid limit 2^31 - 1");
  // combine_kernel takes split_len as an int; split_len <= max_tokens rounded up to 64.
  if (a.seqs.max_tokens > std::numeric_limits<int32_t>::max() - kMlaDecodeMmaStage)
    return no("seqs.max_tokens = " + str(a.seqs.max_tokens) + " is above the int32 range of the split lengths");
  if (overlaps(a.o_part, a.qc) || overlaps(a.lse, a.qc) || overlaps(a.lse, a.o_part))
    return no("o_part and lse must not alias qc or each other on CUDA");
  return core::Status::ok();
}

void partial_mma_run(const CudaOps& ops, const MlaPartialAttentionArgs& a) {
  if (a.seqs.num_seqs == 0) return;
  PartialMmaPlan plan = plan_of(a);
  const size_t part_floats = static_cast<size_t>(plan.Q) * plan.heads * plan.splits * (static_cast<size_t>(plan.L) + 2);
  std::shared_ptr<void> scratch = ops.ctx->scratch(part_floats * sizeof(float));
  plan.part_o = static_cast<float*>(scratch.get());
  plan.part_m = plan.part_o + plan.Q * plan.heads * plan.splits * plan.L;
  plan.part_l = plan.part_m + plan.Q * plan.heads * plan.splits;
  launch_partial_split_kv_mma(ops, a, plan);

  // The CUDA-core strategy's combine over the same [Q][heads][splits] partials (its layout: head index
  // hh = g * H + h over every owner's heads, slot-major), writing o_part / lse by activation row.
  namespace ab = cuda_detail::absorbed;
  ab::CpLayout cp;
  cp.rows = a.qc.dim(1);
  cp.owner_heads = static_cast<int>(a.qc.dim(2));
  cp.cp_size = a.cp_size;
  cp.cp_rank = a.cp_rank;
  const size_t combine_smem = static_cast<size_t>(padded_floats(plan.splits)) * sizeof(float);
  allow_smem(ops, ab::combine_kernel<true>, combine_smem);
  ab::combine_kernel<true><<<dim3(static_cast<unsigned>(plan.Q * plan.heads), grid_for(plan.L, ab::kCombineCols)),
                             ab::kThreads, combine_smem, ops.ctx->stream()>>>(
      seq_tables(a.seqs), plan.part_o, plan.part_m, plan.part_l, plan.heads, plan.splits,
      static_cast<int>(plan.split_len), a.o_part.as<float>(), plan.L, /*round=*/false, cp, a.lse.as<float>());
  K3_CUDA_CHECK_LAUNCH("mla_partial_attention combine_kernel (tensor-core strategy)");
}

}  // namespace

void register_mla_partial_mma_cuda(MlaOps& r, const CudaOps& ops) {
  r.mla_partial_attention.add({"cuda_partial_splitkv_mma", core::Device::cuda,
                               [ops](const MlaPartialAttentionArgs& a) { return partial_mma_supports(ops, a); },
                               [ops](const MlaPartialAttentionArgs& a) { partial_mma_run(ops, a); }});
}

}  // namespace k3::kernels
