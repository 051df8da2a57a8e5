// kernels/moe/cuda_experts.cu: CUDA routed experts in latent space (spec §7), MXFP4 (or bf16/f32)
// weights decoded inside the expert GEMV (never expanded to a bf16 copy):
//   A. routes: the T*k routes (t, j) grouped by expert id (counting sort on the device);
//   B. gate/up: a block per (row range, expert) walks that expert's routes, 8 at a time, reading
//      each weight row once per 8 routes: h = round(SiTU(round(W1 z_t), round(W3 z_t)));
//   C. down: e_tj = round(W2 h) the same way;
//   D. combine: u_t = round(sum_j p_tj e_tj), fp32 in route order j = 0..k-1.
// Each route's sums depend only on its own token, never on where it sits in its expert's list, so
// the result does not depend on the (atomic) order of the sort. A route whose id is outside
// [0, E) (the router writes -1 for a NaN score) makes its token's output row NaN.
#include <algorithm>
#include <vector>

#include "kernels/cuda_rowdot.cuh"
#include "kernels/moe/experts.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kSortThreads = 1024;
constexpr int kMaxExperts = 8192;
constexpr int kTokensPerPiece = 2048;  // bounds the scratch: [piece * k, max(I, L)] f32
constexpr int kWordsPerExpert = 6;     // w1, w1 scale, w3, w3 scale, w2, w2 scale
constexpr int kDownRows = 2;           // down-projection rows per warp segment

// Per-expert weight pointers (a device table) and the layout all experts share.
struct ExpertTable {
  const uint64_t* words;  // [E][6]
  int64_t ld1, sld1, ld3, sld3, ld2, sld2;
  __device__ WeightRef w1(int e) const { return {ptr(e, 0), scale(e, 1), ld1, sld1}; }
  __device__ WeightRef w3(int e) const { return {ptr(e, 2), scale(e, 3), ld3, sld3}; }
  __device__ WeightRef w2(int e) const { return {ptr(e, 4), scale(e, 5), ld2, sld2}; }
  __device__ const void* ptr(int e, int i) const { return reinterpret_cast<const void*>(words[e * 6 + i]); }
  __device__ const uint8_t* scale(int e, int i) const {
    return reinterpret_cast<const uint8_t*>(words[e * 6 + i]);
  }
};

// A. offsets[E+1], order[] = route indices grouped by expert, active[0 .. *n_active) = the experts
// with routes (in no particular order); bad[t] = 1 for a token with an id outside [0, E). One block.
__global__ void __launch_bounds__(kSortThreads) sort_routes_kernel(const int32_t* ids, int64_t ids_ld, int64_t T,
                                                                   int k, int E, int* offsets, int* order, int* bad,
                                                                   int* active, int* n_active) {
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
    const int e = ids[(q / k) * ids_ld + q % k];
    if (e >= 0 && e < E)
      atomicAdd(&cursor[e], 1);
    else
      atomicExch(&bad[q / k], 1);
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
    if (c > 0) active[atomicAdd(&active_count, 1)] = e;
  }
  if (tid == blockDim.x - 1) offsets[E] = start;  // the last run ends at the total
  __syncthreads();
  if (tid == 0) *n_active = active_count;
  for (int64_t q = tid; q < routes; q += blockDim.x) {
    const int e = ids[(q / k) * ids_ld + q % k];
    if (e >= 0 && e < E) order[atomicAdd(&cursor[e], 1)] = static_cast<int>(q);
  }
}

// B / C. For expert blockIdx.y, weight rows of this block: out[route][row] = f(row . x_route).
// GATE_UP: out = round(SiTU(round(W1 x), round(W3 x))); else out = round(W2 x).
// blockIdx.y is a slot of the active expert list (the grid has min(E, routes) slots; extra ones
// leave at once, so an idle expert costs no block).
template <bool GATE_UP, WFmt F, bool VEC, class XT>
__global__ void __launch_bounds__(kRowdotThreads) expert_rows_kernel(ExpertTable tab, const int* offsets,
                                                                     const int* order, const int* active,
                                                                     const int* n_active, const XT* x, int64_t x_ld,
                                                                     int k, int64_t rows, int64_t in, float* out,
                                                                     int64_t out_ld, int width, float beta,
                                                                     float linear_beta, bool round) {
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

// D. out[t] = round(sum_j p[t][j] e[t*k+j]) in route order; NaN for a token with a bad id.
// Grid (T, L / 256): a thread per output element, its k loads independent.
template <class T>
__global__ void combine_kernel(const float* expert_out, int64_t L, const float* p, int64_t p_ld, int k,
                               const int* bad, T* out, int64_t out_ld, bool round) {
  const int64_t t = blockIdx.x, l = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (l >= L) return;
  const float* pt = p + t * p_ld;
  float acc = 0.0f;
#pragma unroll 8
  for (int j = 0; j < k; ++j) acc += pt[j] * expert_out[(t * k + j) * L + l];
  store_act(out + t * out_ld + l, bad[t] ? NAN : acc, round);
}

core::Status experts_supports(const CudaOps& ops, const MoeExpertsArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"z", &a.z}, {"ids", &a.ids}, {"weights", &a.weights}, {"out", &a.out}}); !s) return s;
  if (auto s = same_act({{"z", &a.z}, {"out", &a.out}}, a.precision); !s) return s;
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

