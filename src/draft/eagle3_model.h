// draft/eagle3_model.h: the EAGLE-3 draft model's forward (spec §13.1), as vLLM's
// Eagle3LlamaForCausalLM computes it. CPU backend; the dense math goes through the op registry
// (embedding, linear, rmsnorm, add, silu_glu); RoPE and the attention are helpers of this folder.
//
// Rows and positions. The draft runs one row per target position p: its input is the token at
// p + 1 (embedded) and a hidden state for p:
//   context rows   hidden = fc(concat_a tap_a[p]) from the target's committed taps (the input of
//                  target layer a, for each aux layer a), token = the target's token at p + 1 (the
//                  newest sampled token for the last committed position);
//   chain rows     hidden = the draft's own pre-norm output of the row before, token = the draft
//                  token that row proposed.
// Each row's output, final-normed and through lm_head, is the draft distribution of the token at
// p + 2. Row p's key and value are kept in the request's cache at position p; a row attends
// causally to every cached row up to its own (the draft's positions are absolute target positions,
// so a request first seen mid-sequence, after a prefix-cache hit, starts its cache there).
//
// The decoder layer (one; vLLM's LlamaDecoderLayer for layer 0 of an EAGLE-3 draft):
//   e = input_layernorm(embed(token));  n = hidden_norm(hidden)
//   residual = norm_before_residual ? n : hidden
//   q, k, v = {q,k,v}_proj([e ; n]);  rotate-half RoPE on each head of q and k (draft/rope.h)
//   a = softmax(q k^T / sqrt(head_dim)) v   grouped-query: query head h reads KV head h / (NH / NKV)
//   r = o_proj(a) + residual;  m = down(silu(gate(x)) * up(x)), x = post_attention_layernorm(r)
//   prenorm = m + r;  normed = norm(prenorm);  logits = lm_head(normed) over the draft vocabulary
// Rounding (Precision::bf16): every op's output is stored as an activation (rounded), the logits
// stay fp32; the attention sums scores and the weighted values in fp32, key order.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "draft/eagle3_config.h"
#include "draft/eagle3_weights.h"
#include "draft/rope.h"
#include "kernels/registry.h"

namespace k3::draft {

struct Eagle3Options {
  kernels::Precision precision = kernels::Precision::bf16;
  kernels::RmsNormStyle rmsnorm_style = kernels::RmsNormStyle::moonshot;  // HF's Llama RMSNorm
  bool poison_buffers = false;                                            // NaN-fill every new activation (tests)
};

// One request's draft KV cache: rotated keys and values of its rows, f32 [rows, NKV * head_dim]
// each, for the absolute positions first_position .. first_position + rows - 1.
struct Eagle3Cache {
  std::vector<float> k, v;
  int64_t first_position = 0;
  int64_t rows = 0;
  int64_t end_position() const { return first_position + rows; }
  int64_t bytes() const;
};

struct Eagle3Output {
  core::Tensor normed;   // f32 [N, H]: the final-normed rows (lm_head's input)
  core::Tensor prenorm;  // f32 [N, H]: the residual stream before the final norm (a chain row's hidden)
};

class Eagle3Model {
 public:
  // Checks the weights' shapes against the config; config, weights and registry must outlive it.
  Eagle3Model(const Eagle3Config& config, const Eagle3Weights& weights, const kernels::Registry& ops,
              Eagle3Options options = {});
  const Eagle3Config& config() const { return config_; }

  // fc over the concatenated taps: f32 [n, num_taps * Ht] (CPU; rows may be strided) -> [n, H].
  core::Tensor fuse_taps(const core::TensorView& taps) const;
  // One decoder pass over the rows of several requests, stacked: rows[b] rows of request b, which
  // are appended to caches[b] at its end position onward. tokens [N] (target ids), hidden f32 [N, H],
  // N = sum(rows). Each row attends to its request's cache up to and including itself.
  Eagle3Output forward(std::span<Eagle3Cache* const> caches, std::span<const int64_t> rows,
                       std::span<const int32_t> tokens, const core::Tensor& hidden) const;
  // lm_head over final-normed rows: f32 [N, Vd], fp32 (not rounded).
  core::Tensor logits(const core::Tensor& normed) const;
  // The target id of a logits row's argmax (ties: the lowest draft id).
  int32_t greedy_token(const float* logits_row) const;
  int32_t to_target_id(int32_t draft_id) const;
  // Drops cached rows at positions >= end_position (keeps the earlier ones).
  void truncate(Eagle3Cache& cache, int64_t end_position) const;

 private:
  core::Tensor alloc(int64_t rows, int64_t cols) const;
  core::Tensor linear(const core::Tensor& x, const kernels::LinearWeight& w, bool round_output = true) const;
  core::Tensor rmsnorm(const core::Tensor& x, const core::Tensor& w) const;
  core::Tensor add(const core::Tensor& a, const core::Tensor& b) const;
  // Appends the rows' rotated keys and values, then attends: q [N, NH*hd] (rotated) -> [N, NH*hd].
  core::Tensor attention(std::span<Eagle3Cache* const> caches, std::span<const int64_t> rows, const core::Tensor& q,
                         const core::Tensor& k, const core::Tensor& v) const;

  const Eagle3Config& config_;
  const Eagle3Weights& weights_;
  const kernels::Registry& ops_;
  Eagle3Options options_;
  RotateHalfRope rope_;
};

}  // namespace k3::draft
