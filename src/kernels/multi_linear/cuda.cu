// kernels/multi_linear/cuda.cu: CUDA multi_linear: every output's y_i = x W_i^T in ONE launch over
// the concatenation of all outputs' weight rows (design and byte counts: multi_linear.h).
//
//   cuda_multi_mma: bf16 x, bf16 weights, in % 8 == 0, 16-byte aligned rows. A CTA
//     of 8 warps owns 16 weight rows of one output and up to 64 tokens; the warps split `in` into
//     interleaved 32-wide k-blocks and run mma.sync m16n8k16 (bf16 in, f32 accumulate); partial
//     sums meet in shared memory in warp order (deterministic, no workspace, no atomics).
//   cuda_multi_cublaslt (tuning/*.json: above 16 rows): one cuBLASLt GEMM per output (the
//     standard linear's route) when cuBLASLt takes every output: the one-launch kernel re-reads x
//     from L2 in every CTA (T x in bf16 per 16 weight rows), which past 16 rows costs more than
//     the launches it saves: with it the fused KDA layer was slower than the standard one at batch
//     32-64 (measurements: docs/perf/fastpath.md, the first per-layer run).
//   cuda_multi_rowdot: any bf16/f32 mix, odd widths: cuda_rowdot.cuh's segment dot
//     (the standard linear fallback's math) with all outputs' rows in one grid.
// Both accumulate in fp32 and round once on store (bf16 out, or f32 out with round_output in
// Precision::bf16); the order of the sum differs from the reference's sequential one (tolerance).
//
// Programmatic dependent launch (rules: kernels/cuda_common.cuh): both kernels are launched while the
// kernel before them (the merge that produced x) still runs; each CTA triggers its dependent, asks L2
// for the first bytes of its weight rows (pdl_prefetch_row_bytes: the whole grid at most 16 MiB, a third
// of the H200's 50 MB L2, so the prefetched lines survive the predecessor's traffic until the CTA reads
// them), then waits before it reads x or writes y. At k3-layer-tp8 batch 1 (in = 7168, rows of 14,336 B):
//   KDA q/k/v/g/f_a/b  6284 rows, 90.1 MB -> 2656 B of each row, 16.7 MB (393 CTAs x 42.5 KB);
//   MLA q_a/kv_a/g     3648 rows, 52.3 MB -> 4592 B of each row, 16.8 MB (228 CTAs x 73.5 KB);
//   MoE router/latent_down/shared gate,up 6016 rows, 86.2 MB -> 2784 B of each row, 16.7 MB (376 CTAs x 44.5 KB).
// Only the first grid.y slice prefetches (the others read the same rows).
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_rowdot.cuh"
#include "kernels/linear/cuda_linear.h"
#include "kernels/moe/cuda_router.h"
#include "kernels/moe/cuda_router_select.cuh"
#include "kernels/multi_linear/multi_linear.h"
#include "kernels/multi_linear/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

// One output's part of the launch (host-filled, passed by value in MlParams).
struct MlOutput {
  const void* w = nullptr;  // weight [rows, in], bf16 or f32: row r at w + r * w_ld elements
  int64_t w_ld = 0;
  void* y = nullptr;  // out [T, rows], bf16 or f32: row t at y + t * y_ld elements
  int64_t y_ld = 0;
  int64_t rows = 0;        // out_i
  int first_block = 0;     // first blockIdx.x of this output (blocks never span two outputs)
  int rows_per_block = 0;  // weight rows per block
  int width = 0;           // rowdot only: lanes per weight row (segment width)
  bool w_bf16 = false;     // weight dtype: bf16 (else f32)
  bool y_bf16 = false;     // out dtype: bf16 (always rounds; else f32)
  bool round = false;      // f32 out: round to bf16 (round_output in Precision::bf16)
  bool vec = false;        // rowdot only: 16-byte loads (cuda_rowdot.cuh vector_ok)
};

// The router epilogue of cuda_multi_mma (host-filled; multi_linear.h "Router epilogue").
struct MlRouter {
  int first_block = 0, blocks = 0;  // the logits output's CTAs: [first_block, first_block + blocks)
  const float* logits = nullptr;    // that output's f32 y: row t at logits + t * logits_ld
  int64_t logits_ld = 0;
  const void* bias = nullptr;  // [E] f32 / bf16
  bool bias_bf16 = false;
  int E = 0, k = 0;
  int32_t* ids = nullptr;  // [T, k]: row t at ids + t * ids_ld
  int64_t ids_ld = 0;
  float* weights = nullptr;  // [T, k]: row t at weights + t * weights_ld
  int64_t weights_ld = 0;
  bool renormalize = true;
  float scaling = 1.0f;
  uint32_t* ticket = nullptr;  // Context::tickets(): 0 before and after the kernel
};

