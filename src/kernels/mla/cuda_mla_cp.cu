// kernels/mla/cuda_mla_cp.cu: CUDA implementations of the four MLA steps under decode context
// parallelism (kernels/mla/mla_cp.h), one launch (or two) per op for every sequence of the batch:
//   mla_q_absorb           "cuda_q_absorb"         the absorbed form's q_absorb_kernel, written by row
//   mla_partial_attention  "cuda_partial_splitkv"  its split_kv_kernel + combine_kernel over LOCAL
//                                                  positions (j * cp + rank <= P), unrounded o_part
//                                                  normalised by the rank-local sum, lse = m + log Z
//   mla_lse_rescale        "cuda_lse_rescale"      o_part *= e^{lse_mine - M} / sum_r e^{lse_r - M}
//   mla_w_uv               "cuda_w_uv_rowdot"      round(o_lat) into slot order, then its w_uv_kernel
// The kernels of steps 1, 2 and 4 are cuda_absorbed_kernels.cuh's, so with cp = 1 the four ops give
// mla_absorbed's CUDA numbers bit for bit (the rescale weight is e^0 / e^0 = 1 exactly).
// mla_partial_attention also has a tensor-core strategy, "cuda_partial_splitkv_mma" (priority 20, bf16 mode at
// the dims it names): kernels/mla_decode/cuda_partial_via_decode.cu (it needs kernels_mla_decode, which depends
// on this module); it ends with this strategy's combine_kernel<true>, so the two agree on every layout.
// Query slots qi = s * max_rows + i as there; grids and scratch depend only on num_seqs, max_rows,
// max_tokens, H and G (graph-replayable), never on the device tables' values.
#include <algorithm>
#include <string>

#include "kernels/mla/cuda_absorbed_kernels.cuh"
#include "kernels/mla/mla_cp.h"

