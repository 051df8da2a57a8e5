// model/layers/latent_moe.cpp: Stable LatentMoE (spec §7): sigmoid router with selection
// bias, routed experts in latent space, routed RMSNorm, up-projection, shared experts.
#include "model/layers/context.h"

namespace k3::model {

core::Tensor ffn(const ForwardContext& ctx, int layer, const MoeWeights& w, const core::Tensor& router_bias,
                 const core::Tensor& x) {
  const auto& mc = ctx.config.moe;
  const int64_t rows = x.dim(0), k = mc.num_experts_per_token;
  // Router logits stay fp32 (spec §2).
  const core::Tensor logits = ctx.linear(x, w.router, /*round_output=*/false);
  core::Tensor ids = core::Tensor::zeros(core::DType::i32, {rows, k});
  core::Tensor route_w = ctx.alloc(rows, k);
  ctx.ops.router_topk.run({logits.view(), router_bias.view(), ids.view(), route_w.view(), mc.renormalize,
                           mc.routed_scaling_factor},
                          ctx.device());

  const core::Tensor z = ctx.linear(x, w.latent_down);  // [rows, L]
  core::Tensor u = ctx.alloc(rows, z.dim(1));
  ctx.ops.moe_experts.run({z.view(), ids.view(), route_w.view(), w.w1, w.w3, w.w2, u.view(),
                           ctx.config.situ_beta, ctx.config.situ_linear_beta, ctx.precision()},
                          ctx.device());
  ctx.emit("moe.latent", layer, u);
  const core::Tensor routed =
      ctx.linear(mc.latent_moe_use_norm ? ctx.rmsnorm(u, w.latent_norm, ctx.config.rms_norm_eps) : u, w.latent_up);
  if (mc.num_shared_experts == 0) return routed;
  const core::Tensor shared =
      ctx.linear(ctx.situ_glu(ctx.linear(x, w.shared_gate), ctx.linear(x, w.shared_up)), w.shared_down);
  return ctx.add(routed, shared);  // f = bf16(y_r + y_s); the caller adds it into the prefix
}

}  // namespace k3::model
