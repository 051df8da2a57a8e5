// config/k3_config_test.cpp: K3Config parsing, derived facts, builtins, round trip, hash, resolve.
// (Error paths are in k3_config_errors_test.cpp.)
#include "config/k3_config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "config/config_test_util.h"
#include "core/error.h"

namespace k3::config {
namespace {

using nlohmann::json;
using test::expect_same_config;
using test::TempDir;

// Golden digest of builtin "k3-tiny" (FNV-1a 64 of its canonical to_json dump).
constexpr const char* kTinyHash = "e48358664ea801a8";

std::filesystem::path fixture(const char* name) {
  return std::filesystem::path(K3_SOURCE_DIR) / "src/config/testdata" / name;
}

TEST(K3Config, TinyMatchesSpec14_1) {
  const K3Config c = builtin_config("k3-tiny");
  EXPECT_EQ(c.model_type, "kimi_linear");
  EXPECT_EQ(c.vocab_size, 1024);
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.num_hidden_layers, 4);
  EXPECT_EQ(c.intermediate_size, 512);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_EQ(c.moe.num_experts, 16);
  EXPECT_EQ(c.moe.num_experts_per_token, 4);
  EXPECT_EQ(c.moe.num_shared_experts, 2);
  EXPECT_EQ(c.moe.moe_intermediate_size, 64);
  EXPECT_EQ(c.moe.routed_expert_hidden_size, 128);
  EXPECT_TRUE(c.moe.latent_moe_use_norm);
  EXPECT_TRUE(c.moe.renormalize);
  EXPECT_EQ(c.moe.routed_scaling_factor, 1.0f);
  EXPECT_EQ(c.moe.num_expert_group, 1);
  EXPECT_EQ(c.moe.topk_group, 1);
  EXPECT_EQ(c.situ_beta, 4.0f);
  EXPECT_EQ(c.situ_linear_beta, 25.0f);
  EXPECT_EQ(c.mla.num_heads, 4);
  EXPECT_EQ(c.mla.q_lora_rank, 64);
  EXPECT_EQ(c.mla.kv_lora_rank, 32);
  EXPECT_EQ(c.mla.qk_nope_head_dim, 32);
  EXPECT_EQ(c.mla.qk_rope_head_dim, 16);
  EXPECT_EQ(c.mla.v_head_dim, 32);
  EXPECT_TRUE(c.mla.use_output_gate);
  EXPECT_EQ(c.kda.num_heads, 4);
  EXPECT_EQ(c.kda.head_dim, 32);
  EXPECT_EQ(c.kda.short_conv_kernel_size, 4);
  EXPECT_EQ(c.kda.gate_lower_bound, -5.0f);
  EXPECT_TRUE(c.kda.use_full_rank_gate);
  EXPECT_EQ(c.kda.chunk_size, 64);
  EXPECT_EQ(c.attn_res_block_size, 2);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FALSE(c.tie_word_embeddings);
  // Not in §14.1: the ids of the tokenizer make-checkpoint bundles (builtin_configs.cpp).
  EXPECT_EQ(c.bos_token_id, 768);
  EXPECT_EQ(c.eos_token_id, 770);
  EXPECT_EQ(c.pad_token_id, 1023);
  EXPECT_FALSE(c.mxfp4.enabled);
}

TEST(K3Config, TinyDerivedLayout) {
  // spec §14.1: KDA+dense, KDA+MoE, KDA+MoE (block write), MLA+MoE; bank writes at 0 and 2.
  const K3Config c = builtin_config("k3-tiny");
  ASSERT_EQ(c.attn_kinds.size(), 4u);
  const AttnKind attn[4] = {AttnKind::kda, AttnKind::kda, AttnKind::kda, AttnKind::mla};
  const FfnKind ffn[4] = {FfnKind::dense, FfnKind::moe, FfnKind::moe, FfnKind::moe};
  const bool write[4] = {true, false, true, false};
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(c.attn_kind(l), attn[l]) << "layer " << l;
    EXPECT_EQ(c.ffn_kind(l), ffn[l]) << "layer " << l;
    EXPECT_EQ(c.is_bank_write_layer(l), write[l]) << "layer " << l;
  }
  EXPECT_EQ(c.max_bank_rows(), 2);
  EXPECT_EQ(c.kda.proj_dim(), 128);
  EXPECT_EQ(c.mla.q_head_dim(), 48);
  EXPECT_EQ(c.mla.cache_dim(), 48);
  EXPECT_EQ(c.mla.softmax_scale(), static_cast<float>(1.0 / std::sqrt(48.0)));
  EXPECT_EQ(c.moe.shared_intermediate(), 128);
}

