// kernels/mla/cuda_absorbed.cu: CUDA MLA attention in the absorbed (decode) form (spec §6.2) for every
// sequence of the batch in one launch per kernel, with several query rows per sequence (speculative
// verify: row i at position position[s] + i), the cache read from the pages through the block tables.
// Queries are numbered qi = s * max_rows + i (a row slot of the scratch buffers; slots with
// i >= num_rows[s] exit at once):
//   1. q_absorb: q_lat = round(W_UK[h]^T q_nope) [kv_lora], beside q_pe: Qc[qi][h] = [q_lat; q_pe]
//   2. split_kv: the cache is one shared 576-wide key/value head (MQA), so a block takes a range
//      of positions (a split) for a group of heads, stages each tile of cache rows in shared memory
//      once for all of them: s = scale * Qc . [c_n; k_pe], running max/sum over tiles, partial
//      o = sum e^{s-m} c_n. Splits past the query's last position exit at once.
//   3. combine: o_lat = round(sum over the query's non-empty splits, rescaled, / Z)
//   4. w_uv: o = round(W_UV[h] o_lat), one weight row per warp segment (the row-dot kernel's form)
// Grids and scratch depend only on num_seqs, max_rows, max_tokens and H (graph-replayable): splits
// are sized from max_tokens so that about two blocks per multiprocessor run. The kernels live in
// cuda_absorbed_kernels.cuh, shared with the decode-context-parallel ops (cuda_mla_cp.cu).
#include <algorithm>

#include "kernels/mla/cuda_absorbed_kernels.cuh"
#include "kernels/mla/ops.h"

namespace k3::kernels {

using namespace cuda_detail;
using namespace cuda_detail::absorbed;

namespace {

void absorbed_run(const CudaOps& ops, const MlaAttentionArgs& a) {
  const SeqTables sq = seq_tables(a.seqs);
  if (sq.num_seqs == 0) return;
  // Query slots: every (sequence, row < max_rows); slots past a sequence's rows exit at once.
  const int64_t Q = static_cast<int64_t>(sq.num_seqs) * sq.max_rows, S = sq.max_tokens;
  const int H = a.num_heads, nope = a.qk_nope, rope = a.qk_rope, vd = a.v_head_dim, L = a.kv_lora;
  const cudaStream_t stream = ops.ctx->stream();
  const bool round = a.precision == Precision::bf16;
  const SplitPlan plan = split_plan(ops.ctx->info().sm_count, Q, H, S);
  const int splits = plan.splits, split_len = plan.split_len;

  const size_t qc_floats = static_cast<size_t>(Q * H * (L + rope));
  const size_t part_floats = static_cast<size_t>(Q * H * splits) * (static_cast<size_t>(L) + 2);
  const size_t lat_floats = static_cast<size_t>(Q * H * L);
  std::shared_ptr<void> scratch = ops.ctx->scratch((qc_floats + part_floats + lat_floats) * sizeof(float));
  SplitParams p;
  float* qc = static_cast<float*>(scratch.get());
  p.sq = sq;
  p.pg = pages_ref(a.pages);
  p.qc = qc;
  p.part_o = qc + qc_floats;
  p.part_m = p.part_o + Q * H * splits * L;
  p.part_l = p.part_m + Q * H * splits;
  float* o_lat = p.part_l + Q * H * splits;
  p.k_scale = a.k_scale, p.scale = a.scale;
  p.H = H, p.L = L, p.rope = rope;
  p.group_heads = plan.group_heads, p.splits = splits, p.split_len = split_len;
  p.vec_copy = split_vec_copy(a.pages, p.pg, L + rope);

  if (weight_format(*a.kv_b) == WFmt::mxfp4) return;  // unreachable: mla_attention_check takes dense kv_b only
  launch_q_absorb<false>(ops, sq, Q, a.q, *a.kv_b, qc, H, nope, rope, vd, L, round, stream);
  with_cache(a.pages, [&](const auto* pages) {
    using CacheT = std::remove_cv_t<std::remove_pointer_t<decltype(pages)>>;
    const size_t smem = split_smem_bytes<CacheT>(L + rope, plan.group_heads);
    allow_smem(ops, split_kv_kernel<CacheT, false>, smem);
    split_kv_kernel<CacheT, false>
        <<<dim3(splits, static_cast<unsigned>(Q), plan.groups), kThreads, smem, stream>>>(p, pages);
    K3_CUDA_CHECK_LAUNCH("split_kv_kernel");
  });
  const size_t combine_smem = static_cast<size_t>(padded_floats(splits)) * sizeof(float);
  allow_smem(ops, combine_kernel<false>, combine_smem);
  combine_kernel<false>
      <<<dim3(static_cast<unsigned>(Q * H), grid_for(L, kCombineCols)), kThreads, combine_smem, stream>>>(
          sq, p.part_o, p.part_m, p.part_l, H, splits, split_len, o_lat, L, round, CpLayout{}, nullptr);
  K3_CUDA_CHECK_LAUNCH("combine_kernel");
  launch_w_uv(sq, Q, *a.kv_b, o_lat, a.out, H, nope, vd, L, round, stream);
}

}  // namespace

void register_mla_absorbed_cuda(MlaOps& r, const CudaOps& ops) {
  r.mla_absorbed.add({"cuda_split_kv", core::Device::cuda,
                      [ops](const MlaAttentionArgs& a) {
                        if (auto s = mla_supports(ops, a); !s) return s;
                        const int64_t slots = static_cast<int64_t>(a.seqs.num_seqs) * a.seqs.max_rows;
                        if (slots > kMaxGridYZ)
                          return core::Status::fail("num_seqs * max_rows = " + std::to_string(slots) +
                                                    " is above the CUDA grid limit " + std::to_string(kMaxGridYZ));
                        if (a.kv_lora > kMlaMaxLatent)
                          return core::Status::fail("kv_lora " + std::to_string(a.kv_lora) +
                                                    " is above the CUDA limit " + std::to_string(kMlaMaxLatent));
                        const int E = a.kv_lora + a.qk_rope, G = std::min(a.num_heads, kMaxGroupHeads);
                        const size_t smem = split_smem_bytes_for(a.pages.dtype, E, G);
                        if (smem > ops.ctx->smem_optin())
                          return core::Status::fail("the cache tile needs " + std::to_string(smem) +
                                                    " bytes of shared memory, the device allows " +
                                                    std::to_string(ops.ctx->smem_optin()));
                        return core::Status::ok();
                      },
                      [ops](const MlaAttentionArgs& a) { absorbed_run(ops, a); }});
}

}  // namespace k3::kernels
