// checkpoint/param_inventory.cpp: the spec §4 tensor list for any K3-family config.
#include "checkpoint/param_inventory.h"

#include <algorithm>

#include "core/error.h"
#include "core/fp4.h"

namespace k3::checkpoint {

using core::DType;
using core::Shape;

bool ParamSpec::accepts_dtype(DType t) const { return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end(); }

bool ParamSpec::accepts_shape(const Shape& s) const {
  return std::find(shapes.begin(), shapes.end(), s) != shapes.end();
}

std::string ParamSpec::describe() const {
  std::string d;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (i) d += '/';
    d += core::dtype_name(dtypes[i]);
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    d += i ? " or " : " ";
    d += shapes[i].str();
  }
  return d;
}

bool is_skipped_tensor(std::string_view name) {
  if (name.starts_with(kLanguageModelPrefix)) name.remove_prefix(kLanguageModelPrefix.size());
  return name.starts_with("vision_tower.") || name.starts_with("mm_projector.");
}

namespace {

// Dtypes each role accepts. BF16 is what K3 ships and what the writer writes for weights and
// norms; F32 is also accepted there because the reference ops read both (kernels/common.h).
// The KDA conv/A_log/dt_bias and the router bias are F32 in the checkpoint and are consumed
// as F32 views, so they accept F32 only. KDA o_norm is F32 in the real headers.
const std::vector<DType> kBf16OrF32 = {DType::bf16, DType::f32};
const std::vector<DType> kF32OrBf16 = {DType::f32, DType::bf16};
const std::vector<DType> kF32 = {DType::f32};
const std::vector<DType> kU8 = {DType::u8};

class Builder {
 public:
  explicit Builder(bool mxfp4) : mxfp4_(mxfp4) {}
  std::vector<ParamSpec> specs;

  void add(std::string name, ParamRole role, std::vector<DType> dtypes, std::vector<Shape> shapes) {
    ParamSpec s;
    s.value_name = name;
    s.name = std::move(name);
    s.role = role;
    s.dtypes = std::move(dtypes);
    s.shapes = std::move(shapes);
    specs.push_back(std::move(s));
  }
  void linear(const std::string& name, int64_t out, int64_t in, bool feeds_situ = false) {
    add(name, ParamRole::linear, kBf16OrF32, {{out, in}});
    set_logical(out, in, feeds_situ);
  }
  void norm(const std::string& name, int64_t n, const std::vector<DType>& dtypes = kBf16OrF32) {
    add(name, ParamRole::norm, dtypes, {{n}});
  }
  // A routed-expert weight "<base>.weight": BF16 [out, in], or the MXFP4 pair.
  void expert(const std::string& base, int64_t out, int64_t in, bool feeds_situ) {
    const std::string value_name = base + ".weight";
    if (!mxfp4_) {
      add(value_name, ParamRole::expert_weight, kBf16OrF32, {{out, in}});
      set_logical(out, in, feeds_situ);
      return;
    }
    add(base + ".weight_packed", ParamRole::expert_packed, kU8, {{out, in / 2}});
    set_logical(out, in, feeds_situ);
    specs.back().value_name = value_name;
    add(base + ".weight_scale", ParamRole::expert_scale, kU8, {{out, in / core::kMxfp4Group}});
    set_logical(out, in, feeds_situ);
    specs.back().value_name = value_name;
  }

 private:
  void set_logical(int64_t out, int64_t in, bool feeds_situ) {
    specs.back().out_features = out;
    specs.back().in_features = in;
    specs.back().feeds_situ = feeds_situ;
  }