TEST(K3Config, TinyMxfp4Variant) {
  const K3Config plain = builtin_config("k3-tiny");
  const K3Config q = builtin_config("k3-tiny-mxfp4");
  EXPECT_TRUE(q.mxfp4.enabled);
  EXPECT_EQ(q.mxfp4.group_size, 32);
  K3Config q_off = q;
  q_off.mxfp4.enabled = false;
  expect_same_config(q_off, plain);
  EXPECT_NE(q.hash(), plain.hash());
}

TEST(K3Config, PublishedK3FixtureParses) {
  // The real K3 layout: nested text_config, top-level model_type kimi_k3, quantization inside.
  const K3Config c = load_config(fixture("k3_published_config.json"));
  EXPECT_EQ(c.model_type, "kimi_linear");
  EXPECT_EQ(c.num_hidden_layers, 93);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.vocab_size, 163840);
  EXPECT_EQ(c.bos_token_id, 163584);
  EXPECT_EQ(c.eos_token_id, 163586);
  EXPECT_EQ(c.pad_token_id, 163839);
  int mla = 0, kda = 0;
  for (int l = 0; l < 93; ++l) {
    const bool expect_mla = (l % 4 == 3) || l == 92;  // 0-based: l = 3 mod 4, plus 92
    EXPECT_EQ(c.attn_kind(l), expect_mla ? AttnKind::mla : AttnKind::kda) << "layer " << l;
    (c.attn_kind(l) == AttnKind::mla ? mla : kda)++;
    EXPECT_EQ(c.ffn_kind(l), l == 0 ? FfnKind::dense : FfnKind::moe) << "layer " << l;
  }
  EXPECT_EQ(mla, 24);
  EXPECT_EQ(kda, 69);
  EXPECT_TRUE(c.mxfp4.enabled);
  EXPECT_EQ(c.mxfp4.group_size, 32);
  // Derived sizes of spec §1.2.
  EXPECT_EQ(c.kda.proj_dim(), 12288);
  EXPECT_EQ(c.mla.q_head_dim(), 192);
  EXPECT_EQ(c.mla.cache_dim(), 576);
  EXPECT_EQ(c.mla.softmax_scale(), static_cast<float>(1.0 / std::sqrt(192.0)));
  EXPECT_EQ(c.moe.shared_intermediate(), 6144);
  EXPECT_EQ(c.max_bank_rows(), 8);
  EXPECT_EQ(c.intermediate_size, 33792);
  EXPECT_EQ(c.moe.num_experts, 896);
  EXPECT_EQ(c.moe.num_experts_per_token, 16);
  EXPECT_EQ(c.moe.routed_expert_hidden_size, 3584);
  EXPECT_EQ(c.moe.moe_intermediate_size, 3072);
  EXPECT_EQ(c.mla.q_lora_rank, 1536);
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  EXPECT_EQ(c.attn_res_block_size, 12);
  for (int l : {0, 12, 24, 84}) EXPECT_TRUE(c.is_bank_write_layer(l)) << l;
  for (int l : {1, 11, 13, 92}) EXPECT_FALSE(c.is_bank_write_layer(l)) << l;
  // The builtin "k3" is the same config written flat.
  expect_same_config(c, builtin_config("k3"));
  EXPECT_EQ(c.hash(), builtin_config("k3").hash());
}

TEST(K3Config, NestedEqualsFlatAndTextConfigWins) {
  const json flat = to_json(builtin_config("k3-tiny"));
  json nested = {{"model_type", "kimi_k3"}, {"text_config", flat}};
  // Top-level keys outside text_config must be ignored when text_config exists.
  nested["hidden_size"] = 999;
  nested["num_hidden_layers"] = "not even an integer";
  expect_same_config(parse_config(nested, "nested"), parse_config(flat, "flat"));
}

