// kernels/mla_decode/cuda_mla_decode_stages.cu: the launches of the fused MLA decode op that both split_kv
// strategies share (mla_decode.h has the whole design), and the launch sequence:
//   1. q_absorb  grid (H, ceil(L / 32), ceil(Q / 16)), 128 threads: the CTA stages W_UK[h]'s [nope x 32]
//                column tile (16-byte loads) in shared memory, each thread keeps a quarter of one column
//                (<= 64 values) in registers and runs it against the q_nope of the CTA's 16 slots:
//                Qc[qi][h] = [round(W_UK[h]^T q_nope); q_pe]. 192 CTAs at TP8 batch 1 (132 SMs), 768 at 64.
//   3. combine   grid (Q * H, ceil(L / 128)), 256 threads = 32 float4 columns x 8 split groups:
//                o_lat = round(sum_s w_s o_s / sum_s w_s l_s), w_s = e^{m_s - max m}, over the slot's
//                non-empty splits (written into the Qc region: Qc is dead once split_kv is done).
//   4. w_uv_gate grid (H * ceil(v / 8), ceil(Q / 8)), 256 threads: a warp per W_UV row (in registers,
//                16-byte loads) against the o_lat of 8 slots (shared memory):
//                out = round(round(W_UV o_lat) * round(sigmoid(gate))), or round(W_UV o_lat) without a gate.
// Sums run in another order than the reference (d in 4 groups, splits in 8 groups, warp shuffles; nvcc
// contracts multiply-adds): equal to the CPU reference within attention tolerance.
// Programmatic dependent launch (rules: kernels/cuda_common.cuh), all four launches: each triggers at
// its top. q_absorb stages its W_UK tile ([nope x 32] = 8 KB of bf16 per CTA, 192 CTAs = all 1.57 MB of
// W_UK at K3 TP8 batch 1) in shared memory and w_uv_gate loads its W_UV rows (8 rows x 1 KB per CTA, all
// 1.57 MB of W_UV) into registers before pdl_wait(); the step tables, q, the cache (written by the step's
// cache write), the workspace and the gate are read, and anything is stored, only after it. split_kv
// and combine have no weights: they wait first.
#include <algorithm>
#include <string>

#include "kernels/mla_decode/cuda_mla_decode.cuh"

namespace k3::kernels::cuda_detail {

namespace {

constexpr int kQaThreads = 128;
constexpr int kQaCols = 32;                                 // q_lat columns per CTA (a lane each)
constexpr int kQaGroups = kQaThreads / kQaCols;             // the nope sum in 4 contiguous d ranges
constexpr int kQaSlots = 16;                                // query slots per CTA
constexpr int kQaMaxDPerGroup = kDecodeMaxNope / kQaGroups; // W_UK values a thread keeps in registers
constexpr int kCombineThreads = 256;
constexpr int kCombineCols = 128;                           // 32 lanes x 4 columns
constexpr int kCombineGroups = kCombineThreads / (kCombineCols / 4);  // 8 split groups (a warp each)
constexpr int kUvThreads = 256;
constexpr int kUvRows = kUvThreads / 32;                    // W_UV rows per CTA (a warp each)
constexpr int kUvSlots = 8;                                 // query slots per CTA
constexpr int kUvGroups = kMlaMaxLatent / 256;              // 8-column groups per lane: columns 8 * (lane + 32 k) ..
static_assert(kQaCols == 32 && kQaCols % 8 == 0 && kCombineGroups == kCombineThreads / 32);

// ---------------------------------------------------------------- 1. q_absorb

// vec: 8 consecutive kv_b elements can be read with 16-byte loads (L % 8 == 0, 16-byte aligned rows).
template <class T, WFmt F>
__global__ void __launch_bounds__(kQaThreads) q_absorb_kernel(SeqTables sq, const T* q, int64_t q_ld, WeightRef kv_b,
                                                              float* qc, int H, int nope, int rope, int vd, int L,
                                                              bool vec, bool round) {
  extern __shared__ float4 qa_sm4[];
  const int nope_p = padded_floats(nope);
  float* w_s = reinterpret_cast<float*>(qa_sm4);     // [nope][kQaCols]: W_UK[h][d][c0 + c], zeros past L
  float* q_s = w_s + nope * kQaCols;                 // [kQaSlots][nope_p]: q_nope of the slots (zeros: unused)
  float* red = q_s + kQaSlots * nope_p + 4;          // [kQaGroups][kQaSlots][kQaCols] (4 floats of slack above)
  __shared__ int64_t t_row[kQaSlots];                // q row of each slot, -1 when unused
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
        if constexpr (F == WFmt::bf16)
          load_act_n<8>(static_cast<const bf16*>(kv_b.data) + (row0 + d) * kv_b.ld + c, v);
        else
          load_act_n<8>(static_cast<const float*>(kv_b.data) + (row0 + d) * kv_b.ld + c, v);
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
  __syncthreads();  // t_row ready
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
      if (t_row[s] >= 0)
        qc[((qi0 + s) * H + h) * E + L + r] = to_f32(q[t_row[s] * q_ld + q_col0 + nope + r]);
    }
  }
}

