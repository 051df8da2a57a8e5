// kernels/mla/cuda_mla_cp.cu: CUDA implementations of the four MLA steps under decode context
// parallelism (kernels/mla/mla_cp.h), one launch per op (two for the partial attention) for every
// sequence of the batch:
//   mla_q_absorb           "cuda_q_absorb"         the absorbed form's q_absorb_kernel, written by row
//   mla_partial_attention  "cuda_partial_splitkv"  its split_kv_kernel + combine_kernel over LOCAL
//                                                  positions (j * cp + rank <= P), unrounded o_part
//                                                  normalised by the rank-local sum, lse = m + log Z
//   mla_lse_rescale        "cuda_lse_rescale"      o_part *= e^{lse_mine - M} / sum_r e^{lse_r - M}
//   mla_w_uv               "cuda_w_uv_rowdot"      ONE launch: W_UV rows in registers, a warp per row
//                                                  against the rounded o_lat of 8 rows, and the output gate
// The kernels of steps 1 and 2 are cuda_absorbed_kernels.cuh's, and step 4 sums each W_UV row in the order
// of its w_uv_kernel (segment_row_dot: lane l takes the 16-byte chunks l, l + 32, ... of the row, or the
// elements l, l + 32, ... on the scalar path, then the xor-shuffle tree), so with cp = 1 and no gate the
// four ops give mla_absorbed's CUDA numbers bit for bit (the rescale weight is e^0 / e^0 = 1 exactly).
// mla_partial_attention also has a tensor-core strategy, "cuda_partial_splitkv_mma" (bf16 mode at
// the dims it names): kernels/mla/cuda_partial_via_decode.cu (it needs kernels_mla_decode, which depends
// on this module); it ends with this strategy's combine_kernel<true>, so the two agree on every layout.
// Query slots qi = s * max_rows + i as there; grids and scratch depend only on num_seqs, max_rows,
// max_tokens, H and G (graph-replayable), never on the device tables' values.
#include <algorithm>
#include <string>

#include "kernels/mla/cuda_absorbed_kernels.cuh"
#include "kernels/mla/mla_cp.h"
#include "kernels/mla/ops.h"

