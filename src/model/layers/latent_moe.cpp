// model/layers/latent_moe.cpp: Stable LatentMoE (spec §7): sigmoid router with selection
// bias, routed experts in latent space, routed RMSNorm, up-projection, shared experts.
//
// Tensor parallelism (spec §11): the router, latent down/up and the routed norm are replicated;
// every rank holds 1/tp of each routed expert's intermediate (and of the shared experts'), so the
// routed latent sum u [T, L] and the shared output [T, hidden] are partial sums on each rank. They
// are written unrounded side by side into one f32 [T, L + hidden] buffer and all-reduced in ONE
// collective before the routed RMSNorm; each half is then rounded once, as TP1 rounds it.
// Expert parallelism (MoeWeights::expert_parallel(), config::ShardOptions): a rank holds whole
// experts [expert_begin, expert_begin + E / tp) instead of a slice of every expert, runs only the
// routes to them (moe_experts skips the others at no cost) and writes their unrounded f32 sum into
// the same buffer, so the same one all-reduce sums the experts (the all-reduce form of EP: every
// rank holds the whole batch under TP; no all-to-all). Each e_j is then a whole expert's output,
// rounded as TP1 rounds it; only the sum over routes waits for the all-reduce to be rounded.
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

namespace {

// Top-k routes of every row: ids i32 [rows, k] and fp32 weights [rows, k] (spec §7).
struct Routes {
  core::Tensor ids, weights;
};
Routes route(const ForwardContext& ctx, const core::Tensor& router_bias, const MoeFront& front) {
  if (front.route_ids.defined()) return {front.route_ids, front.route_weights};
  const auto& mc = ctx.config.moe;
  const int64_t rows = front.z.dim(0), k = mc.num_experts_per_token;
  Routes r{ctx.alloc_as(core::DType::i32, rows, k), ctx.alloc_as(core::DType::f32, rows, k)};  // weights stay fp32
  ctx.ops.router_topk.run({front.logits.view(), router_bias.view(), r.ids.view(), r.weights.view(), mc.renormalize,
                           mc.routed_scaling_factor},
                          ctx.device());
  return r;
}

kernels::MoeExpertsArgs experts_args(const ForwardContext& ctx, const MoeWeights& w, const MoeFront& front,
                                     const Routes& r) {
  kernels::MoeExpertsArgs a{front.z.view(),
                            r.ids.view(),
                            r.weights.view(),
                            w.w1,
                            w.w3,
                            w.w2,
                            {},
                            ctx.config.situ_beta,
                            ctx.config.situ_linear_beta,
                            ctx.precision()};
  a.expert_begin = w.expert_begin, a.num_experts = w.num_experts;  // expert parallelism: the held range
  a.whole_experts = w.expert_parallel();
  return a;
}

}  // namespace

core::Tensor moe_routed_latent(const ForwardContext& ctx, int layer, const MoeWeights& w,
                               const core::Tensor& router_bias, const MoeFront& front) {
  K3_CHECK(!ctx.tensor_parallel() && !w.expert_parallel(),
           "moe_routed_latent: under tensor (or expert) parallelism u is a partial sum (moe_tail)");
  const Routes r = route(ctx, router_bias, front);
  core::Tensor u = ctx.alloc(front.z.dim(0), front.z.dim(1));  // [rows, L]
  kernels::MoeExpertsArgs a = experts_args(ctx, w, front, r);
  a.out = u.view();
  ctx.ops.moe_experts.run(a, ctx.device());
  ctx.emit("moe.latent", layer, u);
  return u;
}

core::Tensor moe_combine(const ForwardContext& ctx, const MoeWeights& w, const core::Tensor& u, const MoeFront& front) {
  const auto& mc = ctx.config.moe;
  const bool shared = mc.num_shared_experts > 0;
  core::Tensor shared_out;
  if (shared) shared_out = ctx.linear(ctx.situ_glu(front.shared_gate, front.shared_up), w.shared_down);
  const core::Tensor routed = ctx.linear(
      mc.latent_moe_use_norm ? ctx.rmsnorm(u, w.latent_norm, ctx.config.rms_norm_eps) : u, w.latent_up);
  if (!shared) return routed;
  return ctx.add(routed, shared_out);  // f = bf16(y_r + y_s); the caller adds it into the prefix
}

core::Tensor moe_tail(const ForwardContext& ctx, int layer, const MoeWeights& w, const core::Tensor& router_bias,
                      const MoeFront& front, int64_t hidden) {
  if (!ctx.tensor_parallel()) return moe_combine(ctx, w, moe_routed_latent(ctx, layer, w, router_bias, front), front);

  // Tensor parallel: the routed latent sum (over slices of every expert, or under expert
  // parallelism over the rank's whole experts) and the shared output are partial sums, all-reduced
  // together.
  const auto& mc = ctx.config.moe;
  const core::Tensor& z = front.z;
  const int64_t rows = z.dim(0), L = z.dim(1);
  const bool shared = mc.num_shared_experts > 0;
  const Routes r = route(ctx, router_bias, front);
  core::Tensor partial = ctx.alloc_as(core::DType::f32, rows, L + (shared ? hidden : 0));  // [T, L | hidden]
  kernels::MoeExpertsArgs a = experts_args(ctx, w, front, r);
  a.out = columns(partial, 0, L);
  a.round_output = false;
  ctx.ops.moe_experts.run(a, ctx.device());
  if (shared)
    ctx.ops.linear.run({ctx.situ_glu(front.shared_gate, front.shared_up).view(), &w.shared_down,
                        columns(partial, L, L + hidden), false, ctx.precision()},
                       ctx.device());
  ctx.comm->all_reduce_sum(partial.view());
  const core::Tensor u = ctx.to_activation(columns(partial, 0, L));
  core::Tensor shared_out;
  if (shared) shared_out = ctx.to_activation(columns(partial, L, L + hidden));
  ctx.emit("moe.latent", layer, u);
  const core::Tensor routed = ctx.linear(
      mc.latent_moe_use_norm ? ctx.rmsnorm(u, w.latent_norm, ctx.config.rms_norm_eps) : u, w.latent_up);
  if (!shared) return routed;
  return ctx.add(routed, shared_out);  // f = bf16(y_r + y_s); the caller adds it into the prefix
}

}  // namespace k3::model
