// kernels/moe/cuda_tail.cu: CUDA moe_tail_combine's two-launch forms and the registration of all four
// strategies (design and byte counts: moe_tail.h; the one-launch form for one row: cuda_one_launch.cu):
//   cuda_tail_one_launch (bf16, T == 1, 16-byte aligned input rows, shared memory fits):
//     one kernel, the prologue computed per CTA into shared memory (cuda_one_launch.cu).
//   Two launches otherwise:
//   1. tail_prologue_kernel (grid (T, 2): norm half, situ half): workspace [T, ws_ld] (activation dtype) =
//      [ rmsnorm(u) (or u) at columns 0..L | situ_glu(gate, up) at columns Lp..Lp+SI ], Lp = L rounded up
//      to 8 so both halves start 16-byte aligned; rounded exactly where the references round.
//   2. the dual GEMM out = round(round(ws_L . W_up^T) + round(ws_SI . W_sd^T)):
//      cuda_tail_mma: bf16, tensor cores, in-CTA split-K over 8 warps (the multi_linear
//        cuda_multi_mma scheme, kernels/multi_linear/cuda.cu), run once over L with latent_up and once
//        over SI with shared_down; each pass's partial sums meet in shared memory in warp order 0..7.
//        Serves 9..16 rows and the inputs the one-launch form does not take (unaligned rows).
//      cuda_tail_cublaslt (bf16; tuning/*.json: above 16 rows, where the mma kernel's per-warp
//        workspace re-reads make it L2-bound): the prologue, then one cuBLASLt GEMM per weight into bf16
//        scratch (rounded yr, ys) and tail_add_kernel out = round(yr + ys): 4 launches.
//      cuda_tail_rowdot: any bf16/f32 mix; a warp per output column and 8 rows.
// All sum in fp32 in an order other than the reference's sequential one (tolerance), deterministic; the
// one-launch form and cuda_tail_mma give the same bits (same prologue math, same per-warp k-block order).
// Programmatic dependent launch (rules: kernels/cuda_common.cuh): the prologue, tail_mma and tail_rowdot
// trigger at their top and wait before they read u, gate, up or the workspace and before any store. The
// prologue (launched while the experts' down kernel still runs) first asks L2 for the latent norm weight
// (L x 2 = 7 KB); its early trigger lets tail_mma start right away: each CTA of tail_mma asks L2 for the
// first bytes of its 16 latent_up rows (the k-blocks its warps read first: pdl_prefetch_row_bytes, the
// whole grid at most 16 MiB; at K3 TP8 batch 1 2336 of each row's 7168 B: 448 CTAs x 37 KB = 16.7 MB of
// latent_up's 51.4 MB) before its wait. tail_rowdot prefetches the same per weight row (fp32 mode).
#include "kernels/moe/cuda_tail.cuh"

#include "kernels/linear/cuda_linear.h"
#include "kernels/moe/ops.h"

