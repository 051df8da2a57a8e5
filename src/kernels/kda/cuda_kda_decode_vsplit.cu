// kernels/kda/cuda_kda_decode_vsplit.cu: the fused KDA decode's strategy "cuda_vsplit_cluster"
// (kda_decode.h), for small batches; shared parameters and checks: cuda_kda_decode.cuh.
#include <cooperative_groups.h>

#include "kernels/kda/cuda_kda_decode.cuh"

namespace k3::kernels::kda_decode_detail {

namespace {

// ---------------------------------------------------------------- strategy "cuda_vsplit_cluster"
// Small batches: the head's state is split along V over a cluster of NS CTAs (NS = 4 or 8; one
// cluster per (head, sequence), grid (NS * H, num_seqs)), so batch 1 at TP8 runs 96 CTAs, not 12.
// The delta rule is independent per value row v (read[v] = S[v] . k, S[v] += beta (v~[v] - read) k,
// o[v] = S[v] . q), so each CTA owns rows [j0, j0 + own) of S, j0 = rank * W, W = ceil(D / NS).
// The per-head prologue is split the same way: the CTA of rank r convolves channels [j0, j0 + own)
// of q, k and v and computes the decay logits of those channels; q~, k~ and alpha are exchanged
// through distributed shared memory (every CTA gathers the full vectors in the same order, so the
// L2 norms are bit-identical in all of them). The RMSNorm of o over the head sums each CTA's
// partial of o^2, read in rank order by every CTA. Per row: 5 __syncthreads and 2 cluster.sync.
// f_b rows of this CTA's logits: the first 8 / NS chunks of 8 (all of R = 128) are loaded into
// registers once before the row loop (weights do not change between rows), off the per-row
// dependency chain. __launch_bounds__(256, 2): two CTAs per SM (<= 128 registers, no spills), which
// split_slices counts on. (NS = 2, 32 state floats per thread, spilled at 128 registers, and at one
// CTA per SM would never beat NS = 4 under that rule: not instantiated.)
// Programmatic dependent launch (cuda_kda_decode.cu's file comment): the conv taps and the f_b rows
// (in registers) are loaded before the wait, the tables, the conv window and the state after it.
constexpr int kSplitThreads = 256;

template <class T, class S, int NS>
__global__ void __launch_bounds__(kSplitThreads, 2) kda_decode_split_kernel(DecodeParams<T, S> p) {
  namespace cg = cooperative_groups;
  constexpr int kRows = kMaxD / NS;            // value rows (and channels) per CTA at most
  constexpr int kTpr = kSplitThreads / kRows;  // threads per state row / per decay logit (2 NS)
  constexpr int kChunks = kMaxD / (4 * kTpr);  // float4 chunks of a row per thread
  constexpr int kFbCached = 8 / NS;            // f_b chunks of 8 in registers: all of R = 128
  static_assert(NS == 4 || NS == 8);
  static_assert(3 * kRows <= kSplitThreads && kTpr <= 32 && kChunks * 4 * kTpr == kMaxD);
  __shared__ float fa_s[kMaxFaWidth];
  // This CTA's slice, read by the whole cluster: conv outputs q~, k~ (rounded) and alpha.
  __shared__ float own_q_s[kRows], own_k_s[kRows], own_alpha_s[kRows];
  __shared__ float own_v_s[kRows];                            // v~ of this CTA's value rows (local only)
  __shared__ float qf_s[kMaxD], kf_s[kMaxD], alpha_s[kMaxD];  // gathered over the cluster, 0 past D
  __shared__ float q_s[kMaxD], k_s[kMaxD], o_s[kRows];
  __shared__ float norm_s[2], beta_s, osq_s;  // osq_s: sum of o^2 over this CTA's rows (cluster-read)

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());  // = blockIdx.x % NS (cluster dims (NS, 1, 1))
  const int h = blockIdx.x / NS, seq = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int D = p.D, K = p.K;
  const int W = (D + NS - 1) / NS;  // <= kRows since D <= kMaxD
  const int j0 = rank * W;
  const int own = max(0, min(W, D - j0));  // trailing ranks of a small D may own nothing
  const int64_t c0 = static_cast<int64_t>(h) * D;

