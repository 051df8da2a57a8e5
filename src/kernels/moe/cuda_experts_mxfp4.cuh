// kernels/moe/cuda_experts_mxfp4.cuh: the routed experts' MXFP4 kernels on CUDA cores (f32
// activations; bf16 ones take cuda_experts_mma.cuh, which shares the groups and the pipeline
// below), included by cuda_experts.cu only, made to stream the experts' packed codes at any batch,
// batch 1 included. Work items:
//   gate/up: (group, tile of kGateUpRows intermediate rows): a warp per row reads its gate and up
//            codes, decodes them in registers and sums against the group's routes;
//            h = round(SiTU(round(W1 z), round(W3 z)));
//   down:    (group, tile of latent rows): a segment of lanes per row, the same walk over W2 and h;
//   combine: u_t = round(sum_j p_tj e_tj) in route order j (fixed order, no atomics).
// A group is one expert with its routes. The route form (few routes) makes every route its own
// group (an expert picked by two tokens is read twice, from L2 the second time); the sorted form
// takes the expert groups of the sort kernel (kGroupRoutes routes share one pass over the rows).
// Blocks are persistent (about as many as fit on the device) and walk the items in a fixed
// stride; each block keeps two stages of shared memory: while it computes one item, the codes of
// its next item stream in with cp.async (16-byte copies, nothing held in registers) and its scales
// in registers, so every SM keeps tens of KB of weight reads in flight.
// Each route's sums depend only on its own token and a fixed lane/chunk order, never on the
// grouping or the grid, so results are the same run to run and whatever the batch around it.
#pragma once
#include "kernels/cuda_common.cuh"

namespace k3::kernels::cuda_detail {

constexpr int kWordsPerExpert = 6;  // w1, w1 scale, w3, w3 scale, w2, w2 scale

// Expert parallelism (MoeExpertsArgs::expert_begin / num_experts): ids are global; a rank holds
// experts [e_begin, e_begin + held) and its ExpertTable indexes them from 0. The held index of
// route id `id`, or -1 when another rank holds it or id is bad (unsigned arithmetic: no overflow
// for any i32 id, as e_begin + held <= 2^31 - 1).
__host__ __device__ __forceinline__ int held_expert(int32_t id, int e_begin, int held) {
  const uint32_t e = static_cast<uint32_t>(id) - static_cast<uint32_t>(e_begin);
  return e < static_cast<uint32_t>(held) ? static_cast<int>(e) : -1;
}
// An id outside [0, e_total) (the router's NaN marker -1, or garbage): its token's row is NaN.
__host__ __device__ __forceinline__ bool bad_expert_id(int32_t id, int e_total) { return id < 0 || id >= e_total; }

// Per-expert weight pointers (a device table) and the layout all experts share.
struct ExpertTable {
  const uint64_t* words;  // [E][6]
  int64_t ld1, sld1, ld3, sld3, ld2, sld2;
  __device__ WeightRef w1(int e) const { return {ptr(e, 0), scale(e, 1), ld1, sld1}; }
  __device__ WeightRef w3(int e) const { return {ptr(e, 2), scale(e, 3), ld3, sld3}; }
  __device__ WeightRef w2(int e) const { return {ptr(e, 4), scale(e, 5), ld2, sld2}; }
  __device__ const void* ptr(int e, int i) const { return reinterpret_cast<const void*>(words[e * 6 + i]); }
  __device__ const uint8_t* scale(int e, int i) const { return reinterpret_cast<const uint8_t*>(words[e * 6 + i]); }
};

namespace fp4_experts {

constexpr int kThreads = 256;
constexpr int kGateUpRows = kThreads / 32;  // gate/up rows per item: a warp each
constexpr int kMaxScalesPerThread = 8;      // an item's scale bytes / kThreads, at most
constexpr int kScanMaxRoutes = kThreads;    // the route form: the ids fit one per thread
// Routes of one expert sharing one pass over its rows in the sorted form.
constexpr int kGroupRoutes = 4;

// ---------------------------------------------------------------- MXFP4 decode

// The 8 E2M1 values of a code word (value n = nibble n, exactly). Nibbles n and n + 4 are built
// as one bf16 pair: magnitude bits (e1 e0 m) at bf16 bits 6..8, sign at 15, which reads as
// value * 2^-126 (code 1, 0.5, lands on the bf16 subnormal 2^-127); one bf16x2 multiply by 2^126
// (exact) makes both values, and each widens to f32 by a shift or a mask. Signs of nibbles at an
// even distance from n land inside the magnitude mask (and are dropped) or outside the word; the
// others are masked off first, so one 3-input logic op merges magnitudes and signs.
__device__ __forceinline__ void decode_word(uint32_t w, float (&v)[8]) {
  constexpr uint32_t kMag = 0x01C001C0u;
  const uint32_t m = w & 0x77777777u, s_even = w & 0x08080808u, s_odd = w & 0x80808080u;
  const uint32_t mags[4] = {m << 6, m << 2, m >> 2, m >> 6};
  const uint32_t signs[4] = {s_even << 12, s_odd << 8, s_even << 4, s_odd};
  const __nv_bfloat162 k2p126 = __halves2bfloat162(__ushort_as_bfloat16(0x7E80), __ushort_as_bfloat16(0x7E80));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t raw = (mags[i] & kMag) | (signs[i] & ~kMag);
    const __nv_bfloat162 pair = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&raw), k2p126);
    const uint32_t bits = *reinterpret_cast<const uint32_t*>(&pair);
    v[i] = __uint_as_float(bits << 16);              // nibble i (low half)
    v[i + 4] = __uint_as_float(bits & 0xffff0000u);  // nibble i + 4 (high half)
  }
}