namespace k3::kernels::moe_tail_cuda {

namespace {

// ---------------------------------------------------------------- launch 1: prologue

// Grid (T, 2): CTA (t, 0) writes ws[t, 0..L) = rmsnorm(u[t]) (rmsnorm_reference's math; the sum of
// squares is a fixed-order block tree) or u[t] itself; CTA (t, 1) writes ws[t, Lp..Lp+SI) =
// situ_glu(gate[t], up[t]). N elements per access: 8 (16-byte vectors: L, SI % 8 == 0 and aligned rows
// and norm weight, host-checked) or 1. Inputs and workspace never overlap (__restrict__: loads batch).
template <class E, int N>
__global__ void __launch_bounds__(kThreads) tail_prologue_kernel(TailParams p) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  E* __restrict__ ws = static_cast<E*>(p.ws) + t * p.ws_ld;
  pdl_launch_dependents();
  if (t == 0 && blockIdx.y == 0 && threadIdx.x == 0 && p.use_norm)
    prefetch_l2_within(p.norm_w, static_cast<uint64_t>(p.L) * (p.norm_w_bf16 ? 2 : 4));
  pdl_wait();  // u, gate and up are the step's; the workspace may still be read by the last call's GEMM
  if (blockIdx.y == 0) {
    const E* __restrict__ u = static_cast<const E*>(p.u) + t * p.u_ld;
    if (!p.use_norm) {
      for (int64_t c = threadIdx.x * int64_t{N}; c < p.L; c += kThreads * int64_t{N}) {
        float v[N];
        load_act_n<N>(u + c, v);
        store_act_n<N>(ws + c, v, p.round);
      }
      return;
    }
    float part = 0.0f;
    for (int64_t c = threadIdx.x * int64_t{N}; c < p.L; c += kThreads * int64_t{N}) {
      float v[N];
      load_act_n<N>(u + c, v);
      add_squares<N>(part, v);
    }
    const float inv_rms = inv_rms_of(block_sum(part, red), p);
    for (int64_t c = threadIdx.x * int64_t{N}; c < p.L; c += kThreads * int64_t{N}) {
      float v[N], w[N];
      load_act_n<N>(u + c, v);
      load_vec_n<N>(p.norm_w, p.norm_w_bf16, c, w);
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = norm_value(v[i], w[i], inv_rms, p);
      store_act_n<N>(ws + c, v, p.round);
    }
  } else if (p.shared) {
    const E* __restrict__ gate = static_cast<const E*>(p.gate) + t * p.gate_ld;
    const E* __restrict__ up = static_cast<const E*>(p.up) + t * p.up_ld;
    for (int64_t c = threadIdx.x * int64_t{N}; c < p.SI; c += kThreads * int64_t{N}) {
      float g[N], v[N];
      load_act_n<N>(gate + c, g);
      load_act_n<N>(up + c, v);
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = situ_value(g[i], v[i], p);
      store_act_n<N>(ws + p.Lp + c, v, p.round);
    }
  }
}

// Stores f (already the sum of the rounded halves) as out[t][o].
template <class E>
__device__ __forceinline__ void store_f(const TailParams& p, int64_t t, int64_t o, float f) {
  store_act(static_cast<E*>(p.out) + t * p.out_ld + o, f, p.round);
}

// ---------------------------------------------------------------- launch 2: cuda_tail_rowdot

// Grid (ceil(hidden / 8), ceil(T / 8)): warp w of a CTA owns column o = 8 blockIdx.x + w and rows
// t0..t0+7; lanes stride k, each lane its own fp32 chains, then a warp-shuffle tree (fixed order).
constexpr int kRowdotRows = 8;

template <class E>
__global__ void __launch_bounds__(kThreads) tail_rowdot_kernel(TailParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  // PDL: lane 0 of each warp asks L2 for the first bytes of its latent_up row; then every thread waits
  // (also the warps past `hidden`, before they leave).
  pdl_launch_dependents();
  if (blockIdx.y == 0 && lane == 0 && o < p.hidden) {
    const int64_t esize = p.w_up_bf16 ? 2 : 4, row_bytes = p.L * esize;
    const int64_t bytes = p.prefetch_row_bytes < row_bytes ? int64_t{p.prefetch_row_bytes} : row_bytes;
    prefetch_l2_within(static_cast<const char*>(p.w_up) + o * p.w_up_ld * esize, static_cast<uint64_t>(bytes));
  }
  pdl_wait();
  if (o >= p.hidden) return;  // whole warp: the shuffles below stay full-warp
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kRowdotRows;
  const int nt = static_cast<int>(p.T - t0 < kRowdotRows ? p.T - t0 : kRowdotRows);
  const E* ws = static_cast<const E*>(p.ws) + t0 * p.ws_ld;
  float yr[kRowdotRows], ys[kRowdotRows];
#pragma unroll
  for (int j = 0; j < kRowdotRows; ++j) yr[j] = ys[j] = 0.0f;
  for (int64_t k = lane; k < p.L; k += 32) {
    const float w = load_vec(p.w_up, p.w_up_bf16, o * p.w_up_ld + k);
#pragma unroll
    for (int j = 0; j < kRowdotRows; ++j)
      if (j < nt) yr[j] += w * to_f32(ws[j * p.ws_ld + k]);
  }
  if (p.shared)
    for (int64_t k = lane; k < p.SI; k += 32) {
      const float w = load_vec(p.w_sd, p.w_sd_bf16, o * p.w_sd_ld + k);
#pragma unroll
      for (int j = 0; j < kRowdotRows; ++j)
        if (j < nt) ys[j] += w * to_f32(ws[j * p.ws_ld + p.Lp + k]);
    }
#pragma unroll
  for (int j = 0; j < kRowdotRows; ++j) {
    yr[j] = warp_sum(yr[j]);
    ys[j] = warp_sum(ys[j]);
  }
  if (lane == 0)
    for (int j = 0; j < nt; ++j) {
      float f = round_if(yr[j], p.round);
      if (p.shared) f += round_if(ys[j], p.round);
      store_f<E>(p, t0 + j, o, f);
    }
}

// ---------------------------------------------------------------- launch 2: cuda_tail_mma

constexpr int kMmaTokens = 64;  // rows per grid.y slice: up to 8 n8 tiles

// acc[j] (n8 tile j: rows t0 + 8j..) += x[t0.., 0..in) . W[r0..r0+16, 0..in)^T over this warp's k-blocks
// (warp, warp + 8, ...; U per step in flight). W [rows, in] bf16 (row stride w_ld), x [T, in] bf16
// (row stride x_ld), in % 8 == 0, 16-byte aligned rows. k permutation: lane (g, q) loads the 16
// bytes at k = 32 kb + 8 q of weight rows g and g+8 and of x row g; A and B use the same map, so each
// mma sums products of equal physical k (multi_linear's cuda_multi_mma does the same).
template <int NT, int U>
__device__ __forceinline__ void mma_accumulate(float (&acc)[NT][4], const bf16* w, int64_t w_ld, int64_t rows,
                                               int64_t r0, const bf16* x, int64_t x_ld, int64_t T, int64_t t0,
                                               int64_t in, int warp, int lane) {
  const int g = lane >> 2, q = lane & 3;
  const bool lo_ok = r0 + g < rows, hi_ok = r0 + g + 8 < rows;
  const bf16* w_lo = w + (lo_ok ? r0 + g : 0) * w_ld;
  const bf16* w_hi = w + (hi_ok ? r0 + g + 8 : 0) * w_ld;
  const bf16* xr[NT];
  bool x_ok[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int64_t t = t0 + 8 * j + g;
    x_ok[j] = t < T;
    xr[j] = x + (x_ok[j] ? t : 0) * x_ld;
  }
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const int64_t n_kblocks = (in + kKBlock - 1) / kKBlock;
  for (int64_t kb0 = warp; kb0 < n_kblocks; kb0 += static_cast<int64_t>(kWarps) * U) {
    uint4 wl[U], wh[U], xv[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kb = kb0 + static_cast<int64_t>(u) * kWarps;
      const int64_t k = kb * kKBlock + 8 * q;
      const bool k_ok = kb < n_kblocks && k < in;  // in % 8 == 0: an 8-element chunk is whole
      // Loads from clamped addresses (row 0 / k 0 always exist here), zeroed after: no branches.
      const int64_t kc = k_ok ? k : 0;
      const uint4 lo = load_weight16(w_lo + kc);
      const uint4 hi = load_weight16(w_hi + kc);
      wl[u] = k_ok && lo_ok ? lo : zero;
      wh[u] = k_ok && hi_ok ? hi : zero;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4 xq = __ldg(reinterpret_cast<const uint4*>(xr[j] + kc));
        xv[u][j] = k_ok && x_ok[j] ? xq : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < NT; ++j) mma_kblock(acc[j], wl[u], wh[u], xv[u][j]);
  }
}

// Sums the 8 warps' accumulators (via `partial`, in warp order 0..7) for this thread's tile entries:
// entry e = threadIdx.x + i * kThreads (i < PER) of the 16 x 8NT tile, columns (weight rows) fastest.
// Barriers before (reuse of `partial`) and after the write; every thread of the CTA must call it.
template <int NT, int PER>
__device__ __forceinline__ void reduce_warps(const float (&acc)[NT][4], float (*partial)[NT * 4 * 32], int warp,
                                             int lane, float (&sums)[PER]) {
  __syncthreads();
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) partial[warp][(j * 4 + e) * 32 + partial_col(j * 4 + e, lane)] = acc[j][e];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    sums[i] = 0.0f;
    if (idx >= kMmaRows * 8 * NT) continue;
    // Entry (column rl, row tl) sits in tile j = tl / 8 at lane (rl % 8) * 4 + (tl % 8) / 2, element
    // (rl / 8) * 2 + tl % 2 (the c fragment layout above).
    const int rl = idx % kMmaRows, tl = idx / kMmaRows;
    const int j = tl >> 3, tt = tl & 7;
    const int row = j * 4 + (rl >> 3) * 2 + (tt & 1);
    const int src = row * 32 + partial_col(row, (rl & 7) * 4 + (tt >> 1));
    float s = 0.0f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) s += partial[v][src];
    sums[i] = s;
  }
}