  // PDL: trigger; before the wait only weights (conv taps and f_b rows into registers, a_log).
  pdl_launch_dependents();
  // Conv role: local channel ci of part cpart (global channel c0 + j0 + ci).
  const int cpart = tid / kRows, ci = tid % kRows;
  const bool conv_on = cpart < 3 && ci < own;
  const int64_t cch = conv_on ? c0 + j0 + ci : 0;
  const float* c_w = (cpart == 0 ? p.q_conv : (cpart == 1 ? p.k_conv : p.v_conv)) + cch * K;
  float cw[kMaxWidth], window[kMaxWidth];
#pragma unroll
  for (int i = 0; i < kMaxWidth; ++i) cw[i] = conv_on && i < K ? c_w[i] : 0.0f;
  // State and f_b role: local row / logit `local` (global v = j0 + local), part `sub` of it.
  const int local = tid / kTpr, sub = tid % kTpr;
  const bool row_ok = local < own;
  const int64_t v = row_ok ? c0 + j0 + local : c0;  // channel of the row / logit, in [0, P) always
  const int64_t w_row = v * p.f_b_ld;
  float wc[kFbCached][8];
#pragma unroll
  for (int c = 0; c < kFbCached; ++c) {
    const int jj = 8 * sub + 8 * kTpr * c;
    if (row_ok && p.f_b_vec && jj < p.R) {
      load_vec_n<8>(p.f_b, p.f_b_bf16, w_row + jj, wc[c]);  // R % 8 == 0: all 8 in range
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        wc[c][e] = row_ok && jj + e < p.R ? load_vec(p.f_b, p.f_b_bf16, w_row + jj + e) : 0.0f;
    }
  }
  const float a_log = p.a_log[h];
  pdl_wait();

  // The sequence (the same for every CTA of the cluster: the cluster.sync counts match).
  const int n_raw = p.num_rows[seq];
  const int n = n_raw < 0 ? 0 : (n_raw > p.max_rows ? p.max_rows : n_raw);
  const int64_t row0 = p.row_begin[seq];
  const int64_t slot = p.slot[seq];
  const T* c_in = cpart == 0 ? p.q_in : (cpart == 1 ? p.k_in : p.v_in);
  const int64_t c_ld = cpart == 0 ? p.q_ld : (cpart == 1 ? p.k_ld : p.v_ld);
  S* c_st = p.conv_state + slot * p.conv_slot_stride + (conv_on ? cpart : 0) * p.conv_part_stride + cch * (K - 1);
  float* c_out = cpart == 0 ? own_q_s : (cpart == 1 ? own_k_s : own_v_s);
#pragma unroll
  for (int i = 0; i < kMaxWidth; ++i) window[i] = conv_on && i < K - 1 ? to_f32(c_st[i]) : 0.0f;
  float* S_row = p.state + slot * p.slot_stride + v * D;
  float s[kChunks][4];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int k0 = 4 * kTpr * i + 4 * sub;
    if (row_ok && p.state_vec4 && k0 < D) {
      const float4 q4 = *reinterpret_cast<const float4*>(S_row + k0);
      s[i][0] = q4.x, s[i][1] = q4.y, s[i][2] = q4.z, s[i][3] = q4.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = (row_ok && k0 + e < D) ? S_row[k0 + e] : 0.0f;
    }
  }

  for (int r = 0; r < n; ++r) {
    const int64_t t = row0 + r;
    // 1. f_a row to shared memory; the conv of this thread's channel into the slice vectors.
    for (int j = tid; j < p.R; j += kSplitThreads) fa_s[j] = to_f32(p.f_a[t * p.f_a_ld + j]);
    if (conv_on) {
      const float xt = round_if(to_f32(c_in[t * c_ld + cch]), p.round);
#pragma unroll
      for (int i = 0; i < kMaxWidth; ++i)
        if (i == K - 1) window[i] = xt;
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxWidth; ++i)
        if (i < K) sum += cw[i] * window[i];
      c_out[ci] = round_if(sum / (1.0f + expf(-sum)), p.round);  // SiLU = x / (1 + e^-x)
#pragma unroll
      for (int i = 0; i + 1 < kMaxWidth; ++i)
        if (i + 1 < K) window[i] = window[i + 1];
    }
    __syncthreads();

