// draft/draft_weights.cpp: the draft checkpoint inventory, its loader and the random writer.
#include "draft/draft_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint/random_init.h"
#include "checkpoint/safetensors.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/rng.h"

namespace k3::draft {

namespace fs = std::filesystem;

namespace {

std::string shape_str(const core::Shape& s) { return s.str(); }

void add(std::vector<DraftParamSpec>& v, std::string name, DraftParamRole role, core::Shape shape) {
  v.push_back({std::move(name), role, shape});
}

}  // namespace

std::vector<DraftParamSpec> draft_params(const DraftConfig& c) {
  const int64_t H = c.hidden_size, V = c.vocab_size, Vd = c.draft_vocab_size, R = c.markov_rank;
  const int64_t NH = c.num_heads, I = c.intermediate_size;
  std::vector<DraftParamSpec> v;
  using R_ = DraftParamRole;
  add(v, "context_proj.weight", R_::linear, {H, int64_t{c.num_taps()} * H});
  add(v, "context_norm.weight", R_::norm, {H});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(v, p + "input_layernorm.weight", R_::norm, {H});
    add(v, p + "self_attn.q_a_proj.weight", R_::linear, {c.q_lora_rank, H});
    add(v, p + "self_attn.q_a_layernorm.weight", R_::norm, {c.q_lora_rank});
    add(v, p + "self_attn.q_b_proj.weight", R_::linear, {NH * c.q_head_dim(), c.q_lora_rank});
    add(v, p + "self_attn.kv_a_proj_with_mqa.weight", R_::linear, {c.cache_dim(), H});
    add(v, p + "self_attn.kv_a_layernorm.weight", R_::norm, {c.kv_lora_rank});
    add(v, p + "self_attn.kv_b_proj.weight", R_::linear, {NH * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank});
    add(v, p + "self_attn.o_proj.weight", R_::linear, {H, NH * c.v_head_dim});
    add(v, p + "post_attention_layernorm.weight", R_::norm, {H});
    add(v, p + "mlp.gate_proj.weight", R_::linear, {I, H});
    add(v, p + "mlp.up_proj.weight", R_::linear, {I, H});
    add(v, p + "mlp.down_proj.weight", R_::linear, {H, I});
  }
  add(v, "norm.weight", R_::norm, {H});
  if (!c.share_target_lm_head) add(v, "lm_head.weight", R_::linear, {Vd, H});
  add(v, "markov_w1.weight", R_::markov_embedding, {V, R});
  add(v, "markov_w2.weight", R_::linear, {Vd, R});
  if (c.use_confidence_head) add(v, "confidence_head.weight", R_::linear, {1, H + R});
  if (c.has_d2t()) add(v, "d2t", R_::d2t, {Vd});
  return v;
}

int64_t draft_param_count(const DraftConfig& c) {
  int64_t n = 0;
  for (const auto& p : draft_params(c)) n += p.shape.numel();
  return n;
}

DraftWeights assemble_draft_weights(const DraftConfig& c, const std::map<std::string, Tensor>& got, const Tensor& embed,
                                    const LinearWeight* target_lm_head) {
  DraftWeights w;
  auto lin = [&](const std::string& n) { return LinearWeight{got.at(n), {}}; };
  K3_CHECK(embed.defined() && embed.shape().rank() == 2 && embed.dim(0) == c.vocab_size &&
               embed.dim(1) == c.hidden_size,
           "draft weights: the target's embed_tokens is not [" + std::to_string(c.vocab_size) + ", " +
               std::to_string(c.hidden_size) + "] (a TP-sharded target cannot lend its embedding)");
  w.embed = embed;
  w.context_proj = lin("context_proj.weight");
  w.context_norm = got.at("context_norm.weight");
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    DraftLayerWeights lw;
    lw.input_norm = got.at(p + "input_layernorm.weight");
    lw.q_a_proj = lin(p + "self_attn.q_a_proj.weight");
    lw.q_a_norm = got.at(p + "self_attn.q_a_layernorm.weight");
    lw.q_b_proj = lin(p + "self_attn.q_b_proj.weight");
    lw.kv_a_proj = lin(p + "self_attn.kv_a_proj_with_mqa.weight");
    lw.kv_a_norm = got.at(p + "self_attn.kv_a_layernorm.weight");
    lw.kv_b_proj = lin(p + "self_attn.kv_b_proj.weight");
    lw.o_proj = lin(p + "self_attn.o_proj.weight");
    lw.post_attn_norm = got.at(p + "post_attention_layernorm.weight");
    lw.gate_proj = lin(p + "mlp.gate_proj.weight");
    lw.up_proj = lin(p + "mlp.up_proj.weight");
    lw.down_proj = lin(p + "mlp.down_proj.weight");
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = got.at("norm.weight");
  if (c.share_target_lm_head) {
    K3_CHECK(target_lm_head && target_lm_head->weight.defined() && !target_lm_head->is_mxfp4() &&
                 target_lm_head->out_features() == c.vocab_size && target_lm_head->in_features() == c.hidden_size,
             "draft weights: share_target_lm_head needs the target's full BF16 lm_head [vocab, hidden]");
    w.lm_head = *target_lm_head;
  } else {
    w.lm_head = lin("lm_head.weight");
  }
  w.markov_w1 = got.at("markov_w1.weight");
  w.markov_w2 = lin("markov_w2.weight");
  if (c.use_confidence_head) w.confidence_head = lin("confidence_head.weight");
  if (c.has_d2t()) w.d2t = got.at("d2t");
  return w;
}

