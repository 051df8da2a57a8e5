// kernels/moe/cuda_experts_gemv.cu: the routed experts (spec §7) for small batches (1..16 tokens) as
// two memory-bound GEMV kernels that read each route's MXFP4 codes straight from global memory into
// registers (16-byte loads, no shared-memory staging of codes, no sort): strategy "cuda_expert_gemv".
// The decode, the one-step walk and the staging helpers: cuda_experts_gemv_step.cuh.
//
// Bytes per call at the k3-layer-tp8 shapes (L = 3584, I = 384 per rank, top-16, MXFP4): one route
// reads gate + up 2 x 384 x (1792 B codes + 112 B scales) = 1,462,272 B and down 3584 x (192 + 12)
// = 731,136 B: 2,193,408 B. Batch 1 = 16 routes = 35.1 MB (floor 8.2 us at 4.3 TB/s); batch 8 =
// 128 routes = 280.8 MB (about 120 distinct experts: 263 MB when a repeated expert is served by
// L2; floor 61-65 us). Activations (z 7 KB, h 12 KB, out 7 KB per token) are noise.
//
// The unit of work is a step of one warp: 16 weight rows x 4 chunks (chunk = 32 codes = 16 bytes =
// one E8M0 scale). Lane (g, c) = (lane / 4, lane % 4) takes chunk 4 s + c of rows g and g + 8 (two
// 16-byte loads; a row's 4 lanes read 64 contiguous bytes). Each warp keeps kSlots = 3 steps of
// loads in flight, rolling (step s + 3 is loaded as soon as step s is consumed): 3 KB per warp, ~96
// KB per SM at 32 warps (<= 64 registers: 4 blocks of 256 per SM). While its first loads fly, a
// block stages its activation rows and its scales in shared memory: the scales as ready multipliers
// {row g, row g + 8} per (step, g, c), one 8-byte load per step (scale rows are read 4 bytes at a
// time when 4-byte aligned, else bytewise; a chunk past the row end gets 0, which also zeroes the
// stale codes its lane keeps instead of loading past the row).
// bf16 activations (tensor cores): a code word becomes 4 bf16 pairs in 13 integer ops (the E2M1
// bits placed to read as value * 2^-126), each multiplied once by 2^(e - 1) (exact: value * scale),
// then 2 mma.m16n8k16 (bf16, fp32 accumulate) per word of the two rows: ~160 instructions per step
// and lane, 0.08 warp instructions per weight (the kernels before: 0.14, plus 2-way bank
// conflicts). B is staged in fragment order, [step][word][c] 16-byte groups of pairs (x0, x4), (x1,
// x5), (x2, x6), (x3, x7): one conflict-free 16-byte load per word (a warp reads 64 contiguous
// bytes), the same activations in every column, so every lane ends with its rows' sums. A block
// holding a scale of 2 or more (E8M0 >= 128: never in real weights) or NaN multiplies twice (2^126,
// then 2^(e - 127)), block-uniformly. f32 activations (CUDA cores): decode_word + FMA on unscaled
// values, then one multiply-add by the f32 scale per chunk.
//
// A. gemv_gate_up_kernel, grid (I / 16, T * k): a block per (route, 16 intermediate rows); its 8
//    warps are 2 row groups x 4 slices of the steps of L; warp (group, slice) sums 8 gate rows (mma
//    rows 0..7) and the same 8 up rows (8..15). The slices meet in shared memory in slice order,
//    then h = round(SiTU(round(W1 z), round(W3 z))) goes to the scratch h [T * k, h_ld] (h_ld = I
//    rounded up to whole steps; bf16 h in the fragment order the down kernel stages).
// B. gemv_down_kernel, grid (L / 16, T): a block per (token, 16 latent rows); warp w walks the
//    (route, step) units of routes j = w, w + 8, ...; e_tj = round(W2_j h_tj) (unrounded without
//    round_output) goes to shared memory and one thread per row sums p_tj * e_tj in route order in
//    fp32 (separate multiply and add, as the reference) into out[t][row]. B is a programmatic
//    dependent launch of A: its blocks issue their first W2 loads and stage their scales while A
//    finishes, then wait for A (griddepcontrol) before reading h or writing out (out may alias z).
//    A token with an id outside [0, E) gets a NaN row (A skips its bad routes).
// Expert parallelism (ids global, the table holding experts [expert_begin, expert_begin + E)): A's
//    blocks of a route to another rank's expert leave at once (no weight read); B lists the token's
//    held routes in route order (a ballot over the k ids) and walks only those: their W2 rows, scales
//    and h rows, and the combine sums them in that order (a token with none gets 0). With all routes
//    held (no EP) the list is 0..k-1 and nothing changes. Without round_output an expert-parallel
//    rank (whole_experts) rounds e_tj as TP=1 does and sums them unrounded into its f32 partial.
// Shared memory and load chains (ncu, H200, batch 1; the numbers: docs/perf/kernel-notes.md, moe): the
//    scale tables are 32-byte entries written as two 16-byte stores per thread, their halves swapped on
//    alternate groups of 4 entries (scale_swap, cuda_experts_gemv_step.cuh) so a store phase covers all
//    8 bank groups: the gate/up and down kernels' several-way shared-store conflicts all but vanish.
//    Staging issues a thread's loads before its stores (2 scale entries, 2 z groups, 3 h groups at a
//    time: one round of load latency each), and the down block reads its route weights p_tj with the
//    ids, before the wait: the combine has no global load. That made down faster and left gate/up as it
//    was: both wait on dependent loads (ids -> expert table -> codes and scales), not on bank conflicts
//    or the code stream's depth (kSlots).
// Every sum runs in an order fixed by (L, I, k) alone, never by the grid or the batch: identical
// results run to run. Grids come from host integers, scratch from the context pool: graph-capturable.
//
// Expected time (H200, bf16): at batch 1 A is 384 blocks, all resident, 7 steps per warp, ~30 K
// warp instructions per SM for 177 KB of codes (integer pipe and DRAM both near 5 us): ~6-7 us;
// B 224 blocks, ~4 us, its start under A's tail: ~11-13 us in all. Batch 8 ~70-80 us. The token
// bound is kMaxTokens = 16: every route reads its expert again (repeats come from L2), which the
// rowdot strategy also does up to 16 tokens of top-16 (its route form); beyond that its sorted form
// reads each expert once for all its routes.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/moe/cuda_experts_checks.cuh"
#include "kernels/moe/cuda_experts_gemv_step.cuh"
#include "kernels/moe/experts.h"
#include "kernels/moe/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int64_t kGridYMax = 65535;  // supports(): T * k routes, one grid y each
constexpr int kMaxRoutes = 64;        // supports(): k <= this (the down block's e table)
// supports(): a z row and a token's k h rows of at most this many bytes each (staged in shared
// memory with the scale tables; a launch over 48 KB opts in to more).
constexpr size_t kSmemBudget = 40 * 1024;
constexpr int kSlots = 3;  // steps of loads in flight per warp (24 registers)
// Blocks per SM the registers are cut for: 4 (<= 64 registers) on the tensor-core walk, 3 (<= 80)
// on the CUDA-core walk (its decoded values and activations need more). Deeper rings were tried on
// the H200 (5 gate/up slots at 3 blocks and 6 down slots at 2 blocks: a batch-1 warp's whole W2 share
// in flight before the wait): batch 1 did not change and 16 tokens got slower (docs/perf/kernel-notes.md,
// moe): at batch 1 these kernels wait on their chains of dependent loads (ids, table, scales, staged
// rows), not on the depth of the code stream.
template <bool MMA>
constexpr int kMinBlocks = MMA ? 4 : 3;

