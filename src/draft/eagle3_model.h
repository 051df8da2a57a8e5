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
// stay fp32; the attention (the rope_gqa_attention op, kernels/gqa) sums scores and the weighted
// values in fp32.
//
// Where it runs: on the device of its DeviceMemory (the CPU, or the target's GPU at --tp 1), every
// step through the registry's ops there: weights uploaded once (the embedding aliased from the
// target's device copy when the draft shares it), caches and activations on that device, the taps
// read where the target wrote them, the greedy tokens taken by the `sample` op; only the tokens come
// back to the host.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/device_memory.h"
#include "draft/eagle3_config.h"
#include "draft/eagle3_weights.h"
#include "draft/rope.h"
#include "draft/row_buffer.h"
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
  RowBuffer k, v;
  int64_t first_position = 0;
  int64_t rows() const { return k.rows; }
  int64_t end_position() const { return first_position + k.rows; }
  int64_t bytes() const { return k.bytes() + v.bytes(); }
};

struct Eagle3Output {
  core::Tensor normed;   // f32 [N, H]: the final-normed rows (lm_head's input)
  core::Tensor prenorm;  // f32 [N, H]: the residual stream before the final norm (a chain row's hidden)
};

class Eagle3Model {
 public:
  // Checks the host weights' shapes against the config; config, weights and registry must outlive
  // the model. `memory`: the device it runs on (null: the CPU); on a GPU the weights are uploaded,
  // the embedding as `device_embed` when given (the target's device copy of the same table).
  Eagle3Model(const Eagle3Config& config, const Eagle3Weights& weights, const kernels::Registry& ops,
              Eagle3Options options = {}, std::shared_ptr<core::DeviceMemory> memory = nullptr,
              core::Tensor device_embed = {});
  const Eagle3Config& config() const { return config_; }
  core::DeviceMemory& memory() const { return *memory_; }
  core::Device device() const { return memory_->device(); }

  // fc over the concatenated taps: f32 [n, num_taps * Ht] on the model's device (rows may be
  // strided) -> [n, H].
  core::Tensor fuse_taps(const core::TensorView& taps) const;
  // One decoder pass over the rows of several requests, stacked: rows[b] rows of request b, which
  // are appended to caches[b] at its end position onward. tokens [N] (target ids), hidden f32 [N, H]
  // on the model's device, N = sum(rows). Each row attends to its request's cache up to itself.
  Eagle3Output forward(std::span<Eagle3Cache* const> caches, std::span<const int64_t> rows,
                       std::span<const int32_t> tokens, const core::TensorView& hidden) const;
  // lm_head over final-normed rows: f32 [N, Vd] on the model's device, fp32 (not rounded).
  core::Tensor logits(const core::TensorView& normed) const;
  // The target ids of the rows' argmax (ties: the lowest draft id), taken on the model's device.
  std::vector<int32_t> greedy_tokens(const core::TensorView& logits) const;
  int32_t to_target_id(int32_t draft_id) const;
  // Drops cached rows at positions >= end_position (keeps the earlier ones).
  void truncate(Eagle3Cache& cache, int64_t end_position) const;

  // Row buffers on the model's device: append rows (f32 [n, cols], this device), keep the first n.
  void append(RowBuffer& buf, const core::TensorView& rows) const;
  void keep_rows(RowBuffer& buf, int64_t n) const;
  // dst rows [r0, r0 + src rows) = src (both on the model's device).
  void copy_rows(const core::Tensor& dst, int64_t r0, const core::TensorView& src) const;
  core::Tensor alloc(int64_t rows, int64_t cols) const;

 private:
  core::Tensor linear(const core::TensorView& x, const kernels::LinearWeight& w, bool round_output = true) const;
  core::Tensor rmsnorm(const core::TensorView& x, const core::Tensor& w) const;
  core::Tensor add(const core::TensorView& a, const core::TensorView& b) const;

  const Eagle3Config& config_;
  const Eagle3Weights& host_weights_;
  const kernels::Registry& ops_;
  Eagle3Options options_;
  std::shared_ptr<core::DeviceMemory> memory_;
  Eagle3Weights device_weights_;  // the uploaded copy on a GPU (unused on the CPU)
  const Eagle3Weights* weights_;  // the weights on the model's device
  RotateHalfRope rope_;
  core::Tensor inv_freq_;  // f32 [head_dim / 2] on the model's device
};

}  // namespace k3::draft