// Grid (ceil(hidden / 16), ceil(T / 64)): CTA = 16 output columns x up to 64 rows (NT n8 tiles).
template <int NT, int U>
__global__ void __launch_bounds__(kThreads) tail_mma_kernel(TailParams p) {
  constexpr int PER = (kMmaRows * 8 * NT + kThreads - 1) / kThreads;
  __shared__ float partial[kWarps][NT * 4 * 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kMmaTokens;
  const bf16* ws = static_cast<const bf16*>(p.ws);
  // PDL: thread r < 16 asks L2 for the first prefetch_row_bytes of latent_up row r0 + r (the k-blocks
  // every warp reads first); then wait before the workspace is read or out written.
  pdl_launch_dependents();
  if (blockIdx.y == 0 && threadIdx.x < kMmaRows && r0 + threadIdx.x < p.hidden)
    prefetch_l2_within(static_cast<const bf16*>(p.w_up) + (r0 + threadIdx.x) * p.w_up_ld, p.prefetch_row_bytes);
  pdl_wait();

  float acc[NT][4];
  float yr[PER], ys[PER];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
  mma_accumulate<NT, U>(acc, static_cast<const bf16*>(p.w_up), p.w_up_ld, p.hidden, r0, ws, p.ws_ld, p.T, t0, p.L, warp,
                        lane);
  reduce_warps<NT, PER>(acc, partial, warp, lane, yr);
  if (p.shared) {  // uniform over the CTA (a kernel parameter): the barriers inside are safe
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    mma_accumulate<NT, U>(acc, static_cast<const bf16*>(p.w_sd), p.w_sd_ld, p.hidden, r0, ws + p.Lp, p.ws_ld, p.T, t0,
                          p.SI, warp, lane);
    reduce_warps<NT, PER>(acc, partial, warp, lane, ys);
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    if (idx >= kMmaRows * 8 * NT) continue;
    const int64_t o = r0 + idx % kMmaRows, t = t0 + idx / kMmaRows;
    if (o >= p.hidden || t >= p.T) continue;
    // The standard rounding points: round(yr), round(ys), round(round(yr) + round(ys)) on store.
    float f = round_if(yr[i], p.round);
    if (p.shared) f += round_if(ys[i], p.round);
    store_f<bf16>(p, t, o, f);
  }
}

// ---------------------------------------------------------------- cuda_tail_cublaslt epilogue

// out[t][o] = round(yr[t][o] + ys[t][o]); yr, ys contiguous bf16 [T, hidden] (already rounded GEMM outputs).
__global__ void __launch_bounds__(kThreads)
    tail_add_kernel(const bf16* yr, const bf16* ys, bf16* out, int64_t out_ld, int64_t T, int64_t hidden) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= T * hidden) return;
  const int64_t t = idx / hidden, o = idx % hidden;
  out[t * out_ld + o] = __float2bfloat16_rn(to_f32(yr[idx]) + to_f32(ys[idx]));
}

