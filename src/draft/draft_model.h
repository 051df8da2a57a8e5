// draft/draft_model.h: the DSpark draft model's forward (spec §13.2): context ingestion from the
// target's tapped hidden states, one non-causal block pass of K positions, and the sequential
// low-rank Markov head. Every step goes through the op registry (embedding, linear, rmsnorm,
// situ_glu, add, and the dspark family's rope_pairs, mla_block_attention and markov_draft:
// kernels/dspark/dspark.h) on the model's device: the CPU, or the target's GPU at --tp 1, where the
// weights are uploaded once (the embedding, and a shared lm_head, aliased from the target's device
// copy), the latent caches and activations stay, the taps are read where the target wrote them and
// the Markov chain runs to the end before its tokens come back.
//
// The reading of spec §13.2 implemented here (§16.7 leaves the block layout open; this is the
// simplest form faithful to the DFlash/DSpark descriptions):
//   context   for each committed target position p (tokens 0..p run through the target):
//               c_p = RMSNorm(context_proj(concat_l tap_l[p]); context_norm)            [H]
//             and in each draft layer i:  kv = kv_a_proj_i(c_p) -> [c_n = RMSNorm(kv[:r_kv]; kv_a_layernorm_i)
//             | k_pe = RoPE(kv[r_kv:], p)] appended to layer i's latent cache at row p.
//   block     x_0 = the newest token (sampled by the target, not yet run through it) at position
//             P = number of context rows. The block has K rows at positions P .. P+K-1: row 0 is
//             embed(x_0), rows 1..K-1 are embed(mask_token_id). Each draft layer is pre-norm
//             residual (no AttnRes, no output gate, DeepSeek-V3 dense layer):
//               h += o_proj(MLA(input_layernorm(h)));  h += down(SiTU(gate(x), up(x))), x = post_attention_layernorm(h)
//             MLA (naive, expanded): the queries are the K block rows (q-LoRA, RoPE on q_pe at the
//             row's position); the keys/values are the P context rows of the cache followed by the
//             K block rows' own latents (not stored), and every block row sees all P + K of them
//             (non-causal within the block, as vLLM drafts). Row j's output after the final norm and
//             lm_head is U_{j+1} [Vd]: the base logits of the token at position P+j+1.
//   markov    x_k = argmax( U_k + W2 . W1[x_{k-1}] ), k = 1..K, sequentially (ties: the lowest
//             draft id), draft ids mapped to target ids by d2t; W1 is indexed by the target id.
//   confidence (optional) c_k = sigmoid( w . [hidden_k ; W1[x_{k-1}]] ), hidden_k the final-normed
//             row k-1 (the lm_head input).
// Rounding (Precision::bf16): every linear / norm / SiTU / add / RoPE / attention output is rounded
// as in the target (spec §2); base logits, the Markov term and their sum stay fp32.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/device_memory.h"
#include "draft/draft_config.h"
#include "draft/draft_weights.h"
#include "draft/row_buffer.h"
#include "kernels/registry.h"

namespace k3::draft {

struct DraftOptions {
  kernels::Precision precision = kernels::Precision::bf16;
  kernels::RmsNormStyle rmsnorm_style = kernels::RmsNormStyle::moonshot;
  bool poison_buffers = false;  // NaN-fill every new activation (tests)
  // The block attention in the absorbed form (spec §6.2: q_lat = W_UK^T q_nope, attention over the
  // latent rows, o = W_UV o_lat: the mla_block_attention op): O(K * P * 576) per head instead of
  // expanding all P context rows through kv_b_proj on every pass; the same function up to rounding
  // (q_lat and o_lat are rounded in bf16 mode, as the target's absorbed MLA rounds them). The
  // expanded form is the CPU's reading of the spec; on a GPU the model runs absorbed only.
  bool absorbed_attention = false;
};

// One request's draft-side state: per draft layer its latent cache rows on the model's device,
// f32 [num_context, kv_lora + rope] = [c_n | RoPE'd k_pe] of target positions first_position ..
// first_position + num_context - 1. A request first seen mid-sequence (after a prefix-cache hit)
// starts there: the block attends to the context rows the draft saw, at their absolute positions.
struct DraftCache {
  std::vector<RowBuffer> layers;
  int64_t first_position = 0;
  int64_t num_context = 0;
  int64_t end_position() const { return first_position + num_context; }
  int64_t bytes() const;
};

// The block pass's outputs, on the model's device.
struct BlockOutput {
  core::Tensor hidden;       // f32 [B*K, H]: final-normed rows (the lm_head input)
  core::Tensor base_logits;  // f32 [B*K, Vd]: row b*K + j = U_{j+1} of request b
};

// The drafted tokens of one request.
struct DraftResult {
  std::vector<int32_t> tokens;    // x_1..x_n as target ids
  core::Tensor logits;            // host f32 [n, Vd]: U_k + W2 . W1[x_{k-1}], only when asked for
  std::vector<float> confidence;  // [n] with a confidence head, else empty
};

class DraftModel {
 public:
  // Checks the host weights' shapes against the config; config, weights and registry must outlive
  // the model. `memory`: the device it runs on (null: the CPU); on a GPU the weights are uploaded,
  // except the embedding and a shared lm_head, taken from `device_target` (the target's device
  // weights) when given.
  DraftModel(const DraftConfig& config, const DraftWeights& weights, const kernels::Registry& ops,
             DraftOptions options = {}, std::shared_ptr<core::DeviceMemory> memory = nullptr,
             const model::Weights* device_target = nullptr);
  const DraftConfig& config() const { return config_; }
  const DraftOptions& options() const { return options_; }
  core::DeviceMemory& memory() const { return *memory_; }
  core::Device device() const { return memory_->device(); }

