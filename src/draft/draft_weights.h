// draft/draft_weights.h: every parameter of the DSpark draft model, its checkpoint names, loading
// (through checkpoint/safetensors.h) and deterministic random checkpoints.
//
// Checkpoint tensor names (an optional "model." prefix is accepted when loading; writing uses none).
// Shapes with V = vocab_size, Vd = draft_vocab_size, H = hidden, n = number of taps, R = markov_rank,
// NH = heads, r_q/r_kv = q/kv LoRA ranks, dn/dr/dv = nope/rope/v head dims, I = intermediate:
//   context_proj.weight                               [H, n*H]        BF16 (F32 accepted)
//   context_norm.weight                               [H]
//   layers.{i}.input_layernorm.weight                 [H]
//   layers.{i}.self_attn.q_a_proj.weight              [r_q, H]
//   layers.{i}.self_attn.q_a_layernorm.weight         [r_q]
//   layers.{i}.self_attn.q_b_proj.weight              [NH*(dn+dr), r_q]   per head: nope rows, then rope rows
//   layers.{i}.self_attn.kv_a_proj_with_mqa.weight    [r_kv+dr, H]        c (r_kv rows), then k_pe (dr rows)
//   layers.{i}.self_attn.kv_a_layernorm.weight        [r_kv]
//   layers.{i}.self_attn.kv_b_proj.weight             [NH*(dn+dv), r_kv]  per head: W_UK rows, then W_UV rows
//   layers.{i}.self_attn.o_proj.weight                [H, NH*dv]
//   layers.{i}.post_attention_layernorm.weight        [H]
//   layers.{i}.mlp.{gate_proj,up_proj}.weight         [I, H]
//   layers.{i}.mlp.down_proj.weight                   [H, I]
//   norm.weight                                       [H]
//   lm_head.weight                                    [Vd, H]     absent when share_target_lm_head
//   markov_w1.weight                                  [V, R]      indexed by the previous TARGET id
//   markov_w2.weight                                  [Vd, R]
//   confidence_head.weight                            [1, H+R]    only with use_confidence_head
//   d2t                                               I64 [Vd]    only when Vd < V: target id = d + d2t[d]
// The token embedding is NOT stored: it is the target's model.embed_tokens (aliased), as the K3
// DSpark checkpoint uses the frozen target embedding.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/tensor.h"
#include "draft/draft_config.h"
#include "kernels/common.h"
#include "model/weights.h"

