// kernels/moe/cuda_experts_mma.cuh: the routed experts' MXFP4 kernels on tensor cores for bf16
// activations (z and h bf16 values: the engine's mode; included by cuda_experts.cu only). Same
// items, groups and cp.async pipeline as cuda_experts_mxfp4.cuh, but each 16-byte code chunk is
// decoded to exact bf16 weights (value * scale; the E8M0 scale is a power of two) and multiplied
// by mma.sync m16n8k16 (bf16 in, fp32 accumulation): 16 weight rows x up to 8 routes per
// instruction, a few integer operations per weight instead of a decode, a widen and an FMA.
//
// Fragment mapping (m16n8k16, g = lane / 4, c = lane % 4): in a 32-value chunk, lane c takes code
// word c (values 8c .. 8c + 7). The sum over k does not care which physical column each logical k
// is, as long as A and B agree: step 0 feeds the pairs (8c, 8c+4) and (8c+1, 8c+5), step 1 the
// pairs (8c+2, 8c+6) and (8c+3, 8c+7), which is exactly how decode_word pairs nibbles n and n + 4;
// B takes the same pairs of the route's activations with a byte permute.
// Weights must be row-contiguous (each expert matrix [rows, in/2] codes, [rows, in/32] scales), so
// an item's rows are one contiguous span.
#pragma once
#include "kernels/moe/cuda_experts_mxfp4.cuh"