// What both kernels read (one struct, so the launches stay short).
struct GemvParams {
  ExpertTable tab;     // per-expert w1 / w3 / w2 codes and scales, one layout for all
  const int32_t* ids;  // [T, k] expert ids, rows ids_ld apart
  int64_t ids_ld;
  const float* p;  // [T, k] route weights, rows p_ld apart
  int64_t p_ld;
  const void* z;  // [T, L] XT latent input, rows z_ld apart (16-byte aligned rows)
  int64_t z_ld;
  void* h;    // [T * k, h_ld] HT scratch: SiTU outputs per route (route = t * k + j)
  void* out;  // [T, L] OT, rows out_ld apart
  int64_t out_ld;
  int64_t L, I;
  int h_ld;              // steps_i * kStepValues: an h row padded to whole steps
  int steps_l, steps_i;  // steps of a gate/up row (L / 128, rounded up) and of a down row (I / 128)
  int k, E;              // E: the held experts (the table's)
  int e_begin, e_total;  // expert parallelism: held ids [e_begin, e_begin + E) of [0, e_total)
  float beta, linear_beta;
  bool word_scales_gu, word_scales_dn;  // w1/w3, w2 scale rows read 4 bytes at a time (4-byte aligned)
  bool round;                           // Precision::bf16: gate/up sums and SiTU rounded
  bool round_e;                         // round && (round_output || whole_experts): e_tj rounded
  bool round_out;                       // round && round_output: out rounded
};