namespace k3::kernels {

using namespace cuda_detail;
using namespace cuda_detail::absorbed;

namespace {

constexpr int kRowThreads = 128;  // lse_rescale / round_gather: threads over one [L] row

// o_part[g][t][h][:] *= w for the rows of the batch. Grid (Q slots, G * H): a block owns one
// (slot, owner g, head h) row of L values; each thread reads the cp lse values itself (a handful of
// cached loads, so no shared memory or barrier is needed) and scales its columns. Rows of no
// sequence are never touched.
//   M = max_r lse_all[r][g][t][h], w = e^{lse_all[rank] - M} / sum_r e^{lse_all[r] - M} (r order)
// Every rank -inf (no rank saw a position; cannot happen for valid tables) gives w = 0.
__global__ void __launch_bounds__(kRowThreads) lse_rescale_kernel(SeqTables sq, float* o_part, const float* lse_all,
                                                                  int64_t T, int G, int H, int L, int cp, int rank) {
  const int64_t qi = blockIdx.x;
  const int seq = static_cast<int>(qi / sq.max_rows), i_row = static_cast<int>(qi % sq.max_rows);
  if (i_row >= sq.num_rows[seq]) return;  // an unused row slot
  const int64_t t = static_cast<int64_t>(sq.row_begin[seq]) + i_row;
  const int g = blockIdx.y / H, h = blockIdx.y % H;
  const int64_t at = (static_cast<int64_t>(g) * T + t) * H + h;  // [G, T, H] index
  const int64_t per_rank = static_cast<int64_t>(G) * T * H;     // lse_all[r] is [G, T, H]
  float m = lse_all[at];
  for (int r = 1; r < cp; ++r) m = fmaxf(m, lse_all[r * per_rank + at]);
  float w = 0.0f;
  if (isfinite(m)) {
    float sum = 0.0f;
    for (int r = 0; r < cp; ++r) sum += expf(lse_all[r * per_rank + at] - m);
    w = expf(lse_all[rank * per_rank + at] - m) / sum;
  }
  float* o = o_part + at * L;
  for (int i = threadIdx.x; i < L; i += blockDim.x) o[i] *= w;
}

// o_slot[qi][h][:] = round(o_lat[t][h][:]) (round: bf16 mode) for the rows of the batch: the input
// w_uv_kernel expects (slot order, already rounded as the absorbed combine leaves it). Grid (Q, H).
__global__ void __launch_bounds__(kRowThreads) round_gather_kernel(SeqTables sq, const float* o_lat, float* o_slot,
                                                                   int H, int L, bool round) {
  const int64_t qi = blockIdx.x;
  const int seq = static_cast<int>(qi / sq.max_rows), i_row = static_cast<int>(qi % sq.max_rows);
  if (i_row >= sq.num_rows[seq]) return;  // an unused row slot (w_uv_kernel skips it too)
  const int64_t t = static_cast<int64_t>(sq.row_begin[seq]) + i_row;
  const float* src = o_lat + (t * H + blockIdx.y) * static_cast<int64_t>(L);
  float* dst = o_slot + (qi * H + blockIdx.y) * static_cast<int64_t>(L);
  for (int i = threadIdx.x; i < L; i += blockDim.x) dst[i] = round_if(src[i], round);
}

// ---------------------------------------------------------------- runs

int64_t slots_of(const SeqBatch& b) { return static_cast<int64_t>(b.num_seqs) * b.max_rows; }

void q_absorb_run(const CudaOps& ops, const MlaQAbsorbArgs& a) {
  const SeqTables sq = seq_tables(a.seqs);
  if (sq.num_seqs == 0) return;
  launch_q_absorb<true>(sq, slots_of(a.seqs), a.q, *a.kv_b, a.qc.as<float>(), a.num_heads, a.qk_nope, a.qk_rope,
                        a.v_head_dim, a.kv_lora, a.precision == Precision::bf16, ops.ctx->stream());
}

// split_kv_kernel<kCp> over every (slot, head of every owner) with LOCAL positions, then
// combine_kernel<kCp> into o_part / lse by row. Scratch: the splits' o [Q][G*H][splits][L], m, l.
void partial_attention_run(const CudaOps& ops, const MlaPartialAttentionArgs& a) {
  const SeqTables sq = seq_tables(a.seqs);
  if (sq.num_seqs == 0) return;
  const int64_t Q = slots_of(a.seqs), T = a.qc.dim(1);
  const int G = static_cast<int>(a.qc.dim(0)), H = static_cast<int>(a.qc.dim(2));
  const int E = static_cast<int>(a.qc.dim(3)), L = static_cast<int>(a.o_part.dim(3));
  const int heads = G * H;  // every owner's heads see the same local cache (MQA)
  const cudaStream_t stream = ops.ctx->stream();
  const SplitPlan plan = split_plan(ops.ctx->info().sm_count, Q, heads, sq.max_tokens);

  const size_t part_floats = static_cast<size_t>(Q * heads * plan.splits) * (static_cast<size_t>(L) + 2);
  std::shared_ptr<void> scratch = ops.ctx->scratch(part_floats * sizeof(float));
  SplitParams p;
  p.sq = sq;
  p.pg = pages_ref(a.pages);
  p.qc = a.qc.as<const float>();
  p.part_o = static_cast<float*>(scratch.get());
  p.part_m = p.part_o + Q * heads * plan.splits * L;
  p.part_l = p.part_m + Q * heads * plan.splits;
  p.k_scale = a.k_scale, p.scale = a.scale;
  p.H = heads, p.L = L, p.rope = E - L;
  p.group_heads = plan.group_heads, p.splits = plan.splits, p.split_len = plan.split_len;
  p.vec_copy = split_vec_copy(a.pages, p.pg, E);
  p.cp.rows = T, p.cp.owner_heads = H, p.cp.cp_size = a.cp_size, p.cp.cp_rank = a.cp_rank;

  with_cache(a.pages, [&](const auto* pages) {
    using CacheT = std::remove_cv_t<std::remove_pointer_t<decltype(pages)>>;
    const size_t smem = split_smem_bytes<CacheT>(E, plan.group_heads);
    allow_smem(split_kv_kernel<CacheT, true>, smem);
    split_kv_kernel<CacheT, true><<<dim3(plan.splits, static_cast<unsigned>(Q), plan.groups), kThreads, smem,
                                     stream>>>(p, pages);
    K3_CUDA_CHECK_LAUNCH("mla_partial_attention split_kv_kernel");
  });
  const size_t combine_smem = static_cast<size_t>(padded_floats(plan.splits)) * sizeof(float);
  allow_smem(combine_kernel<true>, combine_smem);
  combine_kernel<true><<<dim3(static_cast<unsigned>(Q * heads), grid_for(L, kCombineCols)), kThreads, combine_smem,
                         stream>>>(sq, p.part_o, p.part_m, p.part_l, heads, plan.splits, plan.split_len,
                                   a.o_part.as<float>(), L, /*round=*/false, p.cp, a.lse.as<float>());
  K3_CUDA_CHECK_LAUNCH("mla_partial_attention combine_kernel");
}

void lse_rescale_run(const CudaOps& ops, const MlaLseRescaleArgs& a) {
  const SeqTables sq = seq_tables(a.seqs);
  if (sq.num_seqs == 0) return;
  const int64_t T = a.o_part.dim(1);
  const int G = static_cast<int>(a.o_part.dim(0)), H = static_cast<int>(a.o_part.dim(2));
  const int L = static_cast<int>(a.o_part.dim(3)), cp = static_cast<int>(a.lse_all.dim(0));
  lse_rescale_kernel<<<dim3(static_cast<unsigned>(slots_of(a.seqs)), G * H), kRowThreads, 0, ops.ctx->stream()>>>(
      sq, a.o_part.as<float>(), a.lse_all.as<const float>(), T, G, H, L, cp, a.cp_rank);
  K3_CUDA_CHECK_LAUNCH("lse_rescale_kernel");
}

// round(o_lat) into a slot-ordered scratch [Q][H][L], then the absorbed form's W_UV step.
void w_uv_run(const CudaOps& ops, const MlaWUvArgs& a) {
  const SeqTables sq = seq_tables(a.seqs);
  if (sq.num_seqs == 0) return;
  const int64_t Q = slots_of(a.seqs);
  const int H = a.num_heads, L = a.kv_lora;
  const cudaStream_t stream = ops.ctx->stream();
  const bool round = a.precision == Precision::bf16;
  std::shared_ptr<void> scratch = ops.ctx->scratch(static_cast<size_t>(Q * H * L) * sizeof(float));
  float* o_slot = static_cast<float*>(scratch.get());
  round_gather_kernel<<<dim3(static_cast<unsigned>(Q), H), kRowThreads, 0, stream>>>(sq, a.o_lat.as<const float>(),
                                                                                    o_slot, H, L, round);
  K3_CUDA_CHECK_LAUNCH("mla_w_uv round_gather_kernel");
  launch_w_uv(sq, Q, *a.kv_b, o_slot, a.out, H, a.qk_nope, a.v_head_dim, L, round, stream);
}

// ---------------------------------------------------------------- supports

std::string str(int64_t v) { return std::to_string(v); }

core::Status seq_rows_on_cuda(const SeqBatch& b) {
  if (b.num_seqs == 0) return core::Status::ok();
  return on_cuda({{"seqs.row_begin", &b.row_begin}, {"seqs.num_rows", &b.num_rows}});
}
// Launch-grid limits: `what` = value must stay within gridDim.y / z.
core::Status grid_yz(const char* what, int64_t value) {
  if (value > kMaxGridYZ)
    return core::Status::fail(std::string(what) + " = " + str(value) + " is above the CUDA grid limit " +
                              str(kMaxGridYZ));
  return core::Status::ok();
}
core::Status dense_kv_b(const LinearWeight* kv_b) {
  if (auto s = weight_on_cuda(*kv_b, "kv_b"); !s) return s;
  if (kv_b->is_mxfp4()) return core::Status::fail("kv_b in MXFP4 is not supported (dense bf16 / f32 only)");
  return core::Status::ok();
}

core::Status q_absorb_supports(const CudaOps& ops, const MlaQAbsorbArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"q", &a.q}, {"qc", &a.qc}}); !s) return s;
  if (auto s = seq_rows_on_cuda(a.seqs); !s) return s;
  if (auto s = dense_kv_b(a.kv_b); !s) return s;
  if (auto s = same_act({{"q", &a.q}}, a.precision); !s) return s;
  if (auto s = grid_yz("num_heads", a.num_heads); !s) return s;
  if (overlaps(a.qc, a.q)) return core::Status::fail("qc must not alias q on CUDA");
  return core::Status::ok();
}

