// kernels/moe/cuda_experts.cu: CUDA routed experts in latent space (spec §7), MXFP4 (or bf16/f32)
// weights decoded inside the expert GEMV (never expanded to a bf16 copy).
//
// Three strategies, each registered under its own name (tuning/*.json order them):
// "cuda_expert_fp4_mma" and "cuda_expert_fp4": MXFP4 weights with rows of whole 16-byte chunks
// (every K3 shape) in persistent blocks that stream the codes through shared memory with cp.async
// (work items of a few rows of one expert): with bf16 activations and row-contiguous experts (the
// engine) the tensor-core kernels of cuda_experts_mma.cuh, else the CUDA-core kernels of
// cuda_experts_mxfp4.cuh; gate/up fused with SiTU, then down, then a fixed-order combine. A piece of
// up to fp4_experts::kScanMaxRoutes routes gives every route its own group (no sort: the ids fit the
// block, a form of the same kernels, not a strategy); a larger one groups the routes by expert with
// the sort below. "cuda_expert_rowdot": any format and width, the generic row-dot kernels:
//   A. routes: the T*k routes (t, j) grouped by expert id (counting sort on the device);
//   B. gate/up: a block per (row range, expert) walks that expert's routes, 8 at a time, reading
//      each weight row once per 8 routes: h = round(SiTU(round(W1 z_t), round(W3 z_t)));
//   C. down: e_tj = round(W2 h) the same way;
//   D. combine: u_t = round(sum_j p_tj e_tj), fp32 in route order j = 0..k-1.
// Without round_output (a TP rank's partial sum) D does not round and writes f32, and C rounds only
// whole experts (whole_experts: an expert-parallel rank). Expert parallelism: the ids are global,
// the table holds experts [expert_begin, expert_begin + E); a route to another rank's expert is in
// no group (A), costs nothing, and D leaves it out of the sum (route order among the held routes).
// Each route's sums depend only on its own token, never on where it sits in its expert's list, so
// the result does not depend on the (atomic) order of the sort. A route whose id is outside
// [0, E) (the router writes -1 for a NaN score) makes its token's output row NaN.
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda_rowdot.cuh"
#include "kernels/moe/cuda_experts_checks.cuh"
#include "kernels/moe/cuda_experts_mma.cuh"
#include "kernels/moe/cuda_experts_mxfp4.cuh"
#include "kernels/moe/cuda_experts_sort.cuh"
#include "kernels/moe/experts.h"
#include "kernels/moe/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kSortThreads = 1024;
constexpr int kMaxExperts = 8192;
constexpr int kTokensPerPiece = 2048;  // bounds the scratch: [piece * k, max(I, L)] f32
constexpr int kDownRows = 2;           // down-projection rows per warp segment