TEST(K3Config, QuantizationConfigLookup) {
  const json flat = to_json(builtin_config("k3-tiny"));
  const json q = to_json(builtin_config("k3-tiny-mxfp4"))["quantization_config"];
  // Top-level fallback when text_config has none.
  json j = {{"model_type", "kimi_k3"}, {"text_config", flat}, {"quantization_config", q}};
  EXPECT_TRUE(parse_config(j).mxfp4.enabled);
  // text_config's copy is looked at first: a broken top-level copy is then never read.
  j["text_config"]["quantization_config"] = q;
  j["quantization_config"] = {{"quant_method", "fp8"}};
  EXPECT_TRUE(parse_config(j).mxfp4.enabled);
  // Null means absent.
  json n = flat;
  n["quantization_config"] = nullptr;
  EXPECT_FALSE(parse_config(n).mxfp4.enabled);
}

TEST(K3Config, GroupSizeMayLiveInEveryCompressedTensorsPlace) {
  const json base = to_json(builtin_config("k3-tiny"));
  const json ct = {{"quant_method", "compressed-tensors"}, {"format", "mxfp4-pack-quantized"}};
  std::vector<json> forms;
  json a = ct;
  a["group_size"] = 32;
  forms.push_back(a);
  json b = ct;
  b["weights"] = {{"group_size", 32}, {"num_bits", 4}};
  forms.push_back(b);
  json c = ct;
  c["config_groups"] = {{"group_0", {{"group_size", 32}}}};
  forms.push_back(c);
  json d = ct;
  d["config_groups"] = {{"g", {{"weights", {{"group_size", 32}, {"type", "float"}}}}}};
  forms.push_back(d);
  forms.push_back(ct);  // no group size anywhere: the MX block size 32
  json e = {{"quant_method", "compressed-tensors"},
            {"format", "mixed-precision"},
            {"config_groups", {{"group_0", {{"format", "mxfp4-pack-quantized"}, {"weights", {{"group_size", 32}}}}}}}};
  forms.push_back(e);
  for (const json& q : forms) {
    json j = base;
    j["quantization_config"] = q;
    const K3Config cfg = parse_config(j, "forms");
    EXPECT_TRUE(cfg.mxfp4.enabled) << q.dump();
    EXPECT_EQ(cfg.mxfp4.group_size, 32) << q.dump();
  }
}

TEST(K3Config, DefaultsForOptionalKeys) {
  json j = to_json(builtin_config("k3-tiny"));
  for (const char* key : {"rms_norm_eps",
                          "first_k_dense_replace",
                          "moe_layer_freq",
                          "activation_situ_beta",
                          "activation_situ_linear_beta",
                          "attn_res_block_size",
                          "tie_word_embeddings",
                          "num_key_value_heads",
                          "mla_use_nope",
                          "mla_use_output_gate",
                          "latent_moe_use_norm",
                          "moe_router_activation_func",
                          "moe_renormalize",
                          "routed_scaling_factor",
                          "topk_method",
                          "use_grouped_topk",
                          "num_expert_group",
                          "topk_group",
                          "hidden_act",
                          "kda_chunk_size",
                          "model_type"})
    j.erase(key);
  j["linear_attn_config"].erase("gate_lower_bound");
  j["linear_attn_config"].erase("use_full_rank_gate");
  j["attn_res_block_size"] = nullptr;  // null also means "use the default"
  const K3Config c = parse_config(j, "defaults");
  EXPECT_EQ(c.model_type, "kimi_linear");
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_EQ(c.situ_beta, 4.0f);
  EXPECT_EQ(c.situ_linear_beta, 25.0f);
  EXPECT_EQ(c.attn_res_block_size, 12);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(c.mla.use_output_gate);
  EXPECT_TRUE(c.moe.latent_moe_use_norm);
  EXPECT_TRUE(c.moe.renormalize);
  EXPECT_EQ(c.moe.routed_scaling_factor, 1.0f);
  EXPECT_EQ(c.kda.gate_lower_bound, -5.0f);
  EXPECT_TRUE(c.kda.use_full_rank_gate);
  EXPECT_EQ(c.kda.chunk_size, 64);
}