core::Status partial_attention_supports(const CudaOps& ops, const MlaPartialAttentionArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"qc", &a.qc}, {"pages", &a.pages}, {"o_part", &a.o_part}, {"lse", &a.lse}}); !s) return s;
  if (a.seqs.num_seqs > 0)
    if (auto s = on_cuda({{"seqs.row_begin", &a.seqs.row_begin}, {"seqs.num_rows", &a.seqs.num_rows},
                          {"seqs.position", &a.seqs.position}, {"seqs.block_table", &a.seqs.block_table}});
        !s)
      return s;
  const int64_t L = a.o_part.dim(3), E = a.qc.dim(3), heads = a.qc.dim(0) * a.qc.dim(2);
  if (L > kMlaMaxLatent)
    return core::Status::fail("kv_lora " + str(L) + " is above the CUDA limit " + str(kMlaMaxLatent));
  if (auto s = grid_yz("num_seqs * max_rows", slots_of(a.seqs)); !s) return s;
  const int64_t groups = (heads + kMaxGroupHeads - 1) / kMaxGroupHeads;
  if (auto s = grid_yz("head groups of G * H", groups); !s) return s;
  const int group_heads = static_cast<int>((heads + groups - 1) / groups);
  const size_t smem = split_smem_bytes_for(a.pages.dtype, static_cast<int>(E), group_heads);
  if (smem > ops.ctx->smem_optin())
    return core::Status::fail("the cache tile needs " + str(static_cast<int64_t>(smem)) +
                              " bytes of shared memory, the device allows " +
                              str(static_cast<int64_t>(ops.ctx->smem_optin())));
  if (overlaps(a.o_part, a.qc) || overlaps(a.lse, a.qc) || overlaps(a.lse, a.o_part))
    return core::Status::fail("o_part and lse must not alias qc or each other on CUDA");
  return core::Status::ok();
}