// A. offsets[E+1], order[] = route indices grouped by held expert (id - e_begin in [0, E)),
// active[0 .. *n_active) = the experts with routes (in no particular order) and, when groups is set,
// groups[g] = {active[g], its first index into order, its route count, 0}; bad[t] = 1 for a token
// with an id outside [0, e_total). Routes to experts outside the held range are in no group. One block.
__global__ void __launch_bounds__(kSortThreads)
    sort_routes_kernel(const int32_t* ids, int64_t ids_ld, int64_t T, int k, int E, int e_begin, int e_total,
                       int* offsets, int* order, int* bad, int* active, int* n_active, int4* groups) {
  __shared__ int cursor[kMaxExperts];
  __shared__ int warp_totals[32];
  __shared__ int active_count;
  const int tid = threadIdx.x;
  if (tid == 0) active_count = 0;
  for (int e = tid; e < E; e += blockDim.x) cursor[e] = 0;
  for (int64_t t = tid; t < T; t += blockDim.x) bad[t] = 0;
  __syncthreads();
  const int64_t routes = T * k;
  for (int64_t q = tid; q < routes; q += blockDim.x) {
    const int32_t id = ids[(q / k) * ids_ld + q % k];
    const int e = held_expert(id, e_begin, E);
    if (e >= 0) atomicAdd(&cursor[e], 1);
    else if (bad_expert_id(id, e_total)) atomicExch(&bad[q / k], 1);
  }
  __syncthreads();
  // Exclusive scan of the counts: each thread a contiguous run, then a scan of the run totals.
  const int per = (E + blockDim.x - 1) / blockDim.x, begin = min(E, tid * per), end = min(E, begin + per);
  int run = 0;
  for (int e = begin; e < end; ++e) run += cursor[e];
  const int lane = tid & 31, warp = tid >> 5;
  int incl = run;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFullMask, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_totals[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = lane < (blockDim.x >> 5) ? warp_totals[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(kFullMask, w, o);
      if (lane >= o) w += y;
    }
    warp_totals[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  int start = incl - run + (warp > 0 ? warp_totals[warp - 1] : 0);
  for (int e = begin; e < end; ++e) {
    const int c = cursor[e];
    offsets[e] = start;
    cursor[e] = start;
    start += c;
    if (c > 0) {
      const int g = atomicAdd(&active_count, 1);
      active[g] = e;
      if (groups) groups[g] = make_int4(e, start - c, c, 0);
    }
  }
  if (tid == blockDim.x - 1) offsets[E] = start;  // the last run ends at the total
  __syncthreads();
  if (tid == 0) *n_active = active_count;
  for (int64_t q = tid; q < routes; q += blockDim.x) {
    const int e = held_expert(ids[(q / k) * ids_ld + q % k], e_begin, E);
    if (e >= 0) order[atomicAdd(&cursor[e], 1)] = static_cast<int>(q);
  }
}

// B / C. For expert blockIdx.y, weight rows of this block: out[route][row] = f(row . x_route).
// GATE_UP: out = round(SiTU(round(W1 x), round(W3 x))); else out = round(W2 x).
// blockIdx.y is a slot of the active expert list (the grid has min(E, routes) slots; extra ones
// leave at once, so an idle expert costs no block).
template <bool GATE_UP, WFmt F, bool VEC, class XT>
__global__ void __launch_bounds__(kRowdotThreads)
    expert_rows_kernel(ExpertTable tab, const int* offsets, const int* order, const int* active, const int* n_active,
                       const XT* x, int64_t x_ld, int k, int64_t rows, int64_t in, float* out, int64_t out_ld,
                       int width, float beta, float linear_beta, bool round) {
  constexpr int R = kRowdotInputs;
  if (static_cast<int>(blockIdx.y) >= *n_active) return;  // the whole block leaves together
  const int e = active[blockIdx.y];
  const int first = offsets[e], count = offsets[e + 1] - first;
  const int sub = threadIdx.x % width;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / width) + threadIdx.x / width;
  const bool row_ok = row < rows;
  for (int r0 = 0; r0 < count; r0 += R) {
    const int nr = min(R, count - r0);
    int route[R];
    const XT* xs[R];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      route[j] = order[first + r0 + (j < nr ? j : 0)];
      xs[j] = x + static_cast<int64_t>(GATE_UP ? route[j] / k : route[j]) * x_ld;
    }
    if constexpr (GATE_UP) {
      const WeightRef ws[2] = {tab.w1(e), tab.w3(e)};  // gate and up rows side by side
      const int64_t rs[2] = {row, row};
      float gu[2][R];
      segment_rows_dot<F, VEC, XT, R, 2>(ws, rs, in, xs, nr, sub, width, row_ok, gu);
      if (row_ok && sub == 0)
#pragma unroll
        for (int j = 0; j < R; ++j) {
          if (j < nr) {
            const float a = round_if(gu[0][j], round), c = round_if(gu[1][j], round);
            const float gate_act = beta * tanhf(a / beta) * sigmoid_f32(a);
            const float up_act = linear_beta * tanhf(c / linear_beta);
            out[static_cast<int64_t>(route[j]) * out_ld + row] = round_if(gate_act * up_act, round);
          }
        }
    } else {
      // kDownRows rows per segment (row, row + stride, ...): fewer, fuller blocks for the many
      // short down rows, and kDownRows loads in flight per lane.
      const int64_t stride = static_cast<int64_t>(gridDim.x) * (blockDim.x / width);
      WeightRef ws[kDownRows];
      int64_t rs[kDownRows];
#pragma unroll
      for (int m = 0; m < kDownRows; ++m) ws[m] = tab.w2(e), rs[m] = row + m * stride < rows ? row + m * stride : row;
      float d[kDownRows][R];
      segment_rows_dot<F, VEC, XT, R, kDownRows>(ws, rs, in, xs, nr, sub, width, row_ok, d);
      if (row_ok && sub == 0)
#pragma unroll
        for (int m = 0; m < kDownRows; ++m)
          if (row + m * stride < rows)
#pragma unroll
            for (int j = 0; j < R; ++j)
              if (j < nr) out[static_cast<int64_t>(route[j]) * out_ld + row + m * stride] = round_if(d[m][j], round);
    }
  }
}

