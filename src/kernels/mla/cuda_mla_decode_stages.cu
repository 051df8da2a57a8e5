// kernels/mla/cuda_mla_decode_stages.cu: the launches of the fused MLA decode op that both split_kv
// strategies share (mla_decode.h has the whole design), and the launch sequence:
//   1. q_absorb  grid (H, ceil(L / 32), ceil(Q / 16)), 128 threads: the CTA stages W_UK[h]'s [nope x 32]
//                column tile (16-byte loads) in shared memory, each thread keeps a quarter of one column
//                (<= 64 values) in registers and runs it against the q_nope of the CTA's 16 slots:
//                Qc[qi][h] = [round(W_UK[h]^T q_nope); q_pe]. 192 CTAs at TP8 batch 1 (132 SMs), 768 at 64.
//   3. combine_w_uv_gate  grid (H * 8, ceil(Q / 8)), clusters of 8 CTAs (one per head and chunk of 8 query
//                slots), 256 threads: rank r combines o_lat columns [r L/8, (r+1) L/8) of the chunk's slots,
//                o_lat = round(sum_s w_s o_s / sum_s w_s l_s), w_s = e^{m_s - max m} over the slot's non-empty
//                splits, into its shared memory; after a cluster barrier every rank copies the other slices
//                (distributed shared memory) and computes W_UV rows [r v/8, (r+1) v/8) of head h (in registers,
//                16-byte loads) for the chunk's slots: out = round(round(W_UV o_lat) * round(sigmoid(gate))),
//                or round(W_UV o_lat) without a gate. o_lat never leaves the cluster (one launch where the
//                standard combine + W_UV pair took two; 96 CTAs at TP8 batch 1, 768 at batch 64).
// Sums run in another order than the reference (d in 4 groups, splits in min(16, splits) groups, warp
// shuffles; nvcc contracts multiply-adds): equal to the CPU reference within attention tolerance. Each order
// is fixed by the dims and the split count alone (not by the grid, the batch or a CTA's rank): deterministic.
// Programmatic dependent launch (rules: kernels/cuda_common.cuh), all three launches: each triggers at
// its top. q_absorb stages its W_UK tile ([nope x 32] = 8 KB of bf16 per CTA, 192 CTAs = all 1.57 MB of
// W_UK at K3 TP8 batch 1) in shared memory and combine_w_uv_gate loads its W_UV rows (16 rows x 1 KB per
// CTA, all 1.57 MB of W_UV over the 96 CTAs) into registers before pdl_wait(); the step tables, q, the
// cache (written by the step's cache write), the workspace and the gate are read, and anything is stored,
// only after it. split_kv has no weights: it waits first.
#include <cooperative_groups.h>

#include <algorithm>
#include <string>
#include <utility>

#include "kernels/mla/cuda_mla_decode.cuh"