// ---------------------------------------------------------------- host

int64_t row_ld(const core::TensorView& v) { return v.dim(0) > 1 ? v.strides[0] : v.dim(1); }
int64_t round_up8(int64_t n) { return (n + 7) / 8 * 8; }

// What every CUDA form needs: a device, CUDA tensors, one activation dtype, dense weights.
core::Status common_supports(const CudaOps& ops, const MoeTailCombineArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"u", &a.u}, {"out", &a.out}}); !s) return s;
  if (auto s = same_act({{"u", &a.u}, {"out", &a.out}}, a.precision); !s) return s;
  if (a.use_norm)
    if (auto s = on_cuda({{"latent_norm", &a.latent_norm}}); !s) return s;
  if (auto s = weight_on_cuda(*a.latent_up, "latent_up"); !s) return s;
  if (a.latent_up->is_mxfp4()) return core::Status::fail("latent_up is MXFP4: the CUDA tail takes bf16/f32 weights");
  if (a.has_shared()) {
    if (auto s = on_cuda({{"shared_gate", &a.shared_gate}, {"shared_up", &a.shared_up}}); !s) return s;
    if (auto s = same_act({{"u", &a.u}, {"shared_gate", &a.shared_gate}, {"shared_up", &a.shared_up}}, a.precision); !s)
      return s;
    if (auto s = weight_on_cuda(*a.shared_down, "shared_down"); !s) return s;
    if (a.shared_down->is_mxfp4())
      return core::Status::fail("shared_down is MXFP4: the CUDA tail takes bf16/f32 weights");
  }
  return core::Status::ok();
}

