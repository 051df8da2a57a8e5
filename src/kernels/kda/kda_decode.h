// kernels/kda/kda_decode.h: the fused KDA decode op of the latency_specialized path
// (fastpath/): everything of a KDA sublayer between its projections and o_proj in one call.
//
// It computes THE SAME FUNCTION as the standard path's op sequence (model/layers/kda.cpp) for the
// rows of `seqs`:
//   f      = round(f_a W_fb^T)                        linear, fp32 sum over R, rounded     [T, P]
//   q~,k~,v~ = kda_conv(q_in | k_in | v_in)           short conv + SiLU, rounded; conv state part
//                                                     0 / 1 / 2 of conv_state            [T, P] each
//   o      = kda_recurrent(q~, k~, v~, f, b)          L2 norms, scale, beta, bounded decay,
//                                                     delta rule; o rounded               [T, P]
//   out    = kda_output_gate(o, g, o_norm, rms_eps)   per-head RMSNorm * sigmoid(g), rounded once
// with round = kernels::round_act (bf16 in Precision::bf16, identity in Precision::fp32) at
// exactly those four points (f, q~/k~/v~, o, out) and nowhere else: the CPU reference
// (kda_decode_reference) composes the standard ops' references, so on the CPU it equals the
// standard sequence BIT FOR BIT in both precisions. The CUDA kernel sums in a different order
// (f GEMV, L2 norms, state dot products, RMS) and uses device expf: equal to fp32 rounding
// (tolerance), with the same rounding points.
//
// Rows and states. Sequence s owns rows [row_begin[s], row_begin[s] + num_rows[s]) and slot
// slot[s] of BOTH pools (conv_state and state); rows are walked in order, so a multi-row sequence
// (speculative verify, up to max_rows rows) equals decoding its rows one by one. Sequences never
// share a slot; rows no sequence covers and slots no sequence names are left untouched (out and
// o_trace rows included). seqs.position is required (as by kda_recurrent) but does not change the
// result. Any rows per sequence are accepted; the fast path uses 1..8 (verify = K+1 rows).
//
// no_commit (speculative verify, spec §5.9 (b)): every row's output is computed from the committed
// conv and recurrent states (advancing private copies row by row), and BOTH pools are left
// byte-identical. After acceptance the caller replays the accepted prefix of each sequence (the
// same q_in, k_in, v_in, g, f_a, b rows, num_rows = accepted count) with no_commit = false, which
// leaves exactly the states decoding those rows one by one would (its out is then scratch).
//
// Inputs may be row-strided column slices of one fused projection buffer (e.g. [T, 4P + R + H]):
// every activation has inner stride 1 and a free row stride. out and o_trace must not overlap any
// input (checked). Activations are f32 on the CPU; on CUDA bf16 (Precision::bf16) or f32 (either
// precision), one dtype for all of them (kernels/op_table.h, CudaOps).
//
// CUDA design (cuda_kda_decode.cu, strategy "cuda_head_cta"): grid (num_heads, num_seqs), one CTA
// of 512 threads per (head, sequence), so the L2 norms and the per-head RMSNorm reduce inside the
// CTA (no global round trip) and one launch serves a whole decode step. Per row the CTA's front does
// the short conv of the head's 3 x D channels (one thread per channel, window in registers, conv
// state read once and written once), the f_b GEMV of the head's D decay logits (4 threads per
// logit, 16-byte weight loads, f_a row in shared memory), gate, beta and L2 norms; then the
// recurrence with the head's D x D state in registers (4 threads per V row, 32 fp32 each, as
// kernels/kda/cuda_recurrent.cu), o in shared memory, then RMSNorm * sigmoid(g) to out. The state is
// loaded once at the start and stored once at the end (not at all with no_commit). Its supports()
// refuses head_dim > 128, conv width K > 4, R > 1024 and num_seqs > 65535 (the CPU reference takes
// any); no spills, 7.5 KiB static shared memory, 1 CTA per SM (register count: docs/perf/kernel-notes.md,
// kda_decode).
// Bytes per call at TP8 (H = 12, D = 128, P = 1536, R = 128, K = 4, bf16 activations), B sequences
// of 1 row: recurrent state 768 KiB read + 768 KiB written per sequence; conv state 3 x 1536 x 3
// bf16 = 27 KiB read + 27 KiB written per sequence; f_b 1536 x 128 bf16 = 384 KiB (read once from
// HBM, from L2 by further sequences); conv weights 3 x 1536 x 4 f32 = 72 KiB; dt_bias 6 KiB;
// activations per row 4 x 1536 + 128 + 12 in and 1536 out (bf16) = 15.3 KiB. B = 1: ~2.1 MiB
// (floor ~0.5 us at 4.3 TB/s); B = 64: ~101 MiB (floor ~25 us). At B = 1 that grid has only 12 CTAs,
// so the kernel is latency-bound there (docs/perf/fastpath.md, the first per-layer run's batch-1
// profile), hence a second strategy for small batches:
// "cuda_vsplit_cluster" (tuning/*.json take it while 4 * H * num_seqs <= 2 * SMs: TP8 batch <= 5
// on the H200) splits each head's state along V over a cluster of NS = 8 (batch 1-2) or 4 CTAs of 256
// threads, grid (NS * H, num_seqs): the delta rule is independent per value row, so rank r owns
// rows [r W, r W + W), W = ceil(D / NS), and also convolves those channels of q, k, v and computes
// those decay logits (f_b rows held in registers across rows); q~, k~, alpha are gathered over
// distributed shared memory and the o^2 partials of the RMSNorm are summed in rank order, with two
// cluster barriers per row. 96 CTAs at TP8 batch 1, <= 128 registers, no spills, ~7 KiB shared.
#pragma once
#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

