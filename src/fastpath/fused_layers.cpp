// fastpath/fused_layers.cpp: the fused path's sublayers and its AttnRes stream. Each reads as the
// standard layer it replaces (model/layers/*.cpp) with the fused ops in place of op sequences.
#include "fastpath/fused_layers.h"

#include <string>
#include <utility>

namespace k3::fastpath {

using core::Tensor;
using core::TensorView;
using model::ForwardContext;

namespace {

struct Projection {
  const kernels::LinearWeight* w;
  Tensor* out;
  bool round_output = true;
};

// Every projection of x in one multi_linear call, with the router's top-k as its epilogue when
// `router` is given; where its kernel does not support them (say an MXFP4 weight), one standard linear
// each, and the skip is recorded for --explain. Returns whether multi_linear ran (so the routes exist).
bool project(const ForwardContext& ctx, const Tensor& x, std::initializer_list<Projection> outs,
             const kernels::MultiLinearRouter& router = {}) {
  kernels::MultiLinearArgs a;
  a.x = x.view();
  a.precision = ctx.precision();
  for (const Projection& p : outs) a.add(p.w, p.out->view(), p.round_output);
  a.router = router;
  std::string why;
  if (ctx.ops.multi_linear.find(a, ctx.device(), &why)) {
    ctx.ops.multi_linear.run(a, ctx.device());
    return true;
  }
  ctx.ops.multi_linear.note_skipped(why, ctx.device());
  for (const Projection& p : outs)
    ctx.ops.linear.run({x.view(), p.w, p.out->view(), p.round_output, ctx.precision()}, ctx.device());
  return false;
}

// Whether `table` has an implementation for `a` on the context's device; when not, the skip and
// its reason are recorded (--explain) and the caller runs the standard ops instead.
template <class Args>
bool fused_op_runs(const ForwardContext& ctx, const kernels::OpTable<Args>& table, const Args& a) {
  std::string why;
  if (table.find(a, ctx.device(), &why)) return true;
  table.note_skipped(why, ctx.device());
  return false;
}

// Element offset `floats` into an f32 tensor, as a contiguous view of `shape`.
TensorView f32_view(const Tensor& t, int64_t floats, core::Shape shape) {
  return TensorView::contiguous(static_cast<float*>(t.view().data) + floats, core::DType::f32, shape, t.view().device);
}

}  // namespace

// ---------------------------------------------------------------- AttnRes stream

AttnResStream::AttnResStream(const ForwardContext& ctx, const model::Weights& w, int64_t rows)
    : ctx_(ctx), w_(w), rows_(rows) {}

const model::AttnResWeights& AttnResStream::mix_weights(MixSite site) const {
  switch (site.side) {
    case MixSite::Side::attention: return w_.layers.at(static_cast<size_t>(site.layer)).attn_res;
    case MixSite::Side::ffn: return w_.layers.at(static_cast<size_t>(site.layer)).mlp_res;
    case MixSite::Side::output: break;
  }
  return w_.output_res;
}

void AttnResStream::write_bank(int l, const Tensor& P) {
  bank_.push_back(P);
  // The Mix operators that read this bank: the FFN side of l, then both sides of each later
  // layer up to the attention side of the next write layer (which still sees this bank), or the
  // output Mix after the last layer.
  const int L = ctx_.config.num_hidden_layers;
  sites_.assign(1, MixSite::ffn(l));
  for (int k = l + 1;; ++k) {
    if (k == L) {
      sites_.push_back(MixSite::output(L));
      break;
    }
    sites_.push_back(MixSite::attention(k));
    if (ctx_.config.is_bank_write_layer(k)) break;
    sites_.push_back(MixSite::ffn(k));
  }
  const auto M = static_cast<int64_t>(sites_.size());
  const int64_t D = ctx_.config.hidden_size;
  acc_ = ctx_.alloc_as(core::DType::f32, M * rows_, D);
  stats_ = ctx_.alloc_as(core::DType::f32, M * rows_, 2);
  std::vector<TensorView> bank, queries, norms;
  for (const Tensor& b : bank_) bank.push_back(b.view());
  for (const MixSite& s : sites_) {
    queries.push_back(mix_weights(s).query.view());
    norms.push_back(mix_weights(s).norm.view());
  }
  kernels::AttnResBankArgs a;
  a.bank = bank;
  a.queries = queries;
  a.norms = norms;
  a.acc = f32_view(acc_, 0, {M, rows_, D});
  a.stats = f32_view(stats_, 0, {M, rows_, 2});
  a.eps = ctx_.config.rms_norm_eps;
  a.precision = ctx_.precision();
  ctx_.ops.attn_res_bank.run(a, ctx_.device());
}

bool AttnResStream::wants_mixture(MixSite site) const {
  if (site.side != MixSite::Side::attention) return false;
  if (ctx_.trace && *ctx_.trace) return true;
  if (ctx_.taps)
    for (int32_t t : ctx_.taps->layers)
      if (t + 1 == site.layer) return true;
  return false;
}

Tensor AttnResStream::merge(Tensor& P, const Tensor* a, bool restart, MixSite site, const Tensor& norm_weight) {
  const int64_t D = ctx_.config.hidden_size;
  const model::AttnResWeights& mw = mix_weights(site);
  kernels::AttnResMergeArgs m;
  m.prefix = P.view();
  Tensor P_new, h;
  if (a) {
    m.sublayer_out = a->view();
    m.restart = restart;
    P_new = ctx_.alloc(rows_, D);  // never in place: P may be a bank row
    m.prefix_out = P_new.view();
  }
  if (!bank_.empty()) {
    int64_t idx = 0;
    while (idx < static_cast<int64_t>(sites_.size()) && !(sites_[static_cast<size_t>(idx)] == site)) ++idx;
    K3_CHECK(idx < static_cast<int64_t>(sites_.size()),
             "fastpath: a Mix with no bank part (layer " + std::to_string(site.layer) + ")");
    m.bank_acc = f32_view(acc_, idx * rows_ * D, {rows_, D});
    m.bank_stats = f32_view(stats_, idx * rows_ * 2, {rows_, 2});
  }
  m.query = mw.query.view();
  m.norm = mw.norm.view();
  m.rmsnorm_weight = norm_weight.view();
  const bool mixture = wants_mixture(site);
  if (mixture) {
    h = ctx_.alloc(rows_, D);
    m.mixed_out = h.view();
  }
  Tensor x = ctx_.alloc(rows_, D);
  m.normed_out = x.view();
  m.mix_eps = ctx_.config.rms_norm_eps;
  m.rmsnorm_eps = ctx_.config.rms_norm_eps;
  m.rmsnorm_style = ctx_.options.rmsnorm_style;
  m.precision = ctx_.precision();
  ctx_.ops.attn_res_merge.run(m, ctx_.device());
  if (a) P = P_new;
  if (mixture) {
    ctx_.emit("attn_res.mix", site.layer, h);
    if (ctx_.taps)
      for (size_t i = 0; i < ctx_.taps->layers.size(); ++i)
        if (ctx_.taps->layers[i] + 1 == site.layer) ctx_.taps->values[i] = h;
  }
  return x;
}

// ---------------------------------------------------------------- attention

Tensor fused_attention(const ForwardContext& ctx, int layer, const model::KdaWeights& w, const Tensor& x) {
  const auto& kc = ctx.config.kda;
  const int64_t n = x.dim(0), P = kc.proj_dim();
  Tensor q_in = ctx.alloc(n, P), k_in = ctx.alloc(n, P), v_in = ctx.alloc(n, P), g = ctx.alloc(n, P);
  Tensor f_a = ctx.alloc(n, w.f_a_proj.out_features()), b = ctx.alloc(n, kc.num_heads);
  Tensor y = ctx.alloc(n, P);
  const bool traced = ctx.trace && *ctx.trace;
  Tensor o = traced ? ctx.alloc(n, P) : Tensor();
  kernels::KdaDecodeArgs a;
  a.q_in = q_in.view();
  a.k_in = k_in.view();
  a.v_in = v_in.view();
  a.g = g.view();
  a.f_a = f_a.view();
  a.f_b = &w.f_b_proj;
  a.b = b.view();
  a.q_conv = w.q_conv.view();
  a.k_conv = w.k_conv.view();
  a.v_conv = w.v_conv.view();
  a.conv_state = ctx.kv.conv_states(layer).view();
  a.a_log = w.a_log.view();
  a.dt_bias = w.dt_bias.view();
  a.state = ctx.kv.kda_states(layer).view();
  a.o_norm = w.o_norm.view();
  a.out = y.view();
  if (traced) a.o_trace = o.view();
  a.num_heads = kc.num_heads;
  a.head_dim = kc.head_dim;
  a.lower_bound = kc.gate_lower_bound;
  a.rms_eps = ctx.config.rms_norm_eps;
  a.precision = ctx.precision();
  a.seqs = ctx.batches.decode;
  // A shape the fused kernel does not take (say head_dim > 128 on CUDA): the standard sublayer.
  if (!fused_op_runs(ctx, ctx.ops.kda_decode, a)) return model::attention(ctx, layer, w, x);
  project(ctx, x,
          {{&w.q_proj, &q_in},
           {&w.k_proj, &k_in},
           {&w.v_proj, &v_in},
           {&w.g_proj, &g},
           {&w.f_a_proj, &f_a},
           {&w.b_proj, &b}});
  // Committing decode sequences, then verify sequences without committing (spec §5.9 (b)): their
  // accepted rows are replayed by Model::commit_verified from what the capture keeps.
  if (ctx.batches.kda_decode.num_seqs > 0) {
    a.seqs = ctx.batches.kda_decode;
    ctx.ops.kda_decode.run(a, ctx.device());
  }
  if (ctx.batches.verify.num_seqs > 0) {
    a.seqs = ctx.batches.verify;
    a.no_commit = true;
    ctx.ops.kda_decode.run(a, ctx.device());
    K3_CHECK(ctx.capture != nullptr, "KDA layer " + std::to_string(layer) + ": verify rows but no VerifyCapture");
    const Tensor decay = ctx.linear(f_a, w.f_b_proj);  // what the standard replay reads
    ctx.capture->layers.at(static_cast<size_t>(layer)) = {model::verify_rows(ctx, q_in), model::verify_rows(ctx, k_in),
                                                          model::verify_rows(ctx, v_in), model::verify_rows(ctx, decay),
                                                          model::verify_rows(ctx, b)};
  }
  if (traced) ctx.emit("kda.o", layer, o);
  ctx.emit("kda.gated", layer, y);
  return ctx.reduce_partial(ctx.row_parallel_linear(y, w.o_proj));
}

Tensor fused_attention(const ForwardContext& ctx, int layer, const model::MlaWeights& w, const Tensor& x) {
  const auto& mc = ctx.config.mla;
  const int64_t n = x.dim(0), width = int64_t{mc.num_heads} * mc.v_head_dim;
  Tensor q_a = ctx.alloc(n, w.q_a_proj.out_features()), kv = ctx.alloc(n, mc.cache_dim());
  Tensor q_a_n = ctx.alloc(n, w.q_a_proj.out_features());  // rmsnorm(q_a): q_b's input
  Tensor g = mc.use_output_gate ? ctx.alloc(n, width) : Tensor();
  Tensor q = ctx.alloc(n, w.q_b_proj.out_features()), out = ctx.alloc(n, width);
  const Tensor& pages = ctx.kv.mla_pages(layer);
  kernels::MlaDecodeArgs a;
  a.q = q.view();
  a.pages = pages.view();
  a.seqs = ctx.batches.decode;  // verify sequences included: every row attends causally
  a.k_scale = ctx.options.kv_k_scale;
  a.kv_b = &w.kv_b_proj;
  if (mc.use_output_gate) a.gate = g.view();
  a.out = out.view();
  a.num_heads = mc.num_heads;
  a.qk_nope = mc.qk_nope_head_dim;
  a.qk_rope = mc.qk_rope_head_dim;
  a.v_head_dim = mc.v_head_dim;
  a.kv_lora = mc.kv_lora_rank;
  a.scale = mc.softmax_scale();
  a.precision = ctx.precision();
  // A shape the fused kernel does not take (say more than 16 local heads on CUDA): the standard sublayer.
  if (!fused_op_runs(ctx, ctx.ops.mla_decode, a)) return model::attention(ctx, layer, w, x);
  if (mc.use_output_gate) project(ctx, x, {{&w.q_a_proj, &q_a}, {&w.kv_a_proj, &kv}, {&w.g_proj, &g}});
  else project(ctx, x, {{&w.q_a_proj, &q_a}, {&w.kv_a_proj, &kv}});
  // Both norms and the cache write in one op (mla_prep.h), then q_b; where mla_prep has no kernel for
  // the call, the standard ops: rmsnorm, q_b, the kv split, rmsnorm, mla_cache_write.
  kernels::MlaPrepArgs prep;
  prep.q_a = q_a.view();
  prep.q_a_norm = w.q_a_norm.view();
  prep.q_a_out = q_a_n.view();
  prep.kv = kv.view();
  prep.kv_a_norm = w.kv_a_norm.view();
  prep.pages = pages.view();
  prep.cache_rows = ctx.batches.cache_rows;
  prep.k_scale = ctx.options.kv_k_scale;
  prep.eps = config::MlaConfig::kLatentNormEps;
  prep.style = ctx.options.rmsnorm_style;
  prep.precision = ctx.precision();
  if (fused_op_runs(ctx, ctx.ops.mla_prep, prep)) {
    ctx.ops.mla_prep.run(prep, ctx.device());
    project(ctx, q_a_n, {{&w.q_b_proj, &q}});
  } else {
    ctx.ops.linear.run({ctx.rmsnorm(q_a, w.q_a_norm, config::MlaConfig::kLatentNormEps).view(), &w.q_b_proj, q.view(),
                        true, ctx.precision()},
                       ctx.device());
    const Tensor c_n = ctx.rmsnorm(model::column_copy(ctx, kv, 0, mc.kv_lora_rank), w.kv_a_norm,
                                   config::MlaConfig::kLatentNormEps);
    const Tensor k_pe = model::column_copy(ctx, kv, mc.kv_lora_rank, mc.cache_dim());
    ctx.ops.mla_cache_write.run({c_n.view(), k_pe.view(), pages.view(), ctx.batches.cache_rows, ctx.options.kv_k_scale},
                                ctx.device());
  }
  ctx.ops.mla_decode.run(a, ctx.device());
  ctx.emit("mla.gated", layer, out);
  return ctx.reduce_partial(ctx.row_parallel_linear(out, w.o_proj));
}

// ---------------------------------------------------------------- MoE

Tensor fused_moe(const ForwardContext& ctx, int layer, const model::MoeWeights& w, const Tensor& router_bias,
                 const Tensor& x) {
  const auto& mc = ctx.config.moe;
  const int64_t n = x.dim(0);
  model::MoeFront front;
  front.logits = ctx.alloc_as(core::DType::f32, n, w.router.out_features());  // fp32, unrounded (spec §2)
  front.z = ctx.alloc(n, w.latent_down.out_features());
  // The top-k in the packed GEMM's epilogue (output 0 is the router): no router launch.
  kernels::MultiLinearRouter router;
  const Tensor ids = ctx.alloc_as(core::DType::i32, n, mc.num_experts_per_token);
  const Tensor weights = ctx.alloc_as(core::DType::f32, n, mc.num_experts_per_token);  // fp32 (spec §7)
  router.output = 0;
  router.bias = router_bias.view();
  router.ids = ids.view();
  router.weights = weights.view();
  router.renormalize = mc.renormalize;
  router.scaling = mc.routed_scaling_factor;
  bool routed = false;
  if (mc.num_shared_experts > 0) {
    front.shared_gate = ctx.alloc(n, w.shared_gate.out_features());
    front.shared_up = ctx.alloc(n, w.shared_up.out_features());
    routed = project(ctx, x,
                     {{&w.router, &front.logits, false},
                      {&w.latent_down, &front.z},
                      {&w.shared_gate, &front.shared_gate},
                      {&w.shared_up, &front.shared_up}},
                     router);
  } else {
    routed = project(ctx, x, {{&w.router, &front.logits, false}, {&w.latent_down, &front.z}}, router);
  }
  if (routed) front.route_ids = ids, front.route_weights = weights;
  // Under TP the routed and shared partial sums are all-reduced between the experts and the tail.
  if (ctx.tensor_parallel()) return model::moe_tail(ctx, layer, w, router_bias, front, x.dim(1));
  const Tensor u = model::moe_routed_latent(ctx, layer, w, router_bias, front);  // [n, L]
  // The tail (situ, shared_down, routed norm, latent_up, add) in one fused op.
  Tensor f = ctx.alloc(n, w.latent_up.out_features());
  kernels::MoeTailCombineArgs a;
  a.u = u.view();
  a.latent_norm = w.latent_norm.view();
  a.latent_up = &w.latent_up;
  if (mc.num_shared_experts > 0) {
    a.shared_gate = front.shared_gate.view();
    a.shared_up = front.shared_up.view();
    a.shared_down = &w.shared_down;
  }
  a.out = f.view();
  a.use_norm = mc.latent_moe_use_norm;
  a.eps = ctx.config.rms_norm_eps;
  a.style = ctx.options.rmsnorm_style;
  a.situ_beta = ctx.config.situ_beta;
  a.situ_linear_beta = ctx.config.situ_linear_beta;
  a.precision = ctx.precision();
  if (!fused_op_runs(ctx, ctx.ops.moe_tail_combine, a)) return model::moe_combine(ctx, w, u, front);
  ctx.ops.moe_tail_combine.run(a, ctx.device());
  return f;
}

}  // namespace k3::fastpath