// D. out[t] = round(sum_j p[t][j] e[t*k+j]) over the held routes (ids[t][j] - e_begin in [0, E))
// in route order; NaN for a token with a bad id. Grid (T, L / 256): a thread per output element.
template <class T>
__global__ void combine_kernel(const float* expert_out, int64_t L, const float* p, int64_t p_ld, int k,
                               const int32_t* ids, int64_t ids_ld, int e_begin, int E, const int* bad, T* out,
                               int64_t out_ld, bool round) {
  const int64_t t = blockIdx.x, l = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (l >= L) return;
  const float* pt = p + t * p_ld;
  const int32_t* it = ids + t * ids_ld;
  float acc = 0.0f;
#pragma unroll 8
  for (int j = 0; j < k; ++j)
    if (held_expert(it[j], e_begin, E) >= 0) acc += pt[j] * expert_out[(t * k + j) * L + l];
  store_act(out + t * out_ld + l, bad[t] ? NAN : acc, round);
}

core::Status experts_supports(const CudaOps& ops, const MoeExpertsArgs& a) {
  if (auto s = experts_io_supports(ops, a); !s) return s;
  if (a.w1.size() > static_cast<size_t>(kMaxExperts))
    return core::Status::fail("at most " + std::to_string(kMaxExperts) + " experts on CUDA, got " +
                              std::to_string(a.w1.size()));
  // One layout for all experts (the kernels take one row stride per matrix).
  const std::span<const LinearWeight> mats[3] = {a.w1, a.w3, a.w2};
  const char* names[3] = {"w1", "w3", "w2"};
  const WFmt fmt = weight_format(a.w1[0]);
  for (int m = 0; m < 3; ++m) {
    const LinearWeight& w0 = mats[m][0];
    for (size_t e = 0; e < mats[m].size(); ++e) {
      const LinearWeight& w = mats[m][e];
      if (auto s = weight_on_cuda(w, names[m]); !s) return s;
      if (weight_format(w) != fmt || w.weight.view().strides[0] != w0.weight.view().strides[0] ||
          (w.is_mxfp4() && w.scale.view().strides[0] != w0.scale.view().strides[0]))
        return core::Status::fail(std::string(names[m]) + "[" + std::to_string(e) +
                                  "] differs in format or layout from the other experts");
    }
  }
  return core::Status::ok();
}

// One piece of tokens on the MXFP4 kernels of cuda_experts_mxfp4.cuh (see the file comment).
struct Fp4Piece {
  ExpertTable tab;
  int64_t T, L, I;
  int k, E;              // E: the held experts (the table's)
  int e_begin, e_total;  // expert parallelism: held ids [e_begin, e_begin + E) of [0, e_total)
  const int32_t* ids;    // [T, k], rows ids_ld apart
  int64_t ids_ld;
  const float* p;  // route weights [T, k]
  int64_t p_ld;
  void* out;  // [T, L] XT (round_output) or f32
  int64_t out_ld;
  int *offsets, *order, *bad, *active, *n_active;  // the sort's outputs (sorted form)
  int4* groups;                                    // [E] (sorted form)
  void* h;                                         // [T * k, I] bf16 (rounding) or f32
  float* eo;                                       // [T * k, L] f32
  float beta, linear_beta;
  bool round, round_output;
  bool round_e;  // round && (round_output || whole_experts): e_tj rounded
  bool mma;      // bf16 activations, rounding, row-contiguous experts: the tensor-core kernels
};