struct MlParams {
  MlOutput out[kMultiLinearMaxOutputs];
  int num_out = 0;
  const void* x = nullptr;  // [T, in] bf16 or f32 (the kernel's XT), row t at x + t * x_ld elements
  int64_t x_ld = 0;
  int64_t T = 0, in = 0;
  uint32_t prefetch_row_bytes = 0;  // L2 prefetch per weight row before the PDL wait (<= any row's bytes)
  MlRouter router;                  // read only by multi_mma_kernel<..., true>
};

// The output that owns block `block`: the last one whose first block is <= block. Static indices
// only, so the descriptors are read from the parameter bank (no local-memory copy).
__device__ __forceinline__ MlOutput output_of_block(const MlParams& p, int block) {
  MlOutput d = p.out[0];
#pragma unroll
  for (int i = 1; i < kMultiLinearMaxOutputs; ++i)
    if (i < p.num_out && block >= p.out[i].first_block) d = p.out[i];
  return d;
}

__device__ __forceinline__ void store_out(const MlOutput& d, int64_t t, int64_t r, float v) {
  if (d.y_bf16) static_cast<bf16*>(d.y)[t * d.y_ld + r] = __float2bfloat16_rn(v);
  else static_cast<float*>(d.y)[t * d.y_ld + r] = round_if(v, d.round);
}

// ---------------------------------------------------------------- cuda_multi_rowdot

// Grid (sum_i ceil(rows_i / rows_per_block_i), ceil(T / 8)); a block's warps all belong to one
// output, so the per-output branch below is uniform and every lane of a warp reaches the shuffles.
template <class XT>
__global__ void __launch_bounds__(kRowdotThreads) multi_rowdot_kernel(MlParams p) {
  constexpr int R = kRowdotInputs;
  const MlOutput d = output_of_block(p, blockIdx.x);
  const int width = d.width;
  const int sub = threadIdx.x % width;
  const int64_t row = static_cast<int64_t>(blockIdx.x - d.first_block) * d.rows_per_block + threadIdx.x / width;
  // PDL: trigger, prefetch this row's first weight bytes, then wait before x is read or y written.
  pdl_launch_dependents();
  if (blockIdx.y == 0 && sub == 0 && row < d.rows) {
    const int64_t esize = d.w_bf16 ? 2 : 4, row_bytes = p.in * esize;
    const int64_t bytes = p.prefetch_row_bytes < row_bytes ? int64_t{p.prefetch_row_bytes} : row_bytes;
    prefetch_l2_within(static_cast<const char*>(d.w) + row * d.w_ld * esize, static_cast<uint64_t>(bytes));
  }
  pdl_wait();
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * R;
  const int nr = static_cast<int>(p.T - t0 < R ? p.T - t0 : R);
  const XT* x = static_cast<const XT*>(p.x);
  const XT* xs[R];
#pragma unroll
  for (int j = 0; j < R; ++j) xs[j] = x + (t0 + (j < nr ? j : 0)) * p.x_ld;
  WeightRef w;
  w.data = d.w;
  w.ld = d.w_ld;
  const bool active = row < d.rows;
  float acc[R];
  if (d.w_bf16) {
    if (d.vec) segment_row_dot<WFmt::bf16, true, XT, R>(w, row, p.in, xs, nr, sub, width, active, acc);
    else segment_row_dot<WFmt::bf16, false, XT, R>(w, row, p.in, xs, nr, sub, width, active, acc);
  } else {
    if (d.vec) segment_row_dot<WFmt::f32, true, XT, R>(w, row, p.in, xs, nr, sub, width, active, acc);
    else segment_row_dot<WFmt::f32, false, XT, R>(w, row, p.in, xs, nr, sub, width, active, acc);
  }
  if (active && sub == 0)
#pragma unroll
    for (int j = 0; j < R; ++j)
      if (j < nr) store_out(d, t0 + j, row, acc[j]);
}

// ---------------------------------------------------------------- cuda_multi_mma

constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaRows = 16;    // weight rows per CTA: one m16 tile
constexpr int kMmaTokens = 64;  // tokens per grid.y slice: up to 8 n8 tiles
constexpr int kKBlock = 32;     // k per (warp, step): 4 lanes x 8 bf16 per row