// acc[m][j] += scale[m] * sum_{i<32} fp4(q[m], i) * x_j[col + i] for MR rows and j < nr routes: the
// chunk's sum runs on the unscaled E2M1 values and takes the (power of two) scale once.
template <int MR, int R, class XT>
__device__ __forceinline__ void chunk_dot(const uint4 (&q)[MR], const float (&scale)[MR], const XT* const (&x)[R],
                                          int64_t col, int nr, float (&acc)[MR][R]) {
  float part[MR][R];
#pragma unroll
  for (int m = 0; m < MR; ++m)
#pragma unroll
    for (int j = 0; j < R; ++j) part[m][j] = 0.0f;
#pragma unroll
  for (int word = 0; word < 4; ++word) {
    float w[MR][8];
#pragma unroll
    for (int m = 0; m < MR; ++m)
      decode_word(word == 0 ? q[m].x : word == 1 ? q[m].y : word == 2 ? q[m].z : q[m].w, w[m]);
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (j < nr) {
        float xv[8];
        load_act_n<8>(x[j] + col + 8 * word, xv);
#pragma unroll
        for (int m = 0; m < MR; ++m)
#pragma unroll
          for (int n = 0; n < 8; ++n) part[m][j] = fmaf(w[m][n], xv[n], part[m][j]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < MR; ++m)
#pragma unroll
    for (int j = 0; j < R; ++j) acc[m][j] = fmaf(part[m][j], scale[m], acc[m][j]);
}

// ---------------------------------------------------------------- cp.async

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all_but_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

// ---------------------------------------------------------------- groups

// Where the groups come from (see the file comment).
struct RouteSource {
  const int32_t* ids;  // [T, k] global expert ids, rows ids_ld apart
  int64_t ids_ld;
  int k, routes, E;  // E: the held experts (the table's), [e_begin, e_begin + E) of the global ids
  int e_begin;
  const int4* groups;  // sorted form: [*n_active] {expert, first index into order, route count, 0}
  const int* order;    // sorted form: route indices grouped by expert
  const int* n_active;
};

struct Group {
  int e, begin, count;  // e: held index; e < 0: nothing to do (route form: a bad or another rank's id)
};

// The route form reads the ids into shared memory once per block (ids_s); the sorted form reads
// its group table.
template <bool SORTED>
__device__ __forceinline__ Group group_at(const RouteSource& rs, const int* ids_s, int g) {
  if constexpr (SORTED) {
    const int4 v = rs.groups[g];
    return {v.x, v.y, v.z};
  } else {
    return {held_expert(ids_s[g], rs.e_begin, rs.E), g, 1};
  }
}
template <bool SORTED>
__device__ __forceinline__ int route_at(const RouteSource& rs, const Group& g, int j) {
  if constexpr (SORTED) return rs.order[g.begin + j];
  else return g.begin + j;
}
template <bool SORTED>
__device__ __forceinline__ int load_groups(const RouteSource& rs, int* ids_s) {
  if constexpr (SORTED) {
    return *rs.n_active;
  } else {
    for (int q = threadIdx.x; q < rs.routes; q += blockDim.x) ids_s[q] = rs.ids[(q / rs.k) * rs.ids_ld + q % rs.k];
    __syncthreads();
    return rs.routes;
  }
}

// One weight matrix tile of an item: `rows` rows from `row0` (rows past `limit` are not read),
// `chunks` 16-byte code chunks and `chunks` scale bytes per row. Codes go to smem_codes
// [rows][chunks * 16] by cp.async; scale byte b of the tile (row b / chunks) into sc[u] for
// b = threadIdx.x + u * kThreads.
struct TileRef {
  const uint8_t* codes;
  const uint8_t* scales;
  int64_t ld, sld, row0, limit;
};
__device__ __forceinline__ void issue_codes(const TileRef& t, int rows, int chunks, uint8_t* smem_codes) {
  const int n = rows * chunks;
  for (int b = threadIdx.x; b < n; b += kThreads) {
    const int r = b / chunks, c = b - r * chunks;
    if (t.row0 + r < t.limit)
      cp_async16(smem_codes + static_cast<int64_t>(b) * 16, t.codes + (t.row0 + r) * t.ld + c * 16);
  }
}
__device__ __forceinline__ void load_scales(const TileRef& t, int rows, int chunks, int first,
                                            uint32_t (&sc)[kMaxScalesPerThread]) {
  const int n = rows * chunks;
#pragma unroll
  for (int u = 0; u < kMaxScalesPerThread; ++u) {
    const int b = threadIdx.x + u * kThreads - first;  // this tile's byte b
    sc[u] = 0;
    if (b >= 0 && b < n) {
      const int r = b / chunks, c = b - r * chunks;
      if (t.row0 + r < t.limit) sc[u] = __ldg(t.scales + (t.row0 + r) * t.sld + c);
    }
  }
}
// Stores the scale bytes that load_scales of every tile of the item gathered (tiles back to back).
__device__ __forceinline__ void store_scales(const uint32_t (&sc)[kMaxScalesPerThread], int n, uint8_t* smem_scales) {
#pragma unroll
  for (int u = 0; u < kMaxScalesPerThread; ++u) {
    const int b = threadIdx.x + u * kThreads;
    if (b < n) smem_scales[b] = static_cast<uint8_t>(sc[u]);
  }
}

// The first min(R, count) routes of a group (the rest repeat the first: valid, unused).
template <bool SORTED, int R>
__device__ __forceinline__ void first_routes(const RouteSource& rs, const Group& g, int (&route)[R]) {
#pragma unroll
  for (int j = 0; j < R; ++j) route[j] = g.e >= 0 ? route_at<SORTED>(rs, g, j < g.count ? j : 0) : 0;
}
// Brings the activation rows of a group's first routes into L1 (x + row(route) * ld, `bytes`
// each) while the block waits for the group's codes.
template <int R, class T, class RowOf>
__device__ __forceinline__ void prefetch_rows(const Group& g, const int (&route)[R], const T* x, int64_t ld,
                                              int64_t bytes, RowOf row_of) {
  if (g.e < 0) return;
  const int lines = static_cast<int>((bytes + 127) / 128), n = min(R, g.count) * lines;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const char* p = reinterpret_cast<const char*>(x + row_of(route[i / lines]) * ld) + (i % lines) * 128;
    asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
  }
}

// ---------------------------------------------------------------- gate/up

// Shared memory of one stage: gate codes [rows][L/2], up codes [rows][L/2], then gate scales
// [rows][L/32] and up scales [rows][L/32] (padded to 16 bytes).
__host__ __device__ inline int gate_up_stage_bytes(int64_t L) {
  return static_cast<int>(2 * kGateUpRows * (L / 2) + (2 * kGateUpRows * (L / 32) + 15) / 16 * 16);
}

// h[route][row] = round(SiTU(round(W1[row] . z_t), round(W3[row] . z_t))). HT is bf16 when rounding
// (h is a bf16 value then) and f32 otherwise. Items: group * tiles + tile, block b takes b, b +
// gridDim.x, ...
template <class XT, class HT, bool SORTED>
__global__ void __launch_bounds__(kThreads)
    gate_up_kernel(ExpertTable tab, RouteSource rs, const XT* z, int64_t z_ld, int64_t I, int64_t L, HT* h, float beta,
                   float linear_beta, bool round) {
  constexpr int R = SORTED ? kGroupRoutes : 1, ROWS = kGateUpRows;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int ids_s[SORTED ? 1 : kScanMaxRoutes];
  const int chunks = static_cast<int>(L / 32), stage = gate_up_stage_bytes(L);
  const int code_bytes = 2 * ROWS * chunks * 16, tile_scales = ROWS * chunks;
  const int tiles = static_cast<int>((I + ROWS - 1) / ROWS);
  const int n_items = load_groups<SORTED>(rs, ids_s) * tiles, step = static_cast<int>(gridDim.x);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const auto token_of = [&](int route) { return static_cast<int64_t>(route / rs.k); };
  const auto group_of_item = [&](int item) {
    return item < n_items ? group_at<SORTED>(rs, ids_s, item / tiles) : Group{-1, 0, 0};
  };
  const auto tile_of = [&](const Group& g, int item, int m) {  // m: 0 gate, 1 up
    const WeightRef w = m == 0 ? tab.w1(g.e) : tab.w3(g.e);
    return TileRef{static_cast<const uint8_t*>(w.data),       w.scale, w.ld, w.scale_ld,
                   static_cast<int64_t>(item % tiles) * ROWS, I};
  };
  // Starts the copies of `item` into stage s and gathers its scales and first routes.
  const auto issue = [&](const Group& g, int item, int s, uint32_t(&sc)[kMaxScalesPerThread], int(&route)[R]) {
    first_routes<SORTED, R>(rs, g, route);
    if (g.e < 0) return;
    uint8_t* base = smem + s * stage;
    for (int m = 0; m < 2; ++m) issue_codes(tile_of(g, item, m), ROWS, chunks, base + m * (code_bytes / 2));
    uint32_t a[kMaxScalesPerThread], b[kMaxScalesPerThread];
    load_scales(tile_of(g, item, 0), ROWS, chunks, 0, a);
    load_scales(tile_of(g, item, 1), ROWS, chunks, tile_scales, b);
#pragma unroll
    for (int u = 0; u < kMaxScalesPerThread; ++u) sc[u] = a[u] | b[u];  // disjoint byte ranges
  };

  int item = blockIdx.x;
  if (item >= n_items) return;
  uint32_t sc[kMaxScalesPerThread] = {};
  int cur_route[R], nxt_route[R];
  Group cur = group_of_item(item), ahead = group_of_item(item + step);
  issue(cur, item, 0, sc, cur_route);
  cp_async_commit();
  if (cur.e >= 0) store_scales(sc, 2 * tile_scales, smem + code_bytes);
  for (int s = 0; item < n_items; item += step, s ^= 1) {
    const int next = item + step;
    const Group nxt = ahead;
    ahead = group_of_item(next + step);  // its load overlaps this item
    issue(nxt, next, s ^ 1, sc, nxt_route);
    cp_async_commit();
    cp_async_wait_all_but_one();  // this item's codes have landed
    __syncthreads();
    if (cur.e >= 0) {
      const uint8_t* base = smem + s * stage;
      const int64_t row = static_cast<int64_t>(item % tiles) * ROWS + warp;
      const bool row_ok = row < I;
      for (int r0 = 0; r0 < cur.count; r0 += R) {
        const int nr = min(R, cur.count - r0);
        int route[R];
        const XT* xs[R];
#pragma unroll
        for (int j = 0; j < R; ++j) {
          route[j] = r0 == 0 ? cur_route[j] : route_at<SORTED>(rs, cur, r0 + (j < nr ? j : 0));
          xs[j] = z + token_of(route[j]) * z_ld;
        }
        float acc[2][R];
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int j = 0; j < R; ++j) acc[m][j] = 0.0f;
        if (row_ok)
          for (int c = lane; c < chunks; c += 32) {
            const uint4 q[2] = {reinterpret_cast<const uint4*>(base + warp * chunks * 16)[c],
                                reinterpret_cast<const uint4*>(base + code_bytes / 2 + warp * chunks * 16)[c]};
            const float scale[2] = {e8m0_value(base[code_bytes + warp * chunks + c]),
                                    e8m0_value(base[code_bytes + tile_scales + warp * chunks + c])};
            chunk_dot<2, R, XT>(q, scale, xs, static_cast<int64_t>(c) * 32, nr, acc);
          }
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int j = 0; j < R; ++j) acc[m][j] = warp_sum(acc[m][j]);
        if (row_ok && lane == 0)
#pragma unroll
          for (int j = 0; j < R; ++j) {
            if (j < nr) {
              const float a = round_if(acc[0][j], round), c = round_if(acc[1][j], round);
              const float gate_act = beta * tanhf(a / beta) * sigmoid_f32(a);
              const float up_act = linear_beta * tanhf(c / linear_beta);
              store_act(h + static_cast<int64_t>(route[j]) * I + row, gate_act * up_act, round);
            }
          }
      }
    }
    prefetch_rows(nxt, nxt_route, z, z_ld, L * static_cast<int64_t>(sizeof(XT)), token_of);
    if (nxt.e >= 0) store_scales(sc, 2 * tile_scales, smem + (s ^ 1) * stage + code_bytes);
    cur = nxt;
#pragma unroll
    for (int j = 0; j < R; ++j) cur_route[j] = nxt_route[j];
    __syncthreads();  // stage s is free for the item after next
  }
}

