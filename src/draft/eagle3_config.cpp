// draft/eagle3_config.cpp: parsing, validation and the built-in configs of the EAGLE-3 draft model.
#include "draft/eagle3_config.h"

#include <algorithm>
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

bool is_eagle3_architecture(const std::string& a) { return a == kEagle3Architecture || a == "Eagle3LlamaForCausalLM"; }

Llama3RopeScaling parse_rope_scaling(const json& v, const std::string& source) {
  const std::string key = "rope_scaling";
  if (!v.is_object()) throw core::Error(source + ": " + key + ": expected an object or null, got " + type_phrase(v));
  const Reader r(v, source + ": " + key);
  const std::string type = r.opt_string("rope_type", r.opt_string("type", "default"));
  if (type == "default") return {};
  if (type != "llama3")
    r.fail("rope_type", "'" + type + "' is not implemented (k3serve applies \"default\" and \"llama3\" RoPE)");
  Llama3RopeScaling s;
  s.factor = r.opt_float("factor", 0.0f);
  s.low_freq_factor = r.opt_float("low_freq_factor", s.low_freq_factor);
  s.high_freq_factor = r.opt_float("high_freq_factor", s.high_freq_factor);
  s.original_max_position_embeddings = r.opt_int("original_max_position_embeddings",
                                                 s.original_max_position_embeddings);
  require(std::isfinite(s.factor) && s.factor >= 1.0f, source, key + ".factor",
          "must be >= 1 for llama3 scaling, got " + std::to_string(s.factor));
  require(std::isfinite(s.low_freq_factor) && std::isfinite(s.high_freq_factor) && s.low_freq_factor > 0.0f &&
              s.high_freq_factor > s.low_freq_factor,
          source, key, "needs 0 < low_freq_factor < high_freq_factor");
  require(s.original_max_position_embeddings > 0, source, key + ".original_max_position_embeddings", "must be > 0");
  return s;
}

// K3 (spec §11): 7168 wide, 64 heads of 128 with 8 KV heads, MLP 18432 [A: a Llama-layout
// EAGLE-3 draft at K3's width, as published for Kimi-K2], vLLM's default taps for 93 layers.
json k3_eagle3_json() {
  return {{"architectures", {kEagle3Architecture}},
          {"model_type", "llama"},
          {"num_hidden_layers", 1},
          {"hidden_size", 7168},
          {"vocab_size", 163840},
          {"draft_vocab_size", 32000},
          {"num_attention_heads", 64},
          {"num_key_value_heads", 8},
          {"head_dim", 128},
          {"intermediate_size", 18432},
          {"hidden_act", "silu"},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 50000.0},
          {"eagle_config", {{"eagle_aux_hidden_state_layer_ids", {2, 46, 90}}, {"use_aux_hidden_state", true}}}};
}

// k3-tiny (4 layers, hidden 256, vocab 1024): taps at the inputs of layers 1, 2, 3; a reduced draft
// vocabulary so d2t is exercised.
json k3_tiny_eagle3_json() {
  return {{"architectures", {kEagle3Architecture}},
          {"model_type", "llama"},
          {"num_hidden_layers", 1},
          {"hidden_size", 256},
          {"vocab_size", 1024},
          {"draft_vocab_size", 768},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 64},
          {"intermediate_size", 512},
          {"hidden_act", "silu"},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"eagle_config", {{"eagle_aux_hidden_state_layer_ids", {1, 2, 3}}, {"use_aux_hidden_state", true}}}};
}

// k3-proxy-tp8 (24 layers, vocab 20480): K3's draft with vLLM's default taps for 24 layers.
json k3_proxy_tp8_eagle3_json() {
  json j = k3_eagle3_json();
  j["vocab_size"] = 20480;
  j["draft_vocab_size"] = 20480;
  j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {2, 12, 21};
  return j;
}

}  // namespace

std::vector<int> Eagle3Config::tap_layers() const {
  std::vector<int> out;
  for (int a : aux_layer_ids) out.push_back(a - 1);
  return out;
}