// mma_bf16_m16n8k16 and load_weight16: kernels/cuda_common.cuh.

// The router epilogue, after a router CTA's stores (block-uniform call; grid.y == 1, T <=
// kMultiLinearRouterInKernelRows): every thread fences its logits stores, thread 0 takes a ticket, and the
// CTA that draws the last one reads all logits through L2 and selects token by token with the whole
// block. It puts the ticket back to 0.
__device__ void router_epilogue(const MlRouter& r, int64_t T, RouterTopkSmem& sm) {
  __shared__ bool last;
  __threadfence();  // this thread's logits stores before the ticket (release)
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(r.ticket, 1u) == static_cast<uint32_t>(r.blocks - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();  // the other CTAs' logits after their tickets (acquire); read with ld.global.cg
  for (int64_t t = 0; t < T; ++t)
    block_router_topk(r.logits + t * r.logits_ld, r.bias, r.bias_bf16, r.E, r.k, r.renormalize, r.scaling,
                      r.ids + t * r.ids_ld, r.weights + t * r.weights_ld, sm);
  if (threadIdx.x == 0) *r.ticket = 0u;
}

// Grid (sum_i ceil(rows_i / 16), ceil(T / 64)); NT n8 token tiles (8 NT >= this slice's tokens), U
// k-blocks loaded per step (loads in flight per lane: 2U of weights + U NT of x). ROUTER: the router
// epilogue (only <1, 4, true> is launched: T <= kMultiLinearRouterInKernelRows).
//
// k permutation: lane (g, q) loads the 16 bytes at k = 32 kb + 8 q .. +8 of weight rows g and g+8
// and of x row (token) g. In the first mma its words 0, 1 stand for the logical k pairs 2q and
// 2q+8, in the second mma words 2, 3 do; A and B use the same map, so each mma still sums
// products of equal physical k (the dot product is order-free up to rounding).
template <int NT, int U, bool ROUTER>
__global__ void __launch_bounds__(kMmaThreads) multi_mma_kernel(MlParams p) {
  __shared__ float partial[kMmaWarps][NT * 4 * 32];  // each warp's accumulators, [tile][elem][lane]
  const MlOutput d = output_of_block(p, blockIdx.x);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x - d.first_block) * kMmaRows;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kMmaTokens;
  const int64_t in = p.in;

  const bool lo_ok = r0 + g < d.rows, hi_ok = r0 + g + 8 < d.rows;
  const bf16* w = static_cast<const bf16*>(d.w);
  // PDL: trigger; thread r < 16 asks L2 for the first prefetch_row_bytes of weight row r0 + r (the
  // k-blocks every warp reads first); then wait before x is read or y written.
  pdl_launch_dependents();
  if (blockIdx.y == 0 && threadIdx.x < kMmaRows && r0 + threadIdx.x < d.rows)
    prefetch_l2_within(w + (r0 + threadIdx.x) * d.w_ld, p.prefetch_row_bytes);
  if constexpr (ROUTER)  // the selection's bias (a weight: no wait needed), so it reads it from L2
    if (threadIdx.x == kMmaRows && static_cast<int>(blockIdx.x) == p.router.first_block)
      prefetch_l2_within(p.router.bias, static_cast<uint64_t>(p.router.E) * (p.router.bias_bf16 ? 2 : 4));
  pdl_wait();
  const bf16* w_lo = w + (lo_ok ? r0 + g : 0) * d.w_ld;
  const bf16* w_hi = w + (hi_ok ? r0 + g + 8 : 0) * d.w_ld;
  const bf16* x = static_cast<const bf16*>(p.x);
  const bf16* xr[NT];
  bool x_ok[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int64_t t = t0 + 8 * j + g;
    x_ok[j] = t < p.T;
    xr[j] = x + (x_ok[j] ? t : 0) * p.x_ld;
  }

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const int64_t n_kblocks = (in + kKBlock - 1) / kKBlock;
  for (int64_t kb0 = warp; kb0 < n_kblocks; kb0 += static_cast<int64_t>(kMmaWarps) * U) {
    uint4 wl[U], wh[U], xv[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kb = kb0 + static_cast<int64_t>(u) * kMmaWarps;
      const int64_t k = kb * kKBlock + 8 * q;
      const bool k_ok = kb < n_kblocks && k < in;  // in % 8 == 0: the 8-element chunk is whole
      // Unconditional loads from clamped addresses (row 0 / k 0 exist whenever this loop runs),
      // zeroed after: no branches, so all 2U + U NT loads are in flight before the first mma.
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
      for (int j = 0; j < NT; ++j) {
        mma_bf16_m16n8k16(acc[j], wl[u].x, wh[u].x, wl[u].y, wh[u].y, xv[u][j].x, xv[u][j].y);
        mma_bf16_m16n8k16(acc[j], wl[u].z, wh[u].z, wl[u].w, wh[u].w, xv[u][j].z, xv[u][j].w);
      }
  }

#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) partial[warp][(j * 4 + e) * 32 + lane] = acc[j][e];
  __syncthreads();
  // Entry (row rl, token tl) of the CTA's 16 x 8NT tile, rows fastest (coalesced stores): it sits
  // in tile j = tl / 8 at lane (rl % 8) * 4 + (tl % 8) / 2, element (rl / 8) * 2 + tl % 2.
  for (int idx = threadIdx.x; idx < kMmaRows * 8 * NT; idx += kMmaThreads) {
    const int rl = idx % kMmaRows, tl = idx / kMmaRows;
    const int j = tl >> 3, tt = tl & 7;
    const int src = (j * 4 + (rl >> 3) * 2 + (tt & 1)) * 32 + (rl & 7) * 4 + (tt >> 1);
    float s = 0.0f;
#pragma unroll
    for (int v = 0; v < kMmaWarps; ++v) s += partial[v][src];
    const int64_t row = r0 + rl, t = t0 + tl;
    if (row < d.rows && t < p.T) store_out(d, t, row, s);
  }
  if constexpr (ROUTER) {
    static_assert(kMmaThreads == kTopkThreads, "the selection takes the whole CTA");
    __shared__ RouterTopkSmem select_smem;
    const int b = static_cast<int>(blockIdx.x) - p.router.first_block;
    if (b >= 0 && b < p.router.blocks) router_epilogue(p.router, p.T, select_smem);
  }
}

// ---------------------------------------------------------------- host

int64_t x_row_ld(const MultiLinearArgs& a) { return a.x.dim(0) > 1 ? a.x.strides[0] : a.x.dim(1); }

// Fills the launch descriptors; returns the total block count (grid.x).
int fill_params(const MultiLinearArgs& a, bool mma, MlParams& p) {
  const int64_t T = a.x.dim(0), in = a.x.dim(1);
  p.num_out = a.num_outputs;
  p.x = a.x.data;
  p.x_ld = x_row_ld(a);
  p.T = T;
  p.in = in;
  int blocks = 0;
  for (int i = 0; i < a.num_outputs; ++i) {
    const MultiLinearOutput& o = a.outputs[static_cast<size_t>(i)];
    MlOutput& d = p.out[i];
    const core::TensorView& wv = o.w->weight.view();
    d.w = wv.data;
    d.w_ld = wv.strides[0];
    d.rows = o.w->out_features();
    d.y = o.out.data;
    d.y_ld = T > 1 ? o.out.strides[0] : d.rows;
    d.w_bf16 = wv.dtype == core::DType::bf16;
    d.y_bf16 = o.out.dtype == core::DType::bf16;
    d.round = o.round_output && a.precision == Precision::bf16;
    if (mma) {
      d.rows_per_block = kMmaRows;
    } else {
      const WFmt f = weight_format(*o.w);
      d.vec = vector_ok(f, weight_ref(*o.w), in, a.x.data, p.x_ld, core::dtype_size(a.x.dtype));
      if (f == WFmt::bf16) d.width = d.vec ? segment_width<WFmt::bf16, true>(in) : segment_width<WFmt::bf16, false>(in);
      else d.width = d.vec ? segment_width<WFmt::f32, true>(in) : segment_width<WFmt::f32, false>(in);
      d.rows_per_block = kRowdotThreads / d.width;
    }
    d.first_block = blocks;
    blocks += static_cast<int>(grid_for(d.rows, d.rows_per_block));
  }
  return blocks;
}

// L2 prefetch per weight row before the PDL wait: the 16 MiB budget (pdl_prefetch_row_bytes) over every
// output's rows, at most a row of `in` elements of max_elem bytes.
uint32_t prefetch_bytes(const CudaOps& ops, const MlParams& p, int64_t max_elem) {
  int64_t rows = 0;
  for (int i = 0; i < p.num_out; ++i) rows += p.out[i].rows;
  return pdl_prefetch_row_bytes(rows, p.in * max_elem, ops.ctx->info().l2_bytes);
}

std::string out_name(int i, const char* field) { return "outputs[" + std::to_string(i) + "]." + field; }

// What both implementations need: a device, CUDA tensors, dense bf16/f32 weights, activation dtypes.
core::Status common_supports(const CudaOps& ops, const MultiLinearArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"x", &a.x}}); !s) return s;
  if (a.x.dtype != core::DType::bf16 && a.x.dtype != core::DType::f32)
    return core::Status::fail("x must be bf16 or f32, got " + describe(a.x));
  if (a.x.dtype == core::DType::bf16 && a.precision != Precision::bf16)
    return core::Status::fail("bf16 activations need Precision::bf16");
  for (int i = 0; i < a.num_outputs; ++i) {
    const MultiLinearOutput& o = a.outputs[static_cast<size_t>(i)];
    const std::string w_name = out_name(i, "w"), y_name = out_name(i, "out");
    if (auto s = on_cuda({{y_name.c_str(), &o.out}}); !s) return s;
    if (auto s = weight_on_cuda(*o.w, w_name.c_str()); !s) return s;
    if (o.w->is_mxfp4())
      return core::Status::fail(w_name + " is MXFP4: multi_linear's CUDA kernels take bf16/f32 weights (use linear)");
    if (o.out.dtype == core::DType::bf16 && !o.round_output)
      return core::Status::fail(y_name + ": round_output = false (logits) needs an f32 out, got " + describe(o.out));
  }
  if (a.router.output >= 0)
    if (auto s = router_topk_cuda_supports(ops, a.router_topk_args()); !s)
      return core::Status::fail("router: " + s.reason());
  return core::Status::ok();
}