bool weight_rows_vec8(const LinearWeight& w) {
  const core::TensorView& v = w.weight.view();
  return v.dtype == core::DType::bf16 && aligned16(v.data) && (v.strides[0] * 2) % 16 == 0;
}

}  // namespace

TailParams fill_params(const MoeTailCombineArgs& a) {
  TailParams p;
  p.T = a.u.dim(0);
  p.L = a.u.dim(1);
  p.hidden = a.latent_up->out_features();
  p.u = a.u.data;
  p.u_ld = row_ld(a.u);
  p.use_norm = a.use_norm;
  if (a.use_norm) {
    p.norm_w = a.latent_norm.data;
    p.norm_w_bf16 = a.latent_norm.dtype == core::DType::bf16;
  }
  p.moonshot = a.style == RmsNormStyle::moonshot;
  p.eps = a.eps;
  p.shared = a.has_shared();
  if (p.shared) {
    p.SI = a.shared_down->in_features();
    p.gate = a.shared_gate.data;
    p.gate_ld = row_ld(a.shared_gate);
    p.up = a.shared_up.data;
    p.up_ld = row_ld(a.shared_up);
    p.w_sd = a.shared_down->weight.view().data;
    p.w_sd_ld = a.shared_down->weight.view().strides[0];
    p.w_sd_bf16 = a.shared_down->weight.dtype() == core::DType::bf16;
  }
  p.beta = a.situ_beta;
  p.linear_beta = a.situ_linear_beta;
  p.Lp = round_up8(p.L);
  p.ws_ld = p.Lp + round_up8(p.SI);
  p.w_up = a.latent_up->weight.view().data;
  p.w_up_ld = a.latent_up->weight.view().strides[0];
  p.w_up_bf16 = a.latent_up->weight.dtype() == core::DType::bf16;
  p.out = a.out.data;
  p.out_ld = row_ld(a.out);
  p.round = a.precision == Precision::bf16;
  return p;
}

core::Status mma_supports(const CudaOps& ops, const MoeTailCombineArgs& a) {
  if (auto s = common_supports(ops, a); !s) return s;
  if (a.u.dtype != core::DType::bf16)
    return core::Status::fail("tensor-core path needs bf16 activations (engine mode), got u " + describe(a.u));
  if (a.u.dim(1) % 8 != 0)
    return core::Status::fail("tensor-core path needs L % 8 == 0, got L = " + std::to_string(a.u.dim(1)));
  if (!weight_rows_vec8(*a.latent_up))
    return core::Status::fail("tensor-core path needs bf16 latent_up with 16-byte aligned rows, got " +
                              describe(a.latent_up->weight.view()));
  if (a.has_shared()) {
    const int64_t SI = a.shared_down->in_features();
    if (SI % 8 != 0) return core::Status::fail("tensor-core path needs SI % 8 == 0, got SI = " + std::to_string(SI));
    if (!weight_rows_vec8(*a.shared_down))
      return core::Status::fail("tensor-core path needs bf16 shared_down with 16-byte aligned rows, got " +
                                describe(a.shared_down->weight.view()));
  }
  return core::Status::ok();
}