namespace k3::kernels::cuda_detail::fp4_experts {

constexpr int kMmaRoutes = 8;      // the sorted form: routes per pass (the n = 8 of the mma)
constexpr int kDownMmaRows = 128;  // down rows per item: 16 per warp

// Raw bf16 pairs of a code word: pair i holds nibbles i (low) and i + 4 (high) as value * 2^-126
// (see decode_word).
__device__ __forceinline__ void raw_pairs(uint32_t w, uint32_t (&p)[4]) {
  constexpr uint32_t kMag = 0x01C001C0u;
  const uint32_t m = w & 0x77777777u, s_even = w & 0x08080808u, s_odd = w & 0x80808080u;
  p[0] = ((m << 6) & kMag) | ((s_even << 12) & ~kMag);
  p[1] = ((m << 2) & kMag) | ((s_odd << 8) & ~kMag);
  p[2] = ((m >> 2) & kMag) | ((s_even << 4) & ~kMag);
  p[3] = ((m >> 6) & kMag) | (s_odd & ~kMag);
}

// Multiplies raw pairs (value * 2^-126) by 2^126 * scale = 2^(e - 1) for the E8M0 exponent e,
// exactly: one bf16 multiply while 2^(e - 1) is a bf16 (e <= 128), else 2^126 then 2^(e - 127);
// e = 255 (NaN) gives NaN.
__device__ __forceinline__ void scale_pairs(uint32_t (&p)[4], uint32_t e) {
  const bool big = e > 128 && e < 255;
  const uint32_t first = e == 255 ? 0x7FC07FC0u : big ? 0x7E807E80u : ((e + 126) << 7) * 0x10001u;
  const uint32_t second = ((e > 127 ? e : 127) << 7) * 0x10001u;  // 2^(e - 127), used when big
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&p[i]),
                               *reinterpret_cast<const __nv_bfloat162*>(&first));
    if (big) v = __hmul2(v, *reinterpret_cast<const __nv_bfloat162*>(&second));
    p[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

// The B pairs of 8 activations x[0..7] (bf16, one uint4): (x0, x4), (x1, x5), (x2, x6), (x3, x7).
__device__ __forceinline__ void act_pairs(const uint4& x, uint32_t (&b)[4]) {
  b[0] = __byte_perm(x.x, x.z, 0x5410);
  b[1] = __byte_perm(x.x, x.z, 0x7632);
  b[2] = __byte_perm(x.y, x.w, 0x5410);
  b[3] = __byte_perm(x.y, x.w, 0x7632);
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One chunk: d += A(rows lo, hi: code words wl, wh with exponents el, eh) x B(activation uint4 x).
__device__ __forceinline__ void chunk_mma(uint32_t wl, uint32_t wh, uint32_t el, uint32_t eh, const uint4& x,
                                          float (&d0)[4], float (&d1)[4]) {
  uint32_t lo[4], hi[4], b[4];
  raw_pairs(wl, lo);
  raw_pairs(wh, hi);
  scale_pairs(lo, el);
  scale_pairs(hi, eh);
  act_pairs(x, b);
  mma_bf16(d0, lo[0], hi[0], lo[1], hi[1], b[0], b[1]);  // step 0: pairs 0 and 1
  mma_bf16(d1, lo[2], hi[2], lo[3], hi[3], b[2], b[3]);  // step 1: pairs 2 and 3
}

// Copies rows [row0, row0 + rows) of a row-contiguous code matrix (`chunks` 16-byte chunks a row;
// rows from `limit` on are skipped) to shared rows `stride` bytes apart.
__device__ __forceinline__ void issue_rows(const uint8_t* codes, int64_t row0, int rows, int64_t limit, int chunks,
                                           uint8_t* smem, int stride) {
  const int valid = static_cast<int>(min(static_cast<int64_t>(rows), limit - row0));
  const uint8_t* src = codes + row0 * chunks * 16;
  for (int i = threadIdx.x; i < valid * chunks; i += kThreads) {
    const int r = i / chunks, c = i - r * chunks;
    cp_async16(smem + r * stride + c * 16, src + static_cast<int64_t>(i) * 16);
  }
}
// Scale bytes [first, first + rows * chunks) of the item's scale block (row-major [.][chunks]) from
// a row-contiguous scale matrix: byte b = threadIdx.x + u * kThreads goes to sc[u].
__device__ __forceinline__ void gather_scales(const uint8_t* scales, int64_t row0, int rows, int64_t limit, int chunks,
                                              int first, uint32_t (&sc)[kMaxScalesPerThread]) {
  const int valid = static_cast<int>(min(static_cast<int64_t>(rows), limit - row0)) * chunks;
  const uint8_t* src = scales + row0 * chunks;
#pragma unroll
  for (int u = 0; u < kMaxScalesPerThread; ++u) {
    const int b = static_cast<int>(threadIdx.x) + u * kThreads - first;
    if (b >= 0 && b < valid) sc[u] = __ldg(src + b);
  }
}

// ---------------------------------------------------------------- gate/up

// One stage: 16 code rows (gate rows of the tile, then its up rows) `L/2 + 16` bytes apart (the pad
// spreads the 8 rows of a fragment over all banks), then their scales [16][L/32].
__host__ __device__ inline int mma_gate_up_stride(int64_t L) { return static_cast<int>(L / 2 + 16); }
__host__ __device__ inline int mma_gate_up_stage_bytes(int64_t L) {
  return 16 * mma_gate_up_stride(L) + static_cast<int>((16 * (L / 32) + 15) / 16 * 16);
}

// h[route][row] = round(SiTU(round(W1[row] . z_t), round(W3[row] . z_t))) for kGateUpRows rows per
// item: mma rows 0..7 are the gate rows, 8..15 the up rows; warp w sums chunks [w * per, (w + 1) *
// per) and the 8 warps' partial sums meet in shared memory in warp order.
template <bool SORTED>
__global__ void __launch_bounds__(kThreads)
    gate_up_mma_kernel(ExpertTable tab, RouteSource rs, const bf16* z, int64_t z_ld, int64_t I, int64_t L, bf16* h,
                       float beta, float linear_beta) {
  constexpr int R = SORTED ? kMmaRoutes : 1, ROWS = kGateUpRows, WARPS = kThreads / 32;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int ids_s[SORTED ? 1 : kScanMaxRoutes];
  __shared__ float red[WARPS][32][4];
  __shared__ int routes_s[kMmaRoutes];
  const int chunks = static_cast<int>(L / 32), stride = mma_gate_up_stride(L), stage = mma_gate_up_stage_bytes(L);
  const int scale_at = 16 * stride, per = (chunks + WARPS - 1) / WARPS;
  const int tiles = static_cast<int>((I + ROWS - 1) / ROWS);
  const int n_items = load_groups<SORTED>(rs, ids_s) * tiles, step = static_cast<int>(gridDim.x);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const auto token_of = [&](int route) { return static_cast<int64_t>(route / rs.k); };
  const auto group_of_item = [&](int item) {
    return item < n_items ? group_at<SORTED>(rs, ids_s, item / tiles) : Group{-1, 0, 0};
  };
  const auto issue = [&](const Group& gr, int item, int s, uint32_t(&sc)[kMaxScalesPerThread], int(&route)[R]) {
    first_routes<SORTED, R>(rs, gr, route);
    if (gr.e < 0) return;
    uint8_t* base = smem + s * stage;
    const int64_t row0 = static_cast<int64_t>(item % tiles) * ROWS;
    const WeightRef w1 = tab.w1(gr.e), w3 = tab.w3(gr.e);
    issue_rows(static_cast<const uint8_t*>(w1.data), row0, ROWS, I, chunks, base, stride);
    issue_rows(static_cast<const uint8_t*>(w3.data), row0, ROWS, I, chunks, base + ROWS * stride, stride);
    gather_scales(w1.scale, row0, ROWS, I, chunks, 0, sc);
    gather_scales(w3.scale, row0, ROWS, I, chunks, ROWS * chunks, sc);
  };

  int item = blockIdx.x;
  if (item >= n_items) return;
  uint32_t sc[kMaxScalesPerThread] = {};
  int cur_route[R], nxt_route[R];
  Group cur = group_of_item(item), ahead = group_of_item(item + step);
  issue(cur, item, 0, sc, cur_route);
  cp_async_commit();
  if (cur.e >= 0) store_scales(sc, 16 * chunks, smem + scale_at);
  for (int s = 0; item < n_items; item += step, s ^= 1) {
    const int next = item + step;
    const Group nxt = ahead;
    ahead = group_of_item(next + step);
    issue(nxt, next, s ^ 1, sc, nxt_route);
    cp_async_commit();
    cp_async_wait_all_but_one();
    __syncthreads();
    if (cur.e >= 0) {
      const uint8_t* base = smem + s * stage;
      const int64_t row0 = static_cast<int64_t>(item % tiles) * ROWS;
      const int c0 = warp * per, c1 = min(chunks, c0 + per);
      for (int r0 = 0; r0 < cur.count; r0 += R) {
        const int nr = min(R, cur.count - r0);
#pragma unroll
        for (int j = 0; j < R; ++j)
          if (static_cast<int>(threadIdx.x) == j)
            routes_s[j] = r0 == 0 ? cur_route[j] : route_at<SORTED>(rs, cur, r0 + (j < nr ? j : 0));
        __syncthreads();
        const bool has_x = g < nr;
        const bf16* x = z + token_of(routes_s[has_x ? g : 0]) * z_ld + 8 * c;
        float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int ch = c0; ch < c1; ++ch) {
          const uint32_t wg = *reinterpret_cast<const uint32_t*>(base + g * stride + ch * 16 + 4 * c);
          const uint32_t wu = *reinterpret_cast<const uint32_t*>(base + (ROWS + g) * stride + ch * 16 + 4 * c);
          const uint32_t eg = base[scale_at + g * chunks + ch], eu = base[scale_at + (ROWS + g) * chunks + ch];
          const uint4 xv = has_x ? *reinterpret_cast<const uint4*>(x + ch * 32) : make_uint4(0, 0, 0, 0);
          chunk_mma(wg, wu, eg, eu, xv, d0, d1);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp][lane][i] = d0[i] + d1[i];
        __syncthreads();
        if (warp == 0) {
          float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // gate(g, 2c), gate(g, 2c+1), up(g, 2c), up(g, 2c+1)
          for (int w = 0; w < WARPS; ++w)
#pragma unroll
            for (int i = 0; i < 4; ++i) sum[i] += red[w][lane][i];
          const int64_t row = row0 + g;
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            const int n = 2 * c + t;
            if (n < nr && row < I) {
              const float a = round_bf16(sum[t]), u = round_bf16(sum[2 + t]);
              const float gate_act = beta * tanhf(a / beta) * sigmoid_f32(a);
              const float up_act = linear_beta * tanhf(u / linear_beta);
              h[static_cast<int64_t>(routes_s[n]) * I + row] = __float2bfloat16_rn(gate_act * up_act);
            }
          }
        }
        __syncthreads();  // red and routes_s are reused by the next pass
      }
    }
    prefetch_rows(nxt, nxt_route, z, z_ld, L * static_cast<int64_t>(sizeof(bf16)), token_of);
    if (nxt.e >= 0) store_scales(sc, 16 * chunks, smem + (s ^ 1) * stage + scale_at);
    cur = nxt;
#pragma unroll
    for (int j = 0; j < R; ++j) cur_route[j] = nxt_route[j];
    __syncthreads();
  }
}

