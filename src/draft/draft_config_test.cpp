// draft/draft_config_test.cpp: DraftConfig parsing, builtins, target checks and every validation error.
#include "draft/draft_config.h"

#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "draft/test_util.h"

namespace k3::draft {
namespace {

using nlohmann::json;

json tiny_json() { return to_json(builtin_draft_config("k3-tiny-dspark")); }

// parse_draft_config(j) must throw an Error whose message contains every needle.
void expect_parse_error(const json& j, const std::vector<std::string>& needles) {
  try {
    parse_draft_config(j, "test.json");
    FAIL() << "no error for " << j.dump();
  } catch (const core::Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
  }
}

TEST(DraftConfig, BuiltinK3MatchesSpec) {
  const DraftConfig c = builtin_draft_config("k3-dspark");
  EXPECT_EQ(c.model_type, "k3_dspark");
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.vocab_size, 163840);
  EXPECT_EQ(c.draft_vocab_size, 163840);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.block_size, 7);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int>{2, 23, 47, 71, 89}));
  EXPECT_EQ(c.markov_rank, 256);
  EXPECT_EQ(c.mask_token_id, 163592);
  EXPECT_EQ(c.cache_dim(), 576);
  EXPECT_FLOAT_EQ(c.softmax_scale(), 1.0f / std::sqrt(192.0f));
  // "about 3.56 B params" (spec §13.2) with the assumed 96 heads and MLP 12288.
  const double params = double(draft_param_count(c));
  EXPECT_NEAR(params / 1e9, 3.56, 0.02);
  check_matches_target(c, config::builtin_config("k3"), "k3-dspark");
}

TEST(DraftConfig, BuiltinsFitTheirTargets) {
  check_matches_target(builtin_draft_config("k3-tiny-dspark"), config::builtin_config("k3-tiny"), "tiny");
  check_matches_target(builtin_draft_config("k3-proxy-tp8-dspark"), config::builtin_config("k3-proxy-tp8"), "proxy");
  EXPECT_EQ(default_draft_for(config::builtin_config("k3")).target_layer_ids,
            builtin_draft_config("k3-dspark").target_layer_ids);
  EXPECT_EQ(default_draft_for(config::builtin_config("k3-tiny")).hidden_size, 256);
  EXPECT_EQ(default_draft_for(config::builtin_config("k3-proxy-tp8")).vocab_size, 20480);
  EXPECT_THROW(builtin_draft_config("k3-huge-dspark"), core::Error);
}

TEST(DraftConfig, DerivedDraftForAnUnknownTarget) {
  config::K3Config t = config::builtin_config("k3-tiny");
  t.hidden_size = 128;  // no builtin draft matches
  const DraftConfig c = default_draft_for(t);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int>{0, 1, 2}));
  check_matches_target(c, t, "derived");
}

TEST(DraftConfig, JsonRoundTripAndFile) {
  const DraftConfig a = builtin_draft_config("k3-tiny-dspark");
  const DraftConfig b = parse_draft_config(to_json(a), "rt");
  EXPECT_EQ(to_json(a), to_json(b));
  testing::TempDir dir;
  std::ofstream(dir.path() / "config.json") << to_json(a).dump();
  EXPECT_EQ(to_json(load_draft_config(dir.path())), to_json(a));  // a folder
  EXPECT_EQ(to_json(resolve_draft_config((dir.path() / "config.json").string())), to_json(a));
  EXPECT_EQ(to_json(resolve_draft_config("k3-tiny-dspark")), to_json(a));
  EXPECT_THROW(resolve_draft_config("/no/such/draft"), core::Error);
  std::ofstream(dir.path() / "bad.json") << "{not json";
  EXPECT_THROW(load_draft_config(dir.path() / "bad.json"), core::Error);
}

TEST(DraftConfig, OptionalKeysTakeDefaults) {
  json j = tiny_json();
  for (const char* k : {"draft_vocab_size", "rope_theta", "activation_situ_beta", "activation_situ_linear_beta",
                        "rms_norm_eps", "use_confidence_head", "share_target_lm_head"})
    j.erase(k);
  const DraftConfig c = parse_draft_config(j, "t");
  EXPECT_EQ(c.draft_vocab_size, c.vocab_size);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_FALSE(c.use_confidence_head);
  EXPECT_FALSE(c.has_d2t());
  j["draft_vocab_size"] = 500;
  EXPECT_TRUE(parse_draft_config(j, "t").has_d2t());
}