namespace k3::draft {

using core::Tensor;
using kernels::LinearWeight;

struct DraftLayerWeights {
  Tensor input_norm;                // [H]
  LinearWeight q_a_proj;            // [r_q, H]
  Tensor q_a_norm;                  // [r_q]
  LinearWeight q_b_proj;            // [NH*(dn+dr), r_q]
  LinearWeight kv_a_proj;           // [r_kv+dr, H]
  Tensor kv_a_norm;                 // [r_kv]
  LinearWeight kv_b_proj;           // [NH*(dn+dv), r_kv]
  LinearWeight o_proj;              // [H, NH*dv]
  Tensor post_attn_norm;            // [H]
  LinearWeight gate_proj, up_proj;  // [I, H]
  LinearWeight down_proj;           // [H, I]
};

struct DraftWeights {
  Tensor embed;               // [V, H] the target's embed_tokens (shared storage, not a copy)
  LinearWeight context_proj;  // [H, n*H]
  Tensor context_norm;        // [H]
  std::vector<DraftLayerWeights> layers;
  Tensor final_norm;             // [H]
  LinearWeight lm_head;          // [Vd, H] (own, or the target's when share_target_lm_head)
  Tensor markov_w1;              // [V, R]
  LinearWeight markov_w2;        // [Vd, R]
  LinearWeight confidence_head;  // [1, H+R] (undefined without a confidence head)
  Tensor d2t;                    // i64 [Vd] (undefined when Vd == V)
};

// What a draft checkpoint tensor is: decides the random init and the accepted dtypes.
enum class DraftParamRole : uint8_t { linear, norm, markov_embedding, d2t };
struct DraftParamSpec {
  std::string name;
  DraftParamRole role = DraftParamRole::linear;
  core::Shape shape;
};
// The list in model order, for the config as given.
std::vector<DraftParamSpec> draft_params(const DraftConfig& c);
// Number of stored parameters (d2t included).
int64_t draft_param_count(const DraftConfig& c);

// Reads DIR/config.json (load_draft_config) and DIR's safetensors (one file or an index),
// checks the config against the target (check_matches_target) and every tensor against
// draft_params(): missing, extra, mis-shaped or wrongly typed tensors throw core::Error naming
// the file and tensor. The embedding (and lm_head when shared) alias the target's tensors.
struct LoadedDraft {
  DraftConfig config;
  DraftWeights weights;
};
LoadedDraft load_draft(const std::filesystem::path& dir, const config::K3Config& target_config,
                       const model::Weights& target_weights);

// Assembles the weights from tensors by checkpoint name (draft_params(c) names, shapes already
// checked), with the target's embedding and (share_target_lm_head) lm_head aliased.
DraftWeights assemble_draft_weights(const DraftConfig& c, const std::map<std::string, Tensor>& tensors,
                                    const Tensor& target_embed, const LinearWeight* target_lm_head);

// The random value rule: linear weights N(0, 1/fan_in) (activations O(1), logits neither flat nor
// one-hot), norms 1 + N(0, 0.05^2), markov_w1 N(0, 1), markov_w2 N(0, 1/R), d2t = 0 (draft ids are
// the first Vd target ids). Every tensor from Rng(seed).fork(hash(name)), rounded to BF16: one
// Box-Muller normal per value up to kDraftSequentialMaxValues values, above that four standard-normal
// quantiles per next_u64 (16 bits each, checkpoint::bulk_normal_quantiles) in row-major order.
inline constexpr int64_t kDraftSequentialMaxValues = int64_t{1} << 20;
// Writes DIR/config.json (to_json) and DIR/model.safetensors; same seed, same bytes.
core::DType draft_param_dtype(const DraftParamSpec& p);  // as written: BF16, d2t I64
// The bytes of one tensor under that rule (exactly numel * dtype size of them).
void fill_random_draft_param(const DraftParamSpec& p, uint64_t seed, std::span<std::byte> bytes);
// The same values in memory (what write_random_draft + load_draft give), for tests and benchmarks.
DraftWeights random_draft_weights(const DraftConfig& c, uint64_t seed, const Tensor& target_embed,
                                  const LinearWeight* target_lm_head = nullptr);
void write_random_draft(const DraftConfig& c, uint64_t seed, const std::filesystem::path& out);

// Shared by the draft loaders (DSpark, EAGLE-3).
// The tensors `params` names from DIR's safetensors, by name. Each is looked up under the names
// stored_names(name) gives, in order (checkpoint layouts differ in prefixes); BF16 or F32 (d2t:
// I64) with the listed shape. Throws core::Error naming the file and tensor for a missing,
// mistyped or misshaped tensor, and for any stored tensor neither read nor `ignored`.
using StoredNamesFn = std::function<std::vector<std::string>(const std::string& name)>;
std::map<std::string, Tensor> read_draft_tensors(const std::filesystem::path& dir,
                                                 const std::vector<DraftParamSpec>& params,
                                                 const StoredNamesFn& stored_names,
                                                 const std::function<bool(const std::string&)>& ignored);
// Every d2t entry maps its draft id into [0, vocab_size); throws naming `source` and the entry.
void check_d2t(const Tensor& d2t, int64_t vocab_size, const std::string& source);
// DIR/config.json (`config`) and DIR/model.safetensors with `params` filled by
// fill_random_draft_param(seed); same seed, same bytes.
void write_random_checkpoint(const std::filesystem::path& out, const nlohmann::json& config,
                             const std::vector<DraftParamSpec>& params, uint64_t seed, const std::string& model_type);

}  // namespace k3::draft