// ---------------------------------------------------------------- down

__host__ __device__ inline int mma_down_stride(int64_t I) { return static_cast<int>(I / 2 + 16); }
__host__ __device__ inline int mma_down_stage_bytes(int64_t I) {
  return kDownMmaRows * mma_down_stride(I) + static_cast<int>((kDownMmaRows * (I / 32) + 15) / 16 * 16);
}

// eo[route][row] = round?(W2[row] . h_route): warp w owns rows 16 w .. 16 w + 15 of the item.
template <bool SORTED>
__global__ void __launch_bounds__(kThreads)
    down_mma_kernel(ExpertTable tab, RouteSource rs, const bf16* h, int64_t I, int64_t L, float* eo, bool round) {
  constexpr int R = SORTED ? kMmaRoutes : 1, ROWS = kDownMmaRows;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int ids_s[SORTED ? 1 : kScanMaxRoutes];
  __shared__ int routes_s[kMmaRoutes];
  const int chunks = static_cast<int>(I / 32), stride = mma_down_stride(I), stage = mma_down_stage_bytes(I);
  const int scale_at = ROWS * stride;
  const int tiles = static_cast<int>((L + ROWS - 1) / ROWS);
  const int n_items = load_groups<SORTED>(rs, ids_s) * tiles, step = static_cast<int>(gridDim.x);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const auto self = [](int route) { return static_cast<int64_t>(route); };
  const auto group_of_item = [&](int item) {
    return item < n_items ? group_at<SORTED>(rs, ids_s, item / tiles) : Group{-1, 0, 0};
  };
  const auto issue = [&](const Group& gr, int item, int s, uint32_t(&sc)[kMaxScalesPerThread], int(&route)[R]) {
    first_routes<SORTED, R>(rs, gr, route);
    if (gr.e < 0) return;
    const WeightRef w2 = tab.w2(gr.e);
    const int64_t row0 = static_cast<int64_t>(item % tiles) * ROWS;
    issue_rows(static_cast<const uint8_t*>(w2.data), row0, ROWS, L, chunks, smem + s * stage, stride);
    gather_scales(w2.scale, row0, ROWS, L, chunks, 0, sc);
  };

  int item = blockIdx.x;
  if (item >= n_items) return;
  uint32_t sc[kMaxScalesPerThread] = {};
  int cur_route[R], nxt_route[R];
  Group cur = group_of_item(item), ahead = group_of_item(item + step);
  issue(cur, item, 0, sc, cur_route);
  cp_async_commit();
  if (cur.e >= 0) store_scales(sc, ROWS * chunks, smem + scale_at);
  for (int s = 0; item < n_items; item += step, s ^= 1) {
    const int next = item + step;
    const Group nxt = ahead;
    ahead = group_of_item(next + step);
    issue(nxt, next, s ^ 1, sc, nxt_route);
    cp_async_commit();
    cp_async_wait_all_but_one();
    __syncthreads();
    if (cur.e >= 0) {
      const uint8_t* base = smem + s * stage;
      const int lo = warp * 16 + g, hi = lo + 8;  // the item's rows of this lane's fragments
      const int64_t row0 = static_cast<int64_t>(item % tiles) * ROWS;
      for (int r0 = 0; r0 < cur.count; r0 += R) {
        const int nr = min(R, cur.count - r0);
#pragma unroll
        for (int j = 0; j < R; ++j)
          if (static_cast<int>(threadIdx.x) == j)
            routes_s[j] = r0 == 0 ? cur_route[j] : route_at<SORTED>(rs, cur, r0 + (j < nr ? j : 0));
        __syncthreads();
        const bool has_x = g < nr;
        const bf16* x = h + static_cast<int64_t>(routes_s[has_x ? g : 0]) * I + 8 * c;
        float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int ch = 0; ch < chunks; ++ch) {
          const uint32_t wl = *reinterpret_cast<const uint32_t*>(base + lo * stride + ch * 16 + 4 * c);
          const uint32_t wh = *reinterpret_cast<const uint32_t*>(base + hi * stride + ch * 16 + 4 * c);
          const uint32_t el = base[scale_at + lo * chunks + ch], eh = base[scale_at + hi * chunks + ch];
          const uint4 xv = has_x ? *reinterpret_cast<const uint4*>(x + ch * 32) : make_uint4(0, 0, 0, 0);
          chunk_mma(wl, wh, el, eh, xv, d0, d1);
        }
        // d: (row lo, route 2c), (lo, 2c + 1), (hi, 2c), (hi, 2c + 1)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int n = 2 * c + (i & 1);
          const int64_t row = row0 + (i < 2 ? lo : hi);
          if (n < nr && row < L) eo[static_cast<int64_t>(routes_s[n]) * L + row] = round_if(d0[i] + d1[i], round);
        }
        __syncthreads();  // routes_s is reused by the next pass
      }
    }
    prefetch_rows(nxt, nxt_route, h, I, I * static_cast<int64_t>(sizeof(bf16)), self);
    if (nxt.e >= 0) store_scales(sc, ROWS * chunks, smem + (s ^ 1) * stage + scale_at);
    cur = nxt;
#pragma unroll
    for (int j = 0; j < R; ++j) cur_route[j] = nxt_route[j];
    __syncthreads();
  }
}

}  // namespace k3::kernels::cuda_detail::fp4_experts
