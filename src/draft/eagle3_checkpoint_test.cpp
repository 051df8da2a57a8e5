// draft/eagle3_checkpoint_test.cpp: the EAGLE-3 draft's config.json and checkpoint in the Hugging
// Face layout vLLM and SGLang load: HF configs parse (taps nested or top level), every unsupported
// or malformed key is an error naming it, random write -> load round-trips, the SpecForge
// ("midlayer.") and vLLM ("layers.0.", "model.") names load alike, a BOOL t2d is ignored, and every
// checkpoint fault is named.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "draft/eagle3_drafter.h"
#include "draft/test_util.h"

namespace k3::draft {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::read_all;
using testing::same_bytes;
using testing::write_all;

// A config.json as SpecForge writes it for a Kimi-K2-style target (taps under eagle_config).
json hf_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
    "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "vocab_size": 1024, "draft_vocab_size": 768, "hidden_act": "silu",
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null, "max_position_embeddings": 131072,
    "attention_bias": false, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_aux_hidden_state": true}
  })");
}

void expect_config_error(const json& j, const std::vector<std::string>& needles) {
  try {
    parse_eagle3_config(j, "cfg.json");
    FAIL() << "no error for " << j.dump();
  } catch (const core::Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
  }
}

TEST(Eagle3Config, ParsesTheHfLayoutAndRoundTrips) {
  const Eagle3Config c = parse_eagle3_config(hf_config());
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.target_hidden_size, 256);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.draft_vocab_size, 768);
  EXPECT_TRUE(c.has_d2t());
  EXPECT_EQ(c.aux_layer_ids, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(c.tap_layers(), (std::vector<int>{0, 1, 2})) << "the input of layer a is k3serve's tap of a - 1";
  const Eagle3Config back = parse_eagle3_config(to_json(c));
  EXPECT_EQ(to_json(back), to_json(c));
  // The taps at the top level (vLLM's flattened form) are the same; both, disagreeing, are an error.
  json top = hf_config();
  top["eagle_aux_hidden_state_layer_ids"] = {1, 2, 3};
  top.erase("eagle_config");
  EXPECT_EQ(parse_eagle3_config(top).aux_layer_ids, c.aux_layer_ids);
  json both = hf_config();
  both["eagle_aux_hidden_state_layer_ids"] = {1, 2};
  expect_config_error(both, {"different values"});
  // Defaults: head_dim from hidden / heads, KV heads = heads, draft vocab = vocab.
  json minimal = hf_config();
  for (const char* k : {"head_dim", "num_key_value_heads", "draft_vocab_size"}) minimal.erase(k);
  const Eagle3Config m = parse_eagle3_config(minimal);
  EXPECT_EQ(m.head_dim, 64);
  EXPECT_EQ(m.num_kv_heads, 4);
  EXPECT_FALSE(m.has_d2t());
  json llama3 = hf_config();
  llama3["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"original_max_position_embeddings", 8192}};
  EXPECT_FLOAT_EQ(parse_eagle3_config(llama3).rope_scaling.factor, 8.0f);
  for (const auto& n : builtin_eagle3_config_names()) EXPECT_NO_THROW(builtin_eagle3_config(n)) << n;
}

TEST(Eagle3Config, EveryUnsupportedOrMalformedKeyIsNamed) {
  auto with = [](const std::string& key, json v) {
    json j = hf_config();
    j[key] = std::move(v);
    return j;
  };
  expect_config_error(with("architectures", {"LlamaForCausalLM"}), {"cfg.json", "architectures", "EAGLE-3"});
  expect_config_error(json{{"model_type", "k3_dspark"}}, {"architectures"});
  expect_config_error(with("num_hidden_layers", 2), {"num_hidden_layers", "must be 1"});
  expect_config_error(with("hidden_act", "gelu"), {"hidden_act", "silu"});
  expect_config_error(with("attention_bias", true), {"attention_bias"});
  expect_config_error(with("mlp_bias", true), {"mlp_bias"});
  expect_config_error(with("tie_word_embeddings", true), {"tie_word_embeddings"});
  expect_config_error(with("num_key_value_heads", 3), {"num_key_value_heads", "divide"});
  expect_config_error(with("head_dim", 63), {"head_dim", "even"});
  expect_config_error(with("draft_vocab_size", 2000), {"draft_vocab_size"});
  expect_config_error(with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}), {"rope_type", "yarn"});
  expect_config_error(with("hidden_size", "256"), {"hidden_size", "integer"});
  expect_config_error(with("eagle_config", {{"eagle_aux_hidden_state_layer_ids", {0, 2, 3}}}), {"[0]", ">= 1"});
  expect_config_error(with("eagle_config", {{"eagle_aux_hidden_state_layer_ids", {2, 2, 3}}}), {"[1]", "increasing"});
  expect_config_error(with("eagle_config",
                           {{"use_aux_hidden_state", false}, {"eagle_aux_hidden_state_layer_ids", {1}}}),
                      {"use_aux_hidden_state"});
  json no_taps = hf_config();
  no_taps.erase("eagle_config");
  expect_config_error(no_taps, {"eagle_aux_hidden_state_layer_ids", "missing"});
}