// P = num_heads * head_dim, R = f_a width (f_b's input width), K = conv width (4 in K3).
struct KdaDecodeArgs {
  core::TensorView q_in, k_in, v_in;  // f32 [T, P] pre-conv W_q x, W_k x, W_v x (rounded projection outputs)
  core::TensorView g;                 // f32 [T, P] output-gate logits g^ = W_g x
  core::TensorView f_a;               // f32 [T, R] rounded f_a_proj output
  const LinearWeight* f_b = nullptr;  // [P, R] dense bf16 or f32 (f_b_proj; not MXFP4)
  core::TensorView b;                 // f32 [T, H] beta logits b^ = W_b x
  // f32 [P, K] (or the checkpoint's [P, 1, K]) contiguous; column K-1 multiplies the current token.
  core::TensorView q_conv, k_conv, v_conv;
  // The model's conv storage (kv.conv_states(layer)) in/out: f32 (or bf16 on CUDA)
  // [num_slots, 3, P, K-1], part 0 q, 1 k, 2 v; per slot and channel the last K-1 pre-conv inputs,
  // oldest first (bf16 values in bf16 mode). Each slot contiguous; the slot stride is free.
  core::TensorView conv_state;
  core::TensorView a_log;    // f32 [>= H]; only the first H entries are used
  core::TensorView dt_bias;  // f32 [P]
  // f32 [num_slots, H, V=D, K=D] in/out, V-major: S[slot][h][v][k]; each slot contiguous, slot
  // stride free (kv.kda_states(layer)). Always fp32.
  core::TensorView state;
  core::TensorView o_norm;  // f32 or bf16 [D] o_norm.weight (shared by all heads)
  core::TensorView out;     // f32 [T, P] y = round(rmsnorm(o_h) * o_norm * sigmoid(g_h)): o_proj's input
  // Optional (data == nullptr: not written): f32 [T, P] receives o (the delta-rule output, rounded
  // as the standard path's "kda.o" intermediate), for layer-by-layer diffs.
  core::TensorView o_trace;
  int num_heads = 0, head_dim = 0;  // H, D
  float lower_bound = -5.0f;        // gate_lower_bound (negative)
  float rms_eps = 1e-5f;            // rms_norm_eps of the o_norm RMSNorm
  Precision precision = Precision::bf16;
  SeqBatch seqs;           // row_begin, num_rows, slot, position (all four required)
  bool no_commit = false;  // speculative verify: compute outputs, leave both pools untouched
};

core::Status kda_decode_check(const KdaDecodeArgs& a);
// The oracle: kernels::linear_reference (f), kda_conv_reference x3, kda_recurrent_reference and
// kda_output_gate_reference on the same views the standard path uses; bit-identical to it.
void kda_decode_reference(const KdaDecodeArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