  bool mxfp4_;
};

void check_config(const config::K3Config& c) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw core::Error("checkpoint inventory: config " + what);
  };
  need(c.vocab_size > 0 && c.hidden_size > 0 && c.num_hidden_layers > 0,
       "needs positive vocab_size, hidden_size, num_hidden_layers");
  need(static_cast<int>(c.attn_kinds.size()) == c.num_hidden_layers,
       "has " + std::to_string(c.attn_kinds.size()) + " attention kinds for " + std::to_string(c.num_hidden_layers) +
           " layers");
  need(c.moe_layer_freq > 0, "needs moe_layer_freq > 0");
  const bool any_kda = std::count(c.attn_kinds.begin(), c.attn_kinds.end(), config::AttnKind::kda) > 0;
  const bool any_mla = std::count(c.attn_kinds.begin(), c.attn_kinds.end(), config::AttnKind::mla) > 0;
  if (any_kda) {
    need(c.kda.num_heads > 0 && c.kda.head_dim > 0 && c.kda.short_conv_kernel_size > 0,
         "needs positive linear_attn_config num_heads, head_dim, short_conv_kernel_size");
    need(c.kda.use_full_rank_gate,
         "has use_full_rank_gate=false (low-rank KDA output gate), which k3serve does not model");
  }
  if (any_mla) {
    need(c.mla.num_heads > 0 && c.mla.q_lora_rank > 0 && c.mla.kv_lora_rank > 0 && c.mla.qk_nope_head_dim > 0 &&
             c.mla.qk_rope_head_dim >= 0 && c.mla.v_head_dim > 0,
         "needs positive MLA sizes (num_attention_heads, q_lora_rank, kv_lora_rank, qk_nope/v_head_dim)");
  }
  bool any_moe = false, any_dense = false;
  for (int l = 0; l < c.num_hidden_layers; ++l) (c.ffn_kind(l) == config::FfnKind::moe ? any_moe : any_dense) = true;
  if (any_dense) need(c.intermediate_size > 0, "needs intermediate_size > 0 for its dense layers");
  if (any_moe) {
    need(c.moe.num_experts > 0 && c.moe.moe_intermediate_size > 0 && c.moe.routed_expert_hidden_size > 0,
         "needs positive num_experts, moe_intermediate_size, routed_expert_hidden_size");
    if (c.mxfp4.enabled) {
      need(c.mxfp4.group_size == core::kMxfp4Group,
           "has MXFP4 group size " + std::to_string(c.mxfp4.group_size) + ", only 32 is supported");
      need(c.moe.routed_expert_hidden_size % core::kMxfp4Group == 0 &&
               c.moe.moe_intermediate_size % core::kMxfp4Group == 0,
           "has MXFP4 experts but routed_expert_hidden_size (" + std::to_string(c.moe.routed_expert_hidden_size) +
               ") or moe_intermediate_size (" + std::to_string(c.moe.moe_intermediate_size) +
               ") is not a multiple of 32");
    }
  }
}

}  // namespace

