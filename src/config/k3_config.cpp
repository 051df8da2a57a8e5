// config/k3_config.cpp: parse a K3-family config.json, validate it, write it back (spec §1, §4, §14).
//
// Reading rules (spec §1.1):
// * The text model sits under "text_config" when that key exists (the real K3 file: top-level
//   model_type "kimi_k3"), otherwise at the top level (k3-tiny, files we write).
// * Sizes that shape tensors are required; behaviour switches default to the K3 value.
// * Keys whose only supported value is K3's (hidden_act "situ", sigmoid router, noaux_tc, one expert
//   group, NoPE MLA, full-rank KDA output gate) are checked here and never stored.
// * quantization_config is looked up in text_config first, then at the top level (quant_config.cpp).
#include "config/k3_config.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "config/json_section.h"
#include "core/error.h"

namespace k3::config {

using detail::Section;
using nlohmann::json;

// Implemented in quant_config.cpp.
namespace detail {
Mxfp4Config parse_quantization(const Section& q);
json mxfp4_quantization_json(const Mxfp4Config& m);
}  // namespace detail

float MlaConfig::softmax_scale() const {
  // Computed in double and rounded once, so 192^-1/2 is the float nearest the exact value.
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(q_head_dim())));
}

namespace {

// A string key whose only supported value is `only` (absent means K3's value).
void expect_only(const Section& s, const std::string& key, const std::string& only, const std::string& what) {
  const std::string v = s.opt_string(key, only);
  if (v != only) s.fail(key, "\"" + v + "\" is not supported; k3serve implements only \"" + only + "\" (" + what + ")");
}

// The 1-based kda_layers / full_attn_layers lists -> one kind per 0-based layer. Each layer
// must be listed exactly once across both lists.
std::vector<AttnKind> parse_layer_kinds(const Section& lac, int num_layers) {
  constexpr int kUnset = -1;
  std::vector<int> owner(static_cast<size_t>(std::max(num_layers, 0)), kUnset);
  const char* keys[2] = {"kda_layers", "full_attn_layers"};
  const AttnKind kinds[2] = {AttnKind::kda, AttnKind::mla};
  for (int list = 0; list < 2; ++list) {
    const std::vector<int> layers = lac.req_int_list(keys[list]);
    for (int layer : layers) {
      if (layer < 1 || layer > num_layers)
        lac.fail(keys[list], "layer " + std::to_string(layer) + " is out of range 1.." + std::to_string(num_layers) +
                                 " (1-based layer numbers, num_hidden_layers = " + std::to_string(num_layers) + ")");
      int& o = owner[static_cast<size_t>(layer - 1)];
      if (o == list) lac.fail(keys[list], "layer " + std::to_string(layer) + " is listed twice");
      if (o != kUnset)
        lac.fail(keys[list], "layer " + std::to_string(layer) + " is also listed in " + lac.path(keys[o]) +
                                 " (each layer has one attention kind)");
      o = list;
    }
  }
  std::vector<AttnKind> out;
  std::string missing;
  int n_missing = 0;
  for (int l = 0; l < num_layers; ++l) {
    const int o = owner[static_cast<size_t>(l)];
    if (o == kUnset) {
      if (n_missing < 8) missing += (n_missing ? ", " : "") + std::to_string(l + 1);
      ++n_missing;
      continue;
    }
    out.push_back(kinds[o]);
  }
  if (n_missing > 0)
    throw core::Error(lac.source() + ": " + lac.path("kda_layers") + " / " + lac.path("full_attn_layers") + ": layer" +
                      (n_missing > 1 ? "s " : " ") + missing + (n_missing > 8 ? ", ..." : "") + " (1-based) " +
                      (n_missing > 1 ? "are" : "is") + " in neither list; every layer 1.." +
                      std::to_string(num_layers) + " (num_hidden_layers = " + std::to_string(num_layers) +
                      ") must be listed exactly once");
  return out;
}

void check_model_type(const Section& s, const char* role) {
  const json* v = s.find("model_type");
  if (v == nullptr) return;
  const std::string t = s.as_string("model_type", *v);
  if (t != "kimi_linear" && t != "kimi_k3")
    s.fail("model_type",
           "\"" + t + "\" is not a K3-family " + role + " model type (expected \"kimi_linear\" or \"kimi_k3\")");
}

// Shortest decimal that reads back as the same float, so written configs say 1e-05, not
// 9.999999747378752e-06.
json float_json(float f) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  const double d = std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
  return static_cast<float>(d) == f ? json(d) : json(static_cast<double>(f));
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw core::Error(path.string() + ": cannot open config file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

K3Config parse_config(const json& j, const std::string& source) {
  if (!j.is_object())
    throw core::Error(source + ": expected a JSON object at the top level, got " + detail::json_type_phrase(j));
  const Section top(j, source, "");
  // Nested when text_config exists (the published K3 file), flat otherwise.
  const Section t = top.has("text_config") ? top.sub("text_config") : top;
  K3Config c;
  try {
    if (top.has("text_config")) check_model_type(top, "top-level");
    check_model_type(t, "text");
    c.model_type = t.opt_string("model_type", "kimi_linear");

    c.vocab_size = t.req_int("vocab_size");
    c.hidden_size = t.req_int("hidden_size");
    c.num_hidden_layers = t.req_int("num_hidden_layers");
    c.intermediate_size = t.req_int("intermediate_size");
    c.rms_norm_eps = t.opt_float("rms_norm_eps", c.rms_norm_eps);
    c.first_k_dense_replace = t.opt_int("first_k_dense_replace", c.first_k_dense_replace);
    c.moe_layer_freq = t.opt_int("moe_layer_freq", c.moe_layer_freq);
    c.situ_beta = t.opt_float("activation_situ_beta", c.situ_beta);
    c.situ_linear_beta = t.opt_float("activation_situ_linear_beta", c.situ_linear_beta);
    c.attn_res_block_size = t.opt_int("attn_res_block_size", c.attn_res_block_size);
    c.tie_word_embeddings = t.opt_bool("tie_word_embeddings", c.tie_word_embeddings);
    c.bos_token_id = t.opt_int("bos_token_id", -1);
    c.eos_token_id = t.opt_int("eos_token_id", -1);
    c.pad_token_id = t.opt_int("pad_token_id", -1);
    expect_only(t, "hidden_act", "situ", "SiTU-GLU, spec §8");

    // Gated MLA (spec §6).
    c.mla.num_heads = t.req_int("num_attention_heads");
    const int kv_heads = t.opt_int("num_key_value_heads", c.mla.num_heads);
    if (kv_heads != c.mla.num_heads)
      t.fail("num_key_value_heads", std::to_string(kv_heads) + " must equal num_attention_heads (" +
                                        std::to_string(c.mla.num_heads) + "): MLA has one latent shared by all heads");
    c.mla.q_lora_rank = t.req_int("q_lora_rank");
    c.mla.kv_lora_rank = t.req_int("kv_lora_rank");
    c.mla.qk_nope_head_dim = t.req_int("qk_nope_head_dim");
    c.mla.qk_rope_head_dim = t.req_int("qk_rope_head_dim");
    c.mla.v_head_dim = t.req_int("v_head_dim");
    if (!t.opt_bool("mla_use_nope", true))
      t.fail("mla_use_nope", "false is not supported; K3 MLA uses no rotary embedding (spec §6)");
    c.mla.use_output_gate = t.opt_bool("mla_use_output_gate", c.mla.use_output_gate);

    // Stable LatentMoE (spec §7).
    c.moe.num_experts = t.req_int("num_experts");
    c.moe.num_experts_per_token = t.req_int("num_experts_per_token");
    c.moe.num_shared_experts = t.req_int("num_shared_experts");
    c.moe.moe_intermediate_size = t.req_int("moe_intermediate_size");
    c.moe.routed_expert_hidden_size = t.req_int("routed_expert_hidden_size");
    c.moe.latent_moe_use_norm = t.opt_bool("latent_moe_use_norm", c.moe.latent_moe_use_norm);
    c.moe.renormalize = t.opt_bool("moe_renormalize", c.moe.renormalize);
    c.moe.routed_scaling_factor = t.opt_float("routed_scaling_factor", c.moe.routed_scaling_factor);
    expect_only(t, "moe_router_activation_func", "sigmoid", "sigmoid router, spec §7");
    expect_only(t, "topk_method", "noaux_tc", "biased top-k selection, spec §7");
    t.opt_bool("use_grouped_topk", true);  // type-checked only: with one group it is a no-op
    c.moe.num_expert_group = t.opt_int("num_expert_group", 1);
    c.moe.topk_group = t.opt_int("topk_group", 1);
    if (c.moe.num_expert_group != 1)
      t.fail("num_expert_group",
             std::to_string(c.moe.num_expert_group) + " is not supported; only 1 expert group (K3's value)");
    if (c.moe.topk_group != 1)
      t.fail("topk_group", std::to_string(c.moe.topk_group) + " is not supported; only 1 (K3's value)");

    // KDA (spec §5).
    const Section lac = t.sub("linear_attn_config");
    c.kda.num_heads = lac.req_int("num_heads");
    c.kda.head_dim = lac.req_int("head_dim");
    c.kda.short_conv_kernel_size = lac.req_int("short_conv_kernel_size");
    c.kda.gate_lower_bound = lac.opt_float("gate_lower_bound", c.kda.gate_lower_bound);
    c.kda.use_full_rank_gate = lac.opt_bool("use_full_rank_gate", true);
    if (!c.kda.use_full_rank_gate)
      lac.fail("use_full_rank_gate",
               "false (low-rank output gate, Kimi Linear 48B) is not supported; K3 uses the "
               "full-rank gate");
    c.kda.chunk_size = t.opt_int("kda_chunk_size", c.kda.chunk_size);
    if (c.num_hidden_layers < 1)
      t.fail("num_hidden_layers", "must be >= 1 (got " + std::to_string(c.num_hidden_layers) + ")");
    c.attn_kinds = parse_layer_kinds(lac, c.num_hidden_layers);

    // MXFP4 routed experts: text_config first, then the top level (spec §1.1).
    if (t.has("quantization_config")) c.mxfp4 = detail::parse_quantization(t.sub("quantization_config"));
    else if (top.has("quantization_config")) c.mxfp4 = detail::parse_quantization(top.sub("quantization_config"));
  } catch (const json::exception& e) {
    // Section reads check types first; this is a last guard so nlohmann never leaks out.
    throw core::Error(source + ": malformed config: " + e.what());
  }
  validate(c, source);
  return c;
}

void validate(const K3Config& c, const std::string& source) {
  auto fail = [&](const std::string& key, const std::string& what) {
    throw core::Error(source + ": " + key + ": " + what);
  };
  auto positive = [&](const std::string& key, int v) {
    if (v <= 0) fail(key, "must be > 0 (got " + std::to_string(v) + ")");
  };
  auto positive_f = [&](const std::string& key, float v) {
    if (!(std::isfinite(v) && v > 0.0f)) fail(key, "must be a finite number > 0 (got " + std::to_string(v) + ")");
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("num_hidden_layers", c.num_hidden_layers);
  positive_f("rms_norm_eps", c.rms_norm_eps);
  if (c.first_k_dense_replace < 0)
    fail("first_k_dense_replace", "must be >= 0 (got " + std::to_string(c.first_k_dense_replace) + ")");
  positive("moe_layer_freq", c.moe_layer_freq);
  positive_f("activation_situ_beta", c.situ_beta);
  positive_f("activation_situ_linear_beta", c.situ_linear_beta);
  positive("attn_res_block_size", c.attn_res_block_size);
  const std::pair<const char*, int> tokens[] = {
      {"bos_token_id", c.bos_token_id}, {"eos_token_id", c.eos_token_id}, {"pad_token_id", c.pad_token_id}};
  for (const auto& [key, id] : tokens)
    if (id < -1 || id >= c.vocab_size)
      fail(key, std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");

  bool any_dense = false, any_moe = false;
  for (int l = 0; l < c.num_hidden_layers; ++l) (c.ffn_kind(l) == FfnKind::dense ? any_dense : any_moe) = true;
  if (any_dense) positive("intermediate_size", c.intermediate_size);

  // KDA (linear_attn_config).
  positive("linear_attn_config.num_heads", c.kda.num_heads);
  positive("linear_attn_config.head_dim", c.kda.head_dim);
  if (c.kda.short_conv_kernel_size < 1)
    fail("linear_attn_config.short_conv_kernel_size",
         "must be >= 1 (got " + std::to_string(c.kda.short_conv_kernel_size) + ")");
  if (!(std::isfinite(c.kda.gate_lower_bound) && c.kda.gate_lower_bound < 0.0f))
    fail("linear_attn_config.gate_lower_bound", "must be a finite number < 0 so the decay stays in (0, 1) (got " +
                                                    std::to_string(c.kda.gate_lower_bound) + ")");
  if (!c.kda.use_full_rank_gate)
    fail("linear_attn_config.use_full_rank_gate", "only true (full-rank output gate) is supported");
  positive("kda_chunk_size", c.kda.chunk_size);

  // MLA.
  positive("num_attention_heads", c.mla.num_heads);
  positive("q_lora_rank", c.mla.q_lora_rank);
  positive("kv_lora_rank", c.mla.kv_lora_rank);
  positive("qk_nope_head_dim", c.mla.qk_nope_head_dim);
  if (c.mla.qk_rope_head_dim < 0)
    fail("qk_rope_head_dim", "must be >= 0 (got " + std::to_string(c.mla.qk_rope_head_dim) + ")");
  positive("v_head_dim", c.mla.v_head_dim);

  // MoE.
  if (any_moe || c.moe.num_experts != 0) {
    positive("num_experts", c.moe.num_experts);
    if (c.moe.num_experts_per_token < 1 || c.moe.num_experts_per_token > c.moe.num_experts)
      fail("num_experts_per_token", "must be in 1..num_experts (" + std::to_string(c.moe.num_experts) + "), got " +
                                        std::to_string(c.moe.num_experts_per_token));
    if (c.moe.num_shared_experts < 0)
      fail("num_shared_experts", "must be >= 0 (got " + std::to_string(c.moe.num_shared_experts) + ")");
    positive("moe_intermediate_size", c.moe.moe_intermediate_size);
    positive("routed_expert_hidden_size", c.moe.routed_expert_hidden_size);
    positive_f("routed_scaling_factor", c.moe.routed_scaling_factor);
  }
  if (c.moe.num_expert_group != 1)
    fail("num_expert_group", "only 1 expert group is supported (got " + std::to_string(c.moe.num_expert_group) + ")");
  if (c.moe.topk_group != 1) fail("topk_group", "only 1 is supported (got " + std::to_string(c.moe.topk_group) + ")");

  // Layer schedule.
  if (c.attn_kinds.size() != static_cast<size_t>(c.num_hidden_layers))
    fail("linear_attn_config.kda_layers / full_attn_layers",
         "the layer lists cover " + std::to_string(c.attn_kinds.size()) + " layers but num_hidden_layers is " +
             std::to_string(c.num_hidden_layers));

  // MXFP4: groups of 32 along the input dim of w1/w3 (routed_expert_hidden_size) and w2
  // (moe_intermediate_size), spec §9.
  if (c.mxfp4.enabled) {
    if (c.mxfp4.group_size != 32)
      fail("quantization_config.group_size",
           "MXFP4 group size must be 32 (got " + std::to_string(c.mxfp4.group_size) + ")");
    if (c.moe.routed_expert_hidden_size % c.mxfp4.group_size != 0)
      fail("routed_expert_hidden_size",
           std::to_string(c.moe.routed_expert_hidden_size) +
               " is not a multiple of the MXFP4 group size 32 (input dim of experts' w1/w3)");
    if (c.moe.moe_intermediate_size % c.mxfp4.group_size != 0)
      fail("moe_intermediate_size", std::to_string(c.moe.moe_intermediate_size) +
                                        " is not a multiple of the MXFP4 group size 32 (input dim "
                                        "of experts' w2)");
  }
}

json to_json(const K3Config& c) {
  json lac = {
      {"num_heads", c.kda.num_heads},
      {"head_dim", c.kda.head_dim},
      {"short_conv_kernel_size", c.kda.short_conv_kernel_size},
      {"gate_lower_bound", float_json(c.kda.gate_lower_bound)},
      {"use_full_rank_gate", c.kda.use_full_rank_gate},
  };
  json kda = json::array(), mla = json::array();
  for (size_t l = 0; l < c.attn_kinds.size(); ++l)
    (c.attn_kinds[l] == AttnKind::kda ? kda : mla).push_back(static_cast<int>(l) + 1);
  lac["kda_layers"] = kda;
  lac["full_attn_layers"] = mla;

  json j = {
      {"model_type", c.model_type.empty() ? "kimi_linear" : c.model_type},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"intermediate_size", c.intermediate_size},
      {"rms_norm_eps", float_json(c.rms_norm_eps)},
      {"first_k_dense_replace", c.first_k_dense_replace},
      {"moe_layer_freq", c.moe_layer_freq},
      {"hidden_act", "situ"},
      {"activation_situ_beta", float_json(c.situ_beta)},
      {"activation_situ_linear_beta", float_json(c.situ_linear_beta)},
      {"attn_res_block_size", c.attn_res_block_size},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"num_attention_heads", c.mla.num_heads},
      {"num_key_value_heads", c.mla.num_heads},
      {"q_lora_rank", c.mla.q_lora_rank},
      {"kv_lora_rank", c.mla.kv_lora_rank},
      {"qk_nope_head_dim", c.mla.qk_nope_head_dim},
      {"qk_rope_head_dim", c.mla.qk_rope_head_dim},
      {"v_head_dim", c.mla.v_head_dim},
      {"mla_use_nope", true},
      {"mla_use_output_gate", c.mla.use_output_gate},
      {"num_experts", c.moe.num_experts},
      {"num_experts_per_token", c.moe.num_experts_per_token},
      {"num_shared_experts", c.moe.num_shared_experts},
      {"moe_intermediate_size", c.moe.moe_intermediate_size},
      {"routed_expert_hidden_size", c.moe.routed_expert_hidden_size},
      {"latent_moe_use_norm", c.moe.latent_moe_use_norm},
      {"moe_router_activation_func", "sigmoid"},
      {"moe_renormalize", c.moe.renormalize},
      {"routed_scaling_factor", float_json(c.moe.routed_scaling_factor)},
      {"topk_method", "noaux_tc"},
      {"use_grouped_topk", true},
      {"num_expert_group", c.moe.num_expert_group},
      {"topk_group", c.moe.topk_group},
      {"linear_attn_config", lac},
      {"kda_chunk_size", c.kda.chunk_size},
  };
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  if (c.pad_token_id >= 0) j["pad_token_id"] = c.pad_token_id;
  if (c.mxfp4.enabled) j["quantization_config"] = detail::mxfp4_quantization_json(c.mxfp4);
  return j;
}

std::string K3Config::hash() const {
  // FNV-1a 64 over the canonical dump (nlohmann objects keep keys sorted), so the digest
  // changes exactly when a field that reaches config.json changes.
  const std::string s = to_json(*this).dump();
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

K3Config load_config(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw core::Error(path.string() + ": invalid JSON: " + e.what());
  }
  return parse_config(j, path.string());
}

K3Config resolve_config(const std::string& name_or_path) {
  for (const std::string& n : builtin_config_names())
    if (n == name_or_path) return builtin_config(n);
  namespace fs = std::filesystem;
  const fs::path p(name_or_path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    const fs::path file = p / "config.json";
    if (!fs::is_regular_file(file, ec)) throw core::Error("config: directory " + p.string() + " has no config.json");
    return load_config(file);
  }
  if (fs::is_regular_file(p, ec)) return load_config(p);
  std::string names;
  for (const std::string& n : builtin_config_names()) names += (names.empty() ? "" : ", ") + n;
  throw core::Error("config: \"" + name_or_path + "\" is neither a built-in config (" + names +
                    ") nor an existing config.json file or a directory containing one");
}

}  // namespace k3::config
