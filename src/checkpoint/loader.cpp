// checkpoint/loader.cpp: checkpoint folder -> model::Weights (spec §4), checked against the
// parameter inventory. Tensors stay views into the mmap'd safetensors files.
#include <map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/param_inventory.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace k3::checkpoint {

namespace fs = std::filesystem;

namespace {

// Problems are collected, not thrown one by one, so a user fixing a converter sees all of
// them at once. They are grouped by kind, and each kind lists its first kMaxListedPerKind,
// so one flood (say every expert in the wrong form) cannot hide the other kinds.
constexpr size_t kMaxListedPerKind = 8;
enum ProblemKind { kDuplicate, kUnexpected, kMissing, kWrongForm, kNumKinds };
constexpr const char* kKindTitle[kNumKinds] = {"present twice", "unexpected", "missing", "wrong dtype or shape"};

struct Found {
  std::string stored_name;  // the name as the file spells it (maybe with the prefix)
  const SafetensorsSet::Entry* entry = nullptr;
};

std::string file_of(const SafetensorsSet::Entry& e) { return e.file->path().string(); }

// The checkpoint tensors that the inventory names, keyed by canonical (unprefixed) name.
class CheckedTensors {
 public:
  CheckedTensors(const SafetensorsSet& set, const std::vector<ParamSpec>& specs) : set_(set) {
    std::map<std::string, const ParamSpec*> by_name;
    for (const ParamSpec& s : specs) by_name[s.name] = &s;

    for (const auto& [stored, entry] : set.entries()) {
      if (is_skipped_tensor(stored)) continue;
      std::string canonical = stored;
      if (canonical.starts_with(kLanguageModelPrefix)) canonical.erase(0, kLanguageModelPrefix.size());
      auto [it, inserted] = found_.try_emplace(canonical, Found{stored, &entry});
      if (!inserted) {
        problem(kDuplicate, "tensor '" + canonical + "' is present twice: as '" + it->second.stored_name + "' in " +
                file_of(*it->second.entry) + " and as '" + stored + "' in " + file_of(entry));
        continue;
      }
      if (!by_name.count(canonical))
        problem(kUnexpected, "unexpected tensor '" + stored + "' in " + file_of(entry) +
                " (not a parameter of this config; only vision_tower.* and mm_projector.* are skipped)");
    }
    for (const ParamSpec& s : specs) {
      auto it = found_.find(s.name);
      if (it == found_.end()) {
        problem(kMissing, "missing tensor '" + s.name + "' (expected " + s.describe() + ") in " + where());
        continue;
      }
      const TensorInfo& info = *it->second.entry->info;
      const bool dtype_ok = s.accepts_dtype(info.dtype), shape_ok = s.accepts_shape(info.shape);
      if (!dtype_ok || !shape_ok)
        problem(kWrongForm, std::string(!dtype_ok && !shape_ok ? "wrong dtype and shape" : !dtype_ok ? "wrong dtype" : "wrong shape") +
                " for tensor '" + it->second.stored_name + "' in " + file_of(*it->second.entry) + ": expected " +
                s.describe() + ", found " + std::string(core::dtype_name(info.dtype)) + " " + info.shape.str());
    }
    size_t total = 0;
    for (const auto& list : problems_) total += list.size();
    if (total == 0) return;
    std::string msg = "checkpoint " + set.dir().string() + ": " + std::to_string(total) + " problem(s) with the tensors:";
    for (int k = 0; k < kNumKinds; ++k) {
      const auto& list = problems_[k];
      if (list.empty()) continue;
      msg += "\n " + std::to_string(list.size()) + " " + kKindTitle[k] + ":";
      for (size_t i = 0; i < list.size() && i < kMaxListedPerKind; ++i) msg += "\n  " + list[i];
      if (list.size() > kMaxListedPerKind)
        msg += "\n  ... and " + std::to_string(list.size() - kMaxListedPerKind) + " more " + kKindTitle[k];
    }
    throw core::Error(msg);
  }

  // The tensor for canonical `name`, already checked. A view into the mapping unless the
  // file placed it misaligned for its dtype (a writer that does not sort by dtype), in which
  // case it is copied so the kernels may read it as typed data.
  core::Tensor get(const std::string& name) const {
    auto it = found_.find(name);
    K3_CHECK(it != found_.end(), "checkpoint loader: internal: '" + name + "' not in the inventory");
    core::Tensor t = set_.tensor(*it->second.entry);
    const auto addr = reinterpret_cast<uintptr_t>(t.data<void>());
    if (addr % core::dtype_size(t.dtype()) != 0) return core::Tensor::copy_of(t.view());
    return t;
  }
  model::LinearWeight linear(const std::string& name) const { return {get(name), {}}; }
  bool has(const std::string& name) const { return found_.count(name) != 0; }

 private:
  void problem(ProblemKind kind, std::string p) { problems_[kind].push_back(std::move(p)); }
  std::string where() const {
    return (set_.dir() / (set_.sharded() ? kIndexFileName : kSingleFileName)).string();
  }

