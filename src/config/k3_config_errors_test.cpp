// config/k3_config_errors_test.cpp: every way a config can be wrong gives a core::Error that
// names the source and the key (missing keys, wrong JSON types, unsupported values, layer lists,
// sizes, MXFP4 groups, files and names).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "config/config_test_util.h"
#include "config/k3_config.h"

namespace k3::config {
namespace {

using nlohmann::json;
using test::expect_error;
using test::TempDir;

const char* kSrc = "unit/config.json";

json tiny() { return to_json(builtin_config("k3-tiny")); }
json tiny_mxfp4() { return to_json(builtin_config("k3-tiny-mxfp4")); }

// Parses j and expects an error naming the source and every needle.
void expect_parse_error(const json& j, std::initializer_list<std::string> needles) {
  const std::string msg = expect_error([&] { parse_config(j, kSrc); }, needles);
  EXPECT_NE(msg.find(kSrc), std::string::npos) << "message lacks the source: " << msg;
}

TEST(K3ConfigErrors, MissingRequiredKeys) {
  for (const char* key :
       {"vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "q_lora_rank",
        "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_experts", "num_experts_per_token",
        "num_shared_experts", "moe_intermediate_size", "routed_expert_hidden_size", "linear_attn_config"}) {
    json j = tiny();
    j.erase(key);
    expect_parse_error(j, {key, "missing"});
    j[key] = nullptr;  // null is not a value for a required key
    expect_parse_error(j, {key, "null"});
  }
  for (const char* key : {"num_heads", "head_dim", "short_conv_kernel_size", "kda_layers", "full_attn_layers"}) {
    json j = tiny();
    j["linear_attn_config"].erase(key);
    expect_parse_error(j, {std::string("linear_attn_config.") + key, "missing"});
  }
  // Nested: the key path includes text_config.
  json nested = {{"model_type", "kimi_k3"}, {"text_config", tiny()}};
  nested["text_config"].erase("hidden_size");
  expect_parse_error(nested, {"text_config.hidden_size", "missing"});
}

TEST(K3ConfigErrors, WrongJsonTypesNameKeyAndExpectedType) {
  struct Case {
    std::string key;  // top-level key, or "linear_attn_config.x"
    json value;
    std::string expected;  // phrase in the message
  };
  const std::vector<Case> cases = {
      {"vocab_size", "1024", "expected an integer"},
      {"vocab_size", 1024.5, "expected an integer"},
      {"vocab_size", true, "expected an integer"},
      {"vocab_size", json::array({1024}), "expected an integer"},
      {"hidden_size", 1e12, "expected an integer"},
      {"hidden_size", 4294967296ll, "range"},
      {"hidden_size", 18446744073709551615ull, "too large"},
      {"rms_norm_eps", "1e-5", "expected a number"},
      {"rms_norm_eps", 1e300, "32-bit float"},
      {"activation_situ_beta", json::object(), "expected a number"},
      {"tie_word_embeddings", 0, "expected a boolean"},
      {"mla_use_output_gate", "true", "expected a boolean"},
      {"moe_renormalize", 1, "expected a boolean"},
      {"hidden_act", 5, "expected a string"},
      {"moe_router_activation_func", json::array(), "expected a string"},
      {"model_type", 3, "expected a string"},
      {"linear_attn_config", 3, "expected an object"},
      {"linear_attn_config", json::array(), "expected an object"},
      {"eos_token_id", json::array({1, 2}), "expected an integer"},
      {"quantization_config", "mxfp4", "expected an object"},
      {"linear_attn_config.kda_layers", "1,2,3", "expected an array of integers"},
      {"linear_attn_config.full_attn_layers", 4, "expected an array of integers"},
      {"linear_attn_config.head_dim", "32", "expected an integer"},
      {"linear_attn_config.gate_lower_bound", "-5", "expected a number"},
      {"linear_attn_config.use_full_rank_gate", "yes", "expected a boolean"},
  };
  for (const Case& c : cases) {
    json j = tiny();
    const size_t dot = c.key.find('.');
    if (dot == std::string::npos) j[c.key] = c.value;
    else j[c.key.substr(0, dot)][c.key.substr(dot + 1)] = c.value;
    SCOPED_TRACE(c.key + " = " + c.value.dump());
    expect_parse_error(j, {c.key, c.expected});
  }
  // An element of a layer list names its index.
  json j = tiny();
  j["linear_attn_config"]["kda_layers"] = json::array({1, "2", 3});
  expect_parse_error(j, {"linear_attn_config.kda_layers[1]", "expected an integer"});
  // text_config that is not an object, and a top level that is not an object.
  expect_parse_error(json{{"text_config", 7}}, {"text_config", "expected an object"});
  expect_parse_error(json::array({1}), {"object"});
}

TEST(K3ConfigErrors, NoJsonExceptionEverEscapes) {
  // Replace every key (top level and linear_attn_config) with values of every JSON type: the
  // result is a valid config or a core::Error naming that key, never an nlohmann exception.
  json base = tiny_mxfp4();
  for (const char* id : {"bos_token_id", "eos_token_id", "pad_token_id"}) base.erase(id);  // depend on vocab_size
  const std::vector<json> junk = {
      nullptr, true, 0, -1, 7, 0.5, -3.25, "x", json::array(), json::array({1, "a"}), json::object(), json{{"a", 1}}};
  auto probe = [&](const json& j, const std::string& key) {
    try {
      parse_config(j, kSrc);
    } catch (const core::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(key), std::string::npos) << msg;
      EXPECT_NE(msg.find(kSrc), std::string::npos) << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << key << ": non-core::Error exception: " << e.what();
    }
  };
  for (auto it = base.begin(); it != base.end(); ++it) {
    for (const json& v : junk) {
      json j = base;
      j[it.key()] = v;
      SCOPED_TRACE(it.key() + " = " + v.dump());
      probe(j, it.key());
    }
  }
  for (auto it = base["linear_attn_config"].begin(); it != base["linear_attn_config"].end(); ++it) {
    for (const json& v : junk) {
      json j = base;
      j["linear_attn_config"][it.key()] = v;
      SCOPED_TRACE(it.key() + " = " + v.dump());
      probe(j, "linear_attn_config");
    }
  }
}

TEST(K3ConfigErrors, UnsupportedValues) {
  struct Case {
    std::string key;
    json value;
  };
  const std::vector<Case> cases = {
      {"hidden_act", "silu"},    {"moe_router_activation_func", "softmax"},
      {"topk_method", "greedy"}, {"num_expert_group", 8},
      {"topk_group", 4},         {"num_key_value_heads", 1},
      {"mla_use_nope", false},   {"model_type", "llama"},
  };
  for (const Case& c : cases) {
    json j = tiny();
    j[c.key] = c.value;
    SCOPED_TRACE(c.key);
    expect_parse_error(j, {c.key});
  }
  json j = tiny();
  j["linear_attn_config"]["use_full_rank_gate"] = false;
  expect_parse_error(j, {"linear_attn_config.use_full_rank_gate"});
  json top = {{"model_type", "deepseek_v3"}, {"text_config", tiny()}};
  expect_parse_error(top, {"model_type", "deepseek_v3"});
}

TEST(K3ConfigErrors, LayerListsCoverEveryLayerOnce) {
  auto with_lists = [](json kda, json full) {
    json j = tiny();
    j["linear_attn_config"]["kda_layers"] = std::move(kda);
    j["linear_attn_config"]["full_attn_layers"] = std::move(full);
    return j;
  };
  // Layer 3 in neither list.
  std::string msg = expect_error(
      [&] {
        parse_config(with_lists({1, 2}, {4}), kSrc);
      },
      {"layer 3", "neither", "kda_layers", "full_attn_layers"});
  // Several missing layers are all named.
  msg = expect_error([&] { parse_config(with_lists({1}, {4}), kSrc); }, {"layers 2, 3"});
  expect_parse_error(with_lists({1, 2, 2, 3}, {4}), {"linear_attn_config.kda_layers", "layer 2", "twice"});
  expect_parse_error(with_lists({1, 2, 3}, {3, 4}), {"linear_attn_config.full_attn_layers", "layer 3",
                                                     "also listed in linear_attn_config.kda_layers"});
  expect_parse_error(with_lists({0, 1, 2, 3}, {4}), {"linear_attn_config.kda_layers", "layer 0", "out of range 1..4"});
  expect_parse_error(with_lists({1, 2, 3}, {4, 5}), {"linear_attn_config.full_attn_layers", "layer 5", "out of range"});
  expect_parse_error(with_lists({1, 2, 3}, {-4}), {"full_attn_layers", "layer -4", "out of range"});
  // Fine: empty lists are allowed when the other covers everything.
  EXPECT_NO_THROW(parse_config(with_lists(json::array(), {1, 2, 3, 4}), kSrc));
  EXPECT_NO_THROW(parse_config(with_lists({4, 3, 2, 1}, json::array()), kSrc));
  json j = tiny();
  j["num_hidden_layers"] = 0;
  expect_parse_error(j, {"num_hidden_layers", ">= 1"});
}

TEST(K3ConfigErrors, SizesAndRangesInParse) {
  struct Case {
    std::string key;
    json value;
    std::string phrase;
  };
  const std::vector<Case> cases = {
      {"vocab_size", 0, "> 0"},
      {"hidden_size", -1, "> 0"},
      {"intermediate_size", 0, "> 0"},  // layer 0 is dense
      {"rms_norm_eps", 0.0, "> 0"},
      {"rms_norm_eps", -1e-5, "> 0"},
      {"first_k_dense_replace", -1, ">= 0"},
      {"moe_layer_freq", 0, "> 0"},
      {"activation_situ_beta", 0.0, "> 0"},
      {"activation_situ_linear_beta", -25.0, "> 0"},
      {"attn_res_block_size", 0, "> 0"},
      {"num_attention_heads", 0, "> 0"},
      {"q_lora_rank", 0, "> 0"},
      {"kv_lora_rank", -3, "> 0"},
      {"qk_nope_head_dim", 0, "> 0"},
      {"qk_rope_head_dim", -1, ">= 0"},
      {"v_head_dim", 0, "> 0"},
      {"num_experts", 0, "> 0"},
      {"num_experts_per_token", 0, "1..num_experts"},
      {"num_experts_per_token", 17, "1..num_experts (16)"},
      {"num_shared_experts", -1, ">= 0"},
      {"moe_intermediate_size", 0, "> 0"},
      {"routed_expert_hidden_size", 0, "> 0"},
      {"routed_scaling_factor", 0.0, "> 0"},
      {"kda_chunk_size", 0, "> 0"},
      {"bos_token_id", 1024, "outside the vocabulary"},
      {"pad_token_id", -2, "outside the vocabulary"},
  };
  for (const Case& c : cases) {
    json j = tiny();
    j[c.key] = c.value;
    if (c.key == "num_attention_heads") j["num_key_value_heads"] = c.value;
    SCOPED_TRACE(c.key + " = " + c.value.dump());
    expect_parse_error(j, {c.key, c.phrase});
  }
  const std::vector<Case> kda_cases = {
      {"num_heads", 0, "> 0"},          {"head_dim", 0, "> 0"},
      {"head_dim", -32, "> 0"},         {"short_conv_kernel_size", 0, ">= 1"},
      {"gate_lower_bound", 5.0, "< 0"}, {"gate_lower_bound", 0.0, "< 0"},
  };
  for (const Case& c : kda_cases) {
    json j = tiny();
    j["linear_attn_config"][c.key] = c.value;
    SCOPED_TRACE(c.key + " = " + c.value.dump());
    expect_parse_error(j, {"linear_attn_config." + c.key, c.phrase});
  }
  // A model with no dense layer does not need intermediate_size > 0.
  json j = tiny();
  j["first_k_dense_replace"] = 0;
  j["intermediate_size"] = 0;
  EXPECT_NO_THROW(parse_config(j, kSrc));
}

TEST(K3ConfigErrors, QuantizationConfig) {
  auto with_q = [](json q) {
    json j = tiny();
    j["quantization_config"] = std::move(q);
    return j;
  };
  const json good = tiny_mxfp4()["quantization_config"];
  json q = good;
  q["quant_method"] = "fp8";
  expect_parse_error(with_q(q), {"quantization_config.quant_method", "fp8"});
  q = good;
  q.erase("quant_method");
  expect_parse_error(with_q(q), {"quantization_config.quant_method", "missing"});
  q = good;
  q["format"] = "nvfp4-pack-quantized";
  expect_parse_error(with_q(q), {"quantization_config.format", "nvfp4-pack-quantized"});
  q = good;
  q["config_groups"]["group_0"]["format"] = "int-quantized";
  expect_parse_error(with_q(q), {"quantization_config.config_groups.group_0.format", "int-quantized"});
  json bare = {{"quant_method", "compressed-tensors"}};
  expect_parse_error(with_q(bare), {"quantization_config.format", "missing"});
  q = good;
  q["config_groups"]["group_0"]["weights"]["group_size"] = 16;
  expect_parse_error(with_q(q), {"quantization_config.config_groups.group_0.weights.group_size", "32"});
  q = good;
  q["config_groups"]["group_0"]["weights"]["num_bits"] = 8;
  expect_parse_error(with_q(q), {"quantization_config.config_groups.group_0.weights.num_bits", "8"});
  q = good;
  q["config_groups"]["group_0"]["weights"]["type"] = "int";
  expect_parse_error(with_q(q), {"quantization_config.config_groups.group_0.weights.type"});
  q = good;
  q["config_groups"]["group_0"]["weights"]["group_size"] = "32";
  expect_parse_error(with_q(q), {"group_size", "expected an integer"});
  q = good;
  q["group_size"] = 64;  // disagrees with the group's 32
  expect_parse_error(with_q(q), {"group_size", "disagrees", "64", "32"});
  q = good;
  q["config_groups"] = json::array();
  expect_parse_error(with_q(q), {"quantization_config.config_groups", "expected an object"});
  q = good;
  q["config_groups"]["group_0"]["weights"] = 4;
  expect_parse_error(with_q(q), {"quantization_config.config_groups.group_0.weights", "expected an object"});
  // Nested under text_config, the path says so.
  json nested = {{"model_type", "kimi_k3"}, {"text_config", tiny_mxfp4()}};
  nested["text_config"]["quantization_config"]["format"] = "bad";
  expect_parse_error(nested, {"text_config.quantization_config.format"});
}

TEST(K3ConfigErrors, Mxfp4GroupMustDivideExpertInputDims) {
  json j = tiny_mxfp4();
  j["routed_expert_hidden_size"] = 80;  // w1/w3 input dim
  expect_parse_error(j, {"routed_expert_hidden_size", "80", "multiple of the MXFP4 group size 32"});
  j = tiny_mxfp4();
  j["moe_intermediate_size"] = 48;  // w2 input dim
  expect_parse_error(j, {"moe_intermediate_size", "48", "multiple of the MXFP4 group size 32"});
  // Without MXFP4 these sizes are fine.
  j = tiny();
  j["routed_expert_hidden_size"] = 80;
  j["moe_intermediate_size"] = 48;
  EXPECT_NO_THROW(parse_config(j, kSrc));
}

TEST(K3ConfigErrors, ValidateOnStructs) {
  // validate() also guards configs built in code (tests, tools), naming the HF key.
  K3Config c = builtin_config("k3-tiny-mxfp4");
  c.mxfp4.group_size = 16;
  expect_error([&] { validate(c, "code"); }, {"code", "quantization_config.group_size", "32"});
  c = builtin_config("k3-tiny");
  c.attn_kinds.pop_back();
  expect_error([&] { validate(c, "code"); }, {"kda_layers", "num_hidden_layers is 4"});
  c = builtin_config("k3-tiny");
  c.kda.use_full_rank_gate = false;
  expect_error([&] { validate(c, "code"); }, {"linear_attn_config.use_full_rank_gate"});
  c = builtin_config("k3-tiny");
  c.moe.num_expert_group = 2;
  expect_error([&] { validate(c, "code"); }, {"num_expert_group"});
  c = builtin_config("k3-tiny");
  c.moe.topk_group = 2;
  expect_error([&] { validate(c, "code"); }, {"topk_group"});
  c = builtin_config("k3-tiny");
  c.kda.gate_lower_bound = std::nanf("");
  expect_error([&] { validate(c, "code"); }, {"linear_attn_config.gate_lower_bound"});
  c = builtin_config("k3-tiny");
  c.rms_norm_eps = std::numeric_limits<float>::infinity();
  expect_error([&] { validate(c, "code"); }, {"rms_norm_eps"});
  EXPECT_NO_THROW(validate(builtin_config("k3"), "code"));
}

TEST(K3ConfigErrors, FilesAndNames) {
  TempDir dir("errors");
  expect_error([&] { load_config(dir.path() / "absent.json"); }, {"absent.json", "cannot open"});
  const auto bad = dir.path() / "bad.json";
  std::ofstream(bad) << "{\"vocab_size\": 1024,,}";
  expect_error([&] { load_config(bad); }, {"bad.json", "invalid JSON"});
  const auto wrong = dir.path() / "wrong.json";
  std::ofstream(wrong) << "{\"vocab_size\": \"big\"}";
  expect_error([&] { load_config(wrong); }, {"wrong.json", "vocab_size", "expected an integer"});
  expect_error([&] { resolve_config(dir.path().string()); }, {"has no config.json"});
  expect_error([&] { resolve_config("k3-tinny"); }, {"k3-tinny", "k3-tiny", "k3-tiny-mxfp4"});
  expect_error([&] { resolve_config((dir.path() / "nope").string()); }, {"nope", "built-in"});
  expect_error([&] { builtin_config("k3-huge"); }, {"k3-huge", "k3-tiny"});
}

}  // namespace
}  // namespace k3::config
