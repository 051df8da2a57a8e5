// config/k3_config.h: the K3-family text-model configuration (spec §1, §4, §14).
//
// Loaded from a Hugging Face config.json (text model nested under "text_config" or flat),
// validated once, then read everywhere as plain data. Every K3-family shape derives from
// these fields; no K3 number is hard-coded elsewhere.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace k3::config {

enum class AttnKind : uint8_t { kda, mla };
enum class FfnKind : uint8_t { dense, moe };

struct KdaConfig {                 // "linear_attn_config"
  int num_heads = 0;               // H_kda (96 in K3)
  int head_dim = 0;                // d_k = d_v (128)
  int short_conv_kernel_size = 0;  // 4
  float gate_lower_bound = -5.0f;  // g = lower_bound * sigmoid(exp(A_log) * z)
  bool use_full_rank_gate = true;  // output gate g_proj is [P, hidden]
  int chunk_size = 64;             // chunked prefill tile ("kda_chunk_size"; an implementation choice)
  int proj_dim() const { return num_heads * head_dim; }  // P
};

struct MlaConfig {
  int num_heads = 0;         // 96
  int q_lora_rank = 0;       // 1536
  int kv_lora_rank = 0;      // 512
  int qk_nope_head_dim = 0;  // 128
  int qk_rope_head_dim = 0;  // 64 (used unrotated: NoPE)
  int v_head_dim = 0;        // 128
  bool use_output_gate = true;
  int q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int cache_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // 576 per token per layer
  float softmax_scale() const;                                       // q_head_dim^-1/2
  // The q_a / kv_a RMSNorms' eps: the Moonshot reference's default, not a config.json field (spec §6.1).
  static constexpr float kLatentNormEps = 1e-6f;
};

struct MoeConfig {
  int num_experts = 0;                // 896
  int num_experts_per_token = 0;      // top-k (16)
  int num_shared_experts = 0;         // 2 (fused: intermediate = 2 * moe_intermediate_size)
  int moe_intermediate_size = 0;      // 3072
  int routed_expert_hidden_size = 0;  // latent width (3584)
  bool latent_moe_use_norm = true;
  bool renormalize = true;
  float routed_scaling_factor = 1.0f;
  int num_expert_group = 1;  // grouping is a no-op with 1 group (the only supported value)
  int topk_group = 1;
  // A rank's config under expert parallelism (config::shard_config with expert_parallel; never in
  // a checkpoint's config.json): expert_parallel_size > 0 = the rank holds num_experts /
  // expert_parallel_size WHOLE routed experts (moe_intermediate_size stays whole), and
  // shared_intermediate_size > 0 is its share of the shared experts' intermediate (still TP-sharded).
  int expert_parallel_size = 0;
  int shared_intermediate_size = 0;
  int shared_intermediate() const {
    return shared_intermediate_size > 0 ? shared_intermediate_size : num_shared_experts * moe_intermediate_size;
  }
  // The routed experts one rank holds (all of them without expert parallelism).
  int held_experts() const { return expert_parallel_size > 0 ? num_experts / expert_parallel_size : num_experts; }
};

struct Mxfp4Config {  // compressed-tensors "mxfp4-pack-quantized" on the routed experts
  bool enabled = false;
  int group_size = 32;
};

struct K3Config {
  std::string model_type;  // "kimi_linear"
  int vocab_size = 0;
  int hidden_size = 0;
  int num_hidden_layers = 0;
  int intermediate_size = 0;  // dense FFN
  float rms_norm_eps = 1e-5f;
  int first_k_dense_replace = 1;
  int moe_layer_freq = 1;
  float situ_beta = 4.0f;          // activation_situ_beta
  float situ_linear_beta = 25.0f;  // activation_situ_linear_beta
  int attn_res_block_size = 12;
  bool tie_word_embeddings = false;
  int bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;  // -1: absent
  KdaConfig kda;
  MlaConfig mla;
  MoeConfig moe;
  Mxfp4Config mxfp4;
  std::vector<AttnKind> attn_kinds;  // per 0-based layer, from the 1-based lists

  AttnKind attn_kind(int layer) const { return attn_kinds.at(static_cast<size_t>(layer)); }
  FfnKind ffn_kind(int layer) const {
    return (layer >= first_k_dense_replace && layer % moe_layer_freq == 0) ? FfnKind::moe : FfnKind::dense;
  }
  // AttnRes: the bank gains a row before the attention of layer l when l % block == 0.
  bool is_bank_write_layer(int layer) const { return layer % attn_res_block_size == 0; }
  int max_bank_rows() const { return (num_hidden_layers + attn_res_block_size - 1) / attn_res_block_size; }
  // Stable digest of every field (hex), for result bundles and golden files.
  std::string hash() const;
};

// Parses and validates; throws core::Error naming the key and the source on any problem.
K3Config parse_config(const nlohmann::json& j, const std::string& source = "config.json");
K3Config load_config(const std::filesystem::path& path);
// Checks cross-field rules (layer lists, head sizes, group sizes ...). Throws core::Error.
void validate(const K3Config& c, const std::string& source);
// Writes the HF form (flat, with linear_attn_config and, when enabled, quantization_config).
nlohmann::json to_json(const K3Config& c);

// Built-in configs by name ("k3-tiny" of spec §14.1). Throws for an unknown name.
K3Config builtin_config(const std::string& name);
std::vector<std::string> builtin_config_names();
// "k3-tiny" or a path to config.json.
K3Config resolve_config(const std::string& name_or_path);

}  // namespace k3::config