    // 2. This CTA's decay logits f = round(W_fb f_a) and alpha; beta (every CTA, identically).
    float fsum = 0.0f;
    if (row_ok) {
#pragma unroll
      for (int c = 0; c < kFbCached; ++c) {
        const int jj = 8 * sub + 8 * kTpr * c;
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (jj + e < p.R) fsum += wc[c][e] * fa_s[jj + e];
      }
      for (int jj = 8 * sub + 8 * kTpr * kFbCached; jj < p.R; jj += 8 * kTpr) {  // R > 128 only
        float w8[8];
        if (p.f_b_vec) {
          load_vec_n<8>(p.f_b, p.f_b_bf16, w_row + jj, w8);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) w8[e] = jj + e < p.R ? load_vec(p.f_b, p.f_b_bf16, w_row + jj + e) : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (jj + e < p.R) fsum += w8[e] * fa_s[jj + e];
      }
    }
#pragma unroll
    for (int o = 1; o < kTpr; o <<= 1) fsum += __shfl_xor_sync(kFullMask, fsum, o);
    if (row_ok && sub == 0) {
      const float f = round_if(fsum, p.round);  // f is an activation of the standard path
      own_alpha_s[local] = expf(kda_gate(f, p.dt_bias[v], a_log, p.lower_bound));
    }
    if (tid == 64) beta_s = sigmoid_f32(to_f32(p.b[t * p.b_ld + h]));
    cluster.sync();  // every CTA's q~, k~, alpha slice is written

    // 3. Gather the head's q~, k~ and alpha from the cluster (channel j lives in rank j / W).
    for (int idx = tid; idx < 3 * kMaxD; idx += kSplitThreads) {
      const int part = idx / kMaxD, j = idx % kMaxD;
      float x = 0.0f;
      if (j < D) {
        float* src = part == 0 ? own_q_s : (part == 1 ? own_k_s : own_alpha_s);
        x = cluster.map_shared_rank(src, static_cast<unsigned>(j / W))[j % W];
      }
      (part == 0 ? qf_s : (part == 1 ? kf_s : alpha_s))[j] = x;
    }
    __syncthreads();

    // 4. |q~|, |k~| (warps 0, 1; eps inside the sqrt of the sum, spec §5.3).
    if (warp < 2) {
      const float* x = warp == 0 ? qf_s : kf_s;
      float sq = 0.0f;
      for (int i = lane; i < D; i += 32) sq += x[i] * x[i];
      sq = warp_sum(sq);
      if (lane == 0) norm_s[warp] = sqrtf(sq + kKdaL2Eps);
    }
    __syncthreads();

    // 5. Normalised q (scaled) and k; channels past D hold zeros (as does alpha_s).
    if (tid < kMaxD) {
      const bool ch = tid < D;
      q_s[tid] = ch ? qf_s[tid] / norm_s[0] * p.q_scale : 0.0f;
      k_s[tid] = ch ? kf_s[tid] / norm_s[1] : 0.0f;
    }
    __syncthreads();

    // 6. The delta rule on this thread's part of row v (spec §5.5, post-update output).
    float read = 0.0f;
#pragma unroll
    for (int i = 0; i < kChunks; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = 4 * kTpr * i + 4 * sub + e;
        s[i][e] *= alpha_s[k];     // decay
        read += s[i][e] * k_s[k];  // read
      }
#pragma unroll
    for (int o = 1; o < kTpr; o <<= 1) read += __shfl_xor_sync(kFullMask, read, o);
    const float u = beta_s * ((row_ok ? own_v_s[local] : 0.0f) - read);  // delta
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < kChunks; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = 4 * kTpr * i + 4 * sub + e;
        s[i][e] += u * k_s[k];  // write
        o += s[i][e] * q_s[k];  // output
      }
