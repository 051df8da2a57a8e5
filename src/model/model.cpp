// model/model.cpp: the top-level forward pass over the AttnRes stream (spec §3).
#include "model/model.h"

#include <cstring>
#include <variant>

namespace k3::model {

namespace {

// Copies the listed rows of a [rows, cols] f32 tensor into a new tensor.
core::Tensor gather_rows(const core::Tensor& t, const std::vector<int64_t>& rows) {
  const int64_t cols = t.dim(1);
  core::Tensor out = core::Tensor::zeros(core::DType::f32, {static_cast<int64_t>(rows.size()), cols});
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.data<float>() + static_cast<int64_t>(i) * cols, t.data<const float>() + rows[i] * cols,
                static_cast<size_t>(cols) * sizeof(float));
  return out;
}

void check_schedule(const config::K3Config& c, const Weights& w) {
  K3_CHECK(static_cast<int>(w.layers.size()) == c.num_hidden_layers,
           "weights have " + std::to_string(w.layers.size()) + " layers, config has " +
               std::to_string(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const auto& lw = w.layers[static_cast<size_t>(l)];
    const bool kda = std::holds_alternative<KdaWeights>(lw.attn);
    const bool moe = std::holds_alternative<MoeWeights>(lw.ffn);
    K3_CHECK(kda == (c.attn_kind(l) == config::AttnKind::kda),
             "layer " + std::to_string(l) + ": attention weights do not match the config's layer lists");
    K3_CHECK(moe == (c.ffn_kind(l) == config::FfnKind::moe),
             "layer " + std::to_string(l) + ": FFN weights do not match first_k_dense_replace/moe_layer_freq");
  }
}

}  // namespace

Model::Model(const config::K3Config& config, const Weights& weights, const kernels::Registry& ops,
             ModelOptions options)
    : config_(config), weights_(weights), ops_(ops), options_(options) {
  check_schedule(config_, weights_);
  router_bias_.resize(weights_.layers.size());
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    const auto* moe = std::get_if<MoeWeights>(&weights_.layers[l].ffn);
    if (!moe) continue;
    core::Tensor bias = core::Tensor::zeros(core::DType::f32, {moe->router_bias.numel()});
    for (int64_t e = 0; e < bias.numel(); ++e)
      bias.data<float>()[e] = kernels::round_act(kernels::load_f32(moe->router_bias.view(), e), options_.precision);
    router_bias_[l] = std::move(bias);
  }
}

core::Tensor Model::forward(KvStorage& kv, std::span<const SequenceInput> batch, LogitRows rows,
                            const TraceFn* trace) const {
  // Lay the sequences out as consecutive row segments.
  std::vector<Segment> segments;
  std::vector<int32_t> ids;
  for (const SequenceInput& in : batch) {
    K3_CHECK(in.state != nullptr, "forward: a sequence has no state");
    K3_CHECK(!in.tokens.empty(), "forward: a sequence has no tokens");
    const int64_t need = in.state->num_tokens + static_cast<int64_t>(in.tokens.size());
    const int64_t have = static_cast<int64_t>(in.state->block_table.size()) * kv.storage_config().block_size;
    K3_CHECK(need <= have, "forward: a sequence's block table covers " + std::to_string(have) + " tokens, the step needs " +
                               std::to_string(need));
    const auto begin = static_cast<int64_t>(ids.size());
    ids.insert(ids.end(), in.tokens.begin(), in.tokens.end());
    segments.push_back({begin, static_cast<int64_t>(ids.size()), in.state, in.kind});
  }
  const auto n = static_cast<int64_t>(ids.size());
  K3_CHECK(n > 0, "forward: empty batch");
  const ForwardContext ctx{config_, kv, ops_, options_, segments, trace};

  core::Tensor prefix = ctx.alloc(n, config_.hidden_size);  // P: running sum of the current block
  ops_.embedding.run({core::TensorView::contiguous(ids.data(), core::DType::i32, {n}), weights_.embed.view(),
                      prefix.view()},
                     options_.device);
  ctx.emit("embed", -1, prefix);

  std::vector<core::Tensor> bank;  // completed block sums, embedding first (at most ceil(L / block))
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    const LayerWeights& lw = weights_.layers[static_cast<size_t>(l)];
    core::Tensor h = attn_res_mix(ctx, bank, prefix, lw.attn_res);
    const bool restart = config_.is_bank_write_layer(l);
    if (restart) bank.push_back(prefix);  // snapshot the block sum before restarting
    const core::Tensor x = ctx.rmsnorm(h, lw.input_norm, config_.rms_norm_eps);
    const core::Tensor a = std::visit([&](const auto& w) { return attention(ctx, l, w, x); }, lw.attn);
    ctx.emit("attn.out", l, a);
    prefix = restart ? a : ctx.add(prefix, a);

    h = attn_res_mix(ctx, bank, prefix, lw.mlp_res);
    const core::Tensor fx = ctx.rmsnorm(h, lw.post_attn_norm, config_.rms_norm_eps);
    const core::Tensor f = std::visit(
        [&](const auto& w) {
          if constexpr (std::is_same_v<std::decay_t<decltype(w)>, MoeWeights>)
            return ffn(ctx, l, w, router_bias_[static_cast<size_t>(l)], fx);
          else
            return ffn(ctx, l, w, fx);
        },
        lw.ffn);
    ctx.emit("ffn.out", l, f);
    prefix = ctx.add(prefix, f);
    ctx.emit("prefix", l, prefix);
  }
  for (const Segment& s : segments) s.state->num_tokens += s.rows();

  // Final Mix -> norm -> lm_head, only on the rows whose logits are wanted.
  if (rows == LogitRows::last) {
    std::vector<int64_t> last;
    for (const Segment& s : segments) last.push_back(s.row_end - 1);
    prefix = gather_rows(prefix, last);
    for (core::Tensor& b : bank) b = gather_rows(b, last);
  }
  const core::Tensor h = attn_res_mix(ctx, bank, prefix, weights_.output_res);
  const core::Tensor x = ctx.rmsnorm(h, weights_.final_norm, config_.rms_norm_eps);
  core::Tensor logits = ctx.linear(x, weights_.lm_head, /*round_output=*/false);
  ctx.emit("logits", -1, logits);
  return logits;
}

}  // namespace k3::model