namespace k3::kernels {

using namespace cuda_detail;
using namespace cuda_detail::absorbed;

namespace {

constexpr int kRowThreads = 128;  // lse_rescale: threads over one [L] row

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
  const int64_t per_rank = static_cast<int64_t>(G) * T * H;      // lse_all[r] is [G, T, H]
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

// ---------------------------------------------------------------- step 4: W_UV and the gate

constexpr int kUvThreads = 256;
constexpr int kUvRows = kUvThreads / 32;       // W_UV rows per CTA (a warp each)
constexpr int kUvSlots = 8;                    // query slots per CTA
constexpr int kUvValues = kMlaMaxLatent / 32;  // W_UV values a lane keeps in registers (16)

// Grid (H * row_blocks, ceil(Q / kUvSlots)), kUvThreads threads: warp k of CTA x owns W_UV row
// e = (x % row_blocks) * kUvRows + k of head h = x / row_blocks (none when e >= v) and runs it against the
// o_lat of the CTA's kUvSlots query slots qi = s * max_rows + i (unused slots skipped):
//   o = round(W_UV[h][e] . round(o_lat[t][h][:])), out[t][h*v + e] = round(o * round(sigmoid(gate))) or o.
// Lane l keeps columns N * (l + 32 k) .. + N - 1 of its row (k < kUvValues / N), N = 16 bytes of weight
// (8 bf16 or 4 f32 values, one 16-byte load; VEC: L % N == 0 and 16-byte aligned rows) or 1 (scalar path):
// each lane sums its columns in index order with fmaf, then warp_sum's xor tree (the order of
// segment_row_dot at width 32; fewer chunks than lanes leave lanes at 0, which adds nothing).
// PDL (kernels/cuda_common.cuh): triggers at the top, loads its W_UV row (a weight) before pdl_wait(); the
// step tables, o_lat (the reduce-scatter's output) and the gate are read, and out written, only after it.
template <class T, WFmt F, bool VEC>
__global__ void __launch_bounds__(kUvThreads)
    w_uv_gate_rows_kernel(SeqTables sq, WeightRef kv_b, const float* o_lat, const T* gate, int64_t gate_ld, T* out,
                          int64_t out_ld, int H, int nope, int vd, int L, int row_blocks, bool round) {
  constexpr int N = chunk_elems<F, VEC>();
  constexpr int kChunks = kUvValues / N;
  extern __shared__ float4 uv_sm4[];
  float* ol = reinterpret_cast<float*>(uv_sm4);  // [kUvSlots][Lp]: rounded o_lat rows, zeros past L / unused
  __shared__ int64_t t_row[kUvSlots];            // activation row of each slot of the CTA, -1 when unused
  const int Lp = padded_floats(L);               // rows stay 16-byte aligned for the float4 reads
  const int h = blockIdx.x / row_blocks, e = (blockIdx.x % row_blocks) * kUvRows + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int64_t Q = static_cast<int64_t>(sq.num_seqs) * sq.max_rows, qi0 = static_cast<int64_t>(blockIdx.y) * kUvSlots;
  pdl_launch_dependents();
  // The W_UV row first (a weight, before the wait): its loads overlap the predecessor's end.
  float w[kChunks][N];
  const int64_t r = static_cast<int64_t>(h) * (nope + vd) + nope + (e < vd ? e : 0);  // W_UV[h][e] in kv_b
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = N * (lane + 32 * k);
    if (c < L) {  // VEC: L % N == 0, so the whole chunk is inside
      load_w_chunk<F, VEC, N>(kv_b, r, c, w[k]);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) w[k][j] = 0.0f;
    }
  }
  pdl_wait();  // the tables, o_lat and the gate from here on; out is stored after it
  if (threadIdx.x < kUvSlots) {
    const int64_t qi = qi0 + threadIdx.x;
    int64_t t = -1;
    if (qi < Q) {
      const int seq = static_cast<int>(qi / sq.max_rows), i_row = static_cast<int>(qi % sq.max_rows);
      if (i_row < sq.num_rows[seq]) t = static_cast<int64_t>(sq.row_begin[seq]) + i_row;
    }
    t_row[threadIdx.x] = t;
  }
  __syncthreads();  // t_row ready
  for (int x = threadIdx.x; x < kUvSlots * Lp; x += kUvThreads) {
    const int s = x / Lp, i = x % Lp;
    ol[x] = t_row[s] >= 0 && i < L ? round_if(o_lat[(t_row[s] * H + h) * L + i], round) : 0.0f;
  }
  __syncthreads();      // ol ready
  if (e >= vd) return;  // after the last barrier: a warp with no W_UV row
  const int64_t col = static_cast<int64_t>(h) * vd + e;
  for (int s = 0; s < kUvSlots; ++s) {
    const int64_t t = t_row[s];
    if (t < 0) continue;  // warp-uniform
    const float* x = ol + s * Lp;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = N * (lane + 32 * k);
      if (c < L) {
        float xv[N];
        if constexpr (N == 8) {
          const float4 a = *reinterpret_cast<const float4*>(x + c), b = *reinterpret_cast<const float4*>(x + c + 4);
          xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
        } else if constexpr (N == 4) {
          const float4 a = *reinterpret_cast<const float4*>(x + c);
          xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
        } else {
          xv[0] = x[c];
        }
#pragma unroll
        for (int j = 0; j < N; ++j) acc = fmaf(w[k][j], xv[j], acc);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      if (gate != nullptr) {  // sigmoid_gate's expression on the value mla_w_uv stores without a gate
        const float o = round_if(acc, round);
        const float g = to_f32(gate[t * gate_ld + col]);  // read before the store: out may be the gate view
        store_act(out + t * out_ld + col, o * round_if(sigmoid_f32(g), round), round);
      } else {
        store_act(out + t * out_ld + col, acc, round);
      }
    }
  }
}

// ---------------------------------------------------------------- runs

int64_t slots_of(const SeqBatch& b) { return static_cast<int64_t>(b.num_seqs) * b.max_rows; }

void q_absorb_run(const CudaOps& ops, const MlaQAbsorbArgs& a) {
  const SeqTables sq = seq_tables(a.seqs);
  if (sq.num_seqs == 0) return;
  launch_q_absorb<true>(ops, sq, slots_of(a.seqs), a.q, *a.kv_b, a.qc.as<float>(), a.num_heads, a.qk_nope, a.qk_rope,
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
    allow_smem(ops, split_kv_kernel<CacheT, true>, smem);
    split_kv_kernel<CacheT, true>
        <<<dim3(plan.splits, static_cast<unsigned>(Q), plan.groups), kThreads, smem, stream>>>(p, pages);
    K3_CUDA_CHECK_LAUNCH("mla_partial_attention split_kv_kernel");
  });
  const size_t combine_smem = static_cast<size_t>(padded_floats(plan.splits)) * sizeof(float);
  allow_smem(ops, combine_kernel<true>, combine_smem);
  combine_kernel<true>
      <<<dim3(static_cast<unsigned>(Q * heads), grid_for(L, kCombineCols)), kThreads, combine_smem, stream>>>(
          sq, p.part_o, p.part_m, p.part_l, heads, plan.splits, plan.split_len, a.o_part.as<float>(), L,
          /*round=*/false, p.cp, a.lse.as<float>());
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