#pragma unroll
    for (int m = 1; m < kTpr; m <<= 1) o += __shfl_xor_sync(kFullMask, o, m);
    if (row_ok && sub == 0) {
      const float o_r = round_if(o, p.round);  // o is an activation of the standard path
      o_s[local] = o_r;
      if (p.o_trace != nullptr) store_act(p.o_trace + t * p.o_trace_ld + v, o_r, p.round);
    }
    __syncthreads();

    // 7. This CTA's sum of o^2, then every CTA adds the cluster's partials in rank order.
    if (warp == 0) {
      float sq = 0.0f;
      for (int i = lane; i < own; i += 32) sq += o_s[i] * o_s[i];
      sq = warp_sum(sq);
      if (lane == 0) osq_s = sq;
    }
    cluster.sync();  // every CTA's partial is written (and no slice vector is still being gathered)

    // 8. out = round(((o * rstd) * w) * sigmoid(g)) for this CTA's channels.
    if (tid < own) {
      float sq = 0.0f;
#pragma unroll
      for (int q = 0; q < NS; ++q) sq += *cluster.map_shared_rank(&osq_s, static_cast<unsigned>(q));
      const float rstd = 1.0f / sqrtf(sq / static_cast<float>(D) + p.eps);
      const int64_t c = c0 + j0 + tid;
      const float gate = to_f32(p.g[t * p.g_ld + c]);
      const float y = o_s[tid] * rstd * load_vec(p.o_norm, p.o_norm_bf16, j0 + tid) * sigmoid_f32(gate);
      store_act(p.out + t * p.out_ld + c, y, p.round);
    }
    // No barrier at the end of the row: the slice vectors (written in the next row's step 1)
    // were gathered by every CTA before this row's second cluster.sync, and osq_s is written
    // again only after the next row's first cluster.sync, which waits for every CTA's step 8.
  }
  cluster.sync();         // no CTA leaves while another still reads its osq_s
  if (!p.commit) return;  // speculative verify: both slots keep their committed states

  if (conv_on) {
#pragma unroll
    for (int i = 0; i < kMaxWidth; ++i)
      if (i < K - 1) store_act(c_st + i, window[i], false);
  }
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int k0 = 4 * kTpr * i + 4 * sub;
    if (row_ok && p.state_vec4 && k0 < D) {
      *reinterpret_cast<float4*>(S_row + k0) = make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (row_ok && k0 + e < D) S_row[k0 + e] = s[i][e];
    }
  }
}

// Slices per head of the split form: 8 while the grid 8 * H * num_seqs stays within two CTAs per
// SM (256 threads, <= 128 registers: both fit), else 4. Where the split pays at all (head x
// sequence pairs <= 2 * SMs / 4: 66 on the H200) is the tuning table's (tuning/*.json). TP8
// (H = 12) on 132 SMs: batch 1-2 -> 8, 3+ -> 4. Host integers only (graph-replayable).
int split_slices(const CudaOps& ops, const KdaDecodeArgs& a) {
  const int64_t heads = int64_t{a.num_heads} * a.seqs.num_seqs, target = 2 * int64_t{ops.ctx->info().sm_count};
  return heads * 8 <= target ? 8 : 4;
}

core::Status kda_decode_split_supports(const CudaOps& ops, const KdaDecodeArgs& a) {
  if (auto s = kda_decode_supports(ops, a); !s) return s;
  if (ops.ctx->info().cc_major < 9)
    return core::Status::fail("thread-block clusters need compute capability 9.0, got " +
                              std::to_string(ops.ctx->info().cc_major) + "." +
                              std::to_string(ops.ctx->info().cc_minor));
  return core::Status::ok();
}

template <class E, class S, int NS>
void launch_split(const CudaOps& ops, const KdaDecodeArgs& a) {
  // Cluster (NS, 1, 1): the NS slices of one (head, sequence) are consecutive blockIdx.x; a programmatic
  // dependent of the kernel before it.
  launch_dependent(kda_decode_split_kernel<E, S, NS>,
                   dim3(static_cast<unsigned>(NS * a.num_heads), static_cast<unsigned>(a.seqs.num_seqs)),
                   dim3(kSplitThreads), 0, ops.ctx->stream(), dim3(NS, 1, 1), decode_params<E, S>(a));
}

}  // namespace

void register_kda_decode_vsplit(KdaOps& r, const CudaOps& ops) {
  // The same function, V split over a cluster: faster at small batches (tuning/*.json).
  r.kda_decode.add({"cuda_vsplit_cluster", core::Device::cuda,
                    [ops](const KdaDecodeArgs& a) { return kda_decode_split_supports(ops, a); },
                    [ops](const KdaDecodeArgs& a) {
                      if (a.q_in.dim(0) == 0 || a.seqs.num_seqs == 0) return;
                      const int ns = split_slices(ops, a);
                      with_act(a.q_in.dtype, [&](auto act) {
                        using E = typename decltype(act)::type;
                        with_act(a.conv_state.dtype, [&](auto st) {
                          using S = typename decltype(st)::type;
                          if (ns == 8) launch_split<E, S, 8>(ops, a);
                          else launch_split<E, S, 4>(ops, a);
                        });
                      });
                    }});
}

}  // namespace k3::kernels::kda_decode_detail