// ---------------------------------------------------------------- down

// Rows per down item: 2 per segment of `width` lanes.
__host__ __device__ inline int down_rows(int width) { return 2 * (kThreads / width); }
__host__ __device__ inline int down_stage_bytes(int64_t I, int width) {
  return static_cast<int>(down_rows(width) * (I / 2) + (down_rows(width) * (I / 32) + 15) / 16 * 16);
}

// eo[route][row] = round?(W2[row] . h_route). A segment of `width` lanes owns rows seg and
// seg + segments of the item's tile.
template <class HT, bool SORTED>
__global__ void __launch_bounds__(kThreads)
    down_kernel(ExpertTable tab, RouteSource rs, const HT* h, int64_t I, int64_t L, float* eo, int width, bool round) {
  constexpr int R = SORTED ? kGroupRoutes : 1;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int ids_s[SORTED ? 1 : kScanMaxRoutes];
  const int chunks = static_cast<int>(I / 32), rows = down_rows(width), stage = down_stage_bytes(I, width);
  const int code_bytes = rows * chunks * 16, segments = kThreads / width;
  const int tiles = static_cast<int>((L + rows - 1) / rows);
  const int n_items = load_groups<SORTED>(rs, ids_s) * tiles, step = static_cast<int>(gridDim.x);
  const int seg = threadIdx.x / width, sub = threadIdx.x % width;
  const auto self = [](int route) { return static_cast<int64_t>(route); };
  const auto group_of_item = [&](int item) {
    return item < n_items ? group_at<SORTED>(rs, ids_s, item / tiles) : Group{-1, 0, 0};
  };
  const auto issue = [&](const Group& g, int item, int s, uint32_t(&sc)[kMaxScalesPerThread], int(&route)[R]) {
    first_routes<SORTED, R>(rs, g, route);
    if (g.e < 0) return;
    const WeightRef w = tab.w2(g.e);
    const TileRef t{static_cast<const uint8_t*>(w.data),       w.scale, w.ld, w.scale_ld,
                    static_cast<int64_t>(item % tiles) * rows, L};
    issue_codes(t, rows, chunks, smem + s * stage);
    load_scales(t, rows, chunks, 0, sc);
  };

  int item = blockIdx.x;
  if (item >= n_items) return;
  uint32_t sc[kMaxScalesPerThread] = {};
  int cur_route[R], nxt_route[R];
  Group cur = group_of_item(item), ahead = group_of_item(item + step);
  issue(cur, item, 0, sc, cur_route);
  cp_async_commit();
  if (cur.e >= 0) store_scales(sc, rows * chunks, smem + code_bytes);
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
      const int64_t row0 = static_cast<int64_t>(item % tiles) * rows;
      const int local[2] = {seg, seg + segments};
      const bool ok[2] = {row0 + local[0] < L, row0 + local[1] < L};
      const int l1 = ok[1] ? local[1] : local[0];  // a missing second row reads the first's codes, unused
      for (int r0 = 0; r0 < cur.count; r0 += R) {
        const int nr = min(R, cur.count - r0);
        int route[R];
        const HT* xs[R];
#pragma unroll
        for (int j = 0; j < R; ++j) {
          route[j] = r0 == 0 ? cur_route[j] : route_at<SORTED>(rs, cur, r0 + (j < nr ? j : 0));
          xs[j] = h + static_cast<int64_t>(route[j]) * I;
        }
        float acc[2][R];
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int j = 0; j < R; ++j) acc[m][j] = 0.0f;
        if (ok[0])  // ok[1] implies ok[0]
          for (int c = sub; c < chunks; c += width) {
            const uint4 q[2] = {reinterpret_cast<const uint4*>(base + local[0] * chunks * 16)[c],
                                reinterpret_cast<const uint4*>(base + l1 * chunks * 16)[c]};
            const float scale[2] = {e8m0_value(base[code_bytes + local[0] * chunks + c]),
                                    e8m0_value(base[code_bytes + l1 * chunks + c])};
            chunk_dot<2, R, HT>(q, scale, xs, static_cast<int64_t>(c) * 32, nr, acc);
          }
        for (int o = width >> 1; o > 0; o >>= 1)
#pragma unroll
          for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int j = 0; j < R; ++j) acc[m][j] += __shfl_xor_sync(kFullMask, acc[m][j], o);
        if (sub == 0)
