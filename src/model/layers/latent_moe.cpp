// model/layers/latent_moe.cpp: Stable LatentMoE (spec §7): sigmoid router with selection
// bias, routed experts in latent space, routed RMSNorm, up-projection, shared experts.
//
// Tensor parallelism (spec §11): the router, latent down/up and the routed norm are replicated;
// every rank holds 1/tp of each routed expert's intermediate (and of the shared experts'), so the
// routed latent sum u [T, L] and the shared output [T, hidden] are partial sums on each rank. They
// are written unrounded side by side into one f32 [T, L + hidden] buffer and all-reduced in ONE
// collective before the routed RMSNorm; each half is then rounded once, as TP1 rounds it.
#include "model/layers/context.h"

namespace k3::model {

namespace {

// Columns [begin, end) of a contiguous [rows, cols] tensor as a row-strided view (no copy).
core::TensorView columns(const core::Tensor& t, int64_t begin, int64_t end) {
  core::TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + begin * static_cast<int64_t>(core::dtype_size(t.dtype()));
  v.shape = core::Shape{t.dim(0), end - begin};
  return v;
}

}  // namespace

core::Tensor ffn(const ForwardContext& ctx, int layer, const MoeWeights& w, const core::Tensor& router_bias,
                 const core::Tensor& x) {
  const auto& mc = ctx.config.moe;
  // Router logits stay fp32 (spec §2).
  MoeFront front;
  front.logits = ctx.linear(x, w.router, /*round_output=*/false);
  front.z = ctx.linear(x, w.latent_down);  // [rows, L]
  if (mc.num_shared_experts > 0) {
    front.shared_gate = ctx.linear(x, w.shared_gate);
    front.shared_up = ctx.linear(x, w.shared_up);
  }
  return moe_tail(ctx, layer, w, router_bias, front, x.dim(1));
}

core::Tensor moe_tail(const ForwardContext& ctx, int layer, const MoeWeights& w, const core::Tensor& router_bias,
                      const MoeFront& front, int64_t hidden) {
  const auto& mc = ctx.config.moe;
  const core::Tensor& z = front.z;
  const int64_t rows = z.dim(0), k = mc.num_experts_per_token;
  core::Tensor ids = ctx.alloc_as(core::DType::i32, rows, k);
  core::Tensor route_w = ctx.alloc_as(core::DType::f32, rows, k);  // route weights stay fp32 (spec §7)
  ctx.ops.router_topk.run({front.logits.view(), router_bias.view(), ids.view(), route_w.view(), mc.renormalize,
                           mc.routed_scaling_factor},
                          ctx.device());

  const int64_t L = z.dim(1);
  const bool shared = mc.num_shared_experts > 0;
  const auto shared_hidden = [&] { return ctx.situ_glu(front.shared_gate, front.shared_up); };
  const kernels::MoeExpertsArgs experts{z.view(), ids.view(), route_w.view(), w.w1, w.w3, w.w2, {},
                                        ctx.config.situ_beta, ctx.config.situ_linear_beta, ctx.precision()};
  core::Tensor u, shared_out;
  if (!ctx.tensor_parallel()) {
    u = ctx.alloc(rows, L);
    kernels::MoeExpertsArgs a = experts;
    a.out = u.view();
    ctx.ops.moe_experts.run(a, ctx.device());
    if (shared) shared_out = ctx.linear(shared_hidden(), w.shared_down);
  } else {
    core::Tensor partial = ctx.alloc_as(core::DType::f32, rows, L + (shared ? hidden : 0));  // [T, L | hidden]
    kernels::MoeExpertsArgs a = experts;
    a.out = columns(partial, 0, L);
    a.round_output = false;
    ctx.ops.moe_experts.run(a, ctx.device());
    if (shared)
      ctx.ops.linear.run({shared_hidden().view(), &w.shared_down, columns(partial, L, L + hidden), false, ctx.precision()},
                         ctx.device());
    ctx.comm->all_reduce_sum(partial.view());
    u = ctx.to_activation(columns(partial, 0, L));
    if (shared) shared_out = ctx.to_activation(columns(partial, L, L + hidden));
  }
  ctx.emit("moe.latent", layer, u);
  const core::Tensor routed =
      ctx.linear(mc.latent_moe_use_norm ? ctx.rmsnorm(u, w.latent_norm, ctx.config.rms_norm_eps) : u, w.latent_up);
  if (!shared) return routed;
  return ctx.add(routed, shared_out);  // f = bf16(y_r + y_s); the caller adds it into the prefix
}

}  // namespace k3::model