TEST(Eagle3Config, ChecksTheTargetAndDerivesADefault) {
  const config::K3Config tiny = config::builtin_config("k3-tiny");
  const Eagle3Config c = default_eagle3_for(tiny);
  EXPECT_EQ(to_json(c), to_json(builtin_eagle3_config("k3-tiny-eagle3")));
  EXPECT_NO_THROW(check_matches_target(c, tiny, "d"));
  Eagle3Config deep = c;
  deep.aux_layer_ids = {1, 2, 4};  // k3-tiny has layers 0..3
  EXPECT_THROW(check_matches_target(deep, tiny, "d"), core::Error);
  Eagle3Config wide = c;
  wide.target_hidden_size = 512;
  EXPECT_THROW(check_matches_target(wide, tiny, "d"), core::Error);
  config::K3Config other = tiny;
  other.hidden_size = 96;
  other.num_hidden_layers = 12;
  const Eagle3Config derived = default_eagle3_for(other);
  EXPECT_EQ(derived.aux_layer_ids, (std::vector<int>{2, 6, 9})) << "vLLM's default (2, L/2, L-3)";
  EXPECT_NO_THROW(check_matches_target(derived, other, "derived"));
}

// ---- checkpoints

struct FakeTarget {
  config::K3Config config = config::builtin_config("k3-tiny");
  model::Weights weights;
  FakeTarget() { weights.embed = testing::random_bf16(config.vocab_size, config.hidden_size, 1); }
};

