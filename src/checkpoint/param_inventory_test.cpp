// checkpoint/param_inventory_test.cpp: the spec §4 inventory against the parameter counts the
// spec derives for k3-tiny (§14.1) and K3 (§1.2), plus the per-config naming rules.
#include "checkpoint/param_inventory.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "config/k3_config.h"

namespace k3::checkpoint {
namespace {

using core::DType;
using core::Shape;

std::map<std::string, const ParamSpec*> by_name(const std::vector<ParamSpec>& specs) {
  std::map<std::string, const ParamSpec*> m;
  for (const ParamSpec& s : specs) EXPECT_TRUE(m.emplace(s.name, &s).second) << "duplicate " << s.name;
  return m;
}

// Parameters as the spec counts them: A_log as num_heads values (the used ones), MXFP4
// tensors by their logical element count.
int64_t spec_param_count(const ParamSpec& s, const config::K3Config& c) {
  if (s.role == ParamRole::kda_a_log) return c.kda.num_heads;
  if (s.role == ParamRole::expert_scale) return 0;
  if (s.role == ParamRole::expert_packed) return s.out_features * s.in_features;
  return s.shapes[0].numel();
}

int64_t layer_params(const std::vector<ParamSpec>& specs, const config::K3Config& c, const std::string& infix) {
  int64_t n = 0;
  for (const ParamSpec& s : specs)
    if (s.name.find(infix) != std::string::npos) n += spec_param_count(s, c);
  return n;
}

TEST(ParamInventory, K3TinyMatchesSpecCounts) {
  const config::K3Config c = config::builtin_config("k3-tiny");
  const std::vector<ParamSpec> specs = expected_params(c);
  auto m = by_name(specs);
  int64_t total = 0;
  for (const ParamSpec& s : specs) total += spec_param_count(s, c);
  EXPECT_EQ(total, 3259644);  // spec §14.1
  // Per-layer sublayer counts of spec §14.1: KDA 178,852; MLA 114,784; MoE 561,296; dense 393,216.
  EXPECT_EQ(layer_params(specs, c, "layers.1.self_attn."), 178852);
  EXPECT_EQ(layer_params(specs, c, "layers.3.self_attn."), 114784);
  EXPECT_EQ(layer_params(specs, c, "layers.1.block_sparse_moe."), 561296);
  EXPECT_EQ(layer_params(specs, c, "layers.0.mlp."), 393216);
  EXPECT_EQ(specs.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(specs.back().name, "lm_head.weight");

  // Exact names, dtypes and shapes of spec §4 (tiny instance).
  auto expect = [&](const std::string& name, DType dtype, Shape shape) {
    ASSERT_TRUE(m.count(name)) << name;
    EXPECT_EQ(m[name]->dtypes[0], dtype) << name;
    EXPECT_EQ(m[name]->shapes[0], shape) << name;
  };
  expect("model.layers.0.self_attn.q_conv1d.weight", DType::f32, {128, 1, 4});
  expect("model.layers.0.self_attn.A_log", DType::f32, {32});
  expect("model.layers.0.self_attn.dt_bias", DType::f32, {128});
  expect("model.layers.0.self_attn.o_norm.weight", DType::f32, {32});
  expect("model.layers.0.self_attn.f_a_proj.weight", DType::bf16, {32, 256});
  expect("model.layers.0.self_attn.f_b_proj.weight", DType::bf16, {128, 32});
  expect("model.layers.0.self_attn.b_proj.weight", DType::bf16, {4, 256});
  expect("model.layers.3.self_attn.q_b_proj.weight", DType::bf16, {4 * 48, 64});
  expect("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", DType::bf16, {48, 256});
  expect("model.layers.3.self_attn.kv_b_proj.weight", DType::bf16, {4 * 64, 32});
  expect("model.layers.3.self_attn.q_a_layernorm.weight", DType::bf16, {64});
  expect("model.layers.3.self_attn.kv_a_layernorm.weight", DType::bf16, {32});
  expect("model.layers.3.self_attn.g_proj.weight", DType::bf16, {128, 256});
  expect("model.layers.3.self_attn.o_proj.weight", DType::bf16, {256, 128});
  expect("model.layers.2.block_sparse_moe.gate.e_score_correction_bias", DType::f32, {16});
  expect("model.layers.2.block_sparse_moe.experts.15.w2.weight", DType::bf16, {128, 64});
  expect("model.layers.2.block_sparse_moe.shared_experts.down_proj.weight", DType::bf16, {256, 128});
  expect("model.layers.2.self_attention_res_proj.weight", DType::bf16, {1, 256});
  expect("model.layers.2.mlp_res_norm.weight", DType::bf16, {256});
  expect("model.output_attn_res_proj.weight", DType::bf16, {1, 256});
  expect("model.norm.weight", DType::bf16, {256});
  // A_log accepts the HF reference length [num_heads] too; nothing else.
  const ParamSpec& a_log = *m["model.layers.0.self_attn.A_log"];
  EXPECT_TRUE(a_log.accepts_shape({4}));
  EXPECT_FALSE(a_log.accepts_shape({8}));
  EXPECT_FALSE(a_log.accepts_dtype(DType::bf16));
  // No MLA names on KDA layers and vice versa; no dense FFN on MoE layers.
  EXPECT_FALSE(m.count("model.layers.0.self_attn.q_a_proj.weight"));
  EXPECT_FALSE(m.count("model.layers.3.self_attn.A_log"));
  EXPECT_FALSE(m.count("model.layers.1.mlp.gate_proj.weight"));
  EXPECT_FALSE(m.count("model.layers.0.block_sparse_moe.gate.weight"));
}

TEST(ParamInventory, Mxfp4ExpertsOnly) {
  config::K3Config c = config::builtin_config("k3-tiny");
  c.mxfp4.enabled = true;
  const std::vector<ParamSpec> specs = expected_params(c);
  auto m = by_name(specs);
  const ParamSpec& packed = *m.at("model.layers.1.block_sparse_moe.experts.3.w1.weight_packed");
  EXPECT_EQ(packed.dtypes, std::vector<DType>{DType::u8});
  EXPECT_EQ(packed.shapes[0], Shape({64, 64}));  // [I, L/2]
  EXPECT_EQ(m.at("model.layers.1.block_sparse_moe.experts.3.w1.weight_scale")->shapes[0], Shape({64, 4}));
  EXPECT_EQ(m.at("model.layers.1.block_sparse_moe.experts.3.w2.weight_packed")->shapes[0], Shape({128, 32}));
  EXPECT_EQ(m.at("model.layers.1.block_sparse_moe.experts.3.w2.weight_scale")->shapes[0], Shape({128, 2}));
  EXPECT_EQ(packed.value_name, "model.layers.1.block_sparse_moe.experts.3.w1.weight");
  EXPECT_FALSE(m.count("model.layers.1.block_sparse_moe.experts.3.w1.weight"));
  int u8 = 0;
  for (const ParamSpec& s : specs) {
    if (s.dtypes[0] != DType::u8) continue;
    ++u8;
    EXPECT_NE(s.name.find(".experts."), std::string::npos) << s.name;  // only routed experts are MXFP4
  }
  EXPECT_EQ(u8, 3 * 16 * 3 * 2);
}

// Spec §1.2: K3 per-layer counts and the 2.7795 T total; MXFP4 expert = 17,547,264 bytes.
TEST(ParamInventory, K3FullSizeMatchesSpec) {
  const config::K3Config c = config::builtin_config("k3");
  ASSERT_TRUE(c.mxfp4.enabled);
  const std::vector<ParamSpec> specs = expected_params(c);
  int64_t total = 0, expert_bytes = 0;
  for (const ParamSpec& s : specs) {
    total += spec_param_count(s, c);
    if (s.name.starts_with("model.layers.5.block_sparse_moe.experts.7.")) expert_bytes += s.shapes[0].numel();
  }
  EXPECT_NEAR(static_cast<double>(total), 2.7795e12, 0.00005e12);
  EXPECT_NEAR(static_cast<double>(layer_params(specs, c, "layers.0.self_attn.")), 443.74e6, 0.005e6);
  EXPECT_NEAR(static_cast<double>(layer_params(specs, c, "layers.3.self_attn.")), 232.20e6, 0.005e6);
  EXPECT_NEAR(static_cast<double>(layer_params(specs, c, "layers.1.block_sparse_moe.")), 29.785e9, 0.0005e9);
  EXPECT_EQ(expert_bytes, 17547264);
  auto find = [&](const std::string& name) -> const ParamSpec& {
    for (const ParamSpec& s : specs)
      if (s.name == name) return s;
    throw std::runtime_error("no " + name);
  };
  EXPECT_EQ(find("model.layers.0.self_attn.A_log").shapes[0], Shape({128}));
  EXPECT_EQ(find("model.layers.92.self_attn.kv_b_proj.weight").shapes[0], Shape({24576, 512}));
  EXPECT_EQ(find("model.embed_tokens.weight").shapes[0], Shape({163840, 7168}));
}

// A config with other sizes and patterns: names follow the config, A_log with more heads than
// head_dim can only be [num_heads], tied embeddings drop lm_head, shared experts may be absent.
TEST(ParamInventory, OtherConfigsFollowTheRules) {
  nlohmann::json j = config::to_json(config::builtin_config("k3-tiny"));
  j["num_hidden_layers"] = 6;
  j["attn_res_block_size"] = 3;
  j["first_k_dense_replace"] = 2;
  j["moe_layer_freq"] = 2;
  j["linear_attn_config"]["num_heads"] = 24;
  j["linear_attn_config"]["head_dim"] = 16;
  j["linear_attn_config"]["kda_layers"] = {1, 3, 4, 6};
  j["linear_attn_config"]["full_attn_layers"] = {2, 5};
  j["num_experts"] = 8;
  j["num_experts_per_token"] = 2;
  j["num_shared_experts"] = 0;
  j["tie_word_embeddings"] = true;
  const config::K3Config c = config::parse_config(j, "test");
  const std::vector<ParamSpec> specs = expected_params(c);
  auto m = by_name(specs);
  EXPECT_EQ(m.at("model.layers.0.self_attn.A_log")->shapes, std::vector<Shape>{Shape({24})});
  EXPECT_TRUE(m.count("model.layers.1.self_attn.kv_b_proj.weight"));
  EXPECT_TRUE(m.count("model.layers.4.self_attn.q_a_proj.weight"));  // 1-based 5
  EXPECT_TRUE(m.count("model.layers.5.self_attn.A_log"));
  EXPECT_TRUE(m.count("model.layers.1.mlp.down_proj.weight"));  // l < first_k_dense_replace
  EXPECT_TRUE(m.count("model.layers.3.mlp.down_proj.weight"));  // l % moe_layer_freq != 0
  EXPECT_TRUE(m.count("model.layers.4.block_sparse_moe.experts.7.w3.weight"));
  EXPECT_FALSE(m.count("model.layers.4.block_sparse_moe.experts.8.w3.weight"));
  EXPECT_FALSE(m.count("model.layers.2.block_sparse_moe.shared_experts.up_proj.weight"));
  EXPECT_FALSE(m.count("lm_head.weight"));
  EXPECT_FALSE(m.count("model.layers.6.input_layernorm.weight"));
  EXPECT_EQ(m.at("model.layers.0.self_attn.f_b_proj.weight")->shapes[0], Shape({24 * 16, 16}));
}

TEST(ParamInventory, RejectsConfigsOutsideTheFamily) {
  config::K3Config c = config::builtin_config("k3-tiny");
  c.attn_kinds.pop_back();
  EXPECT_THROW(expected_params(c), core::Error);
  c = config::builtin_config("k3-tiny");
  c.mxfp4.enabled = true;
  c.moe.moe_intermediate_size = 48;
  EXPECT_THROW(expected_params(c), core::Error);
  c = config::builtin_config("k3-tiny");
  c.kda.use_full_rank_gate = false;
  EXPECT_THROW(expected_params(c), core::Error);
}

TEST(ParamInventory, SkippedFamilies) {
  EXPECT_TRUE(is_skipped_tensor("vision_tower.encoder.blocks.0.wqkv.weight"));
  EXPECT_TRUE(is_skipped_tensor("language_model.vision_tower.x"));
  EXPECT_TRUE(is_skipped_tensor("mm_projector.proj.0.weight"));
  EXPECT_TRUE(is_skipped_tensor("language_model.mm_projector.proj.0.weight"));
  EXPECT_FALSE(is_skipped_tensor("model.vision_tower.x"));
  EXPECT_FALSE(is_skipped_tensor("vision_towerx.y"));
  EXPECT_FALSE(is_skipped_tensor("model.embed_tokens.weight"));
}

}  // namespace
}  // namespace k3::checkpoint