// ---------------------------------------------------------------- A. gate/up + SiTU

// h[route][row] = round(SiTU(round(W1[row] . z_t), round(W3[row] . z_t))) for the block's 16 rows
// of route blockIdx.y (= t * k + j). Dynamic shared memory: the scale pairs [step][16 rows][c]
// {gate, up} (gate_up_scale_bytes), then z_t (steps_l * 128 values of XT).
template <class XT, class HT>
__global__ void __launch_bounds__(kThreads, kMinBlocks<std::is_same_v<XT, bf16>>) gemv_gate_up_kernel(GemvParams p) {
  constexpr bool MMA = std::is_same_v<XT, bf16>;
  constexpr int S = kSlots;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float partial[kGuGroups][kGuSlices][8][2];  // [group][slice][row][gate, up]
  // The down grid may be scheduled now (it waits for this whole grid before reading h).
  pdl_launch_dependents();
  const int route = static_cast<int>(blockIdx.y), t = route / p.k, j = route - t * p.k;
  // The whole block leaves for a bad id (the token's row will be NaN: down kernel) or another
  // rank's expert (the down kernel skips the route).
  const int e = held_expert(p.ids[t * p.ids_ld + j], p.e_begin, p.E);
  if (e < 0) return;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, c = lane & 3, group = warp / kGuSlices, slice = warp % kGuSlices;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kGuRows;  // rows < I: I % 16 == 0
  const int chunks = static_cast<int>(p.L / 32), steps = p.steps_l;
  const int per = (steps + kGuSlices - 1) / kGuSlices, first = slice * per;
  const int n = max(0, min(steps, first + per) - first);  // this warp's steps (warp-uniform)
  // This lane's steps whose chunk 4 (first + s) + c lies inside the row.
  const int n_lane = min(n, max(0, (chunks - c + kStepChunks - 1) / kStepChunks - first));
  const WeightRef wg = p.tab.w1(e), wu = p.tab.w3(e);
  const int64_t row = row0 + group * 8 + g, q0 = first * kStepChunks + c;
  const uint8_t* ca = static_cast<const uint8_t*>(wg.data) + row * wg.ld + 16 * q0;
  const uint8_t* cb = static_cast<const uint8_t*>(wu.data) + row * wu.ld + 16 * q0;

  Slot sl[S];
#pragma unroll
  for (int i = 0; i < S; ++i) {  // in flight while z and the scales are staged
    sl[i].zero();
    sl[i].load(i < n_lane, ca + 64 * i, cb + 64 * i);
  }
  uint2* sc_s = reinterpret_cast<uint2*>(smem);
  XT* z_s = reinterpret_cast<XT*>(smem + gate_up_scale_bytes(steps));
  stage_rows<2>(z_s, static_cast<const XT*>(p.z) + t * p.z_ld, 1, 0, p.L, steps, false);
  bool big = false;
  // Entries it = step * 16 + row, two per thread at a time: both loads in flight, then both stores
  // (448 entries at L = 3584: one round of load latency, not two).
#pragma unroll 1  // few iterations: keep the registers for the loads in flight
  for (int it0 = static_cast<int>(threadIdx.x); it0 < steps * kGuRows; it0 += 2 * kThreads) {
    uint32_t vl[2] = {0u, 0u}, vh[2] = {0u, 0u};
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int it = it0 + b * kThreads;
      if (it < steps * kGuRows) {
        const int64_t r = row0 + (it & (kGuRows - 1));
        vl[b] = step_scale_word(wg.scale + r * wg.scale_ld, it / kGuRows, chunks, p.word_scales_gu);
        vh[b] = step_scale_word(wu.scale + r * wu.scale_ld, it / kGuRows, chunks, p.word_scales_gu);
      }
    }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int it = it0 + b * kThreads;
      if (it < steps * kGuRows) big |= stage_step_scales<MMA>(sc_s, it, vl[b], vh[b], it / kGuRows, chunks);
    }
  }
  big = __syncthreads_or(big);

  RowSums<MMA> acc;
  acc.zero();
  // Entry it0 + 16 s of this lane's rows (it0 % 8 == g): chunk c at c ^ scale_swap(it0). Step stride 64.
  const int it0 = first * kGuRows + group * 8 + g;
  const uint2* f = sc_s + it0 * kStepChunks + (c ^ scale_swap(it0));
  for (int s0 = 0; s0 < n; s0 += S) {
#pragma unroll
    for (int i = 0; i < S; ++i) {
      if (s0 + i < n) {  // warp-uniform
        step_sums(sl[i], f[(s0 + i) * kGuRows * kStepChunks], step_x(z_s, first + s0 + i, c), big, acc);
        const int next = 64 * (i + S);  // step s0 + i + S, rolled into the slot just consumed
        sl[i].load(s0 + i + S < n_lane, ca + next, cb + next);
      }
    }
    ca += 64 * S, cb += 64 * S;
  }
  float gate_sum, up_sum;
  acc.result(gate_sum, up_sum);
  if (c == 0) partial[group][slice][g][0] = gate_sum, partial[group][slice][g][1] = up_sum;
  __syncthreads();
  if (threadIdx.x < kGuRows) {
    const int rg = static_cast<int>(threadIdx.x) / 8, rr = static_cast<int>(threadIdx.x) % 8;
    const int h_row = static_cast<int>(row0) + static_cast<int>(threadIdx.x);
    if (h_row < p.I) {
      float a = 0.0f, u = 0.0f;
#pragma unroll
      for (int s = 0; s < kGuSlices; ++s) a += partial[rg][s][rr][0], u += partial[rg][s][rr][1];
      a = round_if(a, p.round), u = round_if(u, p.round);
      const float gate_act = p.beta * tanhf(a / p.beta) * sigmoid_f32(a);
      const float up_act = p.linear_beta * tanhf(u / p.linear_beta);
      store_act(static_cast<HT*>(p.h) + static_cast<int64_t>(route) * p.h_ld + h_index<HT>(h_row), gate_act * up_act,
                p.round);
    }
  }
}

