// kernels/moe/moe_tail.h: moe_tail_combine, the MoE sublayer's tail after the routed experts
// in ONE fused op (fastpath/ fused op; spec §7 "Stable LatentMoE", §8 SiTU-GLU, §2 rounding).
//
// Contract: given the routed latent sum u (moe_experts' rounded output) and the shared experts'
// gate/up projections, computes the layer's FFN output f exactly as the standard path's op
// sequence in model::moe_tail (model/layers/latent_moe.cpp, the non-tensor-parallel case):
//   s  = situ_glu(shared_gate, shared_up; beta, linear_beta)   [T, SI]      rounded   (situ_glu_reference)
//   ys = linear(s, shared_down)                                [T, hidden]  rounded   (linear_reference)
//   un = rmsnorm(u, latent_norm; eps, style)   if use_norm     [T, L]       rounded as rmsnorm_reference
//        (moonshot: round(w * round(x * inv_rms)); fused: round(w * x * inv_rms)); else un = u
//   yr = linear(un, latent_up)                                 [T, hidden]  rounded   (linear_reference)
//   f  = round(yr + ys)   with shared experts (add_reference); f = yr without them
// "rounded" = round_act(v, precision): bf16 round-to-nearest-even in Precision::bf16, nothing in
// Precision::fp32. All sums fp32; the CPU reference calls the standard references above in this
// order, so on the CPU it equals the standard op sequence BIT FOR BIT in both precisions. CUDA sums
// the two GEMMs in another order (tensor-core / warp partial sums): linear's tolerances apply; the
// rounding points are the same.
//
// Shapes and dtypes (T rows = sequences x tokens per sequence; decode 1..64, any T works):
//   u            f32 [T, L] (bf16 on CUDA in Precision::bf16), unit inner stride, any row stride; read only.
//   latent_norm  bf16 or f32 [L] contiguous (routed_expert_norm); read only when use_norm.
//   latent_up    LinearWeight [hidden, L] bf16 / f32 (MXFP4 passes the check and runs on the CPU; the CUDA
//                implementation rejects it in supports()).
//   shared_gate, shared_up  f32 [T, SI] (bf16 on CUDA), unit inner stride, any row stride; read only;
//                ignored (may be undefined) when shared_down is null.
//   shared_down  LinearWeight [hidden, SI], or nullptr: no shared experts (f = yr).
//   out          f32 [T, hidden] (bf16 on CUDA), unit inner stride, any row stride; written completely,
//                nothing else is written (no intermediate is exposed: the standard path traces none of
//                s, ys, un, yr). out must not overlap any input.
// On CUDA all activations of one call share one dtype: bf16 (Precision::bf16) or f32 (either precision).
//
// Sizes at one TP8 rank (spec §11, §14.2 k3-layer-tp8): L = 3584 (replicated), hidden = 7168,
// SI = 2 x 3072 / 8 = 768. Bytes per call (bf16 weights dominate, bf16 activations):
//   latent_up 7168 x 3584 x 2 = 51,380,224 B + shared_down 7168 x 768 x 2 = 11,010,048 B
//   = 62,390,272 B of weights; per row: u 7,168 + gate/up 3,072 + out 14,336 + workspace write+read
//   2 x 8,704 = 41,984 B (the workspace only in the two-launch forms) -> 62,432,256 B at T = 1 (floor
//   14.5 us at 4.3 TB/s), 65,077,248 B at T = 64.
// The standard tail launches 5 ops for this (situ_glu, 2 cuBLASLt GEMMs (+ split-K reduce), rmsnorm,
// add: 7 kernels; their time: docs/perf/fastpath.md, the first per-layer run's batch-1 profile).
//
// CUDA design: ONE launch for 1 row (cuda_one_launch.cu; kOneLaunchMaxRows in cuda_tail.cuh says why), two
// for 2..16, cuBLASLt above:
//   cuda_tail_one_launch (bf16, T == 1, L % 8 == 0, SI % 8 == 0, 16-byte aligned rows of u, gate, up,
//      latent_norm and the weights, shared memory fits): grid hidden / 32 = 224 CTAs of 8
//      warps, 32 output columns each. Every CTA first computes x = [ rmsnorm(u) | situ_glu(gate, up) ] of
//      all T rows into SHARED memory (the prologue kernel's math, chunks and block tree: the same bits),
//      then the dual GEMM on it: the warps split latent_up's, then shared_down's 32-wide k-blocks as
//      cuda_tail_mma does (one rolling register ring of 4 k-blocks per warp across both weights), mma.sync
//      m16n8k16, partial sums meet in warp order 0..7; out equals cuda_tail_mma's bit for bit. Before its
//      PDL wait it loads only weights: its first k-blocks, an L2 prefetch of the next latent_up bytes and
//      the norm weight. Sized for one wave: 2 CTAs per SM (<= 128 registers, <= 89 KB shared memory at
//      T = 8, the kernel's capacity) = 264 slots on 132 SMs. The wave and bytes-in-flight arithmetic:
//      cuda_one_launch.cu.
//   Two launches (rows 2..16, or inputs the one-launch form does not take, e.g. unaligned rows):
//   1. prologue (grid (T, 2): one CTA per row and half): workspace [T, L + SI] (activation dtype, from
//      the context's scratch) = [ rmsnorm(u) | situ_glu(gate, up) ], each rounded exactly as the
//      references round; the norm's sum of squares is a fixed-order block tree (CUDA rmsnorm's order).
//      Without norm the L half is a copy of u; without shared experts the SI half is not written.
//   2. dual GEMM, cuda_tail_mma (bf16, L % 8 == 0, SI % 8 == 0, 16-byte aligned rows): a
//      CTA of 8 warps owns 16 output columns (rows of latent_up and shared_down) and up to 64 rows; the
//      warps split L, then SI, into interleaved 32-wide k-blocks with 16-byte weight loads and mma.sync
//      m16n8k16 (bf16 -> f32), one pass per weight (yr, then ys); each pass's partial sums meet in shared
//      memory in warp order 0..7 (deterministic); the epilogue stores round(round(yr) + round(ys)). Grid
//      (hidden / 16 = 448, ceil(T / 64)): each weight byte is read once per 64 rows.
//      cuda_tail_cublaslt (bf16, same conditions; tuning/*.json: T > 16): above 16 rows the mma kernel is
//      L2-bound (below), so: the prologue, one cuBLASLt GEMM per weight into bf16 scratch (rounded yr,
//      ys), then out = round(yr + ys) in one elementwise kernel (4 launches; same rounding points).
//      cuda_tail_rowdot (any dtype mix, odd widths): a warp per output column and 8 rows,
//      lanes striding k, warp-shuffle tree sums; the simple path for Precision::fp32 (f32 activations).
// What the measurements showed (H200, ncu, TP8 shapes; the numbers: docs/perf/kernel-notes.md, moe_tail):
//   the two-launch form at T = 1 ran well short of the bytes' rate (cuda_tail_mma's 448 CTAs take more
//   than one wave); at T = 64 the mma kernel is far slower than cuBLASLt, because its warps re-read the
//   workspace from L2 per 16 columns; cuda_tail_rowdot (fp32) is the slow, simple path.
// cuda_tail_one_launch at T = 1 is as fast as the two launches and saves a kernel (the time the wave and
// in-flight arithmetic expects was not reached: the per-CTA prologue sits before the weight stream runs at
// full depth). At T = 8 it made the layer step slower than the two launches (every CTA redoes the
// prologue of 8 rows), hence the bound of one row.
#pragma once
#include "core/error.h"
#include "kernels/common.h"
#include "kernels/norm/rmsnorm.h"