std::vector<ParamSpec> expected_params(const config::K3Config& c) {
  check_config(c);
  Builder b(c.mxfp4.enabled);
  const int64_t hidden = c.hidden_size;
  b.add("model.embed_tokens.weight", ParamRole::embedding, kBf16OrF32, {{c.vocab_size, hidden}});

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    b.norm(p + "input_layernorm.weight", hidden);
    b.norm(p + "self_attention_res_norm.weight", hidden);
    b.add(p + "self_attention_res_proj.weight", ParamRole::attn_res_query, kBf16OrF32, {{1, hidden}});

    const std::string a = p + "self_attn.";
    if (c.attn_kind(l) == config::AttnKind::kda) {
      const int64_t H = c.kda.num_heads, D = c.kda.head_dim, P = c.kda.proj_dim();
      b.linear(a + "q_proj.weight", P, hidden);
      b.linear(a + "k_proj.weight", P, hidden);
      b.linear(a + "v_proj.weight", P, hidden);
      b.linear(a + "g_proj.weight", P, hidden);
      b.linear(a + "f_a_proj.weight", D, hidden);  // the decay's low-rank width equals head_dim
      b.linear(a + "f_b_proj.weight", P, D);
      b.linear(a + "b_proj.weight", H, hidden);
      for (const char* conv : {"q_conv1d", "k_conv1d", "v_conv1d"})
        b.add(a + conv + ".weight", ParamRole::kda_conv, kF32, {{P, 1, c.kda.short_conv_kernel_size}});
      // K3 stores [head_dim] with entries [num_heads:] zero; the HF reference declares [num_heads].
      // [head_dim] can hold one value per head only when num_heads <= head_dim.
      std::vector<Shape> a_log_shapes;
      if (H <= D) a_log_shapes.push_back({D});
      if (H != D) a_log_shapes.push_back({H});
      b.add(a + "A_log", ParamRole::kda_a_log, kF32, a_log_shapes);
      b.add(a + "dt_bias", ParamRole::kda_dt_bias, kF32, {{P}});
      b.norm(a + "o_norm.weight", D, kF32OrBf16);
      b.linear(a + "o_proj.weight", hidden, P);
    } else {
      const auto& m = c.mla;
      const int64_t H = m.num_heads;
      b.linear(a + "q_a_proj.weight", m.q_lora_rank, hidden);
      b.norm(a + "q_a_layernorm.weight", m.q_lora_rank);
      b.linear(a + "q_b_proj.weight", H * m.q_head_dim(), m.q_lora_rank);
      b.linear(a + "kv_a_proj_with_mqa.weight", m.kv_lora_rank + m.qk_rope_head_dim, hidden);
      b.norm(a + "kv_a_layernorm.weight", m.kv_lora_rank);
      b.linear(a + "kv_b_proj.weight", H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank);
      if (m.use_output_gate) b.linear(a + "g_proj.weight", H * m.v_head_dim, hidden);
      b.linear(a + "o_proj.weight", hidden, H * m.v_head_dim);
    }

    b.norm(p + "post_attention_layernorm.weight", hidden);
    b.norm(p + "mlp_res_norm.weight", hidden);
    b.add(p + "mlp_res_proj.weight", ParamRole::attn_res_query, kBf16OrF32, {{1, hidden}});

    if (c.ffn_kind(l) == config::FfnKind::dense) {
      const int64_t I = c.intermediate_size;
      b.linear(p + "mlp.gate_proj.weight", I, hidden, /*feeds_situ=*/true);
      b.linear(p + "mlp.up_proj.weight", I, hidden, /*feeds_situ=*/true);
      b.linear(p + "mlp.down_proj.weight", hidden, I);
    } else {
      const auto& moe = c.moe;
      const int64_t E = moe.num_experts, L = moe.routed_expert_hidden_size, I = moe.moe_intermediate_size;
      const std::string m = p + "block_sparse_moe.";
      b.linear(m + "gate.weight", E, hidden);
      b.add(m + "gate.e_score_correction_bias", ParamRole::router_bias, kF32, {{E}});
      b.linear(m + "routed_expert_down_proj.weight", L, hidden);
      if (moe.latent_moe_use_norm) b.norm(m + "routed_expert_norm.weight", L);
      b.linear(m + "routed_expert_up_proj.weight", hidden, L);
      for (int e = 0; e < E; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        b.expert(x + "w1", I, L, /*feeds_situ=*/true);   // gate
        b.expert(x + "w2", L, I, /*feeds_situ=*/false);  // down
        b.expert(x + "w3", I, L, /*feeds_situ=*/true);   // up
      }
      if (moe.shared_intermediate() > 0) {
        const int64_t S = moe.shared_intermediate();
        b.linear(m + "shared_experts.gate_proj.weight", S, hidden, /*feeds_situ=*/true);
        b.linear(m + "shared_experts.up_proj.weight", S, hidden, /*feeds_situ=*/true);
        b.linear(m + "shared_experts.down_proj.weight", hidden, S);
      }
    }
  }

  b.norm("model.output_attn_res_norm.weight", hidden);
  b.add("model.output_attn_res_proj.weight", ParamRole::attn_res_query, kBf16OrF32, {{1, hidden}});
  b.norm("model.norm.weight", hidden);
  if (!c.tie_word_embeddings) b.linear("lm_head.weight", c.vocab_size, hidden);
  return std::move(b.specs);
}

}  // namespace k3::checkpoint
