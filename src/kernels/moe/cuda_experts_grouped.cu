// kernels/moe/cuda_experts_grouped.cu: the routed experts (spec §7) for 1..64 tokens of bf16
// activations with MXFP4 experts, grouped by expert: strategy "cuda_expert_grouped". Each expert a
// call touches is read once, and each of its weights is decoded once for all of its routes.
//
// Bytes at the k3-layer-tp8 shapes (L = 3584, I = 384 per rank, top-16 of 896): an expert's gate +
// up are 2 x 384 x (1792 B codes + 112 B scales) = 1,462,272 B, its down 3584 x (192 + 12) =
// 731,136 B. Batch 64 (1024 routes, ~614 distinct experts at uniform routing): 898 MB + 449 MB,
// floor 209 + 104 us at 4.3 TB/s; batch 32 (~399 experts): 583 + 292 MB, floor 136 + 68 us.
//
// A. sort (cuda_experts_sort.cuh, the rowdot strategy's counting sort): the T * k routes grouped
//    by expert, groups[g] = {expert, first index into order, route count} for g < n_active.
// B. grouped_gate_up_kernel: an item = (group, slab of kGuRows = 32 intermediate rows): 32 gate +
//    32 up rows = 114,688 B of codes + 7,168 B of scales at L = 3584. Warp (rg, sl) = row group
//    rg (8 rows) x slice sl of the latent width; lane (g, c) owns gate row rg * 8 + g and the same
//    up row, and in step s takes chunk 4 s + c (32 codes = 16 bytes = one E8M0 scale: the 4 lanes
//    of a row read 64 contiguous bytes), 16-byte loads straight from global memory into a ring of
//    kGuRing = 4 steps refilled as soon as a step is used: ~4 KB in flight per warp, 3 blocks (24
//    warps, 80 registers) per SM: ~96 KB per SM. Each code word is decoded once into exact bf16
//    weights (magnitude bits to bf16 bits 6..8, sign to 15: value * 2^-126, then one bf16x2
//    multiply by 2^(e - 1)) and multiplied on the tensor cores: mma m16n8k16, A = 8 gate rows over
//    the same 8 up rows, B column n = route n of the pass (kPass = 8 routes; bigger groups loop
//    passes, re-reading the item's codes from L2: rare). The scale rides on the weights, not on
//    per-chunk fp32 sums, because the 4 lanes of an mma row hold 4 chunks (4 scales) in one mma:
//    moving it would need a 4 x 4 transpose of code words across lanes (~16 shuffles and selects
//    per lane-step, as many as the multiplies saved). The pass's z rows (bf16) are staged in shared
//    memory per item in B-fragment order (the pairs (x0,x4)(x1,x5)(x2,x6)(x3,x7) of the code
//    pairs), swizzled so that the 4 lanes of a row read 64 contiguous bytes and two rows sit 64
//    bytes off a 128-byte multiple apart: one conflict-free 128-bit shared load per word, no byte
//    permutes in the loop (reading z from L2 in the loop would add 4 permutes per word on the busy
//    integer pipe); min(8, T * k) rows of steps * 256 + 64 B (57,856 B for 8 routes at L = 3584;
//    ~1.7 rows = 12 KB per 122 KB item at batch 64). The two slices meet in shared memory in slice
//    order; h = round(SiTU(round(W1 z), round(W3 z))) goes per route to the scratch h [T * k, I].
// C. grouped_down_kernel: an item = (group, slab of kDnRows = 512 latent rows = 104,448 B at
//    I = 384): warp w owns 16-row tiles w, w + 8, w + 16, w + 24 (mma rows = 16 latent rows), lane
//    (g, c) rows g and g + 8 of a tile, chunk 4 s + c in step s; a ring of kDnRing = 3 steps (the
//    tile bookkeeping takes the registers of a fourth) walks the (tile, step) units: ~72 KB per SM
//    in flight; the pass's h rows are staged as z is. e_tj = round(W2 h_tj) (unrounded without
//    round_output) goes per route to the scratch e [T * k, L] (bf16 when rounded, else f32).
// D. grouped_combine_kernel: out[t] = round(sum_j p_tj * e_tj), fp32 in route order j = 0..k-1 with
//    separate multiply and add (as the reference); a token with an id outside [0, E) gets a NaN row
//    (the sort leaves its bad routes out of every group). Without round_output (a TP rank's partial
//    sum) e and out are not rounded and out is f32; an expert-parallel rank's (whole_experts) e is
//    rounded (bf16, as at TP=1) and out is the unrounded f32 sum.
// Expert parallelism: ids are global and the table holds experts [expert_begin, expert_begin + E);
// a route to another rank's expert is in no group (A: the sort), so B and C never read its weights,
// and D leaves it out of the sum (route order among the held routes; a token with none gets 0).
// Items are walked by persistent blocks (as many as fit, a grid fixed by the shapes): item b,
// b + gridDim.x, ...; the next item's group record comes by cp.async while the current one runs.
// Every sum runs in an order fixed by (L, I, k) alone: a route's sums depend only on its own token
// (mma columns are independent), lane/chunk/slice orders are fixed, never the grouping, the pass
// or the grid: results are identical run to run and across batches. Grids and scratch come from
// host integers: the four launches are graph-capturable.
// The device pieces under the three kernels (code decode, lane-step, ring, group walk, staging) are
// in cuda_experts_grouped_step.cuh.
//
// Cost per weight (PTX of one lane-step = 2 rows x 32 codes, the common path): 8 code words x 13
// integer ops (code_pairs: 2 masks, 7 shifts, 4 lop3) + 32 bf16x2 multiplies + 8 mma + 4 LDS.128
// + 2 LDG.128 + 2 LDG.U8 + ~40 scale / address / loop ops ~ 200 instructions per 2048 weights of a
// warp: ~0.1 warp instructions per weight, ~130 of the 200 on the half-rate integer pipe. At batch
// 64 the gate/up's 1.69e9 weights are ~170-230 us of issue / integer pipe against 209 us of
// memory, the down's 0.85e9 half that: expected on the H200 gate/up ~250 us, down ~130 us, sort
// ~5 us, combine ~4 us (e is bf16 then: 7.3 MB).
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/moe/cuda_experts_checks.cuh"
#include "kernels/moe/cuda_experts_grouped_step.cuh"
#include "kernels/moe/cuda_experts_sort.cuh"
#include "kernels/moe/experts.h"
#include "kernels/moe/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