namespace k3::kernels::cuda_detail {

namespace {

namespace cg = cooperative_groups;

constexpr int kQaThreads = 128;
constexpr int kQaCols = 32;                                  // q_lat columns per CTA (a lane each)
constexpr int kQaGroups = kQaThreads / kQaCols;              // the nope sum in 4 contiguous d ranges
constexpr int kQaSlots = 16;                                 // query slots per CTA
constexpr int kQaMaxDPerGroup = kDecodeMaxNope / kQaGroups;  // W_UK values a thread keeps in registers
constexpr int kCgCluster = 8;                                // CTAs per (head, slot chunk): the portable limit
constexpr int kCgThreads = 256;
constexpr int kCgWarps = kCgThreads / 32;
constexpr int kCgSlots = kCgWarps;              // query slots per cluster (a warp each for M and Z)
constexpr int kCgMaxGroups = 16;                // split groups of the combine sum
constexpr int kCgRowsPerPass = 2;               // W_UV rows a warp holds in registers at once
constexpr int kUvGroups = kMlaMaxLatent / 256;  // 8-column groups per lane: columns 8 * (lane + 32 k) ..
static_assert(kQaCols == 32 && kQaCols % 8 == 0 && kCgSlots == 8 && kUvGroups * 256 == kMlaMaxLatent);

// ---------------------------------------------------------------- 1. q_absorb

// vec: 8 consecutive kv_b elements can be read with 16-byte loads (L % 8 == 0, 16-byte aligned rows).
template <class T, WFmt F>
__global__ void __launch_bounds__(kQaThreads)
    q_absorb_kernel(SeqTables sq, const T* q, int64_t q_ld, WeightRef kv_b, float* qc, int H, int nope, int rope,
                    int vd, int L, bool vec, bool round) {
  extern __shared__ float4 qa_sm4[];
  const int nope_p = padded_floats(nope);
  float* w_s = reinterpret_cast<float*>(qa_sm4);  // [nope][kQaCols]: W_UK[h][d][c0 + c], zeros past L
  float* q_s = w_s + nope * kQaCols;              // [kQaSlots][nope_p]: q_nope of the slots (zeros: unused)
  float* red = q_s + kQaSlots * nope_p + 4;       // [kQaGroups][kQaSlots][kQaCols] (4 floats of slack above)
  __shared__ int64_t t_row[kQaSlots];             // q row of each slot, -1 when unused
  const int tid = threadIdx.x, h = blockIdx.x, c0 = blockIdx.y * kQaCols, E = L + rope;
  const int64_t Q = static_cast<int64_t>(sq.num_seqs) * sq.max_rows, qi0 = static_cast<int64_t>(blockIdx.z) * kQaSlots;
  const int64_t row0 = static_cast<int64_t>(h) * (nope + vd);  // W_UK[h] = kv_b rows row0 .. row0 + nope - 1
  pdl_launch_dependents();
  // W_UK tile first (a weight: before the PDL wait), in flight while the predecessor ends and the slots
  // are looked up.
  if (vec) {
    for (int e = tid; e < nope * (kQaCols / 8); e += kQaThreads) {
      const int d = e / (kQaCols / 8), part = e % (kQaCols / 8), c = c0 + 8 * part;
      float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (c < L) {  // L % 8 == 0: the 8 columns are all inside
        if constexpr (F == WFmt::bf16) load_act_n<8>(static_cast<const bf16*>(kv_b.data) + (row0 + d) * kv_b.ld + c, v);
        else load_act_n<8>(static_cast<const float*>(kv_b.data) + (row0 + d) * kv_b.ld + c, v);
      }
      float4* dst = reinterpret_cast<float4*>(w_s + d * kQaCols + 8 * part);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
  } else {
    for (int e = tid; e < nope * kQaCols; e += kQaThreads) {
      const int d = e / kQaCols, c = e % kQaCols;
      w_s[e] = c0 + c < L ? weight_at<F>(kv_b, row0 + d, c0 + c) : 0.0f;
    }
  }
  pdl_wait();  // the tables, q and the qc workspace from here on
  if (tid < kQaSlots) {
    const int64_t qi = qi0 + tid;
    int seq = 0, i_row = 0;
    t_row[tid] = qi < Q && slot_used(sq, qi, seq, i_row) ? static_cast<int64_t>(sq.row_begin[seq]) + i_row : -1;
  }
  __syncthreads();                                                 // t_row ready
  const int64_t q_col0 = static_cast<int64_t>(h) * (nope + rope);  // head h's q_nope, then its q_pe
  for (int e = tid; e < kQaSlots * nope; e += kQaThreads) {
    const int s = e / nope, d = e % nope;
    q_s[s * nope_p + d] = t_row[s] >= 0 ? to_f32(q[t_row[s] * q_ld + q_col0 + d]) : 0.0f;
  }
  __syncthreads();  // w_s and q_s ready
  // Thread (column c, group g) sums d = d0 .. d0 + dpg - 1 in order with its W_UK values in registers.
  const int c = tid % kQaCols, g = tid / kQaCols, dpg = (nope + kQaGroups - 1) / kQaGroups, d0 = g * dpg;
  const int dn = max(0, min(dpg, nope - d0));  // this group's d count (the last group may be short)
  float w[kQaMaxDPerGroup];
#pragma unroll
  for (int k = 0; k < kQaMaxDPerGroup; ++k) w[k] = k < dn ? w_s[(d0 + k) * kQaCols + c] : 0.0f;
  for (int s = 0; s < kQaSlots; ++s) {
    float acc = 0.0f;
    if (t_row[s] >= 0) {  // CTA-uniform
      const float* qs = q_s + s * nope_p + d0;
#pragma unroll
      for (int k = 0; k < kQaMaxDPerGroup; ++k)
        if (k < dn) acc = fmaf(w[k], qs[k], acc);
    }
    red[(g * kQaSlots + s) * kQaCols + c] = acc;
  }
  __syncthreads();  // red ready
  for (int e = tid; e < kQaSlots * kQaCols; e += kQaThreads) {
    const int s = e / kQaCols, cc = e % kQaCols;
    if (t_row[s] < 0 || c0 + cc >= L) continue;
    float acc = red[s * kQaCols + cc];
#pragma unroll
    for (int gg = 1; gg < kQaGroups; ++gg) acc += red[(gg * kQaSlots + s) * kQaCols + cc];  // groups in order
    qc[((qi0 + s) * H + h) * E + c0 + cc] = round_if(acc, round);
  }
  if (blockIdx.y == 0) {
    for (int e = tid; e < kQaSlots * rope; e += kQaThreads) {
      const int s = e / rope, r = e % rope;
      if (t_row[s] >= 0) qc[((qi0 + s) * H + h) * E + L + r] = to_f32(q[t_row[s] * q_ld + q_col0 + nope + r]);
    }
  }
}

// ---------------------------------------------------------------- 3. combine_w_uv_gate

// One launch's arguments (host integers and pointers only: graph-replayable).
template <class T>
struct CombineUvParams {
  SeqTables sq;
  WeightRef kv_b;       // [H * (nope + vd), L]: W_UV[h] = rows h * (nope + vd) + nope .. + vd - 1
  const float* part_o;  // [Q][H][splits][L]: split_kv's unnormalised partial o (k_scale applied)
  const float* part_m;  // [Q][H][splits]: running max of the scaled scores
  const float* part_l;  // [Q][H][splits]: sum of e^{s - m}
  const T* gate;        // [T, H * vd] gate logits (row stride gate_ld), or nullptr: out = o
  int64_t gate_ld;
  T* out;  // [T, H * vd] (row stride out_ld); may be exactly the gate
  int64_t out_ld;
  int H, nope, vd, L;
  int splits;         // splits per (slot, head) in the partials
  int64_t split_len;  // positions per split (which splits of a slot are non-empty)
  int groups;         // G = min(kCgMaxGroups, splits): split groups of the combine sum
  int cols_per_rank;  // Lc = ceil(L / kCgCluster) rounded up to 4: rank r combines [r Lc, (r + 1) Lc) of [0, L)
  int rows_per_rank;  // Vc = ceil(vd / kCgCluster): rank r computes W_UV rows [r Vc, (r + 1) Vc) of [0, vd)
  bool w_vec;         // W_UV rows readable 8 elements at a time (L % 8 == 0, 16-byte aligned rows)
  bool o_vec4;        // part_o rows readable 4 floats at a time (L % 4 == 0, part_o 16-byte aligned)
  bool round;         // Precision::bf16: o_lat, o and the sigmoid are rounded to bf16
};

// Dynamic shared memory of one CTA: o_lat [kCgSlots][Lp] (Lp = L rounded up to 8) and the split-group
// sums [kCgSlots][G][Lc]. At most 8 x 512 + 8 x 16 x 64 floats = 48 KB (kv_lora <= kMlaMaxLatent).
inline size_t combine_w_uv_smem_bytes(int L, int groups, int cols_per_rank) {
  const size_t lp = static_cast<size_t>(L + 7) / 8 * 8;
  return (kCgSlots * lp + static_cast<size_t>(kCgSlots) * groups * cols_per_rank) * sizeof(float);
}

// kv_b rows row0 + j (j < min(count, kCgRowsPerPass)) into w: lane group kg holds columns 8 * (lane + 32 kg)
// .. + 7; zeros past L and for rows past count. vec: 16-byte loads (L % 8 == 0, aligned rows).
template <WFmt F>
__device__ __forceinline__ void load_w_uv_rows(WeightRef kv_b, int64_t row0, int count, int L, bool vec, int lane,
                                               float (&w)[kCgRowsPerPass][kUvGroups][8]) {
#pragma unroll
  for (int j = 0; j < kCgRowsPerPass; ++j) {
    const int64_t r = row0 + j;
#pragma unroll
    for (int kg = 0; kg < kUvGroups; ++kg) {
      const int c = 8 * (lane + 32 * kg);
      if (j < count && vec && c < L) {
        if constexpr (F == WFmt::bf16) load_act_n<8>(static_cast<const bf16*>(kv_b.data) + r * kv_b.ld + c, w[j][kg]);
        else load_act_n<8>(static_cast<const float*>(kv_b.data) + r * kv_b.ld + c, w[j][kg]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) w[j][kg][i] = j < count && c + i < L ? weight_at<F>(kv_b, r, c + i) : 0.0f;
      }
    }
  }
}

// Grid (H * kCgCluster, ceil(Q / kCgSlots)), cluster (kCgCluster, 1, 1), kCgThreads threads: cluster
// (h, chunk) serves head h for query slots qi0 = chunk * kCgSlots .. + kCgSlots - 1; CTA rank r
//   a. loads its W_UV rows into registers (before the PDL wait; warp w: rows e0 + w * rpw .. + rpw - 1,
//      rpw = ceil(Vc / 8), kCgRowsPerPass at a time),
//   b. per slot (a warp each): M = max m_s, Z = sum_s e^{m_s - M} l_s over the non-empty splits (lanes
//      stride the splits in order, then the warp's shuffle tree: an order fixed by `splits`),
//   c. combines columns [r Lc, (r + 1) Lc) of o_lat for the chunk's slots: G split groups (group g sums
//      splits g, g + G, .. in order, G = min(16, splits)), the groups added in order, / Z, rounded: an
//      order fixed by (splits, L) whatever the grid, batch or rank,
//   d. cluster barrier; copies the other ranks' columns from their shared memory (DSMEM) into its own
//      o_lat; arrives on the second cluster barrier (done reading),
//   e. o = round(W_UV o_lat) for its rows and the chunk's used slots (a warp per row pair, the row dot as
//      w_uv's: lane-ordered FMAs, then the shuffle tree), out = round(o * round(sigmoid(gate))) or o,
//   f. waits on the second barrier: no CTA frees its shared memory while another may still read it.
// Every thread of every CTA reaches both cluster barriers (no early exit): an unused slot or a rank with no
// columns / rows only skips work.
template <class T, WFmt F>
__global__ void __launch_bounds__(kCgThreads) combine_w_uv_gate_kernel(const CombineUvParams<T> p) {
  extern __shared__ float4 cg_sm4[];
  const int L = p.L, Lp = (L + 7) / 8 * 8, Lc = p.cols_per_rank, G = p.groups;
  float* ol = reinterpret_cast<float*>(cg_sm4);     // [kCgSlots][Lp]: o_lat of the chunk's slots, zeros past L
  float* part = ol + kCgSlots * Lp;                 // [kCgSlots][G][Lc]: split-group sums of this rank's columns
  __shared__ int64_t t_row[kCgSlots];               // q row of each slot, -1 when unused
  __shared__ int used_s[kCgSlots];                  // non-empty splits of each slot
  __shared__ float max_s[kCgSlots], z_s[kCgSlots];  // M and Z of each slot
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());  // = blockIdx.x % kCgCluster
  const int h = static_cast<int>(blockIdx.x) / kCgCluster, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t Q = static_cast<int64_t>(p.sq.num_seqs) * p.sq.max_rows;
  const int64_t qi0 = static_cast<int64_t>(blockIdx.y) * kCgSlots;
  const int e0 = rank * p.rows_per_rank, e1 = min(p.vd, e0 + p.rows_per_rank);
  const int rows_per_warp = (p.rows_per_rank + kCgWarps - 1) / kCgWarps;
  const int e_first = e0 + warp * rows_per_warp, rows = max(0, min(rows_per_warp, e1 - e_first));
  const int64_t uv_row0 = static_cast<int64_t>(h) * (p.nope + p.vd) + p.nope;  // W_UV[h][0] in kv_b

  // a. The first W_UV rows (a weight: before the PDL wait, in flight while the predecessor ends).
  pdl_launch_dependents();
  float w[kCgRowsPerPass][kUvGroups][8];
  load_w_uv_rows<F>(p.kv_b, uv_row0 + e_first, rows, L, p.w_vec, lane, w);
  pdl_wait();  // the tables, the partials and the gate from here on; out is stored after it

  // b. Slot qi0 + warp's softmax stats (every rank computes the same values).
  {
    const int64_t qi = qi0 + warp;
    int seq = 0, i_row = 0;
    const bool live = qi < Q && slot_used(p.sq, qi, seq, i_row);
    int used = 0;
    float M = -INFINITY, z = 0.0f;
    if (live) {  // warp-uniform
      const int64_t visible = static_cast<int64_t>(p.sq.position[seq]) + i_row + 1;
      const int64_t nonempty = (visible + p.split_len - 1) / p.split_len;  // splits with a visible position
      used = nonempty < p.splits ? static_cast<int>(nonempty) : p.splits;
      const int64_t base = (qi * p.H + h) * p.splits;
      for (int j = lane; j < used; j += 32) M = fmaxf(M, p.part_m[base + j]);
      M = warp_max(M);
      for (int j = lane; j < used; j += 32) z += expf(p.part_m[base + j] - M) * p.part_l[base + j];
      z = warp_sum(z);
    }
    if (lane == 0) {
      t_row[warp] = live ? static_cast<int64_t>(p.sq.row_begin[seq]) + i_row : -1;
      used_s[warp] = used;
      max_s[warp] = M;
      z_s[warp] = z;
    }
  }
  const int pad = Lp - L;  // o_lat's zero columns (read by the W_UV dot beside zero weights)
  for (int x = tid; x < kCgSlots * pad; x += kCgThreads) ol[(x / pad) * Lp + L + x % pad] = 0.0f;
  __syncthreads();  // stats and t_row ready

  // c. This rank's columns [c0, c1): float4 column quads x split groups x slots.
  const int c0 = rank * Lc, c1 = min(L, c0 + Lc), quads = Lc / 4;
  for (int it = tid; it < kCgSlots * G * quads; it += kCgThreads) {
    const int q = it % quads, g = (it / quads) % G, s = it / (quads * G), col = c0 + 4 * q;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t_row[s] >= 0 && col < c1) {
      const int used = used_s[s];
      const float M = max_s[s];
      const int64_t base = ((qi0 + s) * p.H + h) * p.splits;
      if (p.o_vec4) {  // L % 4 == 0: c1 is too, so the whole quad is inside
#pragma unroll 4
        for (int j = g; j < used; j += G) {
          const float ws = expf(p.part_m[base + j] - M);
          const float4 o = *reinterpret_cast<const float4*>(p.part_o + (base + j) * L + col);
          acc.x += ws * o.x, acc.y += ws * o.y, acc.z += ws * o.z, acc.w += ws * o.w;
        }
      } else {
        for (int j = g; j < used; j += G) {
          const float ws = expf(p.part_m[base + j] - M);
          const float* o = p.part_o + (base + j) * L + col;
          acc.x += ws * o[0];
          if (col + 1 < c1) acc.y += ws * o[1];
          if (col + 2 < c1) acc.z += ws * o[2];
          if (col + 3 < c1) acc.w += ws * o[3];
        }
      }
    }
    *reinterpret_cast<float4*>(part + (s * G + g) * Lc + 4 * q) = acc;
  }
  __syncthreads();  // part ready
  for (int x = tid; x < kCgSlots * Lc; x += kCgThreads) {
    const int s = x / Lc, c = x % Lc;
    if (t_row[s] < 0 || c0 + c >= c1) continue;
    const float* ps = part + s * G * Lc + c;
    float sum = ps[0];
    for (int g = 1; g < G; ++g) sum += ps[g * Lc];  // groups in order
    ol[s * Lp + c0 + c] = round_if(sum / z_s[s], p.round);
  }