TEST(DraftConfig, EveryRequiredKeyIsNamedWhenMissing) {
  for (const char* k : {"model_type", "num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads",
                        "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                        "intermediate_size", "block_size", "target_layer_ids", "markov_rank", "mask_token_id"}) {
    json j = tiny_json();
    j.erase(k);
    expect_parse_error(j, {"test.json", k, "missing"});
  }
}

TEST(DraftConfig, EveryPositiveFieldRejectsZero) {
  for (const char* k : {"num_hidden_layers", "hidden_size", "vocab_size", "draft_vocab_size", "num_attention_heads",
                        "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                        "intermediate_size", "block_size", "markov_rank"}) {
    json j = tiny_json();
    j[k] = 0;
    expect_parse_error(j, {k, "must be > 0"});
  }
}

TEST(DraftConfig, EachBadValueIsNamed) {
  struct Case {
    const char* key;
    json value;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"model_type", "kimi_linear", {"model_type", "k3_dspark", "kimi_linear"}},
      {"model_type", 3, {"model_type", "expected a string"}},
      {"hidden_size", "256", {"hidden_size", "expected an integer", "a string"}},
      {"hidden_size", 2.5, {"hidden_size", "expected an integer"}},
      {"block_size", -1, {"block_size", "must be > 0"}},
      {"qk_rope_head_dim", 15, {"qk_rope_head_dim", "even"}},
      {"draft_vocab_size", 2000, {"draft_vocab_size", "<= vocab_size"}},
      {"rope_theta", 0.5, {"rope_theta", "> 1"}},
      {"rope_theta", "x", {"rope_theta", "expected a number"}},
      {"rope_scaling", json{{"type", "yarn"}}, {"rope_scaling", "not supported"}},
      {"rms_norm_eps", 0.0, {"rms_norm_eps", "> 0"}},
      {"activation_situ_beta", -4.0, {"activation_situ_beta", "> 0"}},
      {"activation_situ_linear_beta", 0.0, {"activation_situ_linear_beta", "> 0"}},
      {"target_layer_ids", json::array(), {"target_layer_ids", "at least one"}},
      {"target_layer_ids", 3, {"target_layer_ids", "expected a list"}},
      {"target_layer_ids", {0, "a"}, {"target_layer_ids[1]", "expected an integer"}},
      {"target_layer_ids", {-1, 2}, {"target_layer_ids[0]", ">= 0"}},
      {"target_layer_ids", {2, 2}, {"target_layer_ids[1]", "strictly increasing"}},
      {"target_layer_ids", {2, 1}, {"target_layer_ids[1]", "strictly increasing"}},
      {"mask_token_id", 1024, {"mask_token_id", "[0, 1024)"}},
      {"mask_token_id", -1, {"mask_token_id", "[0, 1024)"}},
      {"use_confidence_head", 1, {"use_confidence_head", "true or false"}},
      {"num_hidden_layers", int64_t{1} << 40, {"num_hidden_layers", "out of range"}},
  };
  for (const Case& c : cases) {
    json j = tiny_json();
    j[c.key] = c.value;
    expect_parse_error(j, c.needles);
  }
  json j = tiny_json();
  j["draft_vocab_size"] = 1000;
  j["share_target_lm_head"] = true;
  expect_parse_error(j, {"share_target_lm_head", "draft_vocab_size == vocab_size"});
  expect_parse_error(json::array({1}), {"test.json", "JSON object"});
}

TEST(DraftConfig, TargetMismatchesAreNamed) {
  const config::K3Config tiny = config::builtin_config("k3-tiny");
  auto expect_target_error = [&](const DraftConfig& c, const std::vector<std::string>& needles) {
    try {
      check_matches_target(c, tiny, "d.json");
      FAIL() << "no error";
    } catch (const core::Error& e) {
      for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  DraftConfig c = builtin_draft_config("k3-tiny-dspark");
  c.hidden_size = 128;
  expect_target_error(c, {"d.json", "hidden_size", "256"});
  c = builtin_draft_config("k3-tiny-dspark");
  c.vocab_size = 2048;
  expect_target_error(c, {"vocab_size", "1024"});
  c = builtin_draft_config("k3-tiny-dspark");
  c.target_layer_ids = {0, 3};  // layer 3 is the last of 4: no layer 4 computes its mixture
  expect_target_error(c, {"target_layer_ids[1]", "<= 2"});
}

}  // namespace
}  // namespace k3::draft