TEST(K3Config, RoundTripThroughToJson) {
  std::vector<K3Config> configs;
  for (const std::string& n : builtin_config_names()) configs.push_back(builtin_config(n));
  configs.push_back(load_config(fixture("k3_published_config.json")));
  // Every field off its default, with floats that have no short decimal form.
  K3Config odd = builtin_config("k3-tiny-mxfp4");
  odd.rms_norm_eps = 1e-6f;
  odd.situ_beta = 3.3f;
  odd.situ_linear_beta = 0.1f + 20.0f;
  odd.attn_res_block_size = 3;
  odd.first_k_dense_replace = 2;
  odd.moe_layer_freq = 2;
  odd.tie_word_embeddings = true;
  odd.bos_token_id = 0;
  odd.eos_token_id = 1023;
  odd.pad_token_id = 7;
  odd.kda.gate_lower_bound = -2.7182817f;
  odd.kda.chunk_size = 16;
  odd.mla.use_output_gate = false;
  odd.moe.latent_moe_use_norm = false;
  odd.moe.renormalize = false;
  odd.moe.routed_scaling_factor = 2.5f;
  odd.attn_kinds = {AttnKind::mla, AttnKind::kda, AttnKind::mla, AttnKind::kda};
  validate(odd, "odd");
  configs.push_back(odd);
  for (const K3Config& c : configs) {
    const json j = to_json(c);
    const K3Config back = parse_config(j, "round-trip");
    expect_same_config(back, c);
    EXPECT_EQ(to_json(back), j);
    EXPECT_EQ(back.hash(), c.hash());
    // And through text: dump, parse, read.
    expect_same_config(parse_config(json::parse(j.dump()), "text"), c);
  }
  // Floats are written in their shortest form.
  EXPECT_EQ(to_json(builtin_config("k3-tiny"))["rms_norm_eps"].dump(), "1e-05");
}

TEST(K3Config, HashIsStableAndSensitive) {
  const K3Config tiny = builtin_config("k3-tiny");
  const std::string h = tiny.hash();
  EXPECT_EQ(h.size(), 16u);
  EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(builtin_config("k3-tiny").hash(), h);
  // Golden value: changing it breaks every result bundle and golden file keyed by it.
  EXPECT_EQ(h, kTinyHash) << "to_json/hash changed: update golden files knowingly";
  std::vector<K3Config> variants(8, tiny);
  variants[0].hidden_size = 128;
  variants[1].rms_norm_eps = 1e-6f;
  variants[2].kda.chunk_size = 16;
  variants[3].attn_kinds[0] = AttnKind::mla;
  variants[4].mxfp4.enabled = true;
  variants[5].tie_word_embeddings = true;
  variants[6].eos_token_id = 5;
  variants[7].moe.num_experts_per_token = 3;
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_NE(variants[i].hash(), h) << "variant " << i;
    for (size_t k = 0; k < i; ++k) EXPECT_NE(variants[i].hash(), variants[k].hash());
  }
}

TEST(K3Config, ResolveBuiltinFileAndDirectory) {
  expect_same_config(resolve_config("k3-tiny"), builtin_config("k3-tiny"));
  TempDir dir("resolve");
  const auto file = dir.path() / "config.json";
  std::ofstream(file) << to_json(builtin_config("k3-tiny-mxfp4")).dump(2);
  expect_same_config(resolve_config(file.string()), builtin_config("k3-tiny-mxfp4"));
  expect_same_config(resolve_config(dir.path().string()), builtin_config("k3-tiny-mxfp4"));
  expect_same_config(load_config(file), builtin_config("k3-tiny-mxfp4"));
  // A config file under another name is read too.
  const auto other = dir.path() / "tiny.json";
  std::ofstream(other) << to_json(builtin_config("k3-tiny")).dump();
  expect_same_config(resolve_config(other.string()), builtin_config("k3-tiny"));
}

TEST(K3Config, BuiltinNames) {
  const auto names = builtin_config_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "k3-tiny"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "k3-tiny-mxfp4"), names.end());
  for (const std::string& n : names) EXPECT_NO_THROW(builtin_config(n)) << n;
}

}  // namespace
}  // namespace k3::config
