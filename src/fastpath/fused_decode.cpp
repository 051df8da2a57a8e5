// fastpath/fused_decode.cpp: the fused decode step (see fused_decode.h for the scope and the plan).
#include "fastpath/fused_decode.h"

#include <variant>

#include "fastpath/fused_layers.h"
#include "kernels/attn_res/attn_res_fused.h"

#ifdef K3_HAVE_CUDA
#include "backends/cuda/device.h"
#endif

namespace k3::fastpath {

namespace {

using core::Tensor;
using model::ForwardContext;

class FusedDecodePath final : public model::FusedDecode {
 public:
  FusedDecodePath(const model::Model& model, std::string device_problem)
      : model_(model), device_problem_(std::move(device_problem)) {
    // The AttnRes stream's fused ops take a bounded bank and number of Mix operators per bank
    // (kernels/attn_res_fused): ceil(L / block) bank rows, at most 2 x block Mix operators.
    const config::K3Config& c = model.config();
    const int block = c.attn_res_block_size;
    const int bank_rows = (c.num_hidden_layers + block - 1) / block;
    if (device_problem_.empty() &&
        (bank_rows > kernels::kAttnResFusedMaxBankRows || 2 * block > kernels::kAttnResFusedMaxMixes))
      device_problem_ = kUnsupportedAttnRes;
  }

  std::string problem() const override { return device_problem_; }
  int64_t max_rows() const override { return kMaxRows; }

  // The standard run_step's function (model/model.cpp), layer by layer through fused ops.
  Tensor run_step(const ForwardContext& ctx, const core::TensorView& ids, model::LogitRows rows) const override {
    K3_CHECK(device_problem_.empty(), "fused decode path: it serves no step here (" + device_problem_ + ")");
    for (const model::Segment& seg : ctx.segments)
      K3_CHECK(seg.kind == model::StepKind::decode, "fused decode path: a step with a prefill row was routed to it");
    K3_CHECK(ids.numel() <= kMaxRows, "fused decode path: a step of " + std::to_string(ids.numel()) +
                                          " rows was routed to it (it serves at most " + std::to_string(kMaxRows) +
                                          ")");
    const config::K3Config& c = ctx.config;
    const model::Weights& W = model_.weights();
    const int L = c.num_hidden_layers;
    Tensor P = model::embed_tokens(ctx, W, ids);  // the running prefix of the current block
    AttnResStream res(ctx, W, ids.numel());
    Tensor x = res.merge(P, nullptr, false, MixSite::attention(0), W.layers[0].input_norm);
    for (int l = 0; l < L; ++l) {
      const model::LayerWeights& lw = W.layers[static_cast<size_t>(l)];
      const bool restart = c.is_bank_write_layer(l);
      if (restart) res.write_bank(l, P);  // the block sum, before the prefix restarts
      const Tensor a = std::visit([&](const auto& w) { return fused_attention(ctx, l, w, x); }, lw.attn);
      ctx.emit("attn.out", l, a);
      const Tensor fx = res.merge(P, &a, restart, MixSite::ffn(l), lw.post_attn_norm);
      const Tensor f = std::visit(
          [&](const auto& w) {
            if constexpr (std::is_same_v<std::decay_t<decltype(w)>, model::MoeWeights>)
              return fused_moe(ctx, l, w, model_.router_bias(l), fx);
            else return model::ffn(ctx, l, w, fx);
          },
          lw.ffn);
      ctx.emit("ffn.out", l, f);
      x = l + 1 < L
              ? res.merge(P, &f, false, MixSite::attention(l + 1), W.layers[static_cast<size_t>(l) + 1].input_norm)
              : res.merge(P, &f, false, MixSite::output(L), W.final_norm);
      ctx.emit("prefix", l, P);
    }
    // x is now the normed final hidden of every row: the final Mix is row-wise, so keeping only
    // the wanted rows afterwards equals the standard path's gather before it.
    if (const std::vector<int64_t> keep = model::logit_rows(ctx.segments, rows, ids.numel()); !keep.empty())
      x = model::gather_rows(ctx, x, keep);
    return model::lm_head_logits(ctx, W, x);
  }

 private:
  const model::Model& model_;
  std::string device_problem_;  // set: every step falls back with this reason
};

}  // namespace

std::unique_ptr<model::FusedDecode> make_fused_decode(const model::Model& model, std::string device_problem) {
  return std::make_unique<FusedDecodePath>(model, std::move(device_problem));
}

std::string gpu_problem(int index) {
#ifdef K3_HAVE_CUDA
  const backends::cuda::DeviceInfo info = backends::cuda::device_info(index);
  if (info.cc_major != 9 || info.cc_minor != 0) return kUnsupportedGpu;
#else
  (void)index;
#endif
  return "";
}

void attach(model::Model& model, int cuda_device) {
  if (model.options().decode_backend != model::DecodeBackend::latency_specialized) return;
  std::string problem = model.options().device == core::Device::cuda ? gpu_problem(cuda_device) : "";
  model.use_fused_decode(make_fused_decode(model, std::move(problem)));
}

}  // namespace k3::fastpath