// What the three kernels read.
struct GroupedParams {
  ExpertTable tab;      // per-expert w1 / w3 / w2 codes and scales, one layout for all
  const int4* groups;   // [E] {expert, first index into order, route count, 0} (sort)
  const int* n_active;  // number of groups
  const int* order;     // [T * k] route indices (t * k + j) grouped by expert
  const int* bad;       // [T] 1 for a token with an id outside [0, num_experts)
  const int32_t* ids;   // [T, k] global expert ids, rows ids_ld apart (the combine skips other ranks')
  int64_t ids_ld;
  int e_begin, E;  // the held experts: ids [e_begin, e_begin + E) (table indices 0 .. E-1)
  const bf16* z;   // [T, L] latent input, rows z_ld apart (16-byte aligned)
  int64_t z_ld;
  bf16* h;         // [T * k, I] scratch: SiTU outputs per route
  void* e;         // [T * k, L] scratch: e_tj, bf16 (round_e) or f32
  const float* p;  // [T, k] route weights, rows p_ld apart
  int64_t p_ld;
  void* out;  // [T, L] bf16 (round_e) or f32, rows out_ld apart
  int64_t out_ld;
  int L, I, k;
  int chunks_l, steps_l;   // L / 32 chunks, in steps of 4 (one per lane c)
  uint32_t steps_l_magic;  // division_magic(steps_l): x / steps_l = umulhi(2 x, magic)
  int chunks_i, steps_i;   // I / 32, likewise
  uint32_t steps_i_magic;  // division_magic(steps_i)
  int slabs_gu, slabs_dn;  // items per group: I / kGuRows, ceil(L / kDnRows)
  float beta, linear_beta;
  bool round_e;    // round_output or whole_experts: e_tj rounded (e bf16)
  bool round_out;  // round_output: out rounded (bf16), else the f32 partial sum
};

// ---------------------------------------------------------------- B. gate/up + SiTU