// ---------------------------------------------------------------- 3. combine

// vec4: part_o and o_lat rows can be read / written 4 floats at a time (L % 4 == 0, 16-byte aligned).
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(SeqTables sq, const float* part_o,
                                                                  const float* part_m, const float* part_l, int H,
                                                                  int splits, int64_t split_len, float* o_lat, int L,
                                                                  bool vec4, bool round) {
  extern __shared__ float weight[];  // [splits]: e^{m_s - M}
  __shared__ float red[32];
  __shared__ float4 partial[kCombineGroups][kCombineCols / 4];
  const int64_t qh = blockIdx.x, qi = qh / H;  // blockIdx.x = qi * H + h
  pdl_launch_dependents();
  pdl_wait();  // no weights: everything this kernel reads is the step's (tables, split_kv's partials)
  int seq, i_row;
  if (!slot_used(sq, qi, seq, i_row)) return;  // the whole block: an unused slot
  const int64_t visible = static_cast<int64_t>(sq.position[seq]) + i_row + 1;
  const int64_t nonempty = (visible + split_len - 1) / split_len;  // splits with a visible position
  const int used = nonempty < splits ? static_cast<int>(nonempty) : splits;
  const int64_t base = qh * splits;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < used; s += kCombineThreads) m = fmaxf(m, part_m[base + s]);
  const float M = block_max(m, red);
  float z = 0.0f;
  for (int s = threadIdx.x; s < used; s += kCombineThreads) {
    const float w = expf(part_m[base + s] - M);
    weight[s] = w;
    z += w * part_l[base + s];
  }
  const float Z = block_sum(z, red);  // its barriers also publish weight[]
  const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
  const int col = blockIdx.y * kCombineCols + 4 * lane;  // this thread's 4 columns col .. col + 3
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (col < L) {
    if (vec4) {
#pragma unroll 4
      for (int s = g; s < used; s += kCombineGroups) {
        const float ws = weight[s];
        const float4 o = *reinterpret_cast<const float4*>(part_o + (base + s) * L + col);
        acc.x += ws * o.x, acc.y += ws * o.y, acc.z += ws * o.z, acc.w += ws * o.w;
      }
    } else {
      for (int s = g; s < used; s += kCombineGroups) {
        const float ws = weight[s];
        const float* o = part_o + (base + s) * L + col;
        acc.x += ws * o[0];
        if (col + 1 < L) acc.y += ws * o[1];
        if (col + 2 < L) acc.z += ws * o[2];
        if (col + 3 < L) acc.w += ws * o[3];
      }
    }
  }
  partial[g][lane] = acc;
  __syncthreads();
  if (g == 0 && col < L) {
    float4 sum = partial[0][lane];
#pragma unroll
    for (int k = 1; k < kCombineGroups; ++k) {  // groups in order
      const float4 x = partial[k][lane];
      sum.x += x.x, sum.y += x.y, sum.z += x.z, sum.w += x.w;
    }
    float* dst = o_lat + qh * L + col;
    const float4 r = make_float4(round_if(sum.x / Z, round), round_if(sum.y / Z, round), round_if(sum.z / Z, round),
                                 round_if(sum.w / Z, round));
    if (vec4) {
      *reinterpret_cast<float4*>(dst) = r;
    } else {
      dst[0] = r.x;
      if (col + 1 < L) dst[1] = r.y;
      if (col + 2 < L) dst[2] = r.z;
      if (col + 3 < L) dst[3] = r.w;
    }
  }
}