core::Status mma_supports(const CudaOps& ops, const MultiLinearArgs& a) {
  if (auto s = common_supports(ops, a); !s) return s;
  if (a.x.dtype != core::DType::bf16)
    return core::Status::fail("tensor-core path needs bf16 x (engine mode), got " + describe(a.x));
  const int64_t in = a.x.dim(1);
  if (in % 8 != 0) return core::Status::fail("tensor-core path needs in % 8 == 0, got in = " + std::to_string(in));
  if (!aligned16(a.x.data) || (x_row_ld(a) * 2) % 16 != 0)
    return core::Status::fail("tensor-core path needs x rows 16-byte aligned");
  for (int i = 0; i < a.num_outputs; ++i) {
    const core::TensorView& wv = a.outputs[static_cast<size_t>(i)].w->weight.view();
    if (wv.dtype != core::DType::bf16)
      return core::Status::fail("tensor-core path needs bf16 weights; " + out_name(i, "w") + " is " + describe(wv));
    if (!aligned16(wv.data) || (wv.strides[0] * 2) % 16 != 0)
      return core::Status::fail("tensor-core path needs 16-byte aligned weight rows; " + out_name(i, "w") + " has not");
  }
  return core::Status::ok();
}

// Whether cuda_multi_mma selects inside its kernel (else the router kernel runs after it).
bool router_in_kernel(const MultiLinearArgs& a) {
  if (a.router.output < 0) return false;
  const RouterTopkArgs r = a.router_topk_args();
  return a.x.dim(0) <= kMultiLinearRouterInKernelRows && block_router_topk_fits(r.logits.dim(1), r.ids.dim(1));
}

