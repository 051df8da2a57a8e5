// draft/eagle3_weights.cpp: the EAGLE-3 checkpoint inventory, its loader and the random writer.
#include "draft/eagle3_weights.h"

#include <map>

#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace k3::draft {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLayerPrefix = "midlayer.";
constexpr const char* kEmbedName = "embed_tokens.weight";

// The names a canonical tensor may be stored under: with or without "model.", the decoder layer as
// "midlayer." (SpecForge) or "layers.0." (vLLM's own naming).
std::vector<std::string> stored_names(const std::string& name) {
  std::vector<std::string> bases = {name};
  if (name.rfind(kLayerPrefix, 0) == 0) bases.push_back("layers.0." + name.substr(std::string(kLayerPrefix).size()));
  std::vector<std::string> out;
  for (const std::string& b : bases) {
    out.push_back(b);
    out.push_back("model." + b);
  }
  return out;
}

bool ignored(const std::string& name) { return name == "t2d" || name == "model.t2d"; }

}  // namespace

std::vector<DraftParamSpec> eagle3_params(const Eagle3Config& c, bool with_embedding) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const std::string p = kLayerPrefix;
  using R = DraftParamRole;
  std::vector<DraftParamSpec> v = {
      {"fc.weight", R::linear, {H, int64_t{c.num_taps()} * c.target_hidden_size}},
      {p + "hidden_norm.weight", R::norm, {H}},
      {p + "input_layernorm.weight", R::norm, {H}},
      {p + "self_attn.q_proj.weight", R::linear, {c.q_width(), 2 * H}},
      {p + "self_attn.k_proj.weight", R::linear, {c.kv_width(), 2 * H}},
      {p + "self_attn.v_proj.weight", R::linear, {c.kv_width(), 2 * H}},
      {p + "self_attn.o_proj.weight", R::linear, {H, c.q_width()}},
      {p + "post_attention_layernorm.weight", R::norm, {H}},
      {p + "mlp.gate_proj.weight", R::linear, {I, H}},
      {p + "mlp.up_proj.weight", R::linear, {I, H}},
      {p + "mlp.down_proj.weight", R::linear, {H, I}},
      {"norm.weight", R::norm, {H}},
      {"lm_head.weight", R::linear, {c.draft_vocab_size, H}},
  };
  if (c.has_d2t()) v.push_back({"d2t", R::d2t, {c.draft_vocab_size}});
  // The embedding's random values are N(0, 1) rows, as a target's (markov_embedding's rule).
  if (with_embedding) v.push_back({kEmbedName, R::markov_embedding, {c.vocab_size, H}});
  return v;
}

int64_t eagle3_param_count(const Eagle3Config& c, bool with_embedding) {
  int64_t n = 0;
  for (const auto& p : eagle3_params(c, with_embedding)) n += p.shape.numel();
  return n;
}

Eagle3Weights assemble_eagle3_weights(const Eagle3Config& c, const std::map<std::string, Tensor>& got,
                                      const Tensor& embed) {
  const std::string p = kLayerPrefix;
  auto lin = [&](const std::string& n) { return LinearWeight{got.at(n), {}}; };
  Eagle3Weights w;
  auto own = got.find(kEmbedName);
  w.embed = own != got.end() ? own->second : embed;
  K3_CHECK(w.embed.defined() && w.embed.shape().rank() == 2 && w.embed.dim(0) == c.vocab_size &&
               w.embed.dim(1) == c.hidden_size,
           "EAGLE-3 weights: the embedding " + (w.embed.defined() ? w.embed.shape().str() : std::string("(none)")) +
               " is not [" + std::to_string(c.vocab_size) + ", " + std::to_string(c.hidden_size) +
               "]: a draft narrower than its target needs its own embed_tokens.weight, and a TP-sharded target "
               "cannot lend its embedding");
  w.fc = lin("fc.weight");
  w.hidden_norm = got.at(p + "hidden_norm.weight");
  w.input_norm = got.at(p + "input_layernorm.weight");
  w.q_proj = lin(p + "self_attn.q_proj.weight");
  w.k_proj = lin(p + "self_attn.k_proj.weight");
  w.v_proj = lin(p + "self_attn.v_proj.weight");
  w.o_proj = lin(p + "self_attn.o_proj.weight");
  w.post_attn_norm = got.at(p + "post_attention_layernorm.weight");
  w.gate_proj = lin(p + "mlp.gate_proj.weight");
  w.up_proj = lin(p + "mlp.up_proj.weight");
  w.down_proj = lin(p + "mlp.down_proj.weight");
  w.final_norm = got.at("norm.weight");
  w.lm_head = lin("lm_head.weight");
  if (c.has_d2t()) w.d2t = got.at("d2t");
  return w;
}

Eagle3Weights random_eagle3_weights(const Eagle3Config& c, uint64_t seed, const Tensor& target_embed) {
  validate(c, "random_eagle3_weights");
  std::map<std::string, Tensor> got;
  for (const DraftParamSpec& p : eagle3_params(c)) {
    Tensor t = Tensor::zeros(draft_param_dtype(p), p.shape);
    fill_random_draft_param(p, seed, {static_cast<std::byte*>(t.data<void>()), static_cast<size_t>(t.nbytes())});
    got[p.name] = t;
  }
  return assemble_eagle3_weights(c, got, target_embed);
}

LoadedEagle3 load_eagle3(const fs::path& dir, const config::K3Config& target_config, const model::Weights& target) {
  LoadedEagle3 out;
  out.config = load_eagle3_config(dir / "config.json");
  const Eagle3Config& c = out.config;
  check_matches_target(c, target_config, (dir / "config.json").string());
  bool with_embedding = false;
  {
    const checkpoint::SafetensorsSet set = checkpoint::SafetensorsSet::open_dir(dir);
    for (const std::string& n : stored_names(kEmbedName)) with_embedding = with_embedding || set.find(n) != nullptr;
  }
  const auto got = read_draft_tensors(dir, eagle3_params(c, with_embedding), stored_names, ignored);
  out.weights = assemble_eagle3_weights(c, got, target.embed);
  if (c.has_d2t()) check_d2t(out.weights.d2t, c.vocab_size, dir.string());
  return out;
}

void write_random_eagle3(const Eagle3Config& c, uint64_t seed, const fs::path& out) {
  validate(c, "write_random_eagle3");
  write_random_checkpoint(out, to_json(c), eagle3_params(c, c.hidden_size != c.target_hidden_size), seed, "llama");
}

}  // namespace k3::draft