#pragma unroll
          for (int m = 0; m < 2; ++m)
            if (ok[m])
#pragma unroll
              for (int j = 0; j < R; ++j)
                if (j < nr) eo[static_cast<int64_t>(route[j]) * L + row0 + local[m]] = round_if(acc[m][j], round);
      }
    }
    prefetch_rows(nxt, nxt_route, h, I, I * static_cast<int64_t>(sizeof(HT)), self);
    if (nxt.e >= 0) store_scales(sc, rows * chunks, smem + (s ^ 1) * stage + code_bytes);
    cur = nxt;
#pragma unroll
    for (int j = 0; j < R; ++j) cur_route[j] = nxt_route[j];
    __syncthreads();
  }
}

// ---------------------------------------------------------------- combine

// out[t][l] = round?(sum_j p[t][j] * eo[t * k + j][l]) over the held routes j (held index of
// ids[t][j] in [0, E) from e_begin) in route order; a NaN row for a token with an id outside
// [0, e_total). Grid (L / 4 / blockDim, T): 4 columns per thread.
template <class OT>
__global__ void combine_kernel(const float* eo, int64_t L, const int32_t* ids, int64_t ids_ld, const float* p,
                               int64_t p_ld, int k, int E, int e_begin, int e_total, OT* out, int64_t out_ld,
                               bool round) {
  const int64_t t = blockIdx.y, l = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (l >= L) return;
  bool bad = false;
  for (int j = 0; j < k; ++j) bad = bad || bad_expert_id(ids[t * ids_ld + j], e_total);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const float* pt = p + t * p_ld;
#pragma unroll 4
  for (int j = 0; j < k; ++j) {
    if (held_expert(ids[t * ids_ld + j], e_begin, E) < 0) continue;  // another rank's route: never written
    const float pj = pt[j];
    const float4 v = *reinterpret_cast<const float4*>(eo + (t * k + j) * L + l);
    acc[0] += pj * v.x, acc[1] += pj * v.y, acc[2] += pj * v.z, acc[3] += pj * v.w;
  }
  OT* o = out + t * out_ld + l;
#pragma unroll
  for (int i = 0; i < 4; ++i) store_act(o + i, bad ? NAN : acc[i], round);
}

// Smallest power-of-two segment width (at most a warp) with at most 4 chunks per lane.
inline int segment_lanes(int64_t chunks) {
  int w = 1;
  while (w < 32 && static_cast<int64_t>(w) * 4 < chunks) w *= 2;
  return w;
}

}  // namespace fp4_experts
}  // namespace k3::kernels::cuda_detail
