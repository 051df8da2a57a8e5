// model/layers/kda.cpp: a KDA attention sublayer (spec §5) for a batch of sequences: the short convs
// and the recurrence are batched ops over the step's sequence tables (ctx.batches), one call each.
#include "model/layers/context.h"

namespace k3::model {

namespace {
// Conv weight [C, 1, K] read as [C, K].
core::TensorView conv_weight(const core::Tensor& w) {
  return core::TensorView::contiguous(w.data<void>(), w.dtype(), {w.dim(0), w.dim(2)}, w.view().device);
}

// Part i (0 q, 1 k, 2 v) of the conv storage [num_slots, 3, P, K-1] as the pool [num_slots, P, K-1]
// the conv op takes: strides {3*P*(K-1), K-1, 1}, same storage.
core::TensorView conv_pool(const core::Tensor& storage, int64_t i) {
  const core::TensorView& s = storage.view();
  core::TensorView v = s;
  v.data = static_cast<char*>(s.data) + i * s.strides[1] * static_cast<int64_t>(core::dtype_size(s.dtype));
  v.shape = core::Shape{s.dim(0), s.dim(2), s.dim(3)};
  v.strides = {s.strides[0], s.strides[2], s.strides[3], 0};
  return v;
}

// The three short convs (q, k, v) over `seqs`, from pre-conv inputs into outs.
void short_convs(const ForwardContext& ctx, int layer, const KdaWeights& w, const core::Tensor* const ins[3],
                 core::Tensor* const outs[3], const kernels::SeqBatch& seqs, bool no_commit) {
  if (seqs.num_seqs == 0) return;
  const core::Tensor& conv_states = ctx.kv.conv_states(layer);  // [num_slots, 3, P, K-1]
  const core::Tensor* weights[3] = {&w.q_conv, &w.k_conv, &w.v_conv};
  for (int i = 0; i < 3; ++i) {
    kernels::KdaConvArgs a{ins[i]->view(),  conv_weight(*weights[i]), conv_pool(conv_states, i),
                           outs[i]->view(), ctx.precision(),          seqs};
    a.no_commit = no_commit;
    ctx.ops.kda_conv.run(a, ctx.device());
  }
}

// The delta rule over `seqs` by `op` (recurrent or chunked).
void delta_rule(const ForwardContext& ctx, int layer, const KdaWeights& w,
                const kernels::OpTable<kernels::KdaAttentionArgs>& op, const kernels::SeqBatch& seqs,
                const core::Tensor& q, const core::Tensor& k, const core::Tensor& v, const core::Tensor& decay,
                const core::Tensor& beta, const core::Tensor& o, bool no_commit) {
  if (seqs.num_seqs == 0) return;
  const auto& kc = ctx.config.kda;
  kernels::KdaAttentionArgs a{q.view(),
                              k.view(),
                              v.view(),
                              decay.view(),
                              beta.view(),
                              w.a_log.view(),
                              w.dt_bias.view(),
                              ctx.kv.kda_states(layer).view(),
                              o.view(),
                              kc.num_heads,
                              kc.head_dim,
                              kc.gate_lower_bound,
                              kc.chunk_size,
                              ctx.precision(),
                              seqs};
  a.no_commit = no_commit;
  op.run(a, ctx.device());
}
}  // namespace

core::Tensor attention(const ForwardContext& ctx, int layer, const KdaWeights& w, const core::Tensor& x) {
  const auto& kc = ctx.config.kda;
  const int64_t rows = x.dim(0), P = kc.proj_dim();
  // Projections over every row of the batch (§5.1). f_a and f are rounded like any linear output.
  const core::Tensor q_in = ctx.linear(x, w.q_proj), k_in = ctx.linear(x, w.k_proj), v_in = ctx.linear(x, w.v_proj),
                     gate = ctx.linear(x, w.g_proj);
  const core::Tensor decay = ctx.linear(ctx.linear(x, w.f_a_proj), w.f_b_proj);
  const core::Tensor beta = ctx.linear(x, w.b_proj);
  core::Tensor q = ctx.alloc(rows, P), k = ctx.alloc(rows, P), v = ctx.alloc(rows, P);
  core::Tensor o = ctx.alloc(rows, P);

  // Short convs: every committing sequence of the step (prefill and decode alike) in one call per
  // q/k/v, each continuing its slot's conv state; verify sequences (speculative decoding) in a
  // second, no-commit call that leaves their slots as they were (spec §5.9 (b)).
  const core::Tensor* ins[3] = {&q_in, &k_in, &v_in};
  core::Tensor* outs[3] = {&q, &k, &v};
  short_convs(ctx, layer, w, ins, outs, ctx.batches.kda_all, /*no_commit=*/false);
  short_convs(ctx, layer, w, ins, outs, ctx.batches.verify, /*no_commit=*/true);

  // The delta rule: decode sequences by the recurrent form, prefill sequences by the chunked form
  // (whose chunk grid lies on absolute positions, so a prefill split anywhere keeps it) or, when
  // chunked prefill is off, all of them by the recurrent form in one call; verify sequences by the
  // recurrent form without committing.
  const auto run = [&](const kernels::OpTable<kernels::KdaAttentionArgs>& op, const kernels::SeqBatch& seqs,
                       bool no_commit) { delta_rule(ctx, layer, w, op, seqs, q, k, v, decay, beta, o, no_commit); };
  if (ctx.options.kda_chunked_prefill) {
    run(ctx.ops.kda_recurrent, ctx.batches.kda_decode, false);
    run(ctx.ops.kda_chunked, ctx.batches.prefill, false);
  } else {
    run(ctx.ops.kda_recurrent, ctx.batches.kda_all, false);
  }
  if (ctx.batches.verify.num_seqs > 0) {
    run(ctx.ops.kda_recurrent, ctx.batches.verify, true);
    K3_CHECK(ctx.capture != nullptr, "KDA layer " + std::to_string(layer) + ": verify rows but no VerifyCapture");
    VerifyCapture::Layer& cap = ctx.capture->layers.at(static_cast<size_t>(layer));
    cap = {verify_rows(ctx, q_in), verify_rows(ctx, k_in), verify_rows(ctx, v_in), verify_rows(ctx, decay),
           verify_rows(ctx, beta)};
  }
  ctx.emit("kda.o", layer, o);

  core::Tensor y = ctx.alloc(rows, P);
  ctx.ops.kda_output_gate.run({o.view(), gate.view(), w.o_norm.view(), y.view(), kc.num_heads, kc.head_dim,
                               ctx.config.rms_norm_eps, ctx.precision()},
                              ctx.device());
  ctx.emit("kda.gated", layer, y);
  return ctx.row_parallel_linear(y, w.o_proj);  // TP: a partial sum, reduced in layer_forward
}

void kda_commit_replay(const ForwardContext& ctx, int layer, const KdaWeights& w, const VerifyCapture::Layer& cap) {
  const kernels::SeqBatch& seqs = ctx.batches.verify;
  if (seqs.num_seqs == 0) return;
  const int64_t rows = cap.q_in.dim(0), P = ctx.config.kda.proj_dim();
  core::Tensor q = ctx.alloc(rows, P), k = ctx.alloc(rows, P), v = ctx.alloc(rows, P), o = ctx.alloc(rows, P);
  const core::Tensor* ins[3] = {&cap.q_in, &cap.k_in, &cap.v_in};
  core::Tensor* outs[3] = {&q, &k, &v};
  short_convs(ctx, layer, w, ins, outs, seqs, /*no_commit=*/false);
  // The same op and inputs as the verify call, so the committed state is what decoding the
  // accepted tokens one by one would leave (o is scratch: the verify step already used it).
  delta_rule(ctx, layer, w, ctx.ops.kda_recurrent, seqs, q, k, v, cap.decay, cap.beta, o, /*no_commit=*/false);
}

}  // namespace k3::model