void fill_router(const CudaOps& ops, const MultiLinearArgs& a, MlParams& p) {
  const RouterTopkArgs r = a.router_topk_args();
  const MlOutput& d = p.out[a.router.output];
  MlRouter& m = p.router;
  m.first_block = d.first_block;
  m.blocks = static_cast<int>(grid_for(d.rows, d.rows_per_block));
  m.logits = static_cast<const float*>(d.y);
  m.logits_ld = d.y_ld;
  m.bias = r.bias.data;
  m.bias_bf16 = r.bias.dtype == core::DType::bf16;
  m.E = static_cast<int>(r.logits.dim(1));
  m.k = static_cast<int>(r.ids.dim(1));
  m.ids = r.ids.as<int32_t>();
  m.ids_ld = r.ids.dim(0) > 1 ? r.ids.strides[0] : m.k;
  m.weights = r.weights.as<float>();
  m.weights_ld = r.weights.dim(0) > 1 ? r.weights.strides[0] : m.k;
  m.renormalize = r.renormalize;
  m.scaling = r.scaling;
  m.ticket = ops.ctx->tickets();
}

// The router epilogue where the GEMM kernel did not run it: the router kernel, after the GEMMs.
void router_after(const CudaOps& ops, const MultiLinearArgs& a) {
  if (a.router.output >= 0) router_topk_cuda(ops, a.router_topk_args());
}