namespace k3::kernels {

struct MoeTailCombineArgs {
  core::TensorView u;                           // f32 [T, L] (bf16 on CUDA): moe_experts' output, rounded
  core::TensorView latent_norm;                 // bf16 / f32 [L] (read when use_norm)
  const LinearWeight* latent_up = nullptr;      // [hidden, L]
  core::TensorView shared_gate;                 // f32 [T, SI] (bf16 on CUDA); unused without shared_down
  core::TensorView shared_up;                   // f32 [T, SI] (bf16 on CUDA); unused without shared_down
  const LinearWeight* shared_down = nullptr;    // [hidden, SI], or nullptr: no shared experts
  core::TensorView out;                         // f32 [T, hidden] (bf16 on CUDA): f
  bool use_norm = true;                         // config.moe.latent_moe_use_norm
  float eps = 1e-5f;                            // rms_norm_eps
  RmsNormStyle style = RmsNormStyle::moonshot;  // ModelOptions::rmsnorm_style
  float situ_beta = 4.0f;                       // config.situ_beta
  float situ_linear_beta = 25.0f;               // config.situ_linear_beta
  Precision precision = Precision::bf16;

  bool has_shared() const { return shared_down != nullptr; }
};

// Fails naming the argument (u, latent_norm, latent_up, shared_gate, shared_up, shared_down, out) with
// the expected vs actual shape/dtype: widths that disagree (latent_up's in != L, shared_down's in != SI,
// the two weights' out widths differ, out not [T, hidden]), rows that disagree, bad betas or eps, out
// overlapping an input.
core::Status moe_tail_combine_check(const MoeTailCombineArgs& a);
// The standard references in the standard order (situ_glu, linear, rmsnorm, linear, add) on f32
// temporaries: bit for bit model::moe_tail's op sequence after moe_experts (non-TP).
void moe_tail_combine_reference(const MoeTailCombineArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