  DraftCache new_cache(int64_t first_position = 0) const;
  // Appends the committed target positions cache.end_position() .. +n-1: taps f32 [n, num_taps * H]
  // on the model's device, rows may be strided (the tapped mixtures in target_layer_ids order).
  // Throws core::Error on a wrong shape or device.
  void append_context(DraftCache& cache, const core::TensorView& taps) const;
  // Drops context rows beyond `num_context` (a rollback; keeps rows 0..num_context-1).
  void truncate(DraftCache& cache, int64_t num_context) const;
  // The one forward pass of the block for newest token x0 (a target id, at position
  // cache.end_position()) on top of `cache`.
  BlockOutput forward_block(const DraftCache& cache, int32_t x0) const;
  // The block passes of several requests as one forward (every linear over all B*K rows; the
  // attention per request): rows [b*K, (b+1)*K) of the outputs belong to caches[b]. Each row's
  // values are those forward_block gives for its request alone (the ops are row-independent).
  BlockOutput forward_blocks(std::span<const DraftCache* const> caches, std::span<const int32_t> x0) const;
  // W2 . W1[prev]: the Markov head's bias for the position after target token `prev`, f32 [Vd]
  // (fp32 dots over R in index order), from the host weights on the CPU.
  std::vector<float> markov_bias(int32_t prev) const;
  // sigmoid(w . [hidden_row ; W1[prev]]) (fp32); requires use_confidence_head.
  float confidence(const float* hidden_row, int32_t prev) const;
  // forward_block, then x_k = argmax(U_k + markov_bias(x_{k-1})) for k = 1..min(max_tokens, K)
  // (the markov_draft op). `with_logits`: also bring back each drafted position's logits.
  DraftResult draft(const DraftCache& cache, int32_t x0, int max_tokens, bool with_logits = false) const;
  // draft() for several requests, their block passes run as one forward_blocks and their Markov
  // chains as one markov_draft.
  std::vector<DraftResult> draft_batch(std::span<const DraftCache* const> caches, std::span<const int32_t> x0,
                                       std::span<const int> max_tokens, bool with_logits = false) const;
  // Draft vocabulary id -> target id (d2t; the identity when Vd == V).
  int32_t to_target_id(int32_t draft_id) const;

 private:
  core::Tensor alloc(int64_t rows, int64_t cols) const;
  core::Tensor linear(const core::TensorView& x, const kernels::LinearWeight& w, bool round_output = true) const;
  core::Tensor rmsnorm(const core::TensorView& x, const core::Tensor& w) const;
  core::Tensor add(const core::TensorView& a, const core::TensorView& b) const;
  core::Tensor upload_i32(std::span<const int32_t> values) const;
  // kv_a_proj + kv_a_layernorm of x [n, H] -> [n, cache_dim] rows [c_n | k_pe], k_pe not rotated.
  core::Tensor latent_rows(const DraftLayerWeights& w, const core::TensorView& x) const;
  // RoPE on the k_pe columns of latent rows [n, cache_dim], row r at position + r.
  void rotate_latents(const core::TensorView& rows, int64_t position) const;
  core::Tensor attention(const DraftLayerWeights& w, std::span<const DraftCache* const> caches, int layer,
                         const core::Tensor& x) const;

  const DraftConfig& config_;
  const DraftWeights& host_weights_;
  const kernels::Registry& ops_;
  DraftOptions options_;
  std::shared_ptr<core::DeviceMemory> memory_;
  DraftWeights device_weights_;  // the uploaded copy on a GPU (unused on the CPU)
  const DraftWeights* weights_;  // the weights on the model's device
  core::Tensor inv_freq_;        // f32 [rope / 2] on the model's device
};

// The block attention core (naive MLA, non-causal; the CPU's expanded form, DraftOptions): q f32 [T, NH*(dn+dr)] (q_pe already RoPE'd),
// latents f32 [S, r_kv + dr] rows [c_n | k_pe] (context rows then the block's own), kv_b expanded
// keys/values kv f32 [S, NH*(dn+dv)] (per head: k_nope then v). Every query row attends to all S:
//   score = scale * (q_nope . k_nope + q_pe . k_pe)   (one fp32 sum: nope dims, then rope dims)
//   o = round( sum_j softmax(score)_j v_j )           fp32, max-subtracted, j in order
// out f32 [T, NH*dv].
void block_attention(const DraftConfig& c, const core::TensorView& q, const core::TensorView& latents,
                     const core::TensorView& kv, const core::TensorView& out, kernels::Precision precision);

}  // namespace k3::draft
