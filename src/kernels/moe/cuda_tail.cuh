// kernels/moe/cuda_tail.cuh: what the two CUDA files of moe_tail_combine share (cuda.cu: the
// two-launch forms and the registration; cuda_one_launch.cu: the one-launch form): the kernel
// parameters, the prologue's per-element math (one copy, so every form rounds at the same points and
// sums the squares in the same order), the m16n8k16 helpers, and the host pieces both sides call.
// Included by those two files only.
#pragma once
#include "kernels/cuda_common.cuh"
#include "kernels/moe/moe_tail.h"

namespace k3::kernels::moe_tail_cuda {

using namespace cuda_detail;

constexpr int kThreads = 256;  // every kernel of the op: 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kMmaRows = 16;  // weight rows (output columns) of one m16 tile
constexpr int kKBlock = 32;   // k per (warp, k-block): 4 lanes x 8 bf16

struct TailParams {
  const void* u = nullptr;  // [T, L] activations, row t at u + t * u_ld
  int64_t u_ld = 0;
  const void* norm_w = nullptr;  // [L] bf16 / f32 (use_norm)
  bool norm_w_bf16 = false;
  const void* gate = nullptr;  // [T, SI] (shared)
  const void* up = nullptr;    // [T, SI] (shared)
  int64_t gate_ld = 0, up_ld = 0;
  void* ws = nullptr;          // two-launch forms: workspace [T, ws_ld]: rmsnorm(u) at 0, situ at Lp
  int64_t ws_ld = 0, Lp = 0;   // Lp = L rounded up to 8 (also the situ columns' start in x_pitch rows)
  int64_t x_pitch = 0;         // one-launch form: shared-memory row pitch of [un | s] (elements)
  const void* w_up = nullptr;  // latent_up [hidden, L] bf16 / f32, row o at w_up + o * w_up_ld
  int64_t w_up_ld = 0;
  bool w_up_bf16 = false;
  const void* w_sd = nullptr;  // shared_down [hidden, SI] (shared)
  int64_t w_sd_ld = 0;
  bool w_sd_bf16 = false;
  void* out = nullptr;  // [T, hidden], row t at out + t * out_ld
  int64_t out_ld = 0;
  int64_t T = 0, L = 0, SI = 0, hidden = 0;
  bool use_norm = false, shared = false, moonshot = true;
  bool round = false;  // Precision::bf16: round every stored value (bf16 storage always rounds)
  float eps = 1e-5f, beta = 4.0f, linear_beta = 25.0f;
  uint32_t prefetch_row_bytes = 0;  // latent_up bytes per row into L2 before the PDL wait
};

// ---------------------------------------------------------------- the prologue's math

// Adds a thread's squares of N consecutive values to its running partial, in index order (the order
// rmsnorm's CUDA kernel and the prologue use: chunks c = 8 * thread + 2048 j in increasing j).
template <int N>
__device__ __forceinline__ void add_squares(float& part, const float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) part += v[i] * v[i];
}
// 1 / rms of a row from its sum of squares.
__device__ __forceinline__ float inv_rms_of(float sum_sq, const TailParams& p) {
  return 1.0f / sqrtf(sum_sq / static_cast<float>(p.L) + p.eps);
}
// rmsnorm of one value before the store's rounding: moonshot w * round(x * inv_rms), fused w * x * inv_rms.
__device__ __forceinline__ float norm_value(float x, float w, float inv_rms, const TailParams& p) {
  float x_hat = x * inv_rms;
  if (p.moonshot) x_hat = round_if(x_hat, p.round);
  return w * x_hat;
}
// situ_glu of one (gate, up) pair before the store's rounding.
__device__ __forceinline__ float situ_value(float g, float u, const TailParams& p) {
  const float gate_act = p.beta * tanhf(g / p.beta) * sigmoid_f32(g);
  const float up_act = p.linear_beta * tanhf(u / p.linear_beta);
  return gate_act * up_act;
}

// ---------------------------------------------------------------- tensor cores

// mma_bf16_m16n8k16 and load_weight16: kernels/cuda_common.cuh.

// One k-block of one m16 tile: lane (g, q) holds 8 consecutive k (k = 32 kb + 8 q) of weight rows g (lo)
// and g + 8 (hi) and of activation row g (x); A and B take the same k permutation (pairs 0, 1 in the
// first mma, 2, 3 in the second), so each mma sums products of equal physical k. Both forms call this in
// the same order per tile, which keeps their sums bit-identical.
__device__ __forceinline__ void mma_kblock(float (&c)[4], const uint4& lo, const uint4& hi, const uint4& x) {
  mma_bf16_m16n8k16(c, lo.x, hi.x, lo.y, hi.y, x.x, x.y);
  mma_bf16_m16n8k16(c, lo.z, hi.z, lo.w, hi.w, x.z, x.w);
}

// Where the warps' accumulators meet: partial-sum rows of 32 floats, row (tile j, element e) = 4 j + e of
// one warp, lane l's value at column partial_col(row, l). A reader of entry (weight row r, token t) takes
// row 4 j + (r % 16 / 8) * 2 + t % 2, column (r % 8) * 4 + t % 8 / 2: one warp's 32 readers span 8 columns
// x 4 rows whose (row ^ row / 2) % 4 differ, so this XOR puts the 4 rows' copies of a column in 4 different
// banks (unswizzled they shared one: 4-way conflicts; ncu's count: docs/perf/fastpath.md, 65cb581).
// A writer warp stores a permutation of its 32 lanes: still one wavefront per row. Only where values sit
// changes; every sum reads the same values in the same order.
__device__ __forceinline__ int partial_col(int row, int col) { return col ^ ((row ^ (row >> 1)) & 3); }

// ---------------------------------------------------------------- host (cuda.cu, cuda_one_launch.cu)

// The kernel parameters of a call (no workspace, no x_pitch, no prefetch: each form sets its own).
TailParams fill_params(const MoeTailCombineArgs& a);
// The tensor-core forms' conditions: bf16 activations and weights, L and SI multiples of 8, 16-byte
// aligned weight rows (plus what every CUDA form needs).
core::Status mma_supports(const CudaOps& ops, const MoeTailCombineArgs& a);
// Whether every activation row the prologue reads (u, gate, up) and the norm weight allow 16-byte vectors.
bool inputs_vec8(const MoeTailCombineArgs& a);

// cuda_tail_one_launch (cuda_one_launch.cu).
// Rows the one-launch kernel serves. Its CTAs (224 at K3 TP8) each redo the prologue of all T rows:
// instructions per CTA, growing with T, before the GEMM's weight stream runs at full depth. At T = 1 one
// launch is as fast as the two and saves a kernel; at T = 8 the layer step is slower than with the two
// launches (measurements: docs/perf/fastpath.md, 65cb581). The kernel holds up to one n8 tile (8 rows); it
// is offered for 1 row only until other counts are measured to pay.
inline constexpr int64_t kOneLaunchMaxRows = 1;
core::Status one_launch_supports(const CudaOps& ops, const MoeTailCombineArgs& a);
void one_launch_run(const CudaOps& ops, const MoeTailCombineArgs& a);

}  // namespace k3::kernels::moe_tail_cuda