// Whether the tensor-core kernels take these widths (their items' scale bytes and two stages).
bool mma_shapes_ok(int64_t L, int64_t I, size_t smem_optin) {
  namespace fx = fp4_experts;
  const int64_t max_scales = int64_t{fx::kMaxScalesPerThread} * fx::kThreads;
  return 16 * (L / 32) <= max_scales && fx::kDownMmaRows * (I / 32) <= max_scales &&
         2 * static_cast<size_t>(fx::mma_gate_up_stage_bytes(L)) + 8 * 1024 <= smem_optin &&
         2 * static_cast<size_t>(fx::mma_down_stage_bytes(I)) + 4 * 1024 <= smem_optin;
}

// Whether the MXFP4 kernels take these widths: whole 16-byte chunks per row and an item's scale
// bytes within kMaxScalesPerThread per thread; two stages within the shared memory a block may use.
bool fp4_shapes_ok(int64_t L, int64_t I, size_t smem_optin) {
  namespace fx = fp4_experts;
  if (L % 32 != 0 || I % 32 != 0 || L == 0 || I == 0) return false;
  const int width = fx::segment_lanes(I / 32);
  const int64_t max_scales = int64_t{fx::kMaxScalesPerThread} * fx::kThreads;
  return 2 * fx::kGateUpRows * (L / 32) <= max_scales && fx::down_rows(width) * (I / 32) <= max_scales &&
         2 * static_cast<size_t>(fx::gate_up_stage_bytes(L)) <= smem_optin &&
         2 * static_cast<size_t>(fx::down_stage_bytes(I, width)) <= smem_optin;
}

// The three strategies of this file, each registered under its own name.
enum class ExpertsStrategy {
  fp4_mma,  // "cuda_expert_fp4_mma": MXFP4 on the tensor cores (bf16 activations, row-contiguous experts)
  fp4,      // "cuda_expert_fp4": MXFP4 on the CUDA cores (whole 16-byte chunks on every row)
  rowdot,   // "cuda_expert_rowdot": any format and width, routes sorted by expert
};

// Whether the MXFP4 kernels (and their tensor-core form) are correct for these arguments. The
// scratch h and e rows come from the context pool, 256-byte aligned: only their row widths count.
core::Status fp4_supports(const CudaOps& ops, const MoeExpertsArgs& a, bool mma) {
  if (auto s = experts_supports(ops, a); !s) return s;
  const int64_t L = a.z.dim(1), I = a.w1[0].out_features();
  const WFmt fmt = weight_format(a.w1[0]);
  if (fmt != WFmt::mxfp4) return core::Status::fail("the MXFP4 kernels take MXFP4 experts");
  for (size_t e = 0; e < a.w1.size(); ++e)
    for (const LinearWeight* w : {&a.w1[e], &a.w3[e], &a.w2[e]})
      if (!aligned16(w->weight.view().data))
        return core::Status::fail("the MXFP4 kernels read 16-byte aligned expert codes; expert " + std::to_string(e) +
                                  " is not");
  if (!fp4_shapes_ok(L, I, ops.ctx->smem_optin()))
    return core::Status::fail("the MXFP4 kernels do not take L = " + std::to_string(L) + ", I = " + std::to_string(I));
  const bool round = a.precision == Precision::bf16;
  const size_t x_elem = core::dtype_size(a.z.dtype), h_elem = round ? sizeof(bf16) : sizeof(float);
  const WeightRef r1 = weight_ref(a.w1[0]), r3 = weight_ref(a.w3[0]), r2 = weight_ref(a.w2[0]);
  const void* pool_row = reinterpret_cast<const void*>(uintptr_t{256});  // any 256-byte aligned address
  if (!vector_ok(fmt, r1, L, a.z.data, a.z.strides[0], x_elem) ||
      !vector_ok(fmt, r3, L, a.z.data, a.z.strides[0], x_elem) || !vector_ok(fmt, r2, I, pool_row, I, h_elem))
    return core::Status::fail("the MXFP4 kernels read whole 16-byte chunks of z, w1, w3 and w2 rows");
  if (!mma) return core::Status::ok();
  if (a.z.dtype != core::DType::bf16 || !round)
    return core::Status::fail("the tensor-core form needs bf16 activations (Precision::bf16)");
  if (r1.ld != L / 2 || r3.ld != L / 2 || r1.scale_ld != L / 32 || r3.scale_ld != L / 32 || r2.ld != I / 2 ||
      r2.scale_ld != I / 32)
    return core::Status::fail("the tensor-core form needs row-contiguous expert matrices");
  if (!mma_shapes_ok(L, I, ops.ctx->smem_optin()))
    return core::Status::fail("the tensor-core form does not take L = " + std::to_string(L) +
                              ", I = " + std::to_string(I));
  return core::Status::ok();
}