  // d. Every rank's slice (and zero padding) is written (release / acquire at cluster scope); gather the
  // other ranks' quads. Column quad k lives in rank 4k / Lc (Lc % 4 == 0: a quad never straddles two
  // ranks); a quad reaching past L brings the owner's zero padding. Only the owner writes its own
  // columns, and never after this barrier, so these reads race with nothing.
  cluster.sync();
  const int quads_p = Lp / 4;
  for (int x = tid; x < kCgSlots * quads_p; x += kCgThreads) {
    const int s = x / quads_p, k = x % quads_p, src = 4 * k / Lc;
    if (t_row[s] < 0 || 4 * k >= L || src == rank) continue;
    const float4* remote = reinterpret_cast<const float4*>(cluster.map_shared_rank(ol, src));
    reinterpret_cast<float4*>(ol)[x] = remote[x];  // float4 x = slot s, columns 4k .. 4k + 3
  }
  auto done_reading = cluster.barrier_arrive();  // this CTA reads no other CTA's shared memory any more
  __syncthreads();                               // the whole o_lat of the chunk is in ol

  // e. W_UV rows of this warp, kCgRowsPerPass at a time (TP8: Vc = 16, one pass of 2 rows per warp).
  for (int pass = 0; pass * kCgRowsPerPass < rows; ++pass) {  // warp-uniform
    const int first = e_first + pass * kCgRowsPerPass, count = min(kCgRowsPerPass, rows - pass * kCgRowsPerPass);
    if (pass > 0) load_w_uv_rows<F>(p.kv_b, uv_row0 + first, count, L, p.w_vec, lane, w);
    for (int s = 0; s < kCgSlots; ++s) {
      if (t_row[s] < 0) continue;  // warp-uniform
      float acc[kCgRowsPerPass];
#pragma unroll
      for (int j = 0; j < kCgRowsPerPass; ++j) acc[j] = 0.0f;
#pragma unroll
      for (int kg = 0; kg < kUvGroups; ++kg) {
        const int c = 8 * (lane + 32 * kg);
        if (c < Lp) {  // zeros past L on both sides
          const float4 a = *reinterpret_cast<const float4*>(ol + s * Lp + c);
          const float4 b = *reinterpret_cast<const float4*>(ol + s * Lp + c + 4);
#pragma unroll
          for (int j = 0; j < kCgRowsPerPass; ++j) {
            const float* wj = w[j][kg];
            acc[j] = fmaf(wj[0], a.x, acc[j]), acc[j] = fmaf(wj[1], a.y, acc[j]), acc[j] = fmaf(wj[2], a.z, acc[j]);
            acc[j] = fmaf(wj[3], a.w, acc[j]), acc[j] = fmaf(wj[4], b.x, acc[j]), acc[j] = fmaf(wj[5], b.y, acc[j]);
            acc[j] = fmaf(wj[6], b.z, acc[j]), acc[j] = fmaf(wj[7], b.w, acc[j]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kCgRowsPerPass; ++j) {
        const float dot = warp_sum(acc[j]);
        if (lane == 0 && j < count) {
          const int64_t col = static_cast<int64_t>(h) * p.vd + first + j;
          const float o = round_if(dot, p.round);  // o = round(W_UV o_lat): the standard op's output
          float v = o;
          if (p.gate != nullptr) v = o * round_if(sigmoid_f32(to_f32(p.gate[t_row[s] * p.gate_ld + col])), p.round);
          store_act(p.out + t_row[s] * p.out_ld + col, v, p.round);  // after its own gate element was read
        }
      }
    }
  }
  cluster.barrier_wait(std::move(done_reading));  // f. every rank is done reading this CTA's o_lat
}

}  // namespace

// ---------------------------------------------------------------- host

core::Status decode_supports_common(const CudaOps& ops, const MlaDecodeArgs& a) {
  if (auto s = mla_supports(ops, mla_decode_attention_args(a, a.out)); !s) return s;
  if (ops.ctx->info().cc_major < 9)  // combine_w_uv_gate: thread-block clusters, distributed shared memory
    return core::Status::fail(
        "mla_decode's combine_w_uv_gate runs as a thread-block cluster: needs compute "
        "capability 9.0, got " +
        std::to_string(ops.ctx->info().cc_major) + "." + std::to_string(ops.ctx->info().cc_minor));
  if (a.gate.data != nullptr) {
    if (auto s = on_cuda({{"gate", &a.gate}}); !s) return s;
    if (auto s = same_act({{"q", &a.q}, {"gate", &a.gate}}, a.precision); !s) return s;
    if (overlaps(a.out, a.gate) && a.out.data != a.gate.data)
      return core::Status::fail("out overlaps gate without being the same view");
  }
  if (a.workspace.data != nullptr)
    if (auto s = on_cuda({{"workspace", &a.workspace}}); !s) return s;
  const int64_t slots = static_cast<int64_t>(a.seqs.num_seqs) * a.seqs.max_rows;  // split_kv grid.y
  if (slots > kMaxGridYZ)
    return core::Status::fail("num_seqs * max_rows = " + std::to_string(slots) + " is above the CUDA grid limit " +
                              std::to_string(kMaxGridYZ));
  if (a.num_heads > kDecodeMaxHeads)
    return core::Status::fail("num_heads " + std::to_string(a.num_heads) + " is above the split_kv limit " +
                              std::to_string(kDecodeMaxHeads) + " (all heads share one CTA)");
  if (a.kv_lora > kMlaMaxLatent)
    return core::Status::fail("kv_lora " + std::to_string(a.kv_lora) + " is above the CUDA limit " +
                              std::to_string(kMlaMaxLatent));
  if (a.qk_nope > kDecodeMaxNope)
    return core::Status::fail("qk_nope " + std::to_string(a.qk_nope) + " is above the q_absorb limit " +
                              std::to_string(kDecodeMaxNope));
  if (a.kv_b->is_mxfp4()) return core::Status::fail("kv_b must be a dense bf16 or f32 weight (MXFP4 given)");
  return core::Status::ok();
}

void decode_run(const CudaOps& ops, const MlaDecodeArgs& a, SplitKvLaunch split_kv) {
  const SeqTables sq = seq_tables(a.seqs);
  DecodePlan plan;
  plan.Q = static_cast<int64_t>(sq.num_seqs) * sq.max_rows;
  if (plan.Q <= 0) return;
  plan.H = a.num_heads, plan.nope = a.qk_nope, plan.rope = a.qk_rope, plan.vd = a.v_head_dim, plan.L = a.kv_lora;
  plan.E = plan.L + plan.rope;
  plan.split_len = mla_decode_split_len(a);
  plan.splits = static_cast<int>(mla_decode_num_splits(a));
  const int64_t Q = plan.Q;
  const int H = plan.H, nope = plan.nope, rope = plan.rope, vd = plan.vd, L = plan.L;
  const cudaStream_t stream = ops.ctx->stream();
  const bool round = a.precision == Precision::bf16;

  // Workspace: Qc [Q][H][E], then the partials (o_lat stays in the combine_w_uv_gate clusters' shared memory).
  std::shared_ptr<void> scratch;
  float* ws = nullptr;
  if (a.workspace.data != nullptr) {
    ws = a.workspace.as<float>();
  } else {
    scratch = ops.ctx->scratch(static_cast<size_t>(mla_decode_workspace_floats(a)) * sizeof(float));
    ws = static_cast<float*>(scratch.get());
  }
  plan.qc = ws;
  plan.part_o = ws + Q * H * plan.E;
  plan.part_m = plan.part_o + Q * H * plan.splits * L;
  plan.part_l = plan.part_m + Q * H * plan.splits;

  const WeightRef w = weight_ref(*a.kv_b);
  const size_t welem = a.kv_b->weight.dtype() == core::DType::bf16 ? 2 : 4;
  const bool w_vec = L % 8 == 0 && aligned16(w.data) && (w.ld * welem) % 16 == 0;
  with_act(a.q.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_wfmt(weight_format(*a.kv_b), [&](auto fc) {
      constexpr WFmt FC = decltype(fc)::value;
      if constexpr (FC != WFmt::mxfp4) {  // refused by decode_supports_common
        // w_s [nope][32], q_s [16][nope_p] + 4 floats of slack, red [4][16][32]
        const size_t qa_floats = static_cast<size_t>(nope) * kQaCols +
                                 static_cast<size_t>(kQaSlots) * padded_floats(nope) + 4 +
                                 static_cast<size_t>(kQaGroups) * kQaSlots * kQaCols;
        const size_t qa_smem = qa_floats * sizeof(float);
        allow_smem(ops, q_absorb_kernel<T, FC>, qa_smem);
        launch_dependent(q_absorb_kernel<T, FC>, dim3(H, grid_for(L, kQaCols), grid_for(Q, kQaSlots)), dim3(kQaThreads),
                         qa_smem, stream, dim3(1, 1, 1), sq, a.q.as<const T>(), a.q.strides[0], w, plan.qc, H, nope,
                         rope, vd, L, w_vec, round);
        K3_CUDA_CHECK_LAUNCH("mla_decode q_absorb_kernel");

        split_kv(ops, a, plan);

        // One cluster of kCgCluster CTAs per (head, chunk of kCgSlots slots); a programmatic dependent.
        CombineUvParams<T> cp;
        cp.sq = sq;
        cp.kv_b = w;
        cp.part_o = plan.part_o, cp.part_m = plan.part_m, cp.part_l = plan.part_l;
        cp.gate = a.gate.data != nullptr ? a.gate.as<const T>() : nullptr;
        cp.gate_ld = a.gate.data != nullptr ? a.gate.strides[0] : 0;
        cp.out = a.out.as<T>();
        cp.out_ld = a.out.strides[0];
        cp.H = H, cp.nope = nope, cp.vd = vd, cp.L = L;
        cp.splits = plan.splits;
        cp.split_len = plan.split_len;
        cp.groups = std::min(kCgMaxGroups, plan.splits);
        cp.cols_per_rank = (static_cast<int>(grid_for(L, kCgCluster)) + 3) / 4 * 4;
        cp.rows_per_rank = static_cast<int>(grid_for(vd, kCgCluster));
        cp.w_vec = w_vec;
        cp.o_vec4 = L % 4 == 0 && aligned16(plan.part_o);
        cp.round = round;
        const size_t cg_smem = combine_w_uv_smem_bytes(L, cp.groups, cp.cols_per_rank);
        allow_smem(ops, combine_w_uv_gate_kernel<T, FC>, cg_smem);
        const dim3 cg_grid(static_cast<unsigned>(H * kCgCluster), grid_for(Q, kCgSlots));
        launch_dependent(combine_w_uv_gate_kernel<T, FC>, cg_grid, dim3(kCgThreads), cg_smem, stream,
                         dim3(kCgCluster, 1, 1), cp);
        K3_CUDA_CHECK_LAUNCH("mla_decode combine_w_uv_gate_kernel");
      }
    });
  });
}

}  // namespace k3::kernels::cuda_detail
