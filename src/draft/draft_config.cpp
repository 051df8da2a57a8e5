// draft/draft_config.cpp: parsing, validation and the built-in configs of the DSpark draft model.
#include "draft/draft_config.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "draft/config_reader.h"

namespace k3::draft {

using detail::Reader;
using detail::require;
using detail::type_phrase;
using nlohmann::json;

namespace {

// Builtin drafts, written as the config.json each stands for so they pass through parse_draft_config.
json k3_dspark_json() {
  // spec §13.2: 5 dense MLA+RoPE layers, q-LoRA 1536, kv_lora 512, rope 64, hidden 7168, vocab
  // 163840, K = 7, taps 2/23/47/71/89, rank-256 Markov head. Heads (96, K3's) and the MLP width
  // 12288 are [A]: with an own lm_head they give 3.55 B parameters, the reported "about 3.56 B".
  return {{"model_type", kDsparkModelType},
          {"num_hidden_layers", 5},
          {"hidden_size", 7168},
          {"vocab_size", 163840},
          {"num_attention_heads", 96},
          {"q_lora_rank", 1536},
          {"kv_lora_rank", 512},
          {"qk_nope_head_dim", 128},
          {"qk_rope_head_dim", 64},
          {"v_head_dim", 128},
          {"rope_theta", 10000.0},
          {"intermediate_size", 12288},
          {"activation_situ_beta", 4.0},
          {"activation_situ_linear_beta", 25.0},
          {"rms_norm_eps", 1e-5},
          {"block_size", 7},
          {"target_layer_ids", {2, 23, 47, 71, 89}},
          {"markov_rank", 256},
          {"use_confidence_head", false},
          {"mask_token_id", 163592},  // spec §10: the DFlash draft's mask token
          {"share_target_lm_head", false}};
}

// For k3-tiny (4 layers: taps 0, 1, 2; the tap of layer 2 is layer 3's mixture). Small but every
// component on, the confidence head included. Mask token: K3's 163592 moved to the tiny vocabulary
// as k3-tiny moves K3's special ids (vocab - 248).
json k3_tiny_dspark_json() {
  return {{"model_type", kDsparkModelType},
          {"num_hidden_layers", 2},
          {"hidden_size", 256},
          {"vocab_size", 1024},
          {"num_attention_heads", 4},
          {"q_lora_rank", 64},
          {"kv_lora_rank", 32},
          {"qk_nope_head_dim", 32},
          {"qk_rope_head_dim", 16},
          {"v_head_dim", 32},
          {"rope_theta", 10000.0},
          {"intermediate_size", 512},
          {"rms_norm_eps", 1e-5},
          {"block_size", 4},
          {"target_layer_ids", {0, 1, 2}},
          {"markov_rank", 32},
          {"use_confidence_head", true},
          {"mask_token_id", 1024 - 248},
          {"share_target_lm_head", false}};
}

// For k3-proxy-tp8 (24 layers, vocab 20480, 12 MLA heads per TP8 rank): K3's draft with the
// per-rank head count and MLP width (12288 / 8), taps spread over 24 layers as K3's over 93.
json k3_proxy_tp8_dspark_json() {
  json j = k3_dspark_json();
  j["vocab_size"] = 20480;
  j["num_attention_heads"] = 96 / 8;
  j["intermediate_size"] = 12288 / 8;
  j["target_layer_ids"] = {0, 6, 11, 17, 22};
  j["mask_token_id"] = 20480 - 248;
  return j;
}

}  // namespace

float DraftConfig::softmax_scale() const { return 1.0f / std::sqrt(static_cast<float>(q_head_dim())); }

DraftConfig parse_draft_config(const json& j, const std::string& source) {
  if (!j.is_object()) throw core::Error(source + ": expected a JSON object, got " + type_phrase(j));
  const Reader r(j, source);
  DraftConfig c;
  const json* mt = r.find("model_type");
  if (!mt) r.fail("model_type", std::string("missing (required: \"") + kDsparkModelType + "\")");
  if (!mt->is_string()) r.fail("model_type", "expected a string, got " + type_phrase(*mt));
  c.model_type = mt->get<std::string>();
  c.num_layers = r.req_int("num_hidden_layers");
  c.hidden_size = r.req_int("hidden_size");
  c.vocab_size = r.req_int("vocab_size");
  c.draft_vocab_size = r.opt_int("draft_vocab_size", c.vocab_size);
  c.num_heads = r.req_int("num_attention_heads");
  c.q_lora_rank = r.req_int("q_lora_rank");
  c.kv_lora_rank = r.req_int("kv_lora_rank");
  c.qk_nope_head_dim = r.req_int("qk_nope_head_dim");
  c.qk_rope_head_dim = r.req_int("qk_rope_head_dim");
  c.v_head_dim = r.req_int("v_head_dim");
  c.rope_theta = r.opt_float("rope_theta", c.rope_theta);
  if (r.find("rope_scaling"))
    r.fail("rope_scaling", "not supported (RoPE scaling is not implemented); remove it or set null");
  c.intermediate_size = r.req_int("intermediate_size");
  c.situ_beta = r.opt_float("activation_situ_beta", c.situ_beta);
  c.situ_linear_beta = r.opt_float("activation_situ_linear_beta", c.situ_linear_beta);
  c.rms_norm_eps = r.opt_float("rms_norm_eps", c.rms_norm_eps);
  c.block_size = r.req_int("block_size");
  c.target_layer_ids = r.req_int_list("target_layer_ids");
  c.markov_rank = r.req_int("markov_rank");
  c.use_confidence_head = r.opt_bool("use_confidence_head", false);
  c.mask_token_id = r.req_int("mask_token_id");
  c.share_target_lm_head = r.opt_bool("share_target_lm_head", false);
  validate(c, source);
  return c;
}

void validate(const DraftConfig& c, const std::string& source) {
  require(c.model_type == kDsparkModelType, source, "model_type",
          std::string("expected \"") + kDsparkModelType + "\", got \"" + c.model_type + "\"");
  const std::pair<const char*, int> positive[] = {{"num_hidden_layers", c.num_layers},
                                                  {"hidden_size", c.hidden_size},
                                                  {"vocab_size", c.vocab_size},
                                                  {"draft_vocab_size", c.draft_vocab_size},
                                                  {"num_attention_heads", c.num_heads},
                                                  {"q_lora_rank", c.q_lora_rank},
                                                  {"kv_lora_rank", c.kv_lora_rank},
                                                  {"qk_nope_head_dim", c.qk_nope_head_dim},
                                                  {"qk_rope_head_dim", c.qk_rope_head_dim},
                                                  {"v_head_dim", c.v_head_dim},
                                                  {"intermediate_size", c.intermediate_size},
                                                  {"block_size", c.block_size},
                                                  {"markov_rank", c.markov_rank}};
  for (const auto& [key, v] : positive) require(v > 0, source, key, "must be > 0, got " + std::to_string(v));
  require(c.qk_rope_head_dim % 2 == 0, source, "qk_rope_head_dim",
          "must be even (RoPE rotates pairs), got " + std::to_string(c.qk_rope_head_dim));
  require(c.draft_vocab_size <= c.vocab_size, source, "draft_vocab_size",
          "must be <= vocab_size " + std::to_string(c.vocab_size) + ", got " + std::to_string(c.draft_vocab_size));
  require(std::isfinite(c.rope_theta) && c.rope_theta > 1.0f, source, "rope_theta",
          "must be a finite number > 1, got " + std::to_string(c.rope_theta));
  require(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0, source, "rms_norm_eps",
          "must be > 0, got " + std::to_string(c.rms_norm_eps));
  require(std::isfinite(c.situ_beta) && c.situ_beta > 0, source, "activation_situ_beta",
          "must be > 0, got " + std::to_string(c.situ_beta));
  require(std::isfinite(c.situ_linear_beta) && c.situ_linear_beta > 0, source, "activation_situ_linear_beta",
          "must be > 0, got " + std::to_string(c.situ_linear_beta));
  require(!c.target_layer_ids.empty(), source, "target_layer_ids", "must name at least one target layer");
  for (size_t i = 0; i < c.target_layer_ids.size(); ++i) {
    const std::string key = "target_layer_ids[" + std::to_string(i) + "]";
    require(c.target_layer_ids[i] >= 0, source, key, "must be >= 0, got " + std::to_string(c.target_layer_ids[i]));
    if (i > 0)
      require(c.target_layer_ids[i] > c.target_layer_ids[i - 1], source, key,
              "taps must be strictly increasing, got " + std::to_string(c.target_layer_ids[i]) + " after " +
                  std::to_string(c.target_layer_ids[i - 1]));
  }
  require(c.mask_token_id >= 0 && c.mask_token_id < c.vocab_size, source, "mask_token_id",
          "must be a token id in [0, " + std::to_string(c.vocab_size) + "), got " + std::to_string(c.mask_token_id));
  require(!c.share_target_lm_head || c.draft_vocab_size == c.vocab_size, source, "share_target_lm_head",
          "needs draft_vocab_size == vocab_size (the target's lm_head has vocab_size rows)");
}

void check_matches_target(const DraftConfig& c, const config::K3Config& t, const std::string& source) {
  require(c.hidden_size == t.hidden_size, source, "hidden_size",
          "must equal the target's hidden_size " + std::to_string(t.hidden_size) +
              " (the embedding is the "
              "target's), got " +
              std::to_string(c.hidden_size));
  require(c.vocab_size == t.vocab_size, source, "vocab_size",
          "must equal the target's vocab_size " + std::to_string(t.vocab_size) + ", got " +
              std::to_string(c.vocab_size));
  for (size_t i = 0; i < c.target_layer_ids.size(); ++i)
    require(c.target_layer_ids[i] + 1 < t.num_hidden_layers, source, "target_layer_ids[" + std::to_string(i) + "]",
            "tap " + std::to_string(c.target_layer_ids[i]) +
                " needs a next layer (the tap is the mixture layer l + 1 "
                "computes); the target has " +
                std::to_string(t.num_hidden_layers) +
                " layers, so taps must be <= " + std::to_string(t.num_hidden_layers - 2));
}

DraftConfig load_draft_config(const std::filesystem::path& path) {
  const auto [j, source] = detail::read_config_json(path, "draft config");
  return parse_draft_config(j, source);
}

json to_json(const DraftConfig& c) {
  json j = {{"model_type", c.model_type},
            {"num_hidden_layers", c.num_layers},
            {"hidden_size", c.hidden_size},
            {"vocab_size", c.vocab_size},
            {"draft_vocab_size", c.draft_vocab_size},
            {"num_attention_heads", c.num_heads},
            {"q_lora_rank", c.q_lora_rank},
            {"kv_lora_rank", c.kv_lora_rank},
            {"qk_nope_head_dim", c.qk_nope_head_dim},
            {"qk_rope_head_dim", c.qk_rope_head_dim},
            {"v_head_dim", c.v_head_dim},
            {"rope_theta", c.rope_theta},
            {"intermediate_size", c.intermediate_size},
            {"activation_situ_beta", c.situ_beta},
            {"activation_situ_linear_beta", c.situ_linear_beta},
            {"rms_norm_eps", c.rms_norm_eps},
            {"block_size", c.block_size},
            {"target_layer_ids", c.target_layer_ids},
            {"markov_rank", c.markov_rank},
            {"use_confidence_head", c.use_confidence_head},
            {"mask_token_id", c.mask_token_id},
            {"share_target_lm_head", c.share_target_lm_head},
            {"architectures", {"K3DSparkModel"}}};
  return j;
}

std::vector<std::string> builtin_draft_config_names() { return {"k3-dspark", "k3-tiny-dspark", "k3-proxy-tp8-dspark"}; }

DraftConfig builtin_draft_config(const std::string& name) {
  if (name == "k3-dspark") return parse_draft_config(k3_dspark_json(), "builtin:k3-dspark");
  if (name == "k3-tiny-dspark") return parse_draft_config(k3_tiny_dspark_json(), "builtin:k3-tiny-dspark");
  if (name == "k3-proxy-tp8-dspark")
    return parse_draft_config(k3_proxy_tp8_dspark_json(), "builtin:k3-proxy-tp8-dspark");
  std::string names;
  for (const auto& n : builtin_draft_config_names()) names += (names.empty() ? "" : ", ") + n;
  throw core::Error("unknown built-in draft config '" + name + "' (known: " + names + ")");
}

DraftConfig resolve_draft_config(const std::string& name_or_path) {
  for (const auto& n : builtin_draft_config_names())
    if (n == name_or_path) return builtin_draft_config(n);
  if (!std::filesystem::exists(name_or_path))
    throw core::Error("draft config '" + name_or_path + "' is neither a built-in name nor an existing path");
  return load_draft_config(name_or_path);
}

DraftConfig default_draft_for(const config::K3Config& t) {
  for (const auto& n : builtin_draft_config_names()) {
    DraftConfig c = builtin_draft_config(n);
    const bool taps_fit = c.target_layer_ids.back() + 1 < t.num_hidden_layers;
    if (c.hidden_size == t.hidden_size && c.vocab_size == t.vocab_size && taps_fit && c.num_heads == t.mla.num_heads)
      return c;
  }
  // Derived: the target's MLA dims, its dense FFN width, up to 5 taps spread evenly over [0, L-2].
  K3_CHECK(t.num_hidden_layers >= 2, "default_draft_for: the target needs at least 2 layers to tap one");
  DraftConfig c;
  c.num_layers = t.num_hidden_layers >= 8 ? 5 : 2;
  c.hidden_size = t.hidden_size;
  c.vocab_size = t.vocab_size;
  c.draft_vocab_size = t.vocab_size;
  c.num_heads = t.mla.num_heads > 0 ? t.mla.num_heads : 4;
  c.q_lora_rank = t.mla.q_lora_rank > 0 ? t.mla.q_lora_rank : t.hidden_size / 4;
  c.kv_lora_rank = t.mla.kv_lora_rank > 0 ? t.mla.kv_lora_rank : t.hidden_size / 8;
  c.qk_nope_head_dim = t.mla.qk_nope_head_dim > 0 ? t.mla.qk_nope_head_dim : 32;
  c.qk_rope_head_dim = t.mla.qk_rope_head_dim > 0 && t.mla.qk_rope_head_dim % 2 == 0 ? t.mla.qk_rope_head_dim : 16;
  c.v_head_dim = t.mla.v_head_dim > 0 ? t.mla.v_head_dim : 32;
  c.intermediate_size = t.intermediate_size;
  c.situ_beta = t.situ_beta;
  c.situ_linear_beta = t.situ_linear_beta;
  c.rms_norm_eps = t.rms_norm_eps;
  c.block_size = 7;
  const int last = t.num_hidden_layers - 2;
  const int n = std::min(5, last + 1);
  for (int i = 0; i < n; ++i) {
    const int tap = n == 1 ? last : static_cast<int>(std::lround(double(i) * last / (n - 1)));
    if (c.target_layer_ids.empty() || tap > c.target_layer_ids.back()) c.target_layer_ids.push_back(tap);
  }
  c.markov_rank = std::min(256, std::max(8, t.hidden_size / 8));
  c.mask_token_id = t.vocab_size > 248 ? t.vocab_size - 248 : t.vocab_size - 1;
  validate(c, "derived draft for the target");
  return c;
}

}  // namespace k3::draft