template <class XT>
void run_fp4_piece(const CudaOps& ops, const Fp4Piece& f, const XT* z, int64_t z_ld, cudaStream_t stream) {
  namespace fx = fp4_experts;
  const int64_t routes = f.T * f.k;
  const bool sorted = routes > fx::kScanMaxRoutes;
  if (sorted) {
    sort_routes_kernel<<<1, kSortThreads, 0, stream>>>(f.ids, f.ids_ld, f.T, f.k, f.E, f.e_begin, f.e_total, f.offsets,
                                                       f.order, f.bad, f.active, f.n_active, f.groups);
    K3_CUDA_CHECK_LAUNCH("sort_routes_kernel");
  }
  const fx::RouteSource rs{f.ids,    f.ids_ld, f.k,       static_cast<int>(routes), f.E, f.e_begin,
                           f.groups, f.order,  f.n_active};
  // Groups: a route each (route form), at most min(E, routes) experts (sorted form).
  const int64_t groups = sorted ? std::min<int64_t>(f.E, routes) : routes;
  const int width_dn = fx::segment_lanes(f.I / 32);
  const int64_t items_gu = groups * ((f.I + fx::kGateUpRows - 1) / fx::kGateUpRows);
  const int64_t items_dn = groups * ((f.L + fx::down_rows(width_dn) - 1) / fx::down_rows(width_dn));
  const size_t smem_gu = 2 * static_cast<size_t>(fx::gate_up_stage_bytes(f.L));
  const size_t smem_dn = 2 * static_cast<size_t>(fx::down_stage_bytes(f.I, width_dn));
  const auto launch_mma = [&](auto sorted_tag) {
    if constexpr (std::is_same_v<XT, bf16>) {
      constexpr bool S = decltype(sorted_tag)::value;
      bf16* h = static_cast<bf16*>(f.h);
      const size_t smem_mgu = 2 * static_cast<size_t>(fx::mma_gate_up_stage_bytes(f.L));
      const size_t smem_mdn = 2 * static_cast<size_t>(fx::mma_down_stage_bytes(f.I));
      const int64_t items_mdn = groups * ((f.L + fx::kDownMmaRows - 1) / fx::kDownMmaRows);
      const auto gate_up = fx::gate_up_mma_kernel<S>;
      gate_up<<<persistent_blocks(ops, gate_up, fx::kThreads, smem_mgu, items_gu), fx::kThreads, smem_mgu, stream>>>(
          f.tab, rs, z, z_ld, f.I, f.L, h, f.beta, f.linear_beta);
      K3_CUDA_CHECK_LAUNCH("fp4_experts::gate_up_mma_kernel");
      const auto down = fx::down_mma_kernel<S>;
      down<<<persistent_blocks(ops, down, fx::kThreads, smem_mdn, items_mdn), fx::kThreads, smem_mdn, stream>>>(
          f.tab, rs, h, f.I, f.L, f.eo, f.round_e);
      K3_CUDA_CHECK_LAUNCH("fp4_experts::down_mma_kernel");
    }
  };
  const auto launch = [&](auto h_tag, auto sorted_tag) {
    using HT = typename decltype(h_tag)::type;
    constexpr bool S = decltype(sorted_tag)::value;
    HT* h = static_cast<HT*>(f.h);
    const auto gate_up = fx::gate_up_kernel<XT, HT, S>;
    gate_up<<<persistent_blocks(ops, gate_up, fx::kThreads, smem_gu, items_gu), fx::kThreads, smem_gu, stream>>>(
        f.tab, rs, z, z_ld, f.I, f.L, h, f.beta, f.linear_beta, f.round);
    K3_CUDA_CHECK_LAUNCH("fp4_experts::gate_up_kernel");
    const auto down = fx::down_kernel<HT, S>;
    down<<<persistent_blocks(ops, down, fx::kThreads, smem_dn, items_dn), fx::kThreads, smem_dn, stream>>>(
        f.tab, rs, h, f.I, f.L, f.eo, width_dn, f.round_e);
    K3_CUDA_CHECK_LAUNCH("fp4_experts::down_kernel");
  };
  // h is a bf16 value whenever it is rounded: stored as bf16 then (half the bytes to read back).
  const auto with_sorted = [&](auto h_tag) {
    if (sorted) launch(h_tag, std::true_type{});
    else launch(h_tag, std::false_type{});
  };
  if (f.mma) {
    if (sorted) launch_mma(std::true_type{});
    else launch_mma(std::false_type{});
  } else if (f.round) {
    with_sorted(Tag<bf16>{});
  } else {
    with_sorted(Tag<float>{});
  }
  const dim3 grid_c(grid_for(f.L / 4, 256), static_cast<unsigned>(f.T));
  if (f.round_output)
    fx::combine_kernel<XT><<<grid_c, 256, 0, stream>>>(f.eo, f.L, f.ids, f.ids_ld, f.p, f.p_ld, f.k, f.E, f.e_begin,
                                                       f.e_total, static_cast<XT*>(f.out), f.out_ld, f.round);
  else  // a TP or EP rank's unrounded f32 partial sum
    fx::combine_kernel<float><<<grid_c, 256, 0, stream>>>(f.eo, f.L, f.ids, f.ids_ld, f.p, f.p_ld, f.k, f.E, f.e_begin,
                                                          f.e_total, static_cast<float*>(f.out), f.out_ld, false);
  K3_CUDA_CHECK_LAUNCH("fp4_experts::combine_kernel");
}

