// draft/eagle3_config.h: the EAGLE-3 draft model's configuration (spec §13.1), read from the
// Hugging Face config.json that vLLM and SGLang load for EAGLE-3 drafts of Kimi models
// (architectures ["LlamaForCausalLMEagle3"], model_type "llama"), validated once, then plain data.
//
// config.json keys (top level unless noted; vLLM's default in brackets):
//   architectures            must hold "LlamaForCausalLMEagle3" (or vLLM's "Eagle3LlamaForCausalLM")
//   num_hidden_layers        must be 1 (every published EAGLE-3 draft has one decoder layer)
//   hidden_size              H, the draft's width
//   target_hidden_size       the width of each tapped target hidden state [hidden_size]
//   vocab_size               V = the target's vocabulary
//   draft_vocab_size         Vd, rows of lm_head [vocab_size]; when smaller, the tensor d2t maps
//                            draft ids to target ids (target id = d + d2t[d])
//   num_attention_heads      NH; num_key_value_heads NKV [NH] (grouped-query attention)
//   head_dim                 [hidden_size / num_attention_heads]
//   intermediate_size        the SiLU-GLU MLP width
//   hidden_act               must be "silu"
//   rms_norm_eps             [1e-6]; rope_theta [10000]
//   rope_scaling             null, {"rope_type": "default"} or {"rope_type": "llama3", "factor",
//                            "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
//   attention_bias, mlp_bias must be false (no published EAGLE-3 draft has biases)
//   norm_before_residual     the residual is the hidden_norm'ed input instead of the raw one [false]
//   eagle_config.eagle_aux_hidden_state_layer_ids (or the same key at the top level)
//                            the target layers whose INPUT is tapped, vLLM's meaning [2, L/2, L-3];
//                            under AttnRes the input of layer a is the mixture layer a computes,
//                            which is k3serve's tap of layer a - 1 (spec/drafter.h)
//   eagle_config.use_aux_hidden_state  must be true (without taps it is not EAGLE-3)
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/k3_config.h"

namespace k3::draft {

inline constexpr const char* kEagle3Architecture = "LlamaForCausalLMEagle3";

// Llama-3 frequency scaling (HF's "llama3" rope_type); factor 0 = none.
struct Llama3RopeScaling {
  float factor = 0.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
  bool enabled() const { return factor > 0.0f; }
};

struct Eagle3Config {
  int hidden_size = 0;         // H
  int target_hidden_size = 0;  // width of one tap
  int vocab_size = 0;          // V
  int draft_vocab_size = 0;    // Vd
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // even (rotate-half RoPE over the whole head)
  int intermediate_size = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  Llama3RopeScaling rope_scaling;
  bool norm_before_residual = false;
  std::vector<int> aux_layer_ids;  // vLLM's eagle_aux_hidden_state_layer_ids, strictly increasing, >= 1

  int num_taps() const { return static_cast<int>(aux_layer_ids.size()); }
  // k3serve's tap layers (spec/drafter.h): the mixture the attention side of layer a computes is
  // the tap of layer a - 1.
  std::vector<int> tap_layers() const;
  int q_width() const { return num_heads * head_dim; }
  int kv_width() const { return num_kv_heads * head_dim; }
  bool has_d2t() const { return draft_vocab_size < vocab_size; }
};

// Parses and validates; throws core::Error naming `source` and the key.
Eagle3Config parse_eagle3_config(const nlohmann::json& j, const std::string& source = "config.json");
Eagle3Config load_eagle3_config(const std::filesystem::path& path);  // a config.json or a folder holding one
void validate(const Eagle3Config& c, const std::string& source);
// Against the target: the taps' width is its hidden size, the same vocabulary, every aux layer a
// layer of the target after the first (its input is a mixture the target computes).
void check_matches_target(const Eagle3Config& c, const config::K3Config& target, const std::string& source);
// The HF config.json (architectures, model_type "llama", eagle_config), loadable by vLLM too.
nlohmann::json to_json(const Eagle3Config& c);

// Built-in drafts: "k3-eagle3" (K3's width, vLLM's default taps 2/46/90, a 32K draft vocabulary),
// "k3-tiny-eagle3" (k3-tiny), "k3-proxy-tp8-eagle3" (k3-proxy-tp8). Throws for an unknown name.
Eagle3Config builtin_eagle3_config(const std::string& name);
std::vector<std::string> builtin_eagle3_config_names();
Eagle3Config resolve_eagle3_config(const std::string& name_or_path);
// The builtin draft matching the target's shapes, else one derived from them (vLLM's default taps
// clamped into the target, heads of up to 64 dims, MLP width 3 H).
Eagle3Config default_eagle3_for(const config::K3Config& target);

}  // namespace k3::draft