core::Status lse_rescale_supports(const CudaOps& ops, const MlaLseRescaleArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"o_part", &a.o_part}, {"lse_all", &a.lse_all}}); !s) return s;
  if (auto s = seq_rows_on_cuda(a.seqs); !s) return s;
  if (auto s = grid_yz("G * H", a.o_part.dim(0) * a.o_part.dim(2)); !s) return s;
  if (overlaps(a.o_part, a.lse_all)) return core::Status::fail("o_part must not alias lse_all on CUDA");
  return core::Status::ok();
}

core::Status w_uv_supports(const CudaOps& ops, const MlaWUvArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"o_lat", &a.o_lat}, {"out", &a.out}}); !s) return s;
  if (auto s = seq_rows_on_cuda(a.seqs); !s) return s;
  if (auto s = dense_kv_b(a.kv_b); !s) return s;
  if (auto s = same_act({{"out", &a.out}}, a.precision); !s) return s;
  if (auto s = grid_yz("num_seqs * max_rows", slots_of(a.seqs)); !s) return s;
  if (auto s = grid_yz("num_heads", a.num_heads); !s) return s;
  if (overlaps(a.out, a.o_lat)) return core::Status::fail("out must not alias o_lat on CUDA");
  return core::Status::ok();
}

}  // namespace

void register_mla_cp_cuda(Registry& r, const CudaOps& ops) {
  r.mla_q_absorb.add({"cuda_q_absorb", core::Device::cuda, 10,
                      [ops](const MlaQAbsorbArgs& a) { return q_absorb_supports(ops, a); },
                      [ops](const MlaQAbsorbArgs& a) { q_absorb_run(ops, a); }});
  r.mla_partial_attention.add({"cuda_partial_splitkv", core::Device::cuda, 10,
                               [ops](const MlaPartialAttentionArgs& a) { return partial_attention_supports(ops, a); },
                               [ops](const MlaPartialAttentionArgs& a) { partial_attention_run(ops, a); }});
  r.mla_lse_rescale.add({"cuda_lse_rescale", core::Device::cuda, 10,
                         [ops](const MlaLseRescaleArgs& a) { return lse_rescale_supports(ops, a); },
                         [ops](const MlaLseRescaleArgs& a) { lse_rescale_run(ops, a); }});
  r.mla_w_uv.add({"cuda_w_uv_rowdot", core::Device::cuda, 10,
                  [ops](const MlaWUvArgs& a) { return w_uv_supports(ops, a); },
                  [ops](const MlaWUvArgs& a) { w_uv_run(ops, a); }});
}

}  // namespace k3::kernels