void experts_run(const CudaOps& ops, const MoeExpertsArgs& a, ExpertsStrategy strategy) {
  const int64_t T_all = a.z.dim(0), L = a.z.dim(1);
  const int k = static_cast<int>(a.ids.dim(1)), E = static_cast<int>(a.w1.size());
  const int e_begin = static_cast<int>(a.expert_begin), e_total = static_cast<int>(moe_total_experts(a));
  const int64_t I = a.w1[0].out_features();
  if (T_all == 0) return;
  const cudaStream_t stream = ops.ctx->stream();
  const bool round = a.precision == Precision::bf16;
  const bool round_e = round && moe_rounds_expert_outputs(a);

  std::vector<uint64_t> words(static_cast<size_t>(E) * kWordsPerExpert);
  bool aligned = true;
  const auto addr = [](const core::Tensor& t) { return reinterpret_cast<uint64_t>(t.view().data); };
  for (int e = 0; e < E; ++e) {
    const LinearWeight* ws[3] = {&a.w1[e], &a.w3[e], &a.w2[e]};
    for (int m = 0; m < 3; ++m) {
      words[e * 6 + 2 * m] = addr(ws[m]->weight);
      words[e * 6 + 2 * m + 1] = ws[m]->is_mxfp4() ? addr(ws[m]->scale) : 0;
      aligned = aligned && aligned16(ws[m]->weight.view().data);
    }
  }
  ExpertTable tab;
  tab.words = static_cast<const uint64_t*>(ops.ctx->device_table(words));
  const WeightRef r1 = weight_ref(a.w1[0]), r3 = weight_ref(a.w3[0]), r2 = weight_ref(a.w2[0]);
  tab.ld1 = r1.ld, tab.sld1 = r1.scale_ld, tab.ld3 = r3.ld, tab.sld3 = r3.scale_ld;
  tab.ld2 = r2.ld, tab.sld2 = r2.scale_ld;
  const WFmt fmt = weight_format(a.w1[0]);

  const int64_t piece = std::min<int64_t>(T_all, kTokensPerPiece);
  std::shared_ptr<void> ints = ops.ctx->scratch(sizeof(int) * static_cast<size_t>(2 * E + 2 + piece * k + piece));
  std::shared_ptr<void> h_buf = ops.ctx->scratch(sizeof(float) * static_cast<size_t>(piece * k * I));
  std::shared_ptr<void> e_buf = ops.ctx->scratch(sizeof(float) * static_cast<size_t>(piece * k * L));
  std::shared_ptr<void> groups_buf = ops.ctx->scratch(sizeof(int4) * static_cast<size_t>(E));
  int* offsets = static_cast<int*>(ints.get());
  int* order = offsets + E + 1;
  int* bad = order + piece * k;
  int* active = bad + piece;
  int* n_active = active + E;
  float* h = static_cast<float*>(h_buf.get());
  float* eo = static_cast<float*>(e_buf.get());

  with_act(a.z.dtype, [&](auto tag) {
    using XT = typename decltype(tag)::type;
    // The MXFP4 kernels (fp4_supports said they take these arguments; the pool's scratch rows are
    // 16-byte aligned as it assumed).
    const bool fp4_fast = strategy != ExpertsStrategy::rowdot;
    const bool fp4_mma = strategy == ExpertsStrategy::fp4_mma;
    K3_CHECK(!fp4_fast || (aligned && aligned16(h) && aligned16(eo)),
             "moe_experts: the MXFP4 kernels' scratch is not 16-byte aligned");
    for (int64_t t0 = 0; t0 < T_all; t0 += piece) {
      const int64_t T = std::min(piece, T_all - t0);
      const XT* z = a.z.as<const XT>() + t0 * a.z.strides[0];
      if (fp4_fast) {
        Fp4Piece f{tab,
                   T,
                   L,
                   I,
                   k,
                   E,
                   e_begin,
                   e_total,
                   a.ids.as<const int32_t>() + t0 * a.ids.strides[0],
                   a.ids.strides[0],
                   a.weights.as<const float>() + t0 * a.weights.strides[0],
                   a.weights.strides[0],
                   nullptr,
                   a.out.strides[0],
                   offsets,
                   order,
                   bad,
                   active,
                   n_active,
                   static_cast<int4*>(groups_buf.get()),
                   h,
                   eo,
                   a.beta,
                   a.linear_beta,
                   round,
                   a.round_output,
                   round_e,
                   fp4_mma};
        f.out = a.round_output ? static_cast<void*>(a.out.as<XT>() + t0 * a.out.strides[0])
                               : static_cast<void*>(a.out.as<float>() + t0 * a.out.strides[0]);
        run_fp4_piece<XT>(ops, f, z, a.z.strides[0], stream);
        continue;
      }
      const int32_t* ids = a.ids.as<const int32_t>() + t0 * a.ids.strides[0];
      sort_routes_kernel<<<1, kSortThreads, 0, stream>>>(ids, a.ids.strides[0], T, k, E, e_begin, e_total, offsets,
                                                         order, bad, active, n_active, nullptr);
      K3_CUDA_CHECK_LAUNCH("sort_routes_kernel");
      const unsigned slots = static_cast<unsigned>(std::min<int64_t>(E, T * k));  // distinct experts <= routes
      with_wfmt(fmt, [&](auto fc) {
        constexpr WFmt FC = decltype(fc)::value;
        // B: gate/up rows (I of them, `L` wide) against z.
        const bool vec_b = aligned && vector_ok(fmt, r1, L, z, a.z.strides[0], sizeof(XT)) &&
                           vector_ok(fmt, r3, L, z, a.z.strides[0], sizeof(XT));
        const auto launch_b = [&](auto kernel, int width) {
          const dim3 grid(grid_for(I, kRowdotThreads / width), slots);
          kernel<<<grid, kRowdotThreads, 0, stream>>>(tab, offsets, order, active, n_active, z, a.z.strides[0], k, I, L,
                                                      h, I, width, a.beta, a.linear_beta, round);
          K3_CUDA_CHECK_LAUNCH("expert_rows_kernel<gate_up>");
        };
        if (vec_b) launch_b(expert_rows_kernel<true, FC, true, XT>, segment_width<FC, true>(L));
        else launch_b(expert_rows_kernel<true, FC, false, XT>, segment_width<FC, false>(L));
        // C: down rows (L of them, `I` wide) against h.
        const bool vec_c = aligned && vector_ok(fmt, r2, I, h, I, sizeof(float));
        const auto launch_c = [&](auto kernel, int width) {
          const dim3 grid(grid_for(L, kRowdotThreads / width * kDownRows), slots);
          kernel<<<grid, kRowdotThreads, 0, stream>>>(tab, offsets, order, active, n_active,
                                                      static_cast<const float*>(h), I, k, L, I, eo, L, width, a.beta,
                                                      a.linear_beta, round_e);
          K3_CUDA_CHECK_LAUNCH("expert_rows_kernel<down>");
        };
        if (vec_c) launch_c(expert_rows_kernel<false, FC, true, float>, segment_width<FC, true>(I));
        else launch_c(expert_rows_kernel<false, FC, false, float>, segment_width<FC, false>(I));
      });
      if (a.round_output) {
        combine_kernel<XT><<<dim3(static_cast<unsigned>(T), grid_for(L, 256)), 256, 0, stream>>>(
            eo, L, a.weights.as<const float>() + t0 * a.weights.strides[0], a.weights.strides[0], k, ids,
            a.ids.strides[0], e_begin, E, bad, a.out.as<XT>() + t0 * a.out.strides[0], a.out.strides[0], round);
      } else {  // a TP or EP rank's unrounded f32 partial sum
        combine_kernel<float><<<dim3(static_cast<unsigned>(T), grid_for(L, 256)), 256, 0, stream>>>(
            eo, L, a.weights.as<const float>() + t0 * a.weights.strides[0], a.weights.strides[0], k, ids,
            a.ids.strides[0], e_begin, E, bad, a.out.as<float>() + t0 * a.out.strides[0], a.out.strides[0], false);
      }
      K3_CUDA_CHECK_LAUNCH("combine_kernel");
    }
  });
}

}  // namespace