Eagle3Config parse_eagle3_config(const json& j, const std::string& source) {
  if (!j.is_object()) throw core::Error(source + ": expected a JSON object, got " + type_phrase(j));
  const Reader r(j, source);
  const json* arch = r.find("architectures");
  if (!arch || !arch->is_array() || std::none_of(arch->begin(), arch->end(), [](const json& a) {
        return a.is_string() && is_eagle3_architecture(a.get<std::string>());
      }))
    r.fail("architectures", std::string("must list \"") + kEagle3Architecture + "\" (an EAGLE-3 draft), got " +
                                (arch ? arch->dump() : std::string("nothing")) +
                                (r.find("model_type") ? " with model_type " + r.find("model_type")->dump() : ""));
  Eagle3Config c;
  const int layers = r.req_int("num_hidden_layers");
  require(layers == 1, source, "num_hidden_layers",
          "must be 1 (EAGLE-3 drafts have one decoder layer), got " + std::to_string(layers));
  c.hidden_size = r.req_int("hidden_size");
  c.target_hidden_size = r.opt_int("target_hidden_size", c.hidden_size);
  c.vocab_size = r.req_int("vocab_size");
  c.draft_vocab_size = r.opt_int("draft_vocab_size", c.vocab_size);
  c.num_heads = r.req_int("num_attention_heads");
  c.num_kv_heads = r.opt_int("num_key_value_heads", c.num_heads);
  c.head_dim = r.opt_int("head_dim", c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  c.intermediate_size = r.req_int("intermediate_size");
  const std::string act = r.opt_string("hidden_act", "silu");
  require(act == "silu", source, "hidden_act", "must be \"silu\" (the Llama MLP), got \"" + act + "\"");
  c.rms_norm_eps = r.opt_float("rms_norm_eps", c.rms_norm_eps);
  c.rope_theta = r.opt_float("rope_theta", c.rope_theta);
  if (const json* rs = r.find("rope_scaling")) c.rope_scaling = parse_rope_scaling(*rs, source);
  require(!r.opt_bool("attention_bias", false), source, "attention_bias", "must be false (biases are not loaded)");
  require(!r.opt_bool("mlp_bias", false), source, "mlp_bias", "must be false (biases are not loaded)");
  require(!r.opt_bool("tie_word_embeddings", false), source, "tie_word_embeddings",
          "must be false (the draft has its own lm_head over the draft vocabulary)");
  c.norm_before_residual = r.opt_bool("norm_before_residual", false);

  const std::string ids_key = "eagle_aux_hidden_state_layer_ids";
  std::vector<int> top, nested;
  if (r.find(ids_key)) top = r.req_int_list(ids_key);
  if (const json* ec = r.find("eagle_config")) {
    if (!ec->is_object()) r.fail("eagle_config", "expected an object, got " + type_phrase(*ec));
    const Reader er(*ec, source + ": eagle_config");
    if (er.find(ids_key)) nested = er.req_int_list(ids_key);
    require(er.opt_bool("use_aux_hidden_state", true), source, "eagle_config.use_aux_hidden_state",
            "must be true (EAGLE-3 drafts from the target's tapped hidden states)");
  }
  require(top.empty() || nested.empty() || top == nested, source, ids_key,
          "given at the top level and in eagle_config with different values");
  c.aux_layer_ids = !nested.empty() ? nested : top;
  require(!c.aux_layer_ids.empty(), source, ids_key,
          "missing: name the tapped target layers (vLLM's default [2, L/2, L-3] depends on the target; "
          "k3serve wants them written down)");
  validate(c, source);
  return c;
}

void validate(const Eagle3Config& c, const std::string& source) {
  const std::pair<const char*, int> positive[] = {{"hidden_size", c.hidden_size},
                                                  {"target_hidden_size", c.target_hidden_size},
                                                  {"vocab_size", c.vocab_size},
                                                  {"draft_vocab_size", c.draft_vocab_size},
                                                  {"num_attention_heads", c.num_heads},
                                                  {"num_key_value_heads", c.num_kv_heads},
                                                  {"head_dim", c.head_dim},
                                                  {"intermediate_size", c.intermediate_size}};
  for (const auto& [key, v] : positive) require(v > 0, source, key, "must be > 0, got " + std::to_string(v));
  require(c.num_heads % c.num_kv_heads == 0, source, "num_key_value_heads",
          "must divide num_attention_heads " + std::to_string(c.num_heads) + ", got " + std::to_string(c.num_kv_heads));
  require(c.head_dim % 2 == 0, source, "head_dim",
          "must be even (RoPE rotates pairs), got " + std::to_string(c.head_dim));
  require(c.draft_vocab_size <= c.vocab_size, source, "draft_vocab_size",
          "must be <= vocab_size " + std::to_string(c.vocab_size) + ", got " + std::to_string(c.draft_vocab_size));
  require(std::isfinite(c.rope_theta) && c.rope_theta > 1.0f, source, "rope_theta",
          "must be a finite number > 1, got " + std::to_string(c.rope_theta));
  require(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0, source, "rms_norm_eps",
          "must be > 0, got " + std::to_string(c.rms_norm_eps));
  for (size_t i = 0; i < c.aux_layer_ids.size(); ++i) {
    const std::string key = "eagle_aux_hidden_state_layer_ids[" + std::to_string(i) + "]";
    require(c.aux_layer_ids[i] >= 1, source, key,
            "must be >= 1 (the input of layer 0 is the embedding, not a hidden state k3serve taps), got " +
                std::to_string(c.aux_layer_ids[i]));
    if (i > 0)
      require(c.aux_layer_ids[i] > c.aux_layer_ids[i - 1], source, key,
              "must be strictly increasing, got " + std::to_string(c.aux_layer_ids[i]) + " after " +
                  std::to_string(c.aux_layer_ids[i - 1]));
  }
}

void check_matches_target(const Eagle3Config& c, const config::K3Config& t, const std::string& source) {
  require(c.target_hidden_size == t.hidden_size, source, "target_hidden_size",
          "must equal the target's hidden_size " + std::to_string(t.hidden_size) + ", got " +
              std::to_string(c.target_hidden_size));
  require(c.vocab_size == t.vocab_size, source, "vocab_size",
          "must equal the target's vocab_size " + std::to_string(t.vocab_size) + ", got " +
              std::to_string(c.vocab_size));
  for (size_t i = 0; i < c.aux_layer_ids.size(); ++i)
    require(c.aux_layer_ids[i] < t.num_hidden_layers, source,
            "eagle_aux_hidden_state_layer_ids[" + std::to_string(i) + "]",
            "layer " + std::to_string(c.aux_layer_ids[i]) + " is not a layer of the target (it has " +
                std::to_string(t.num_hidden_layers) + ", so ids must be <= " + std::to_string(t.num_hidden_layers - 1) +
                ")");
}

Eagle3Config load_eagle3_config(const std::filesystem::path& path) {
  const auto [j, source] = detail::read_config_json(path, "EAGLE-3 draft config");
  return parse_eagle3_config(j, source);
}

json to_json(const Eagle3Config& c) {
  json j = {{"architectures", {kEagle3Architecture}},
            {"model_type", "llama"},
            {"num_hidden_layers", 1},
            {"hidden_size", c.hidden_size},
            {"target_hidden_size", c.target_hidden_size},
            {"vocab_size", c.vocab_size},
            {"draft_vocab_size", c.draft_vocab_size},
            {"num_attention_heads", c.num_heads},
            {"num_key_value_heads", c.num_kv_heads},
            {"head_dim", c.head_dim},
            {"intermediate_size", c.intermediate_size},
            {"hidden_act", "silu"},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta},
            {"rope_scaling", nullptr},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"tie_word_embeddings", false},
            {"norm_before_residual", c.norm_before_residual},
            {"eagle_config", {{"eagle_aux_hidden_state_layer_ids", c.aux_layer_ids}, {"use_aux_hidden_state", true}}}};
  if (c.rope_scaling.enabled())
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  return j;
}

