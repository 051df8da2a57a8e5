// kernels/kda/kda.h: Kimi Delta Attention ops (spec §5), batched over sequences.
//
// The conv and attention ops take a kernels::SeqBatch (kernels/common.h): sequence s owns the
// activation rows [row_begin[s], row_begin[s] + num_rows[s]) and the state slot slot[s] of a state
// POOL holding every slot; it continues that slot's state and leaves its updated state there. So
// one decode step of 64 sequences is one call (one launch) per op, and a CUDA graph captured once
// replays for any slots and positions: launch grids depend only on num_seqs, max_rows and shapes.
// Sequences of one call never share a slot and their row ranges never overlap (slots not named by
// the batch, and rows no sequence covers, are left untouched).
//
// Checks (kda_conv_check, kda_attention_check): the SeqBatch tables are contiguous i32 [num_seqs]
// on the activations' device. On the CPU they also validate the table VALUES (rows within T,
// 1 <= num_rows <= max_rows, slots within the pool and distinct, row ranges disjoint, position
// >= 0). On CUDA the values live in device memory and are not read by the check (that would need
// a sync): only shapes, dtypes and devices are checked there; the kernels clamp num_rows to
// max_rows, and other bad values are the caller's bug.
#pragma once
#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

// Causal depthwise short conv + SiLU (spec §5.2), for one of q/k/v (or all three side by side).
// The fp32 sum runs i = 0..K-1; x before a sequence's first row is what its state slot holds
// (zeros for a new sequence). After its rows the slot holds the last K-1 inputs of
// (old state ++ x rows), also when num_rows < K-1, so splitting a sequence over calls changes
// nothing. In bf16 mode the inputs are taken as round_act(x) (a no-op for the bf16 values upstream
// produces) and the state holds bf16 values. Activations may have a row stride (inner stride 1);
// out may alias x. Uses seqs.row_begin, num_rows, slot (position is not read).
struct KdaConvArgs {
  core::TensorView x;       // f32 [T, C] pre-conv inputs (W_q x, W_k x or W_v x)
  core::TensorView weight;  // f32 [C, K] (or the checkpoint's [C, 1, K]); column K-1 multiplies the current token
  // f32 (or bf16 on CUDA) [num_slots, C, K-1] in/out: per slot the last K-1 pre-conv inputs, oldest
  // first. Each slot's [C, K-1] is contiguous; the slot stride (strides[0]) is free, so index i of
  // the model's [num_slots, 3, P, K-1] storage (strides {3*P*(K-1), K-1, 1}) is a valid pool.
  core::TensorView state;
  core::TensorView out;  // f32 [T, C] = round(SiLU(sum_i w[c,i] x_{t-K+1+i}[c]))
  Precision precision = Precision::bf16;
  SeqBatch seqs;  // the sequences: rows and state slot of each
  // Speculative verify (spec §5.9 (b)): read each slot's committed state and compute every row's
  // output, but leave the slots exactly as they were (the accepted rows are replayed later with
  // no_commit = false). Off: the normal rolling update.
  bool no_commit = false;
};
core::Status kda_conv_check(const KdaConvArgs& a);
void kda_conv_reference(const KdaConvArgs& a, backends::cpu::ThreadPool* pool = nullptr);

// L2 norm of q,k (eps 1e-6 inside the sqrt of the sum), q scale head_dim^-1/2, beta = sigmoid(b),
// bounded decay g = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias)) (spec §5.3-5.4),
// then the delta rule over each sequence's rows (spec §5.5 recurrent, §5.7 chunked; equal up to
// rounding). Both forms continue from the sequence's state slot and leave the state after its last
// row in it, so prefill(T) then decode(k) equals one call over T+k. The state is always fp32 (also
// in bf16 mode); only the output o is rounded (round_act) in bf16 mode. (sequence, head) pairs run
// in parallel; results do not depend on the thread count or on which other sequences share the
// call. Activations may have a row stride (inner stride 1); out may alias q, k, v or f (the CPU
// reference; CUDA refuses out aliasing q, k or f).
//
// Uses seqs.row_begin, num_rows, slot and position (the check requires all four for both forms;
// only the chunked form reads position). The chunked form accepts any positive chunk_size and lays
// its chunk grid on ABSOLUTE positions: a sequence's first chunk ends at the next multiple of
// chunk_size after position[s] (a full chunk when position is a multiple), the last may be
// partial. So chunk boundaries do not depend on how a prefill was split into calls: a split on a
// multiple of chunk_size (prefix-cache hit, chunked prefill on block boundaries) computes exactly
// what one unsplit prefill computes, and a split inside a chunk changes only that chunk (computed
// in two pieces: equal to rounding). (The CUDA form uses chunks of min(chunk_size, 64), halved
// while shared memory is short, on the absolute grid of that length: equal to rounding.)
struct KdaAttentionArgs {
  core::TensorView q, k, v;  // f32 [T, H*D] post-conv (q~, k~, v~)
  core::TensorView f;        // f32 [T, H*D] decay logits (f_b output)
  core::TensorView b;        // f32 [T, H] beta logits
  core::TensorView a_log;    // f32 [>= H]; only the first H entries are used (spec §4 quirk)
  core::TensorView dt_bias;  // f32 [H*D]
  // f32 [num_slots, H, V=D, K=D] in/out pool, V-major: S[slot][h][v][k]. Each slot's [H, D, D] is
  // contiguous; the slot stride (strides[0]) is free.
  core::TensorView state;
  core::TensorView out;  // f32 [T, H*D] o (an activation: rounded in bf16 mode)
  int num_heads = 0, head_dim = 0;
  float lower_bound = -5.0f;  // gate_lower_bound: g in (lower_bound, 0); must be negative
  int chunk_size = 64;        // kda_chunked only; any positive size
  Precision precision = Precision::bf16;
  SeqBatch seqs;  // the sequences: rows, state slot and position of each
  // Speculative verify (spec §5.9 (b)), kda_recurrent only (kda_chunked refuses it): each sequence
  // starts from its committed slot state and computes every row's output on a private copy, and
  // the slots are left unchanged. Off: the state after the last row is stored back.
  bool no_commit = false;
};
core::Status kda_attention_check(const KdaAttentionArgs& a);
void kda_recurrent_reference(const KdaAttentionArgs& a, backends::cpu::ThreadPool* pool = nullptr);
void kda_chunked_reference(const KdaAttentionArgs& a, backends::cpu::ThreadPool* pool = nullptr);

// Per-head RMSNorm (shared weight) times sigmoid of the full-rank gate (spec §5.6):
//   out = round( o_h * rsqrt(mean(o_h^2) + eps) * w * sigmoid(g^_h) ), fp32 inside, rounded once.
// out may alias o or gate.
struct KdaOutputGateArgs {
  core::TensorView o;       // f32 [T, H*D]
  core::TensorView gate;    // f32 [T, H*D] g^ = W_g x
  core::TensorView norm_w;  // f32/bf16 [D] o_norm.weight
  core::TensorView out;     // f32 [T, H*D] = round(rmsnorm(o_h) * w * sigmoid(g^_h)), fp32 inside
  int num_heads = 0, head_dim = 0;
  float eps = 1e-5f;
  Precision precision = Precision::bf16;
};
core::Status kda_output_gate_check(const KdaOutputGateArgs& a);
void kda_output_gate_reference(const KdaOutputGateArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