// ---------------------------------------------------------------- B. down + combine

// out[t][row] = round?(sum_j p_tj * round?(W2_j[row] . h_tj)) for the block's 16 rows of token
// blockIdx.y. Dynamic shared memory: the scale pairs [route][step][g][c] {row g, row g + 8}
// (down_scale_bytes), then the token's h rows (k * h_ld values of HT).
template <class HT, class OT>
__global__ void __launch_bounds__(kThreads, kMinBlocks<std::is_same_v<HT, bf16>>) gemv_down_kernel(GemvParams p) {
  constexpr bool MMA = std::is_same_v<HT, bf16>;
  constexpr int S = kSlots;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float e_s[kMaxRoutes][kDnRows];      // e_tj of the block's rows, route-major
  __shared__ const uint8_t* codes_s[kMaxRoutes];  // W2 codes / scales of the token's held routes
  __shared__ const uint8_t* scales_s[kMaxRoutes];
  __shared__ int route_s[kMaxRoutes];     // the held routes j, in route order
  __shared__ float weight_s[kMaxRoutes];  // their route weights p_tj (read with the ids, before the wait)
  __shared__ unsigned held_mask_s[kMaxRoutes / 32];
  static_assert(kMaxRoutes % 32 == 0 && kMaxRoutes <= kThreads, "the held-route ballot takes whole warps");
  // The op's next kernel (moe_tail's prologue in the fused path) may start its pre-wait part now.
  pdl_launch_dependents();
  const int t = static_cast<int>(blockIdx.y);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kDnRows;  // rows < L: L % 16 == 0
  OT* out = static_cast<OT*>(p.out) + t * p.out_ld;
  // Thread j < k: route j's held expert (-1: another rank's, or bad); a ballot per warp marks the
  // held ones, so that their slots in route order are prefix counts.
  int held = -1;
  bool bad = false;
  if (threadIdx.x < kMaxRoutes) {  // whole warps (the ballot)
    if (static_cast<int>(threadIdx.x) < p.k) {
      const int32_t id = p.ids[t * p.ids_ld + threadIdx.x];
      held = held_expert(id, p.e_begin, p.E);
      bad = bad_expert_id(id, p.e_total);
    }
    const unsigned mask = __ballot_sync(kFullMask, held >= 0);
    if ((threadIdx.x & 31) == 0) held_mask_s[threadIdx.x >> 5] = mask;
  }
  if (__syncthreads_or(bad)) {  // the whole block: a NaN row, as the reference contract says
    pdl_wait();                 // out may alias z, which the gate/up grid reads
    if (threadIdx.x < kDnRows) store_act(out + row0 + threadIdx.x, NAN, false);
    return;
  }
  int n_held = 0, slot = 0;  // the held routes, and this thread's route's slot among them
#pragma unroll
  for (int w = 0; w < kMaxRoutes / 32; ++w) {
    const unsigned m = held_mask_s[w];
    const int before = static_cast<int>(threadIdx.x >> 5) - w;  // > 0: warp w lies before this thread's
    slot += before > 0 ? __popc(m) : before == 0 ? __popc(m & ((1u << (threadIdx.x & 31)) - 1u)) : 0;
    n_held += __popc(m);
  }
  if (held >= 0) {  // the held route's W2 rows from the block's first row on
    codes_s[slot] = static_cast<const uint8_t*>(p.tab.ptr(held, 4)) + row0 * p.tab.ld2;
    scales_s[slot] = p.tab.scale(held, 5) + row0 * p.tab.sld2;
    route_s[slot] = static_cast<int>(threadIdx.x);
    weight_s[slot] = p.p[t * p.p_ld + threadIdx.x];
  }
  __syncthreads();
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, c = lane & 3;
  const int chunks = static_cast<int>(p.I / 32), steps = p.steps_i;
  const int lane_steps = (chunks - c + kStepChunks - 1) / kStepChunks;  // steps whose chunk 4 s + c exists
  const int n_routes = warp < n_held ? (n_held - warp + kWarps - 1) / kWarps : 0;
  const int n_units = n_routes * steps;  // (route, step) units of this warp, route-major
  const int sld = static_cast<int>(p.tab.sld2);
  const int code_lo = g * static_cast<int>(p.tab.ld2) + 16 * c, code_hi = code_lo + 8 * static_cast<int>(p.tab.ld2);

  int load_r = 0, load_s = 0;  // the (route, step) of the next unit to load
  const auto load_next = [&](Slot& sl) {
    const bool ok = load_r < n_routes && load_s < lane_steps;
    const uint8_t* codes = codes_s[ok ? warp + load_r * kWarps : 0] + 64 * load_s;
    sl.load(ok, codes + code_lo, codes + code_hi);
    if (++load_s == steps) load_s = 0, ++load_r;
  };
  Slot sl[S];
#pragma unroll
  for (int i = 0; i < S; ++i) {  // in flight while h and the scales are staged
    sl[i].zero();
    load_next(sl[i]);
  }
  uint2* sc_s = reinterpret_cast<uint2*>(smem);
  HT* h_s = reinterpret_cast<HT*>(smem + down_scale_bytes(p.k, steps));
  bool big = false;
  // Entries it = (j * steps + s) * 8 + g, two per thread at a time as in the gate/up kernel (384 at
  // k = 16, I = 384: one round of load latency).
#pragma unroll 1
  for (int it0 = static_cast<int>(threadIdx.x); it0 < n_held * steps * 8; it0 += 2 * kThreads) {
    uint32_t vl[2] = {0u, 0u}, vh[2] = {0u, 0u};
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int it = it0 + b * kThreads;
      if (it < n_held * steps * 8) {
        const int js = it >> 3, jr = js / steps, s = js - jr * steps;
        const uint8_t* row_lo = scales_s[jr] + (it & 7) * sld;
        vl[b] = step_scale_word(row_lo, s, chunks, p.word_scales_dn);
        vh[b] = step_scale_word(row_lo + 8 * sld, s, chunks, p.word_scales_dn);
      }
    }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int it = it0 + b * kThreads;
      if (it < n_held * steps * 8) {
        const int js = it >> 3, jr = js / steps, s = js - jr * steps;
        big |= stage_step_scales<MMA>(sc_s, it, vl[b], vh[b], s, chunks);
      }
    }
  }
  pdl_wait();  // h is complete from here on (and out may be written)
  stage_rows<3>(h_s, static_cast<const HT*>(p.h) + static_cast<int64_t>(t) * p.k * p.h_ld, n_held, p.h_ld, p.I, steps,
                true, route_s);
  big = __syncthreads_or(big);

  RowSums<MMA> acc;
  acc.zero();
  // The unit being summed: held route slot j = warp + r * 8 (route route_s[j]), step s; its staged
  // scales and activations sit at js = j * steps + s (scale pairs [js][g][c], h groups [js][word][c]).
  // Entry (js * 8 + g) holds this lane's scale pair at uint2 c ^ scale_swap(g) (js * 8 % 8 == 0).
  const int sc_lane = g * kStepChunks + (c ^ scale_swap(g));
  int r = 0, s = 0, js = warp * steps;
  for (int u0 = 0; u0 < n_units; u0 += S) {
#pragma unroll
    for (int i = 0; i < S; ++i) {
      if (u0 + i < n_units) {  // warp-uniform
        step_sums(sl[i], sc_s[js * 32 + sc_lane], step_x(h_s, js, c), big, acc);
        load_next(sl[i]);
        ++js;
        if (++s == steps) {  // slot j done: its 16 values e_tj (warp-uniform)
          const int j = warp + r * kWarps;
          float e_lo, e_hi;
          acc.result(e_lo, e_hi);
          if (c == 0) e_s[j][g] = round_if(e_lo, p.round_e), e_s[j][g + 8] = round_if(e_hi, p.round_e);
          acc.zero();
          s = 0, ++r, js += (kWarps - 1) * steps;
        }
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < kDnRows) {
    float sum = 0.0f;  // weight_s[jr] = p[t][route_s[jr]], staged before the wait: no global load here
    for (int jr = 0; jr < n_held; ++jr) sum = __fadd_rn(sum, __fmul_rn(weight_s[jr], e_s[jr][threadIdx.x]));
    store_act(out + row0 + threadIdx.x, sum, p.round_out);
  }
}

// ---------------------------------------------------------------- host

int steps_of(int64_t n) { return static_cast<int>((n / 32 + kStepChunks - 1) / kStepChunks); }
// Dynamic shared memory of a block: the staged scale pairs, then the staged z row / h rows.
size_t gate_up_smem(int64_t L, size_t x_bytes) {
  return static_cast<size_t>(gate_up_scale_bytes(steps_of(L))) +
         static_cast<size_t>(steps_of(L)) * kStepValues * x_bytes;
}
size_t down_smem(int64_t k, int64_t I, size_t h_bytes) {
  return static_cast<size_t>(down_scale_bytes(static_cast<int>(k), steps_of(I))) +
         static_cast<size_t>(k) * steps_of(I) * kStepValues * h_bytes;
}
// Static shared memory of the down block (e table, route pointers) and the gate/up block, at most.
constexpr size_t kStaticSmem = kMaxRoutes * kDnRows * sizeof(float) + 2 * kMaxRoutes * sizeof(void*) +
                               kMaxRoutes * (sizeof(int) + sizeof(float)) + 16;

core::Status gemv_supports(const CudaOps& ops, const MoeExpertsArgs& a) {
  if (auto s = experts_io_supports(ops, a); !s) return s;
  const int64_t T = a.z.dim(0), L = a.z.dim(1), k = a.ids.dim(1);
  using std::to_string;
  if (T < 1 || T * k > kGridYMax)
    return core::Status::fail("the expert GEMV takes 1 token and up to " + to_string(kGridYMax) +
                              " routes (one grid y each), got " + to_string(T) + " tokens of " + to_string(k));
  if (k < 1 || k > kMaxRoutes)
    return core::Status::fail("the expert GEMV takes 1.." + to_string(kMaxRoutes) +
                              " routes per token, got k = " + to_string(k));
  const int64_t I = a.w1[0].out_features();
  if (L % 32 != 0 || I % 32 != 0)
    return core::Status::fail("the expert GEMV needs whole MXFP4 chunks (L and I multiples of 32), got L = " +
                              to_string(L) + ", I = " + to_string(I));
  const size_t x_bytes = a.z.dtype == core::DType::bf16 ? 2 : 4;
  const size_t h_bytes = a.precision == Precision::bf16 ? 2 : 4;
  if (static_cast<size_t>(L) * x_bytes > kSmemBudget || static_cast<size_t>(k * I) * h_bytes > kSmemBudget)
    return core::Status::fail("the expert GEMV stages z (" + to_string(L * x_bytes) + " B) and a token's h rows (" +
                              to_string(k * I * h_bytes) + " B) in at most " + to_string(kSmemBudget) +
                              " B of shared memory");
  // With the staged scales (and rows padded to whole steps) a block may need more than the 48 KB
  // default: opted in at launch, up to the device's limit.
  if (const size_t need = std::max(gate_up_smem(L, x_bytes), down_smem(k, I, h_bytes)) + kStaticSmem;
      need > ops.ctx->smem_optin())
    return core::Status::fail("the expert GEMV needs " + to_string(need) +
                              " B of shared memory per block, the device allows " + to_string(ops.ctx->smem_optin()));
  if (!aligned16(a.z.data) || (T > 1 && (static_cast<size_t>(a.z.strides[0]) * x_bytes) % 16 != 0))
    return core::Status::fail(
        "the expert GEMV reads z rows 16 bytes at a time: z must be 16-byte aligned with rows "
        "a multiple of 16 bytes apart, got " +
        describe(a.z) + " with row stride " + to_string(a.z.strides[0]));
  // MXFP4 everywhere, one layout per matrix (one row stride each), code rows 16-byte aligned.
  const std::span<const LinearWeight> mats[3] = {a.w1, a.w3, a.w2};
  const char* names[3] = {"w1", "w3", "w2"};
  for (int m = 0; m < 3; ++m) {
    const LinearWeight& w0 = mats[m][0];
    if (!w0.is_mxfp4())
      return core::Status::fail(std::string("the expert GEMV reads MXFP4 experts only; ") + names[m] + "[0] is " +
                                describe(w0.weight.view()));
    const int64_t ld = w0.weight.view().strides[0], sld = w0.scale.view().strides[0];
    if (ld % 16 != 0)
      return core::Status::fail(std::string(names[m]) + " code rows are " + to_string(ld) +
                                " bytes apart; the expert GEMV needs a multiple of 16");
    for (size_t e = 0; e < mats[m].size(); ++e) {
      const LinearWeight& w = mats[m][e];
      if (auto s = weight_on_cuda(w, names[m]); !s) return s;
      if (!w.is_mxfp4() || w.weight.view().strides[0] != ld || w.scale.view().strides[0] != sld)
        return core::Status::fail(std::string(names[m]) + "[" + to_string(e) + "] differs in format or layout from " +
                                  names[m] + "[0]");
      if (!aligned16(w.weight.view().data))
        return core::Status::fail(std::string(names[m]) + "[" + to_string(e) +
                                  "] codes are not 16-byte aligned (the expert GEMV loads 16 bytes at a time)");
    }
  }
  return core::Status::ok();
}

void gemv_run(const CudaOps& ops, const MoeExpertsArgs& a) {
  const int64_t T = a.z.dim(0), L = a.z.dim(1), I = a.w1[0].out_features();
  const int k = static_cast<int>(a.ids.dim(1)), E = static_cast<int>(a.w1.size());
  const cudaStream_t stream = ops.ctx->stream();
  const bool round = a.precision == Precision::bf16;

  std::vector<uint64_t> words(static_cast<size_t>(E) * kWordsPerExpert);
  uint64_t scale_bits[3] = {0, 0, 0};  // OR of every scale pointer and row stride, per matrix
  for (int e = 0; e < E; ++e) {
    const LinearWeight* ws[3] = {&a.w1[e], &a.w3[e], &a.w2[e]};
    for (int m = 0; m < 3; ++m) {
      const core::TensorView sv = ws[m]->scale.view();
      words[e * kWordsPerExpert + 2 * m] = reinterpret_cast<uint64_t>(ws[m]->weight.view().data);
      words[e * kWordsPerExpert + 2 * m + 1] = reinterpret_cast<uint64_t>(sv.data);
      scale_bits[m] |= reinterpret_cast<uint64_t>(sv.data) | static_cast<uint64_t>(sv.strides[0]);
    }
  }
  GemvParams p{};
  p.tab.words = static_cast<const uint64_t*>(ops.ctx->device_table(words));
  const WeightRef r1 = weight_ref(a.w1[0]), r3 = weight_ref(a.w3[0]), r2 = weight_ref(a.w2[0]);
  p.tab.ld1 = r1.ld, p.tab.sld1 = r1.scale_ld, p.tab.ld3 = r3.ld, p.tab.sld3 = r3.scale_ld;
  p.tab.ld2 = r2.ld, p.tab.sld2 = r2.scale_ld;
  p.ids = a.ids.as<const int32_t>(), p.ids_ld = a.ids.strides[0];
  p.p = a.weights.as<const float>(), p.p_ld = a.weights.strides[0];
  p.z = a.z.data, p.z_ld = a.z.strides[0];
  p.out = a.out.data, p.out_ld = a.out.strides[0];
  p.L = L, p.I = I, p.k = k, p.E = E;
  p.e_begin = static_cast<int>(a.expert_begin), p.e_total = static_cast<int>(moe_total_experts(a));
  p.steps_l = steps_of(L), p.steps_i = steps_of(I), p.h_ld = p.steps_i * kStepValues;
  // Scale rows 4-byte aligned (every pointer and the row stride): each step's 4 bytes in one load.
  p.word_scales_gu = ((scale_bits[0] | scale_bits[1]) & 3u) == 0, p.word_scales_dn = (scale_bits[2] & 3u) == 0;
  p.beta = a.beta, p.linear_beta = a.linear_beta;
  p.round = round, p.round_e = round && moe_rounds_expert_outputs(a), p.round_out = round && a.round_output;
  // h is a bf16 value whenever it is rounded: stored as bf16 then (the tensor-core down walk).
  const std::shared_ptr<void> h_buf = ops.ctx->scratch(static_cast<size_t>(T * k) * p.h_ld * (round ? 2 : 4));
  p.h = h_buf.get();

  const dim3 grid_gu(grid_for(I, kGuRows), static_cast<unsigned>(T * k));
  const dim3 grid_dn(grid_for(L, kDnRows), static_cast<unsigned>(T));
  const size_t x_bytes = a.z.dtype == core::DType::bf16 ? 2 : 4, h_bytes = round ? 2 : 4;
  const size_t gu_smem = gate_up_smem(L, x_bytes), dn_smem = down_smem(k, I, h_bytes);
  const auto launch = [&](auto x_tag, auto h_tag, auto o_tag) {
    using XT = typename decltype(x_tag)::type;
    using HT = typename decltype(h_tag)::type;
    using OT = typename decltype(o_tag)::type;
    allow_smem(ops, gemv_gate_up_kernel<XT, HT>, gu_smem);
    allow_smem(ops, gemv_down_kernel<HT, OT>, dn_smem);
    gemv_gate_up_kernel<XT, HT><<<grid_gu, kThreads, gu_smem, stream>>>(p);
    K3_CUDA_CHECK_LAUNCH("gemv_gate_up_kernel");
    // down: a programmatic dependent of gate/up (graph-capturable; see the file comment).
    launch_dependent(gemv_down_kernel<HT, OT>, grid_dn, dim3(kThreads), dn_smem, stream, dim3(1, 1, 1), p);
  };
  const bool bf16_z = a.z.dtype == core::DType::bf16;  // bf16 storage implies Precision::bf16 (supports)
  if (bf16_z && a.round_output) launch(Tag<bf16>{}, Tag<bf16>{}, Tag<bf16>{});
  else if (bf16_z) launch(Tag<bf16>{}, Tag<bf16>{}, Tag<float>{});
  else if (round) launch(Tag<float>{}, Tag<bf16>{}, Tag<float>{});
  else launch(Tag<float>{}, Tag<float>{}, Tag<float>{});
}

}  // namespace

void register_moe_experts_gemv_cuda(MoeOps& r, const CudaOps& ops) {
  r.moe_experts.add({"cuda_expert_gemv", core::Device::cuda,
                     [ops](const MoeExpertsArgs& a) { return gemv_supports(ops, a); },
                     [ops](const MoeExpertsArgs& a) { gemv_run(ops, a); }});
}

}  // namespace k3::kernels