void fill_random_draft_param(const DraftParamSpec& p, uint64_t seed, std::span<std::byte> bytes) {
  const int64_t n = p.shape.numel();
  if (p.role == DraftParamRole::d2t) {  // identity prefix: draft id d is target id d
    K3_CHECK(static_cast<int64_t>(bytes.size()) == n * 8, "fill_random_draft_param: wrong size for " + p.name);
    std::memset(bytes.data(), 0, bytes.size());
    return;
  }
  K3_CHECK(static_cast<int64_t>(bytes.size()) == n * 2, "fill_random_draft_param: wrong size for " + p.name);
  core::Rng rng = core::Rng(seed).fork(core::Rng::hash(p.name.c_str()));
  double mean = 0, std = 1;
  switch (p.role) {
    case DraftParamRole::linear: std = 1.0 / std::sqrt(double(p.shape[1])); break;
    case DraftParamRole::norm: mean = 1.0, std = 0.05; break;
    case DraftParamRole::markov_embedding: std = 1.0; break;
    case DraftParamRole::d2t: break;
  }
  auto* dst = reinterpret_cast<uint16_t*>(bytes.data());
  if (n <= kDraftSequentialMaxValues) {
    for (int64_t i = 0; i < n; ++i) dst[i] = core::f32_to_bf16_bits(static_cast<float>(rng.normal(mean, std)));
    return;
  }
  // Large tensors (K3 widths: 3.5 B values in all): four table quantiles per draw, as the target
  // writer's bulk path (checkpoint/random_init.h), far cheaper than Box-Muller.
  const float* q = checkpoint::bulk_normal_quantiles();
  for (int64_t i = 0; i < n; i += 4) {
    uint64_t u = rng.next_u64();
    for (int64_t j = i; j < std::min(n, i + 4); ++j, u >>= 16)
      dst[j] = core::f32_to_bf16_bits(static_cast<float>(mean + std * double(q[u & 0xffff])));
  }
}

core::DType draft_param_dtype(const DraftParamSpec& p) {
  return p.role == DraftParamRole::d2t ? core::DType::i64 : core::DType::bf16;
}

DraftWeights random_draft_weights(const DraftConfig& c, uint64_t seed, const Tensor& embed,
                                  const LinearWeight* target_lm_head) {
  validate(c, "random_draft_weights");
  std::map<std::string, Tensor> got;
  for (const DraftParamSpec& p : draft_params(c)) {
    Tensor t = Tensor::zeros(draft_param_dtype(p), p.shape);
    fill_random_draft_param(p, seed, {static_cast<std::byte*>(t.data<void>()), static_cast<size_t>(t.nbytes())});
    got[p.name] = t;
  }
  return assemble_draft_weights(c, got, embed, target_lm_head);
}

