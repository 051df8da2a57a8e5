// draft/draft_config.h: the DSpark draft model's configuration (spec §13.2), read from an HF-style
// config.json with model_type "k3_dspark", validated once, then read everywhere as plain data.
//
// config.json keys (all top level; the K3 value in brackets):
//   model_type            "k3_dspark"
//   num_hidden_layers     draft layers [5]
//   hidden_size           = the target's hidden size [7168] (the embedding is the target's)
//   vocab_size            = the target's vocabulary [163840]
//   draft_vocab_size      V_draft, rows of lm_head / markov_w2 [= vocab_size when absent]; when
//                         smaller, the tensor d2t maps draft ids to target ids (EAGLE-3 style)
//   num_attention_heads   MLA heads [96]
//   q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim  [1536, 512, 128, 64, 128]
//   rope_theta            RoPE base of the 64-wide rope slice (rotated, unlike the target's NoPE) [10000]
//   rope_scaling          must be absent or null (YaRN etc. are not implemented)
//   intermediate_size     SiTU-GLU MLP width [12288, see builtin_configs.cpp]
//   activation_situ_beta / activation_situ_linear_beta  [4.0 / 25.0]
//   rms_norm_eps          every draft RMSNorm, q_a/kv_a layernorms included [1e-5]
//   block_size            K: draft tokens proposed per forward pass [7]
//   target_layer_ids      0-based target layers whose AttnRes mixture is tapped [2, 23, 47, 71, 89]
//   markov_rank           rank of the low-rank Markov head [256]
//   use_confidence_head   confidence head Linear([hidden ++ markov]) -> sigmoid [false]
//   mask_token_id         the placeholder token of the block's query positions [163592]
//   share_target_lm_head  true: no lm_head.weight, the target's lm_head is used [false]
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/k3_config.h"

namespace k3::draft {

inline constexpr const char* kDsparkModelType = "k3_dspark";

struct DraftConfig {
  std::string model_type = kDsparkModelType;
  int num_layers = 0;        // draft decoder layers (dense MLA + SiTU MLP)
  int hidden_size = 0;       // = target hidden
  int vocab_size = 0;        // V: the target's vocabulary (embedding, markov_w1 rows)
  int draft_vocab_size = 0;  // V_draft: lm_head and markov_w2 rows
  int num_heads = 0;         // MLA heads
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;  // rotated by RoPE (even)
  int v_head_dim = 0;
  float rope_theta = 10000.0f;
  int intermediate_size = 0;  // SiTU-GLU MLP
  float situ_beta = 4.0f;
  float situ_linear_beta = 25.0f;
  float rms_norm_eps = 1e-5f;
  int block_size = 0;                 // K: draft positions per pass
  std::vector<int> target_layer_ids;  // taps, 0-based target layers, strictly increasing
  int markov_rank = 0;                // R
  bool use_confidence_head = false;
  int mask_token_id = -1;  // target id of the block placeholder token
  bool share_target_lm_head = false;

  int num_taps() const { return static_cast<int>(target_layer_ids.size()); }
  int q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int cache_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // latent cache row: [c_n | k_pe]
  float softmax_scale() const;                                       // q_head_dim^-1/2 (no YaRN mscale)
  bool has_d2t() const { return draft_vocab_size < vocab_size; }
};

// Parses and validates (validate() below); throws core::Error naming `source` and the key.
DraftConfig parse_draft_config(const nlohmann::json& j, const std::string& source = "config.json");
DraftConfig load_draft_config(const std::filesystem::path& path);
// Every field's own rule (positive sizes, even rope dim, taps increasing and >= 0, ...).
void validate(const DraftConfig& c, const std::string& source);
// The draft against the target it drafts for: same hidden size and vocabulary, every tap a layer
// whose next layer exists (the tap is the mixture layer l + 1 computes), the mask token in the
// vocabulary, a shared lm_head only with V_draft = V. Throws core::Error naming the field.
void check_matches_target(const DraftConfig& c, const config::K3Config& target, const std::string& source);
nlohmann::json to_json(const DraftConfig& c);

// Built-in drafts: "k3-dspark" (the K3 drafter, spec §13.2), "k3-tiny-dspark" (for the k3-tiny
// target), "k3-proxy-tp8-dspark" (for k3-proxy-tp8). Throws for an unknown name.
DraftConfig builtin_draft_config(const std::string& name);
std::vector<std::string> builtin_draft_config_names();
// A builtin name or a path to a draft config.json (or a folder holding one).
DraftConfig resolve_draft_config(const std::string& name_or_path);
// The default draft for a target: the builtin draft for a builtin target (by shape), otherwise a
// draft derived from the target's shapes (its MLA dims, taps spread over its layers as K3's
// 2/23/47/71/89 over 93, K = 7, rank min(256, hidden)).
DraftConfig default_draft_for(const config::K3Config& target);

}  // namespace k3::draft