void mma_run(const CudaOps& ops, const MultiLinearArgs& a) {
  const int64_t T = a.x.dim(0);
  if (T == 0) return;
  MlParams p;
  const int blocks = fill_params(a, /*mma=*/true, p);
  if (blocks == 0) return;
  p.prefetch_row_bytes = prefetch_bytes(ops, p, /*max_elem=*/2);
  const int64_t slice = T < kMmaTokens ? T : kMmaTokens;  // tokens of the widest grid.y slice
  const dim3 grid(static_cast<unsigned>(blocks), grid_for(T, kMmaTokens));
  const auto launch = [&](auto kernel) {
    launch_dependent(kernel, grid, dim3(kMmaThreads), 0, ops.ctx->stream(), dim3(1, 1, 1), p);
  };
  const bool in_kernel = router_in_kernel(a);
  if (in_kernel) {
    fill_router(ops, a, p);
    launch(multi_mma_kernel<1, 4, true>);
  } else if (slice <= 8) {
    launch(multi_mma_kernel<1, 4, false>);
  } else if (slice <= 16) {
    launch(multi_mma_kernel<2, 4, false>);
  } else if (slice <= 32) {
    launch(multi_mma_kernel<4, 2, false>);
  } else {
    launch(multi_mma_kernel<8, 2, false>);
  }
  K3_CUDA_CHECK_LAUNCH("multi_mma_kernel");
  if (!in_kernel) router_after(ops, a);
}

void rowdot_run(const CudaOps& ops, const MultiLinearArgs& a) {
  const int64_t T = a.x.dim(0);
  if (T == 0) return;
  MlParams p;
  const int blocks = fill_params(a, /*mma=*/false, p);
  if (blocks == 0) return;
  p.prefetch_row_bytes = prefetch_bytes(ops, p, /*max_elem=*/4);  // the kernel caps it per row by its dtype
  const dim3 grid(static_cast<unsigned>(blocks), grid_for(T, kRowdotInputs));
  with_act(a.x.dtype, [&](auto xt) {
    using XT = typename decltype(xt)::type;
    launch_dependent(multi_rowdot_kernel<XT>, grid, dim3(kRowdotThreads), 0, ops.ctx->stream(), dim3(1, 1, 1), p);
    K3_CUDA_CHECK_LAUNCH("multi_rowdot_kernel");
  });
  router_after(ops, a);
}

// Output i as the standard linear's arguments.
LinearArgs linear_args(const MultiLinearArgs& a, int i) {
  const MultiLinearOutput& o = a.outputs[static_cast<size_t>(i)];
  return {a.x, o.w, o.out, o.round_output, a.precision};
}

core::Status cublaslt_supports(const CudaOps& ops, const MultiLinearArgs& a) {
  if (auto s = common_supports(ops, a); !s) return s;
  for (int i = 0; i < a.num_outputs; ++i)
    if (auto s = linear_cublaslt_supports(ops, linear_args(a, i)); !s)
      return core::Status::fail("outputs[" + std::to_string(i) + "]: " + s.reason());
  return core::Status::ok();
}

void cublaslt_run(const CudaOps& ops, const MultiLinearArgs& a) {
  for (int i = 0; i < a.num_outputs; ++i) linear_cublaslt_run(ops, linear_args(a, i));
  router_after(ops, a);
}

}  // namespace

void register_multi_linear_cuda(MultiLinearOps& r, const CudaOps& ops) {
  r.multi_linear.add({"cuda_multi_cublaslt", core::Device::cuda,
                      [ops](const MultiLinearArgs& a) { return cublaslt_supports(ops, a); },
                      [ops](const MultiLinearArgs& a) { cublaslt_run(ops, a); }});
  r.multi_linear.add({"cuda_multi_mma", core::Device::cuda,
                      [ops](const MultiLinearArgs& a) { return mma_supports(ops, a); },
                      [ops](const MultiLinearArgs& a) { mma_run(ops, a); }});
  r.multi_linear.add({"cuda_multi_rowdot", core::Device::cuda,
                      [ops](const MultiLinearArgs& a) { return common_supports(ops, a); },
                      [ops](const MultiLinearArgs& a) { rowdot_run(ops, a); }});
}

}  // namespace k3::kernels