  const SafetensorsSet& set_;
  std::map<std::string, Found> found_;
  std::vector<std::string> problems_[kNumKinds];
};

model::AttnResWeights attn_res(const CheckedTensors& t, const std::string& proj, const std::string& norm) {
  return {t.get(proj), t.get(norm)};
}

model::KdaWeights kda_weights(const CheckedTensors& t, const std::string& a) {
  model::KdaWeights w;
  w.q_proj = t.linear(a + "q_proj.weight");
  w.k_proj = t.linear(a + "k_proj.weight");
  w.v_proj = t.linear(a + "v_proj.weight");
  w.g_proj = t.linear(a + "g_proj.weight");
  w.o_proj = t.linear(a + "o_proj.weight");
  w.f_a_proj = t.linear(a + "f_a_proj.weight");
  w.f_b_proj = t.linear(a + "f_b_proj.weight");
  w.b_proj = t.linear(a + "b_proj.weight");
  w.q_conv = t.get(a + "q_conv1d.weight");
  w.k_conv = t.get(a + "k_conv1d.weight");
  w.v_conv = t.get(a + "v_conv1d.weight");
  w.a_log = t.get(a + "A_log");
  w.dt_bias = t.get(a + "dt_bias");
  w.o_norm = t.get(a + "o_norm.weight");
  return w;
}

model::MlaWeights mla_weights(const CheckedTensors& t, const std::string& a) {
  model::MlaWeights w;
  w.q_a_proj = t.linear(a + "q_a_proj.weight");
  w.q_a_norm = t.get(a + "q_a_layernorm.weight");
  w.q_b_proj = t.linear(a + "q_b_proj.weight");
  w.kv_a_proj = t.linear(a + "kv_a_proj_with_mqa.weight");
  w.kv_a_norm = t.get(a + "kv_a_layernorm.weight");
  w.kv_b_proj = t.linear(a + "kv_b_proj.weight");
  if (t.has(a + "g_proj.weight")) w.g_proj = t.linear(a + "g_proj.weight");  // absent without output gate
  w.o_proj = t.linear(a + "o_proj.weight");
  return w;
}

model::MoeWeights moe_weights(const CheckedTensors& t, const std::string& m, const config::K3Config& c) {
  model::MoeWeights w;
  w.router = t.linear(m + "gate.weight");
  w.router_bias = t.get(m + "gate.e_score_correction_bias");
  w.latent_down = t.linear(m + "routed_expert_down_proj.weight");
  if (c.moe.latent_moe_use_norm) w.latent_norm = t.get(m + "routed_expert_norm.weight");
  w.latent_up = t.linear(m + "routed_expert_up_proj.weight");
  auto expert = [&](const std::string& base) -> model::LinearWeight {
    if (c.mxfp4.enabled) return {t.get(base + ".weight_packed"), t.get(base + ".weight_scale")};
    return t.linear(base + ".weight");
  };
  for (int e = 0; e < c.moe.num_experts; ++e) {
    const std::string x = m + "experts." + std::to_string(e) + ".";
    w.w1.push_back(expert(x + "w1"));
    w.w2.push_back(expert(x + "w2"));
    w.w3.push_back(expert(x + "w3"));
  }
  if (c.moe.shared_intermediate() > 0) {
    w.shared_gate = t.linear(m + "shared_experts.gate_proj.weight");
    w.shared_up = t.linear(m + "shared_experts.up_proj.weight");
    w.shared_down = t.linear(m + "shared_experts.down_proj.weight");
  }
  return w;
}

}  // namespace

model::Weights load_weights(const fs::path& dir, const config::K3Config& config) {
  const std::vector<ParamSpec> specs = expected_params(config);
  const SafetensorsSet set = SafetensorsSet::open_dir(dir);
  const CheckedTensors t(set, specs);  // throws listing every problem

  model::Weights w;
  w.embed = t.get("model.embed_tokens.weight");
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    model::LayerWeights lw;
    lw.input_norm = t.get(p + "input_layernorm.weight");
    lw.post_attn_norm = t.get(p + "post_attention_layernorm.weight");
    lw.attn_res = attn_res(t, p + "self_attention_res_proj.weight", p + "self_attention_res_norm.weight");
    lw.mlp_res = attn_res(t, p + "mlp_res_proj.weight", p + "mlp_res_norm.weight");
    if (config.attn_kind(l) == config::AttnKind::kda)
      lw.attn = kda_weights(t, p + "self_attn.");
    else
      lw.attn = mla_weights(t, p + "self_attn.");
    if (config.ffn_kind(l) == config::FfnKind::dense)
      lw.ffn = model::DenseFfnWeights{t.linear(p + "mlp.gate_proj.weight"), t.linear(p + "mlp.up_proj.weight"),
                                      t.linear(p + "mlp.down_proj.weight")};
    else
      lw.ffn = moe_weights(t, p + "block_sparse_moe.", config);
    w.layers.push_back(std::move(lw));
  }
  w.output_res = attn_res(t, "model.output_attn_res_proj.weight", "model.output_attn_res_norm.weight");
  w.final_norm = t.get("model.norm.weight");
  // Tied embeddings: the inventory has no lm_head and the head reads the embedding table.
  w.lm_head = config.tie_word_embeddings ? model::LinearWeight{w.embed, {}} : t.linear("lm_head.weight");
  return w;
}

LoadedModel load_checkpoint(const fs::path& dir) {
  LoadedModel m;
  m.config = config::load_config(dir / "config.json");
  m.weights = load_weights(dir, m.config);
  return m;
}

}  // namespace k3::checkpoint