std::vector<std::string> builtin_eagle3_config_names() {
  return {"k3-eagle3", "k3-tiny-eagle3", "k3-proxy-tp8-eagle3"};
}

Eagle3Config builtin_eagle3_config(const std::string& name) {
  if (name == "k3-eagle3") return parse_eagle3_config(k3_eagle3_json(), "builtin:k3-eagle3");
  if (name == "k3-tiny-eagle3") return parse_eagle3_config(k3_tiny_eagle3_json(), "builtin:k3-tiny-eagle3");
  if (name == "k3-proxy-tp8-eagle3")
    return parse_eagle3_config(k3_proxy_tp8_eagle3_json(), "builtin:k3-proxy-tp8-eagle3");
  std::string names;
  for (const auto& n : builtin_eagle3_config_names()) names += (names.empty() ? "" : ", ") + n;
  throw core::Error("unknown built-in EAGLE-3 config '" + name + "' (known: " + names + ")");
}

Eagle3Config resolve_eagle3_config(const std::string& name_or_path) {
  for (const auto& n : builtin_eagle3_config_names())
    if (n == name_or_path) return builtin_eagle3_config(n);
  if (!std::filesystem::exists(name_or_path))
    throw core::Error("EAGLE-3 config '" + name_or_path + "' is neither a built-in name nor an existing path");
  return load_eagle3_config(name_or_path);
}

Eagle3Config default_eagle3_for(const config::K3Config& t) {
  for (const auto& n : builtin_eagle3_config_names()) {
    const Eagle3Config c = builtin_eagle3_config(n);
    if (c.target_hidden_size == t.hidden_size && c.vocab_size == t.vocab_size &&
        c.aux_layer_ids.back() < t.num_hidden_layers)
      return c;
  }
  K3_CHECK(t.num_hidden_layers >= 2, "default_eagle3_for: the target needs at least 2 layers to tap one");
  Eagle3Config c;
  c.hidden_size = c.target_hidden_size = t.hidden_size;
  c.vocab_size = c.draft_vocab_size = t.vocab_size;
  c.head_dim = 2;  // the widest of 64, 32, ..., 2 that divides the hidden size
  for (int hd : {64, 32, 16, 8, 4})
    if (t.hidden_size % hd == 0) {
      c.head_dim = hd;
      break;
    }
  c.num_heads = std::max(1, t.hidden_size / c.head_dim);
  c.num_kv_heads = c.num_heads % 2 == 0 ? c.num_heads / 2 : c.num_heads;
  c.intermediate_size = 3 * t.hidden_size;
  c.rms_norm_eps = t.rms_norm_eps;
  // vLLM's default (2, L/2, L-3), clamped into [1, L-1] and made strictly increasing.
  const int L = t.num_hidden_layers;
  for (int a : {2, L / 2, L - 3}) {
    a = std::clamp(a, 1, L - 1);
    if (c.aux_layer_ids.empty() || a > c.aux_layer_ids.back()) c.aux_layer_ids.push_back(a);
  }
  validate(c, "derived EAGLE-3 draft for the target");
  return c;
}

}  // namespace k3::draft