std::map<std::string, Tensor> read_draft_tensors(const fs::path& dir, const std::vector<DraftParamSpec>& params,
                                                 const StoredNamesFn& stored_names,
                                                 const std::function<bool(const std::string&)>& ignored) {
  const checkpoint::SafetensorsSet set = checkpoint::SafetensorsSet::open_dir(dir);
  std::map<std::string, Tensor> got;
  std::set<std::string> used;
  for (const DraftParamSpec& p : params) {
    const checkpoint::SafetensorsSet::Entry* e = nullptr;
    std::string stored;
    for (const std::string& n : stored_names(p.name))
      if ((e = set.find(n))) {
        stored = n;
        break;
      }
    if (!e) throw core::Error(dir.string() + ": draft checkpoint lacks tensor " + p.name);
    const std::string where = e->file->path().string() + ": tensor " + stored;
    const core::DType dt = e->info->dtype;
    const bool float_ok = dt == core::DType::bf16 || dt == core::DType::f32;
    const bool int_ok = dt == core::DType::i64;
    if (p.role == DraftParamRole::d2t ? !int_ok : !float_ok)
      throw core::Error(where + ": dtype " + std::string(core::dtype_name(dt)) + ", expected " +
                        (p.role == DraftParamRole::d2t ? "I64" : "BF16 or F32"));
    if (!(e->info->shape == p.shape))
      throw core::Error(where + ": shape " + shape_str(e->info->shape) + ", expected " + shape_str(p.shape));
    got[p.name] = set.tensor(*e);
    used.insert(stored);
  }
  for (const auto& [name, e] : set.entries())
    if (!used.count(name) && !ignored(name))
      throw core::Error(e.file->path().string() + ": unexpected tensor " + name + " in the draft checkpoint");
  return got;
}

void check_d2t(const Tensor& d2t, int64_t vocab_size, const std::string& source) {
  const int64_t* d = d2t.data<const int64_t>();
  for (int64_t i = 0; i < d2t.numel(); ++i)
    if (i + d[i] < 0 || i + d[i] >= vocab_size)
      throw core::Error(source + ": d2t[" + std::to_string(i) + "] = " + std::to_string(d[i]) + " maps draft id " +
                        std::to_string(i) + " outside the target vocabulary");
}

LoadedDraft load_draft(const fs::path& dir, const config::K3Config& target_config, const model::Weights& target) {
  LoadedDraft out;
  out.config = load_draft_config(dir / "config.json");
  const DraftConfig& c = out.config;
  check_matches_target(c, target_config, (dir / "config.json").string());
  const auto got = read_draft_tensors(
      dir, draft_params(c),
      [](const std::string& n) {
        return std::vector<std::string>{n, "model." + n};
      },
      [](const std::string&) { return false; });
  out.weights = assemble_draft_weights(c, got, target.embed, &target.lm_head);
  if (c.has_d2t()) check_d2t(out.weights.d2t, c.vocab_size, dir.string());
  return out;
}

void write_random_checkpoint(const fs::path& out, const nlohmann::json& config,
                             const std::vector<DraftParamSpec>& params, uint64_t seed, const std::string& model_type) {
  fs::create_directories(out);
  {
    std::ofstream f(out / "config.json", std::ios::binary | std::ios::trunc);
    K3_CHECK(f.good(), "write_random_checkpoint: cannot create " + (out / "config.json").string());
    f << config.dump(2) << "\n";
    K3_CHECK(f.good(), "write_random_checkpoint: writing " + (out / "config.json").string() + " failed");
  }
  std::vector<checkpoint::TensorEntry> entries;
  std::map<std::string, DraftParamSpec> by_name;
  for (const auto& p : params) {
    entries.push_back({p.name, draft_param_dtype(p), p.shape});
    by_name[p.name] = p;
  }
  auto fill = [&](const checkpoint::TensorEntry& e, std::span<std::byte> bytes) {
    fill_random_draft_param(by_name.at(e.name), seed, bytes);
  };
  // A folder reused for a sharded checkpoint must not keep its index beside the single file.
  std::filesystem::remove(out / checkpoint::kIndexFileName);
  checkpoint::write_safetensors(out / checkpoint::kSingleFileName, entries, fill,
                                {{"format", "pt"}, {"model_type", model_type}});
}

void write_random_draft(const DraftConfig& c, uint64_t seed, const fs::path& out) {
  validate(c, "write_random_draft");
  write_random_checkpoint(out, to_json(c), draft_params(c), seed, kDsparkModelType);
}

}  // namespace k3::draft