// Rewrites the file's header so tensor `name` (written as U8) is declared BOOL, as torch saves masks.
void declare_bool(const fs::path& dir, const std::string& name) {
  const fs::path p = dir / checkpoint::kSingleFileName;
  std::ifstream in(p, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  json header = json::parse(bytes.substr(8, n));
  ASSERT_EQ(header[name]["dtype"], "U8");
  header[name]["dtype"] = "BOOL";
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t len = h.size();
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << h << bytes.substr(8 + n);
}

void expect_load_error(const fs::path& dir, const FakeTarget& t, const std::vector<std::string>& needles) {
  try {
    load_eagle3(dir, t.config, t.weights);
    FAIL() << "no error";
  } catch (const core::Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
  }
}

TEST(Eagle3Checkpoint, RandomWriteLoadRoundTripInEveryNaming) {
  FakeTarget t;
  testing::TempDir dir;
  const Eagle3Config c = builtin_eagle3_config("k3-tiny-eagle3");
  write_random_eagle3(c, 7, dir.path());
  const Eagle3Weights want = random_eagle3_weights(c, 7, t.weights.embed);
  const auto check = [&](const std::string& naming) {
    const LoadedEagle3 got = load_eagle3(dir.path(), t.config, t.weights);
    EXPECT_TRUE(same_bytes(got.weights.q_proj.weight, want.q_proj.weight)) << naming;
    EXPECT_TRUE(same_bytes(got.weights.lm_head.weight, want.lm_head.weight)) << naming;
    EXPECT_TRUE(same_bytes(got.weights.d2t, want.d2t)) << naming;
    EXPECT_EQ(got.weights.embed.data<void>(), t.weights.embed.data<void>()) << naming << ": the target's embedding";
  };
  check("midlayer.");
  // vLLM's own naming ("layers.0.") under "model.", plus a BOOL t2d, load the same.
  auto tensors = read_all(dir.path());
  std::map<std::string, core::Tensor> renamed;
  for (auto& [n, v] : tensors) {
    std::string m = n.rfind("midlayer.", 0) == 0 ? "layers.0." + n.substr(9) : n;
    renamed["model." + m] = v;
  }
  renamed["t2d"] = core::Tensor::zeros(core::DType::u8, {c.vocab_size});
  write_all(dir.path(), renamed);
  declare_bool(dir.path(), "t2d");
  check("model.layers.0. + BOOL t2d");
  // An own embedding (a draft narrower than its target needs one) is used instead of the target's.
  tensors["embed_tokens.weight"] = testing::random_bf16(c.vocab_size, c.hidden_size, 9);
  write_all(dir.path(), tensors);
  EXPECT_TRUE(same_bytes(load_eagle3(dir.path(), t.config, t.weights).weights.embed, tensors["embed_tokens.weight"]));
}

TEST(Eagle3Checkpoint, EveryFaultIsNamed) {
  FakeTarget t;
  testing::TempDir dir;
  const Eagle3Config c = builtin_eagle3_config("k3-tiny-eagle3");
  write_random_eagle3(c, 3, dir.path());
  const auto good = read_all(dir.path());
  auto edit = [&](const std::function<void(std::map<std::string, core::Tensor>&)>& f) {
    auto t2 = good;
    f(t2);
    write_all(dir.path(), t2);
  };
  edit([](auto& m) { m.erase("midlayer.self_attn.k_proj.weight"); });
  expect_load_error(dir.path(), t, {"lacks tensor midlayer.self_attn.k_proj.weight"});
  edit([](auto& m) { m["fc.weight"] = testing::random_bf16(256, 512, 1); });
  expect_load_error(dir.path(), t, {"fc.weight", "shape [256, 512]", "expected [256, 768]"});
  edit([](auto& m) { m["d2t"] = core::Tensor::zeros(core::DType::f32, {768}); });
  expect_load_error(dir.path(), t, {"d2t", "I64"});
  edit([](auto& m) { m["midlayer.extra.weight"] = testing::random_bf16(2, 2, 1); });
  expect_load_error(dir.path(), t, {"unexpected tensor midlayer.extra.weight"});
  edit([](auto& m) { m["d2t"].template data<int64_t>()[767] = 1000; });
  expect_load_error(dir.path(), t, {"d2t[767]", "outside the target vocabulary"});
  edit([](auto& m) { m["embed_tokens.weight"] = testing::random_bf16(1024, 128, 1); });
  expect_load_error(dir.path(), t, {"embed_tokens.weight", "expected [1024, 256]"});
  // A draft for another target.
  write_all(dir.path(), good);
  config::K3Config small = t.config;
  small.num_hidden_layers = 3;
  try {
    load_eagle3(dir.path(), small, t.weights);
    FAIL() << "loaded a draft tapping layer 3 of a 3-layer target";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("eagle_aux_hidden_state_layer_ids[2]"), std::string::npos) << e.what();
  }
  // A DSpark folder given to the EAGLE-3 loader says what it is not.
  testing::TempDir dspark;
  write_random_draft(builtin_draft_config("k3-tiny-dspark"), 1, dspark.path());
  try {
    load_eagle3(dspark.path(), t.config, t.weights);
    FAIL();
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("architectures"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("k3_dspark"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace k3::draft