bool inputs_vec8(const MoeTailCombineArgs& a) {
  return rows_vec8(a.u) && (!a.use_norm || aligned16(a.latent_norm.data)) &&
         (!a.has_shared() || (rows_vec8(a.shared_gate) && rows_vec8(a.shared_up)));
}

namespace {

// Launch 1 into a scratch workspace; returns it (held until launch 2 is queued: reuse is in stream order).
std::shared_ptr<void> run_prologue(const CudaOps& ops, const MoeTailCombineArgs& a, TailParams& p) {
  const core::DType act = a.u.dtype;
  const size_t elem = core::dtype_size(act);
  std::shared_ptr<void> ws = ops.ctx->scratch(static_cast<size_t>(p.T * p.ws_ld) * elem);
  p.ws = ws.get();
  K3_CHECK(aligned16(p.ws), "moe_tail_combine: scratch workspace must be 16-byte aligned");
  // 16-byte vectors when every row the prologue touches allows them (the workspace always does).
  const bool vec = inputs_vec8(a);
  const dim3 grid(static_cast<unsigned>(p.T), 2);
  with_act(act, [&](auto tag) {
    using E = typename decltype(tag)::type;
    if (vec) launch_dependent(tail_prologue_kernel<E, 8>, grid, dim3(kThreads), 0, ops.ctx->stream(), dim3(1, 1, 1), p);
    else launch_dependent(tail_prologue_kernel<E, 1>, grid, dim3(kThreads), 0, ops.ctx->stream(), dim3(1, 1, 1), p);
    K3_CUDA_CHECK_LAUNCH("tail_prologue_kernel");
  });
  return ws;
}

// Launch 2 of cuda_tail_mma on a filled workspace (a programmatic dependent of the prologue).
void mma_launch(const CudaOps& ops, TailParams p) {
  p.prefetch_row_bytes = pdl_prefetch_row_bytes(p.hidden, p.L * 2, ops.ctx->info().l2_bytes);  // bf16 latent_up
  const int64_t slice = p.T < kMmaTokens ? p.T : kMmaTokens;  // rows of the widest grid.y slice
  const dim3 grid(grid_for(p.hidden, kMmaRows), grid_for(p.T, kMmaTokens));
  const auto launch = [&](auto kernel) {
    launch_dependent(kernel, grid, dim3(kThreads), 0, ops.ctx->stream(), dim3(1, 1, 1), p);
  };
  if (slice <= 8) launch(tail_mma_kernel<1, 4>);
  else if (slice <= 16) launch(tail_mma_kernel<2, 4>);
  else if (slice <= 32) launch(tail_mma_kernel<4, 2>);
  else launch(tail_mma_kernel<8, 2>);
  K3_CUDA_CHECK_LAUNCH("tail_mma_kernel");
}

void mma_run(const CudaOps& ops, const MoeTailCombineArgs& a) {
  if (a.u.dim(0) == 0 || a.latent_up->out_features() == 0) return;
  TailParams p = fill_params(a);
  const std::shared_ptr<void> ws = run_prologue(ops, a, p);
  mma_launch(ops, p);
}

core::Status cublaslt_supports(const CudaOps& ops, const MoeTailCombineArgs& a) {
  return mma_supports(ops, a);  // bf16, L and SI % 8 == 0, bf16 weights with 16-byte aligned rows
}

// Columns [c0, c0 + cols) of the bf16 workspace [T, ws_ld] as a row-strided view.
core::TensorView ws_columns(const TailParams& p, int64_t c0, int64_t cols) {
  core::TensorView v = core::TensorView::contiguous(static_cast<bf16*>(p.ws) + c0, core::DType::bf16, {p.T, p.ws_ld},
                                                    core::Device::cuda);
  v.shape = core::Shape{p.T, cols};
  return v;
}

void cublaslt_run(const CudaOps& ops, const MoeTailCombineArgs& a) {
  if (a.u.dim(0) == 0 || a.latent_up->out_features() == 0) return;
  TailParams p = fill_params(a);
  const std::shared_ptr<void> ws = run_prologue(ops, a, p);
  const LinearArgs routed{ws_columns(p, 0, p.L), a.latent_up, a.out, true, a.precision};
  if (!a.has_shared()) {  // f = yr: the GEMM writes out directly
    if (linear_cublaslt_supports(ops, routed)) return linear_cublaslt_run(ops, routed);
    return mma_launch(ops, p);
  }
  std::shared_ptr<void> y = ops.ctx->scratch(static_cast<size_t>(2 * p.T * p.hidden) * sizeof(bf16));
  bf16* yr = static_cast<bf16*>(y.get());
  bf16* ys = yr + p.T * p.hidden;
  const LinearArgs r{ws_columns(p, 0, p.L), a.latent_up,
                     core::TensorView::contiguous(yr, core::DType::bf16, {p.T, p.hidden}, core::Device::cuda), true,
                     a.precision};
  const LinearArgs sh{ws_columns(p, p.Lp, p.SI), a.shared_down,
                      core::TensorView::contiguous(ys, core::DType::bf16, {p.T, p.hidden}, core::Device::cuda), true,
                      a.precision};
  if (!linear_cublaslt_supports(ops, r) || !linear_cublaslt_supports(ops, sh)) return mma_launch(ops, p);
  linear_cublaslt_run(ops, r);   // round(yr) into bf16
  linear_cublaslt_run(ops, sh);  // round(ys) into bf16
  tail_add_kernel<<<grid_for(p.T * p.hidden, kThreads), kThreads, 0, ops.ctx->stream()>>>(
      yr, ys, static_cast<bf16*>(p.out), p.out_ld, p.T, p.hidden);
  K3_CUDA_CHECK_LAUNCH("tail_add_kernel");
}

void rowdot_run(const CudaOps& ops, const MoeTailCombineArgs& a) {
  if (a.u.dim(0) == 0 || a.latent_up->out_features() == 0) return;
  TailParams p = fill_params(a);
  const std::shared_ptr<void> ws = run_prologue(ops, a, p);
  p.prefetch_row_bytes = pdl_prefetch_row_bytes(p.hidden, p.L * 4, ops.ctx->info().l2_bytes);  // capped per dtype
  const dim3 grid(grid_for(p.hidden, kWarps), grid_for(p.T, kRowdotRows));
  with_act(a.u.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    launch_dependent(tail_rowdot_kernel<E>, grid, dim3(kThreads), 0, ops.ctx->stream(), dim3(1, 1, 1), p);
    K3_CUDA_CHECK_LAUNCH("tail_rowdot_kernel");
  });
}

}  // namespace

}  // namespace k3::kernels::moe_tail_cuda

