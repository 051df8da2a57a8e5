// checkpoint/checkpoint_test_util.h: test helpers for whole checkpoints: extra configs, the
// test's own Weights -> name map, the round-trip check, and rewriting a checkpoint's tensors.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/param_inventory.h"
#include "checkpoint/random_init.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/test_util.h"
#include "config/k3_config.h"

namespace k3::checkpoint::testing {

// A K3-family config unlike k3-tiny in every size and pattern: 6 layers, AttnRes block 3, MLA
// at 1-based layers 2 and 5, dense FFN on layers 0, 1, 3, 5 (first_k_dense_replace 2,
// moe_layer_freq 2), KDA with more heads than head_dim (A_log stored [num_heads]) and conv
// kernel 3, 8 experts top-2 with one shared expert, untied embeddings.
inline config::K3Config other_config() {
  nlohmann::json j = config::to_json(config::builtin_config("k3-tiny"));
  j["vocab_size"] = 300;
  j.erase("bos_token_id");  // k3-tiny's special ids sit above 300
  j.erase("eos_token_id");
  j.erase("pad_token_id");
  j["hidden_size"] = 96;
  j["num_hidden_layers"] = 6;
  j["intermediate_size"] = 160;
  j["attn_res_block_size"] = 3;
  j["first_k_dense_replace"] = 2;
  j["moe_layer_freq"] = 2;
  j["linear_attn_config"]["num_heads"] = 24;
  j["linear_attn_config"]["head_dim"] = 16;
  j["linear_attn_config"]["short_conv_kernel_size"] = 3;
  j["linear_attn_config"]["kda_layers"] = {1, 3, 4, 6};
  j["linear_attn_config"]["full_attn_layers"] = {2, 5};
  j["num_attention_heads"] = 3;
  j["num_key_value_heads"] = 3;
  j["q_lora_rank"] = 48;
  j["kv_lora_rank"] = 32;
  j["qk_nope_head_dim"] = 16;
  j["qk_rope_head_dim"] = 8;
  j["v_head_dim"] = 24;
  j["num_experts"] = 8;
  j["num_experts_per_token"] = 2;
  j["num_shared_experts"] = 1;
  j["moe_intermediate_size"] = 64;
  j["routed_expert_hidden_size"] = 64;
  return config::parse_config(j, "test:other_config");
}

// k3-tiny sizes with another layer pattern (5 layers), to show values depend on names only.
inline config::K3Config other_config_same_hidden() {
  nlohmann::json j = config::to_json(config::builtin_config("k3-tiny"));
  j["num_hidden_layers"] = 5;
  j["linear_attn_config"]["kda_layers"] = {1, 2, 4};
  j["linear_attn_config"]["full_attn_layers"] = {3, 5};
  return config::parse_config(j, "test:other_config_same_hidden");
}

inline bool same_bytes(const core::Tensor& a, const core::Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data<void>(), b.data<void>(), static_cast<size_t>(a.nbytes())) == 0;
}