// h[route][row] = round(SiTU(round(W1[row] . z_t), round(W3[row] . z_t))) for the 32 rows of each
// item (see the file comment). Dynamic shared memory: min(8, T * k) staged z rows.
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) grouped_gate_up_kernel(GroupedParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ __align__(16) int4 group_s[2];
  __shared__ int route_s[kPass];
  __shared__ const bf16* src_s[kPass];
  __shared__ float4 red_s[kGuGroups][32];  // slice 1's sums: gate (2c, 2c+1), up (2c, 2c+1) of row g
  const int n_items = *p.n_active * p.slabs_gu;
  if (static_cast<int>(blockIdx.x) >= n_items) return;  // the whole block
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, c = lane & 3, rg = warp >> 1, sl = warp & 1;
  const int pitch = staged_pitch(p.steps_l), per = (p.steps_l + kGuSlices - 1) / kGuSlices;
  const int first_step = sl * per, n_steps = max(0, min(p.steps_l, first_step + per) - first_step);
  first_group(group_s, p.groups, p.slabs_gu);
  int it = 0;
  for (int item = blockIdx.x; item < n_items; item += gridDim.x, ++it) {
    const int4 gr = next_group(group_s, p.groups, p.slabs_gu, it, item, n_items);
    const int e = gr.x, count = gr.z;
    const int row = (item % p.slabs_gu) * kGuRows + rg * 8 + g;  // < I (I a multiple of 32)
    const WeightRef w1 = p.tab.w1(e), w3 = p.tab.w3(e);
    const uint8_t* gate_codes = static_cast<const uint8_t*>(w1.data) + row * w1.ld;
    const uint8_t* up_codes = static_cast<const uint8_t*>(w3.data) + row * w3.ld;
    const uint8_t* gate_scales = w1.scale + row * w1.scale_ld;
    const uint8_t* up_scales = w3.scale + row * w3.scale_ld;
    Ring<kGuRing> ring;
    const auto load = [&](int i, int s) {
      const int q = 4 * (first_step + s) + c;
      ring.load(i, q < p.chunks_l, gate_codes, up_codes, gate_scales, up_scales, q);
    };
    for (int r0 = 0; r0 < count; r0 += kPass) {
      const int nr = min(kPass, count - r0);
      // The ring's first slots are in flight while z is staged, the others (their registers hold
      // the staging loads meanwhile) right after.
#pragma unroll
      for (int i = 0; i < kEarlySlots; ++i)
        if (i < n_steps) load(i, i);
      if (r0 > 0) __syncthreads();  // the previous pass's readers of smem, route_s, red_s are done
      stage_rows(smem, route_s, src_s, p.order, gr.y + r0, nr, p.z, p.z_ld, p.chunks_l, p.steps_l, p.steps_l_magic,
                 [&](int route) { return static_cast<int64_t>(route / p.k); });
#pragma unroll
      for (int i = kEarlySlots; i < kGuRing; ++i)
        if (i < n_steps) load(i, i);
      __syncthreads();
      const uint4* x = reinterpret_cast<const uint4*>(smem + staged_row(g, nr) * pitch + first_step * 256) + c;
      float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int s0 = 0; s0 < n_steps; s0 += kGuRing) {
#pragma unroll
        for (int i = 0; i < kGuRing; ++i) {
          const int s = s0 + i;
          if (s < n_steps) {  // warp-uniform
            ring.step(i, x + s * 16, d0, d1);
            if (s + kGuRing < n_steps) load(i, s + kGuRing);
          }
        }
      }
      // d: gate row g (routes 2c, 2c+1), up row g (2c, 2c+1); the slices meet in slice order.
      float sum[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) sum[i] = d0[i] + d1[i];
      if (sl == 1) red_s[rg][lane] = make_float4(sum[0], sum[1], sum[2], sum[3]);
      __syncthreads();
      if (sl == 0) {
        const float4 o = red_s[rg][lane];
        sum[0] += o.x, sum[1] += o.y, sum[2] += o.z, sum[3] += o.w;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const int n = 2 * c + t;
          if (n < nr) {
            const float a = round_bf16(sum[t]), u = round_bf16(sum[2 + t]);
            const float gate_act = p.beta * tanhf(a / p.beta) * sigmoid_f32(a);
            const float up_act = p.linear_beta * tanhf(u / p.linear_beta);
            p.h[static_cast<int64_t>(route_s[n]) * p.I + row] = __float2bfloat16_rn(gate_act * up_act);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- C. down

// e[route][row] = round?(W2[row] . h_route) for the 512 rows of each item. Dynamic shared memory:
// min(8, T * k) staged h rows.
template <class ET>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) grouped_down_kernel(GroupedParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ __align__(16) int4 group_s[2];
  __shared__ int route_s[kPass];
  __shared__ const bf16* src_s[kPass];
  const int n_items = *p.n_active * p.slabs_dn;
  if (static_cast<int>(blockIdx.x) >= n_items) return;  // the whole block
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, c = lane & 3, steps = p.steps_i, pitch = staged_pitch(steps);
  ET* eo = static_cast<ET*>(p.e);
  first_group(group_s, p.groups, p.slabs_dn);
  int it = 0;
  for (int item = blockIdx.x; item < n_items; item += gridDim.x, ++it) {
    const int4 gr = next_group(group_s, p.groups, p.slabs_dn, it, item, n_items);
    const int count = gr.z;
    const int row0 = (item % p.slabs_dn) * kDnRows + warp * 16 + g;  // row lo of tile 0; tile t: + t * 128
    // This warp's tiles t = 0 .. n_tiles - 1 (tile rows all inside L: L and the tiles multiples of 16).
    const int n_tiles = max(0, min(kDnTiles, (p.L - (row0 - g) + kWarps * 16 - 1) / (kWarps * 16)));
    const int units = n_tiles * steps;  // (tile, step), tile-major
    const uint8_t* codes = static_cast<const uint8_t*>(p.tab.ptr(gr.x, 4));
    const uint8_t* scales = p.tab.scale(gr.x, 5);
    // 32-bit offsets inside one expert's matrix (supports() bounds its bytes): fewer live registers.
    const int ld = static_cast<int>(p.tab.ld2), sld = static_cast<int>(p.tab.sld2);
    Ring<kDnRing> ring;
    // Unit u = (tile u / steps, step u % steps); the division is a multiply-high by a host magic.
    const auto tile_of = [&](int u) {
      return static_cast<int>(__umulhi(2u * static_cast<uint32_t>(u), p.steps_i_magic));
    };
    const auto load = [&](int i, int u) {
      const int t = tile_of(u), q = 4 * (u - t * steps) + c, lo = row0 + t * (kWarps * 16);
      ring.load(i, q < p.chunks_i, codes + lo * ld, codes + (lo + 8) * ld, scales + lo * sld, scales + (lo + 8) * sld,
                q);
    };
    for (int r0 = 0; r0 < count; r0 += kPass) {
      const int nr = min(kPass, count - r0);
#pragma unroll
      for (int i = 0; i < kEarlySlots; ++i)
        if (i < units) load(i, i);  // in flight while h is staged
      if (r0 > 0) __syncthreads();
      stage_rows(smem, route_s, src_s, p.order, gr.y + r0, nr, p.h, p.I, p.chunks_i, steps, p.steps_i_magic,
                 [](int route) { return static_cast<int64_t>(route); });
#pragma unroll
      for (int i = kEarlySlots; i < kDnRing; ++i)
        if (i < units) load(i, i);
      __syncthreads();
      const uint4* x = reinterpret_cast<const uint4*>(smem + staged_row(g, nr) * pitch) + c;
      float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int u0 = 0; u0 < units; u0 += kDnRing) {
#pragma unroll
        for (int i = 0; i < kDnRing; ++i) {
          const int u = u0 + i;
          if (u < units) {  // warp-uniform
            const int t = tile_of(u), s = u - t * steps;
            ring.step(i, x + s * 16, d0, d1);
            if (u + kDnRing < units) load(i, u + kDnRing);
            if (s == steps - 1) {  // tile t done: d = rows lo (routes 2c, 2c+1), hi (2c, 2c+1)
              const int lo = row0 + t * (kWarps * 16);
#pragma unroll
              for (int v = 0; v < 4; ++v) {
                const int n = 2 * c + (v & 1);
                if (n < nr) {
                  const float val = d0[v] + d1[v];
                  ET* dst = eo + static_cast<int64_t>(route_s[n]) * p.L + lo + (v < 2 ? 0 : 8);
                  if constexpr (std::is_same_v<ET, bf16>) *dst = __float2bfloat16_rn(val);
                  else *dst = val;
                }
                d0[v] = d1[v] = 0.0f;
              }
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- D. combine

// out[t][l] = round?(sum_j p[t][j] * e[t * k + j][l]) over the held routes, route order, separate
// multiply and add; a NaN row for a token with a bad id. ET: e's type, OT: out's. Grid
// (ceil(L / 8 / 128), T), 128 threads: 8 columns each.
template <class ET, class OT>
__global__ void __launch_bounds__(128) grouped_combine_kernel(GroupedParams p) {
  const int t = static_cast<int>(blockIdx.y);
  const int l = (static_cast<int>(blockIdx.x) * blockDim.x + static_cast<int>(threadIdx.x)) * 8;
  if (l >= p.L) return;
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const bool bad = p.bad[t] != 0;
  if (!bad) {  // a bad route's e row was never written
    const ET* e = static_cast<const ET*>(p.e) + static_cast<int64_t>(t) * p.k * p.L + l;
    const float* pt = p.p + t * p.p_ld;
    const int32_t* ids = p.ids + t * p.ids_ld;
    for (int j = 0; j < p.k; ++j) {
      if (held_expert(ids[j], p.e_begin, p.E) < 0) continue;  // another rank's expert: e never written
      float v[8];
      load_act_n<8>(e + static_cast<int64_t>(j) * p.L, v);
      const float pj = pt[j];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(pj, v[i]));
    }
  }
  OT* o = static_cast<OT*>(p.out) + t * p.out_ld + l;
#pragma unroll
  for (int i = 0; i < 8; ++i) store_act(o + i, bad ? NAN : acc[i], p.round_out);
}

// ---------------------------------------------------------------- host

// ceil(2^31 / d): x / d = umulhi(2 x, magic), exact while x * d < 2^31 (x here: a few thousand).
uint32_t division_magic(int d) { return static_cast<uint32_t>(((uint64_t{1} << 31) + d - 1) / d); }

// Staged rows per block: a pass holds at most kPass routes, and a group at most T * k.
int64_t staged_rows(int64_t T, int64_t k) { return std::min<int64_t>(kPass, T * k); }

core::Status grouped_supports(const CudaOps& ops, const MoeExpertsArgs& a) {
  if (auto s = experts_io_supports(ops, a); !s) return s;
  if (a.z.dtype != core::DType::bf16)
    return core::Status::fail(
        "the grouped experts take bf16 activations (exact bf16 inputs of the tensor cores), got " + describe(a.z));
  const int64_t T = a.z.dim(0), L = a.z.dim(1), k = a.ids.dim(1), E = static_cast<int64_t>(a.w1.size());
  if (T < 1 || T > kMaxTokens)
    return core::Status::fail("the grouped experts take 1.." + std::to_string(kMaxTokens) + " tokens, got " +
                              std::to_string(T));
  if (k < 1 || k > kMaxK)
    return core::Status::fail("the grouped experts take 1.." + std::to_string(kMaxK) +
                              " routes per token, got k = " + std::to_string(k));
  if (E > kSortMaxExperts)
    return core::Status::fail("the grouped experts sort at most " + std::to_string(kSortMaxExperts) + " experts, got " +
                              std::to_string(E));
  const int64_t I = a.w1[0].out_features();
  if (L % 32 != 0 || I % 32 != 0 || L == 0 || I == 0)
    return core::Status::fail("the grouped experts need whole MXFP4 chunks (L and I multiples of 32), got L = " +
                              std::to_string(L) + ", I = " + std::to_string(I));
  const size_t smem = static_cast<size_t>(staged_rows(T, k) * staged_pitch(steps_of(L)));
  if (smem > ops.ctx->smem_optin())
    return core::Status::fail("the grouped experts stage " + std::to_string(staged_rows(T, k)) + " z rows (" +
                              std::to_string(smem) + " B) in shared memory; the device allows " +
                              std::to_string(ops.ctx->smem_optin()) + " B");
  if (!aligned16(a.z.data) || (T > 1 && (a.z.strides[0] * 2) % 16 != 0))
    return core::Status::fail(
        "the grouped experts read z rows 16 bytes at a time: z must be 16-byte aligned with "
        "rows a multiple of 16 bytes apart, got " +
        describe(a.z) + " with row stride " + std::to_string(a.z.strides[0]));
  // MXFP4 everywhere, one layout per matrix (the kernels take one row stride each), code rows
  // 16-byte aligned (16-byte loads straight from global memory).
  const std::span<const LinearWeight> mats[3] = {a.w1, a.w3, a.w2};
  const char* names[3] = {"w1", "w3", "w2"};
  for (int m = 0; m < 3; ++m) {
    const LinearWeight& w0 = mats[m][0];
    if (!w0.is_mxfp4())
      return core::Status::fail(std::string("the grouped experts read MXFP4 experts only; ") + names[m] + "[0] is " +
                                describe(w0.weight.view()));
    const int64_t ld = w0.weight.view().strides[0], sld = w0.scale.view().strides[0];
    if (ld % 16 != 0)
      return core::Status::fail(std::string(names[m]) + " code rows are " + std::to_string(ld) +
                                " bytes apart; the grouped experts need a multiple of 16");
    for (size_t e = 0; e < mats[m].size(); ++e) {
      const LinearWeight& w = mats[m][e];
      if (auto s = weight_on_cuda(w, names[m]); !s) return s;
      if (!w.is_mxfp4() || w.weight.view().strides[0] != ld || w.scale.view().strides[0] != sld)
        return core::Status::fail(std::string(names[m]) + "[" + std::to_string(e) +
                                  "] differs in format or layout from " + names[m] + "[0]");
      if (!aligned16(w.weight.view().data))
        return core::Status::fail(std::string(names[m]) + "[" + std::to_string(e) +
                                  "] codes are not 16-byte aligned (the grouped experts load 16 bytes at a time)");
    }
  }
  // The down walk addresses a W2 row with 32-bit offsets (fewer live registers).
  const int64_t w2_bytes = L * std::max(a.w2[0].weight.view().strides[0], a.w2[0].scale.view().strides[0]);
  if (w2_bytes >= (int64_t{1} << 31))
    return core::Status::fail("the grouped experts address a w2 matrix with 32-bit offsets; its rows span " +
                              std::to_string(w2_bytes) + " bytes");
  return core::Status::ok();
}

void grouped_run(const CudaOps& ops, const MoeExpertsArgs& a) {
  const int64_t T = a.z.dim(0), L = a.z.dim(1), I = a.w1[0].out_features();
  const int k = static_cast<int>(a.ids.dim(1)), E = static_cast<int>(a.w1.size());
  const int e_begin = static_cast<int>(a.expert_begin), e_total = static_cast<int>(moe_total_experts(a));
  const cudaStream_t stream = ops.ctx->stream();
  const int64_t routes = T * k;

  std::vector<uint64_t> words(static_cast<size_t>(E) * kWordsPerExpert);
  const auto addr = [](const core::Tensor& t) { return reinterpret_cast<uint64_t>(t.view().data); };
  for (int e = 0; e < E; ++e) {
    const LinearWeight* ws[3] = {&a.w1[e], &a.w3[e], &a.w2[e]};
    for (int m = 0; m < 3; ++m) {
      words[e * kWordsPerExpert + 2 * m] = addr(ws[m]->weight);
      words[e * kWordsPerExpert + 2 * m + 1] = addr(ws[m]->scale);
    }
  }
  GroupedParams p{};
  p.tab.words = static_cast<const uint64_t*>(ops.ctx->device_table(words));
  const WeightRef r1 = weight_ref(a.w1[0]), r3 = weight_ref(a.w3[0]), r2 = weight_ref(a.w2[0]);
  p.tab.ld1 = r1.ld, p.tab.sld1 = r1.scale_ld, p.tab.ld3 = r3.ld, p.tab.sld3 = r3.scale_ld;
  p.tab.ld2 = r2.ld, p.tab.sld2 = r2.scale_ld;

  // Scratch: the sort's ints (offsets E + 1, order T * k, bad T, active E, n_active 1), its group
  // records [E] int4, h [T * k, I] bf16, e [T * k, L] bf16 or f32.
  const std::shared_ptr<void> ints = ops.ctx->scratch(sizeof(int) * static_cast<size_t>(2 * E + 2 + routes + T));
  const std::shared_ptr<void> groups = ops.ctx->scratch(sizeof(int4) * static_cast<size_t>(E));
  const std::shared_ptr<void> h_buf = ops.ctx->scratch(sizeof(bf16) * static_cast<size_t>(routes * I));
  const bool round_e = moe_rounds_expert_outputs(a);  // bf16 activations: Precision::bf16
  const size_t e_bytes = round_e ? sizeof(bf16) : sizeof(float);
  const std::shared_ptr<void> e_buf = ops.ctx->scratch(e_bytes * static_cast<size_t>(routes * L));
  int* offsets = static_cast<int*>(ints.get());
  int* order = offsets + E + 1;
  int* bad = order + routes;
  int* active = bad + T;
  int* n_active = active + E;

  launch_sort_routes(a.ids.as<const int32_t>(), a.ids.strides[0], T, k, E, e_begin, e_total, offsets, order, bad,
                     active, n_active, static_cast<int4*>(groups.get()), stream);

  p.groups = static_cast<const int4*>(groups.get());
  p.n_active = n_active;
  p.order = order;
  p.bad = bad;
  p.ids = a.ids.as<const int32_t>(), p.ids_ld = a.ids.strides[0];
  p.e_begin = e_begin, p.E = E;
  p.z = a.z.as<const bf16>(), p.z_ld = a.z.strides[0];
  p.h = static_cast<bf16*>(h_buf.get());
  p.e = e_buf.get();
  p.p = a.weights.as<const float>(), p.p_ld = a.weights.strides[0];
  p.out = a.out.data, p.out_ld = a.out.strides[0];
  p.L = static_cast<int>(L), p.I = static_cast<int>(I), p.k = k;
  p.chunks_l = static_cast<int>(L / 32), p.steps_l = steps_of(L);
  p.chunks_i = static_cast<int>(I / 32), p.steps_i = steps_of(I);
  p.steps_l_magic = division_magic(p.steps_l);
  p.steps_i_magic = division_magic(p.steps_i);
  p.slabs_gu = static_cast<int>(I / kGuRows), p.slabs_dn = static_cast<int>((L + kDnRows - 1) / kDnRows);
  p.beta = a.beta, p.linear_beta = a.linear_beta;
  p.round_e = round_e, p.round_out = a.round_output;

  // Items: (group, slab); at most min(T * k, E) groups (host integers: the grid never reads the sort).
  const int64_t max_groups = std::min<int64_t>(routes, E);
  const size_t smem_gu = static_cast<size_t>(staged_rows(T, k) * staged_pitch(p.steps_l));
  const size_t smem_dn = static_cast<size_t>(staged_rows(T, k) * staged_pitch(p.steps_i));
  const unsigned grid_gu = persistent_blocks(ops, grouped_gate_up_kernel, kThreads, smem_gu, max_groups * p.slabs_gu);
  grouped_gate_up_kernel<<<grid_gu, kThreads, smem_gu, stream>>>(p);
  K3_CUDA_CHECK_LAUNCH("grouped_gate_up_kernel");
  const dim3 grid_c(grid_for(L / 8, 128), static_cast<unsigned>(T));
  // e and out: bf16 when rounded, else (a rank's unrounded partial sum) f32; an expert-parallel
  // rank's whole experts give bf16 e and an f32 out.
  const auto down_and_combine = [&](auto e_tag, auto out_tag) {
    using ET = typename decltype(e_tag)::type;
    using OT = typename decltype(out_tag)::type;
    const auto down = grouped_down_kernel<ET>;
    const unsigned grid_dn = persistent_blocks(ops, down, kThreads, smem_dn, max_groups * p.slabs_dn);
    down<<<grid_dn, kThreads, smem_dn, stream>>>(p);
    K3_CUDA_CHECK_LAUNCH("grouped_down_kernel");
    grouped_combine_kernel<ET, OT><<<grid_c, 128, 0, stream>>>(p);
    K3_CUDA_CHECK_LAUNCH("grouped_combine_kernel");
  };
  if (a.round_output) down_and_combine(Tag<bf16>{}, Tag<bf16>{});
  else if (round_e) down_and_combine(Tag<bf16>{}, Tag<float>{});
  else down_and_combine(Tag<float>{}, Tag<float>{});
}

}  // namespace

void register_moe_experts_grouped_cuda(MoeOps& r, const CudaOps& ops) {
  r.moe_experts.add({"cuda_expert_grouped", core::Device::cuda,
                     [ops](const MoeExpertsArgs& a) { return grouped_supports(ops, a); },
                     [ops](const MoeExpertsArgs& a) { grouped_run(ops, a); }});
}

}  // namespace k3::kernels