// w_uv_gate_rows_kernel over grid (H * ceil(v / 8), ceil(Q / 8)): one launch, no scratch; PDL.
void w_uv_run(const CudaOps& ops, const MlaWUvArgs& a) {
  const SeqTables sq = seq_tables(a.seqs);
  if (sq.num_seqs == 0) return;
  const int64_t Q = slots_of(a.seqs);
  const int H = a.num_heads, L = a.kv_lora, vd = a.v_head_dim;
  const cudaStream_t stream = ops.ctx->stream();
  const bool round = a.precision == Precision::bf16;
  const WeightRef w = weight_ref(*a.kv_b);
  const size_t w_elem = core::dtype_size(a.kv_b->weight.dtype());
  const int chunk = a.kv_b->weight.dtype() == core::DType::bf16 ? 8 : 4;  // weight values per 16 bytes
  const bool vec = L % chunk == 0 && aligned16(w.data) && (static_cast<size_t>(w.ld) * w_elem) % 16 == 0;
  const int row_blocks = (vd + kUvRows - 1) / kUvRows;
  const dim3 grid(static_cast<unsigned>(H * row_blocks), grid_for(Q, kUvSlots));
  const size_t smem = static_cast<size_t>(kUvSlots) * padded_floats(L) * sizeof(float);
  const bool gated = a.gate.data != nullptr;
  with_act(a.out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* gate = gated ? a.gate.as<const T>() : nullptr;
    const int64_t gate_ld = gated ? a.gate.strides[0] : 0;
    with_wfmt(weight_format(*a.kv_b), [&](auto fc) {
      constexpr WFmt FC = decltype(fc)::value;
      if constexpr (FC != WFmt::mxfp4) {  // refused by mla_w_uv_check and w_uv_supports
        const auto launch = [&](auto kernel) {
          allow_smem(ops, kernel, smem);
          launch_dependent(kernel, grid, dim3(kUvThreads), smem, stream, dim3(1, 1, 1), sq, w,
                           a.o_lat.as<const float>(), gate, gate_ld, a.out.as<T>(), a.out.strides[0], H, a.qk_nope, vd,
                           L, row_blocks, round);
          K3_CUDA_CHECK_LAUNCH("mla_w_uv w_uv_gate_rows_kernel");
        };
        if (vec) launch(w_uv_gate_rows_kernel<T, FC, true>);
        else launch(w_uv_gate_rows_kernel<T, FC, false>);
      }
    });
  });
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
  if (auto s = seq_tables_on_cuda(a.seqs); !s) return s;
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
  if (a.gate.data != nullptr) {
    if (auto s = on_cuda({{"gate", &a.gate}}); !s) return s;
    if (auto s = same_act({{"out", &a.out}, {"gate", &a.gate}}, a.precision); !s) return s;
    if (overlaps(a.out, a.gate) && a.out.data != a.gate.data)
      return core::Status::fail("out overlaps gate without being the same view");
  }
  if (a.kv_lora > kMlaMaxLatent)  // a lane keeps kMlaMaxLatent / 32 W_UV values in registers
    return core::Status::fail("kv_lora " + str(a.kv_lora) + " is above the CUDA limit " + str(kMlaMaxLatent));
  static_assert(kUvSlots == 8, "the message below names the slot chunk");
  if (auto s = grid_yz("ceil(num_seqs * max_rows / 8)", (slots_of(a.seqs) + kUvSlots - 1) / kUvSlots); !s) return s;
  if (overlaps(a.out, a.o_lat)) return core::Status::fail("out must not alias o_lat on CUDA");
  return core::Status::ok();
}

}  // namespace

void register_mla_cp_cuda(MlaOps& r, const CudaOps& ops) {
  r.mla_q_absorb.add({"cuda_q_absorb", core::Device::cuda,
                      [ops](const MlaQAbsorbArgs& a) { return q_absorb_supports(ops, a); },
                      [ops](const MlaQAbsorbArgs& a) { q_absorb_run(ops, a); }});
  r.mla_partial_attention.add({"cuda_partial_splitkv", core::Device::cuda,
                               [ops](const MlaPartialAttentionArgs& a) { return partial_attention_supports(ops, a); },
                               [ops](const MlaPartialAttentionArgs& a) { partial_attention_run(ops, a); }});
  r.mla_lse_rescale.add({"cuda_lse_rescale", core::Device::cuda,
                         [ops](const MlaLseRescaleArgs& a) { return lse_rescale_supports(ops, a); },
                         [ops](const MlaLseRescaleArgs& a) { lse_rescale_run(ops, a); }});
  r.mla_w_uv.add({"cuda_w_uv_rowdot", core::Device::cuda, [ops](const MlaWUvArgs& a) { return w_uv_supports(ops, a); },
                  [ops](const MlaWUvArgs& a) { w_uv_run(ops, a); }});
}

}  // namespace k3::kernels