namespace k3::kernels {

void register_moe_tail_combine_cuda(MoeOps& r, const CudaOps& ops) {
  using namespace moe_tail_cuda;
  r.moe_tail_combine.add({"cuda_tail_one_launch", core::Device::cuda,
                          [ops](const MoeTailCombineArgs& a) { return one_launch_supports(ops, a); },
                          [ops](const MoeTailCombineArgs& a) { one_launch_run(ops, a); }});
  r.moe_tail_combine.add({"cuda_tail_cublaslt", core::Device::cuda,
                          [ops](const MoeTailCombineArgs& a) { return cublaslt_supports(ops, a); },
                          [ops](const MoeTailCombineArgs& a) { cublaslt_run(ops, a); }});
  r.moe_tail_combine.add({"cuda_tail_mma", core::Device::cuda,
                          [ops](const MoeTailCombineArgs& a) { return mma_supports(ops, a); },
                          [ops](const MoeTailCombineArgs& a) { mma_run(ops, a); }});
  r.moe_tail_combine.add({"cuda_tail_rowdot", core::Device::cuda,
                          [ops](const MoeTailCombineArgs& a) { return common_supports(ops, a); },
                          [ops](const MoeTailCombineArgs& a) { rowdot_run(ops, a); }});
}

}  // namespace k3::kernels