// The sort for the other strategies (cuda_experts_sort.cuh).
void cuda_detail::launch_sort_routes(const int32_t* ids, int64_t ids_ld, int64_t T, int k, int E, int e_begin,
                                     int e_total, int* offsets, int* order, int* bad, int* active, int* n_active,
                                     int4* groups, cudaStream_t stream) {
  static_assert(kMaxExperts == kSortMaxExperts, "cuda_experts_sort.cuh states the sort's expert bound");
  sort_routes_kernel<<<1, kSortThreads, 0, stream>>>(ids, ids_ld, T, k, E, e_begin, e_total, offsets, order, bad,
                                                     active, n_active, groups);
  K3_CUDA_CHECK_LAUNCH("sort_routes_kernel");
}

void register_moe_experts_cuda(MoeOps& r, const CudaOps& ops) {
  r.moe_experts.add({"cuda_expert_fp4_mma", core::Device::cuda,
                     [ops](const MoeExpertsArgs& a) { return fp4_supports(ops, a, true); },
                     [ops](const MoeExpertsArgs& a) { experts_run(ops, a, ExpertsStrategy::fp4_mma); }});
  r.moe_experts.add({"cuda_expert_fp4", core::Device::cuda,
                     [ops](const MoeExpertsArgs& a) { return fp4_supports(ops, a, false); },
                     [ops](const MoeExpertsArgs& a) { experts_run(ops, a, ExpertsStrategy::fp4); }});
  r.moe_experts.add({"cuda_expert_rowdot", core::Device::cuda,
                     [ops](const MoeExpertsArgs& a) { return experts_supports(ops, a); },
                     [ops](const MoeExpertsArgs& a) { experts_run(ops, a, ExpertsStrategy::rowdot); }});
}

}  // namespace k3::kernels