void experts_run(const CudaOps& ops, const MoeExpertsArgs& a) {
  const int64_t T_all = a.z.dim(0), L = a.z.dim(1);
  const int k = static_cast<int>(a.ids.dim(1)), E = static_cast<int>(a.w1.size());
  const int64_t I = a.w1[0].out_features();
  if (T_all == 0) return;
  const cudaStream_t stream = ops.ctx->stream();
  const bool round = a.precision == Precision::bf16;

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
  int* offsets = static_cast<int*>(ints.get());
  int* order = offsets + E + 1;
  int* bad = order + piece * k;
  int* active = bad + piece;
  int* n_active = active + E;
  float* h = static_cast<float*>(h_buf.get());
  float* eo = static_cast<float*>(e_buf.get());

  with_act(a.z.dtype, [&](auto tag) {
    using XT = typename decltype(tag)::type;
    for (int64_t t0 = 0; t0 < T_all; t0 += piece) {
      const int64_t T = std::min(piece, T_all - t0);
      const XT* z = a.z.as<const XT>() + t0 * a.z.strides[0];
      sort_routes_kernel<<<1, kSortThreads, 0, stream>>>(a.ids.as<const int32_t>() + t0 * a.ids.strides[0],
                                                         a.ids.strides[0], T, k, E, offsets, order, bad, active,
                                                         n_active);
      K3_CUDA_CHECK_LAUNCH("sort_routes_kernel");
      const unsigned slots = static_cast<unsigned>(std::min<int64_t>(E, T * k));  // distinct experts <= routes
      with_wfmt(fmt, [&](auto fc) {
        constexpr WFmt FC = decltype(fc)::value;
        // B: gate/up rows (I of them, `L` wide) against z.
        const bool vec_b = aligned && vector_ok(fmt, r1, L, z, a.z.strides[0], sizeof(XT)) &&
                           vector_ok(fmt, r3, L, z, a.z.strides[0], sizeof(XT));
        const auto launch_b = [&](auto kernel, int width) {
          const dim3 grid(grid_for(I, kRowdotThreads / width), slots);
          kernel<<<grid, kRowdotThreads, 0, stream>>>(tab, offsets, order, active, n_active, z, a.z.strides[0], k, I,
                                                     L, h, I, width, a.beta, a.linear_beta, round);
          K3_CUDA_CHECK_LAUNCH("expert_rows_kernel<gate_up>");
        };
        if (vec_b)
          launch_b(expert_rows_kernel<true, FC, true, XT>, segment_width<FC, true>(L));
        else
          launch_b(expert_rows_kernel<true, FC, false, XT>, segment_width<FC, false>(L));
        // C: down rows (L of them, `I` wide) against h.
        const bool vec_c = aligned && vector_ok(fmt, r2, I, h, I, sizeof(float));
        const auto launch_c = [&](auto kernel, int width) {
          const dim3 grid(grid_for(L, kRowdotThreads / width * kDownRows), slots);
          kernel<<<grid, kRowdotThreads, 0, stream>>>(tab, offsets, order, active, n_active,
                                                     static_cast<const float*>(h), I, k, L, I, eo, L, width, a.beta,
                                                     a.linear_beta, round);
          K3_CUDA_CHECK_LAUNCH("expert_rows_kernel<down>");
        };
        if (vec_c)
          launch_c(expert_rows_kernel<false, FC, true, float>, segment_width<FC, true>(I));
        else
          launch_c(expert_rows_kernel<false, FC, false, float>, segment_width<FC, false>(I));
      });
      combine_kernel<XT><<<dim3(static_cast<unsigned>(T), grid_for(L, 256)), 256, 0, stream>>>(
          eo, L, a.weights.as<const float>() + t0 * a.weights.strides[0], a.weights.strides[0], k, bad,
          a.out.as<XT>() + t0 * a.out.strides[0], a.out.strides[0], round);
      K3_CUDA_CHECK_LAUNCH("combine_kernel");
    }
  });
}

}  // namespace

void register_moe_experts_cuda(Registry& r, const CudaOps& ops) {
  r.moe_experts.add({"cuda_expert_rowdot", core::Device::cuda, 10,
                     [ops](const MoeExpertsArgs& a) { return experts_supports(ops, a); },
                     [ops](const MoeExpertsArgs& a) { experts_run(ops, a); }});
}

}  // namespace k3::kernels