// Canonical name -> tensor for every field of Weights. Written here independently of the
// loader, so a swapped field (say q_proj <-> k_proj) fails the byte comparison.
inline std::map<std::string, core::Tensor> flatten(const model::Weights& w, const config::K3Config& c) {
  std::map<std::string, core::Tensor> m;
  auto add = [&](const std::string& n, const core::Tensor& t) {
    EXPECT_TRUE(t.defined()) << n;
    EXPECT_TRUE(m.emplace(n, t).second) << n;
  };
  auto lin = [&](const std::string& n, const kernels::LinearWeight& lw) {
    EXPECT_FALSE(lw.is_mxfp4()) << n;
    add(n + ".weight", lw.weight);
  };
  auto expert = [&](const std::string& base, const kernels::LinearWeight& lw) {
    if (!lw.is_mxfp4()) return add(base + ".weight", lw.weight);
    add(base + ".weight_packed", lw.weight);
    add(base + ".weight_scale", lw.scale);
  };
  add("model.embed_tokens.weight", w.embed);
  EXPECT_EQ(w.layers.size(), static_cast<size_t>(c.num_hidden_layers));
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const model::LayerWeights& L = w.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", L.input_norm);
    add(p + "post_attention_layernorm.weight", L.post_attn_norm);
    add(p + "self_attention_res_proj.weight", L.attn_res.query);
    add(p + "self_attention_res_norm.weight", L.attn_res.norm);
    add(p + "mlp_res_proj.weight", L.mlp_res.query);
    add(p + "mlp_res_norm.weight", L.mlp_res.norm);
    const std::string a = p + "self_attn.";
    if (const auto* k = std::get_if<model::KdaWeights>(&L.attn)) {
      EXPECT_EQ(c.attn_kind(static_cast<int>(l)), config::AttnKind::kda);
      lin(a + "q_proj", k->q_proj), lin(a + "k_proj", k->k_proj), lin(a + "v_proj", k->v_proj);
      lin(a + "g_proj", k->g_proj), lin(a + "o_proj", k->o_proj), lin(a + "f_a_proj", k->f_a_proj);
      lin(a + "f_b_proj", k->f_b_proj), lin(a + "b_proj", k->b_proj);
      add(a + "q_conv1d.weight", k->q_conv), add(a + "k_conv1d.weight", k->k_conv),
          add(a + "v_conv1d.weight", k->v_conv);
      add(a + "A_log", k->a_log), add(a + "dt_bias", k->dt_bias), add(a + "o_norm.weight", k->o_norm);
    } else {
      const auto& q = std::get<model::MlaWeights>(L.attn);
      EXPECT_EQ(c.attn_kind(static_cast<int>(l)), config::AttnKind::mla);
      lin(a + "q_a_proj", q.q_a_proj), add(a + "q_a_layernorm.weight", q.q_a_norm), lin(a + "q_b_proj", q.q_b_proj);
      lin(a + "kv_a_proj_with_mqa", q.kv_a_proj), add(a + "kv_a_layernorm.weight", q.kv_a_norm);
      lin(a + "kv_b_proj", q.kv_b_proj), lin(a + "g_proj", q.g_proj), lin(a + "o_proj", q.o_proj);
    }
    if (const auto* d = std::get_if<model::DenseFfnWeights>(&L.ffn)) {
      EXPECT_EQ(c.ffn_kind(static_cast<int>(l)), config::FfnKind::dense);
      lin(p + "mlp.gate_proj", d->gate_proj), lin(p + "mlp.up_proj", d->up_proj),
          lin(p + "mlp.down_proj", d->down_proj);
    } else {
      const auto& e = std::get<model::MoeWeights>(L.ffn);
      EXPECT_EQ(c.ffn_kind(static_cast<int>(l)), config::FfnKind::moe);
      const std::string m = p + "block_sparse_moe.";
      lin(m + "gate", e.router), add(m + "gate.e_score_correction_bias", e.router_bias);
      lin(m + "routed_expert_down_proj", e.latent_down), add(m + "routed_expert_norm.weight", e.latent_norm);
      lin(m + "routed_expert_up_proj", e.latent_up);
      EXPECT_EQ(e.w1.size(), static_cast<size_t>(c.moe.num_experts));
      for (size_t x = 0; x < e.w1.size(); ++x) {
        const std::string b = m + "experts." + std::to_string(x) + ".";
        expert(b + "w1", e.w1[x]), expert(b + "w2", e.w2[x]), expert(b + "w3", e.w3[x]);
      }
      lin(m + "shared_experts.gate_proj", e.shared_gate), lin(m + "shared_experts.up_proj", e.shared_up);
      lin(m + "shared_experts.down_proj", e.shared_down);
    }
  }
  add("model.output_attn_res_proj.weight", w.output_res.query);
  add("model.output_attn_res_norm.weight", w.output_res.norm);
  add("model.norm.weight", w.final_norm);
  if (!c.tie_word_embeddings) lin("lm_head", w.lm_head);
  return m;
}

// Loads DIR and checks: the config is the written one (mxfp4 as in the options), every
// inventory tensor is wired to its field, with the written dtype/shape and exactly the bytes
// random_init gives for (seed, init, name).
inline void expect_round_trip(const fs::path& dir, const config::K3Config& cfg, const WriteOptions& opt) {
  const LoadedModel m = load_checkpoint(dir);
  config::K3Config written = cfg;
  written.mxfp4.enabled = opt.mxfp4;
  EXPECT_EQ(m.config.hash(), written.hash());
  const std::vector<ParamSpec> specs = expected_params(written);
  const std::map<std::string, core::Tensor> got = flatten(m.weights, written);
  EXPECT_EQ(got.size(), specs.size());
  std::vector<std::byte> want;
  for (const ParamSpec& s : specs) {
    auto it = got.find(s.name);
    ASSERT_NE(it, got.end()) << s.name;
    const core::Tensor& t = it->second;
    ASSERT_EQ(t.dtype(), s.dtypes[0]) << s.name;
    ASSERT_EQ(t.shape(), s.shapes[0]) << s.name;
    want.assign(static_cast<size_t>(t.nbytes()), std::byte{0});
    fill_random_param(s, written, opt.init, opt.seed, want);
    ASSERT_EQ(std::memcmp(want.data(), t.data<void>(), want.size()), 0) << s.name;
  }
}

// Reads every tensor of the checkpoint in DIR, lets `edit` change the name -> tensor map, and
// writes it back as DIR/model.safetensors (removing an index and its shards).
inline void rewrite_tensors(const fs::path& dir,
                            const std::function<void(std::map<std::string, core::Tensor>&)>& edit) {
  std::map<std::string, core::Tensor> tensors;
  {
    const SafetensorsSet set = SafetensorsSet::open_dir(dir);
    for (const auto& [name, e] : set.entries()) tensors[name] = set.tensor(e);  // views keep their files mapped
    if (set.sharded()) {
      for (const auto& [name, e] : set.entries()) fs::remove(e.file->path());
      fs::remove(dir / kIndexFileName);
    }
  }
  edit(tensors);
  std::map<std::string, core::TensorView> views;
  for (const auto& [name, t] : tensors) views[name] = t.view();
  write_safetensors(dir / kSingleFileName, views);
}

}  // namespace k3::checkpoint::testing
