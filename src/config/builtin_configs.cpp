// config/builtin_configs.cpp: named configs built into k3serve: "k3-tiny" (spec §14.1), its MXFP4
// variant, "k3" (the published K3 text_config, spec §1.1, for shape checks and sizing) and
// "k3-proxy-tp8" (one TP8 rank's share of K3 as a 24-layer model, for single-GPU decode numbers).
//
// Each is written as the HF JSON it stands for and goes through parse_config, so a builtin is
// validated exactly like a file and cannot drift from what a config.json would give.
#include <nlohmann/json.hpp>

#include "config/k3_config.h"
#include "core/error.h"

namespace k3::config {

using nlohmann::json;

namespace {

// spec §14.1 verbatim, plus the special-token ids of the tokenizer make-checkpoint bundles with
// it (tokenizer/tiny_tokenizer.h; K3's 163584 / 163586 / 163839 moved to the tiny vocabulary), so
// generation stops at <|end_of_msg|> like K3's. tiny_tokenizer_test checks the two agree.
json k3_tiny_json() {
  json j = json::parse(R"({
    "model_type": "kimi_linear", "vocab_size": 1024, "hidden_size": 256, "num_hidden_layers": 4,
    "intermediate_size": 512, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "num_experts": 16, "num_experts_per_token": 4, "num_shared_experts": 2, "moe_intermediate_size": 64,
    "routed_expert_hidden_size": 128, "latent_moe_use_norm": true,
    "moe_router_activation_func": "sigmoid", "moe_renormalize": true, "routed_scaling_factor": 1.0,
    "use_grouped_topk": true, "num_expert_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
    "hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 32,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
    "mla_use_nope": true, "mla_use_output_gate": true,
    "linear_attn_config": {"num_heads": 4, "head_dim": 32, "short_conv_kernel_size": 4,
       "gate_lower_bound": -5.0, "use_full_rank_gate": true,
       "kda_layers": [1, 2, 3], "full_attn_layers": [4]},
    "attn_res_block_size": 2, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
    "kda_chunk_size": 64
  })");
  j["bos_token_id"] = 768;
  j["eos_token_id"] = 770;
  j["pad_token_id"] = 1023;
  return j;
}

// spec §1.1 (HF moonshotai/Kimi-K3 text_config), flat.
json k3_json() {
  json kda = json::array(), full = json::array();
  for (int layer = 1; layer <= 93; ++layer) (layer % 4 == 0 || layer == 93 ? full : kda).push_back(layer);
  return {
      {"model_type", "kimi_linear"},
      {"vocab_size", 163840},
      {"hidden_size", 7168},
      {"num_hidden_layers", 93},
      {"intermediate_size", 33792},
      {"rms_norm_eps", 1e-5},
      {"first_k_dense_replace", 1},
      {"moe_layer_freq", 1},
      {"tie_word_embeddings", false},
      {"bos_token_id", 163584},
      {"eos_token_id", 163586},
      {"pad_token_id", 163839},
      {"num_attention_heads", 96},
      {"num_key_value_heads", 96},
      {"q_lora_rank", 1536},
      {"kv_lora_rank", 512},
      {"qk_nope_head_dim", 128},
      {"qk_rope_head_dim", 64},
      {"v_head_dim", 128},
      {"mla_use_nope", true},
      {"mla_use_output_gate", true},
      {"num_experts", 896},
      {"num_experts_per_token", 16},
      {"num_shared_experts", 2},
      {"moe_intermediate_size", 3072},
      {"routed_expert_hidden_size", 3584},
      {"latent_moe_use_norm", true},
      {"moe_router_activation_func", "sigmoid"},
      {"topk_method", "noaux_tc"},
      {"use_grouped_topk", true},
      {"num_expert_group", 1},
      {"topk_group", 1},
      {"moe_renormalize", true},
      {"routed_scaling_factor", 1.0},
      {"hidden_act", "situ"},
      {"activation_situ_beta", 4.0},
      {"activation_situ_linear_beta", 25.0},
      {"attn_res_block_size", 12},
      {"linear_attn_config",
       {{"num_heads", 96},
        {"head_dim", 128},
        {"short_conv_kernel_size", 4},
        {"gate_lower_bound", -5.0},
        {"use_full_rank_gate", true},
        {"kda_layers", kda},
        {"full_attn_layers", full}}},
      {"quantization_config",
       {{"quant_method", "compressed-tensors"},
        {"format", "mxfp4-pack-quantized"},
        {"config_groups",
         {{"group_0",
           {{"format", "mxfp4-pack-quantized"},
            {"targets", json::array({"Linear"})},
            {"weights", {{"num_bits", 4}, {"type", "float"}, {"strategy", "group"}, {"group_size", 32}}}}}}}}},
  };
}

// One TP8 rank's share of K3 (spec §11) as a whole model that fits one GPU (about 52 GB): the
// shapes of spec §14.2 (hidden 7168; 12 KDA heads of 128; 12 MLA heads with K3's MLA dims; 896
// MXFP4 experts of intermediate 3072 / 8 = 384 on the latent 3584; shared 2 x 384 = 768; dense
// 33792 / 8 = 4224; vocab 163840 / 8 = 20480) in 24 layers of K3's pattern: 1-based layer l is
// MLA when l % 4 == 0 (6 MLA, 18 KDA, the last layer MLA as in K3), layer 0 dense, the rest MoE,
// AttnRes blocks of 12. Norms, eps, SiTU betas, router and gate bound are K3's. The special ids
// are those of the tiny tokenizer make-checkpoint writes for this vocabulary (K3's slots moved to
// the top 256 ids: vocab - 256, vocab - 254, vocab - 1), as k3-tiny does.
json k3_proxy_tp8_json() {
  constexpr int kLayers = 24, kVocab = 20480;
  json j = k3_json();
  json kda = json::array(), full = json::array();
  for (int layer = 1; layer <= kLayers; ++layer) (layer % 4 == 0 ? full : kda).push_back(layer);
  j["num_hidden_layers"] = kLayers;
  j["vocab_size"] = kVocab;
  j["intermediate_size"] = 33792 / 8;
  j["num_attention_heads"] = 96 / 8;
  j["num_key_value_heads"] = 96 / 8;
  j["moe_intermediate_size"] = 3072 / 8;
  j["linear_attn_config"]["num_heads"] = 96 / 8;
  j["linear_attn_config"]["kda_layers"] = kda;
  j["linear_attn_config"]["full_attn_layers"] = full;
  j["bos_token_id"] = kVocab - 256;
  j["eos_token_id"] = kVocab - 254;
  j["pad_token_id"] = kVocab - 1;
  return j;
}

}  // namespace

std::vector<std::string> builtin_config_names() { return {"k3-tiny", "k3-tiny-mxfp4", "k3", "k3-proxy-tp8"}; }

K3Config builtin_config(const std::string& name) {
  if (name == "k3-tiny") return parse_config(k3_tiny_json(), "builtin:k3-tiny");
  if (name == "k3-tiny-mxfp4") {
    json j = k3_tiny_json();
    j["quantization_config"] = {{"quant_method", "compressed-tensors"},
                                {"format", "mxfp4-pack-quantized"},
                                {"weights", {{"num_bits", 4}, {"type", "float"}, {"group_size", 32}}}};
    return parse_config(j, "builtin:k3-tiny-mxfp4");
  }
  if (name == "k3") return parse_config(k3_json(), "builtin:k3");
  if (name == "k3-proxy-tp8") return parse_config(k3_proxy_tp8_json(), "builtin:k3-proxy-tp8");
  std::string names;
  for (const std::string& n : builtin_config_names()) names += (names.empty() ? "" : ", ") + n;
  throw core::Error("config: unknown built-in config \"" + name + "\" (built-in: " + names + ")");
}

}  // namespace k3::config