// ---------------------------------------------------------------- 4. w_uv_gate

// Grid (H * row blocks, slot chunks of kUvSlots): the CTA's rows e = rb * kUvRows + warp all belong to
// head h = blockIdx.x / row_blocks. Lane k-group kg holds columns 8 * (lane + 32 kg) .. + 7 of its row.
// vec: 16-byte loads of W_UV (L % 8 == 0, aligned rows); o_lat rows in shared memory padded to Lp.
template <class T, WFmt F>
__global__ void __launch_bounds__(kUvThreads) w_uv_gate_kernel(SeqTables sq, WeightRef kv_b, const float* o_lat,
                                                               const T* gate, int64_t gate_ld, T* out, int64_t out_ld,
                                                               int H, int nope, int vd, int L, int row_blocks, bool vec,
                                                               bool round) {
  extern __shared__ float4 uv_sm4[];
  float* ol = reinterpret_cast<float*>(uv_sm4);  // [kUvSlots][Lp], zeros past L
  __shared__ int64_t t_row[kUvSlots];            // q row of each slot of the chunk, -1 when unused
  const int Lp = (L + 7) / 8 * 8;
  const int h = blockIdx.x / row_blocks, e = (blockIdx.x % row_blocks) * kUvRows + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int64_t Q = static_cast<int64_t>(sq.num_seqs) * sq.max_rows, qi0 = static_cast<int64_t>(blockIdx.y) * kUvSlots;
  // The W_UV row first (registers; a weight: before the PDL wait, its loads overlap the predecessor's end
  // and the staging below).
  pdl_launch_dependents();
  float w[kUvGroups][8];
  const int64_t r = static_cast<int64_t>(h) * (nope + vd) + nope + (e < vd ? e : 0);  // W_UV[h][e] in kv_b
#pragma unroll
  for (int kg = 0; kg < kUvGroups; ++kg) {
    const int c = 8 * (lane + 32 * kg);
    if (vec && c < L) {
      if constexpr (F == WFmt::bf16)
        load_act_n<8>(static_cast<const bf16*>(kv_b.data) + r * kv_b.ld + c, w[kg]);
      else
        load_act_n<8>(static_cast<const float*>(kv_b.data) + r * kv_b.ld + c, w[kg]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) w[kg][j] = c + j < L ? weight_at<F>(kv_b, r, c + j) : 0.0f;
    }
  }
  pdl_wait();  // the tables, o_lat and the gate from here on; out is stored after it
  if (threadIdx.x < kUvSlots) {
    const int64_t qi = qi0 + threadIdx.x;
    int seq = 0, i_row = 0;
    t_row[threadIdx.x] = qi < Q && slot_used(sq, qi, seq, i_row) ? static_cast<int64_t>(sq.row_begin[seq]) + i_row : -1;
  }
  __syncthreads();
  for (int x = threadIdx.x; x < kUvSlots * Lp; x += kUvThreads) {
    const int s = x / Lp, i = x % Lp;
    ol[x] = t_row[s] >= 0 && i < L ? o_lat[((qi0 + s) * H + h) * L + i] : 0.0f;
  }
  __syncthreads();
  if (e >= vd) return;  // after the last barrier: a warp with no W_UV row
  for (int s = 0; s < kUvSlots; ++s) {
    if (t_row[s] < 0) continue;  // warp-uniform
    float acc = 0.0f;
#pragma unroll
    for (int kg = 0; kg < kUvGroups; ++kg) {
      const int c = 8 * (lane + 32 * kg);
      if (c < Lp) {  // zeros past L on both sides
        const float4 a = *reinterpret_cast<const float4*>(ol + s * Lp + c);
        const float4 b = *reinterpret_cast<const float4*>(ol + s * Lp + c + 4);
        acc = fmaf(w[kg][0], a.x, acc), acc = fmaf(w[kg][1], a.y, acc), acc = fmaf(w[kg][2], a.z, acc);
        acc = fmaf(w[kg][3], a.w, acc), acc = fmaf(w[kg][4], b.x, acc), acc = fmaf(w[kg][5], b.y, acc);
        acc = fmaf(w[kg][6], b.z, acc), acc = fmaf(w[kg][7], b.w, acc);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      const int64_t col = static_cast<int64_t>(h) * vd + e;
      const float o = round_if(acc, round);  // o = round(W_UV o_lat): the standard op's output
      float v = o;
      if (gate != nullptr) v = o * round_if(sigmoid_f32(to_f32(gate[t_row[s] * gate_ld + col])), round);
      store_act(out + t_row[s] * out_ld + col, v, round);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- host

core::Status decode_supports_common(const CudaOps& ops, const MlaDecodeArgs& a) {
  if (auto s = mla_supports(ops, mla_decode_attention_args(a, a.out)); !s) return s;
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

  // Workspace: Qc [Q][H][E] (reused for o_lat [Q][H][L] once split_kv is done), then the partials.
  std::shared_ptr<void> scratch;
  float* ws = nullptr;
  if (a.workspace.data != nullptr) {
    ws = a.workspace.as<float>();
  } else {
    scratch = ops.ctx->scratch(static_cast<size_t>(mla_decode_workspace_floats(a)) * sizeof(float));
    ws = static_cast<float*>(scratch.get());
  }
  plan.qc = ws;
  plan.o_lat = ws;
  plan.part_o = ws + Q * H * plan.E;
  plan.part_m = plan.part_o + Q * H * plan.splits * L;
  plan.part_l = plan.part_m + Q * H * plan.splits;

  const WeightRef w = weight_ref(*a.kv_b);
  const size_t welem = a.kv_b->weight.dtype() == core::DType::bf16 ? 2 : 4;
  const bool w_vec = L % 8 == 0 && aligned16(w.data) && (w.ld * welem) % 16 == 0;
  const int row_blocks = (vd + kUvRows - 1) / kUvRows;
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
        allow_smem(q_absorb_kernel<T, FC>, qa_smem);
        launch_dependent(q_absorb_kernel<T, FC>, dim3(H, grid_for(L, kQaCols), grid_for(Q, kQaSlots)), dim3(kQaThreads),
                         qa_smem, stream, dim3(1, 1, 1), sq, a.q.as<const T>(), a.q.strides[0], w, plan.qc, H, nope,
                         rope, vd, L, w_vec, round);
        K3_CUDA_CHECK_LAUNCH("mla_decode q_absorb_kernel");

        split_kv(ops, a, plan);

        const bool c_vec4 = L % 4 == 0 && aligned16(plan.part_o) && aligned16(plan.o_lat);
        const size_t combine_smem = static_cast<size_t>(padded_floats(plan.splits)) * sizeof(float);
        allow_smem(combine_kernel, combine_smem);
        const dim3 combine_grid(static_cast<unsigned>(Q * H), grid_for(L, kCombineCols));
        launch_dependent(combine_kernel, combine_grid, dim3(kCombineThreads), combine_smem, stream, dim3(1, 1, 1), sq,
                         static_cast<const float*>(plan.part_o), static_cast<const float*>(plan.part_m),
                         static_cast<const float*>(plan.part_l), H, plan.splits, plan.split_len, plan.o_lat, L, c_vec4,
                         round);
        K3_CUDA_CHECK_LAUNCH("mla_decode combine_kernel");

        const size_t uv_smem = static_cast<size_t>(kUvSlots) * ((L + 7) / 8 * 8) * sizeof(float);
        allow_smem(w_uv_gate_kernel<T, FC>, uv_smem);
        const T* gate = a.gate.data != nullptr ? a.gate.as<const T>() : nullptr;
        const int64_t gate_ld = a.gate.data != nullptr ? a.gate.strides[0] : 0;
        const dim3 uv_grid(H * row_blocks, grid_for(Q, kUvSlots));
        launch_dependent(w_uv_gate_kernel<T, FC>, uv_grid, dim3(kUvThreads), uv_smem, stream, dim3(1, 1, 1), sq, w,
                         static_cast<const float*>(plan.o_lat), gate, gate_ld, a.out.as<T>(), a.out.strides[0], H,
                         nope, vd, L, row_blocks, w_vec, round);
        K3_CUDA_CHECK_LAUNCH("mla_decode w_uv_gate_kernel");
      }
    });
  });
}

}  // namespace k3::kernels::cuda_detail
