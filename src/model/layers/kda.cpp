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
}  // namespace

core::Tensor attention(const ForwardContext& ctx, int layer, const KdaWeights& w, const core::Tensor& x) {
  const auto& kc = ctx.config.kda;
  const int64_t rows = x.dim(0), P = kc.proj_dim();
  // Projections over every row of the batch (§5.1). f_a and f are rounded like any linear output.
  const core::Tensor q_in = ctx.linear(x, w.q_proj), k_in = ctx.linear(x, w.k_proj),
                     v_in = ctx.linear(x, w.v_proj), gate = ctx.linear(x, w.g_proj);
  const core::Tensor decay = ctx.linear(ctx.linear(x, w.f_a_proj), w.f_b_proj);
  const core::Tensor beta = ctx.linear(x, w.b_proj);
  core::Tensor q = ctx.alloc(rows, P), k = ctx.alloc(rows, P), v = ctx.alloc(rows, P);
  core::Tensor o = ctx.alloc(rows, P);

  // Short convs: every sequence of the step (prefill and decode alike) in one call per q/k/v, each
  // continuing its slot's conv state.
  const core::Tensor& conv_states = ctx.kv.conv_states(layer);  // [num_slots, 3, P, K-1]
  const core::Tensor* ins[3] = {&q_in, &k_in, &v_in};
  core::Tensor* outs[3] = {&q, &k, &v};
  const core::Tensor* weights[3] = {&w.q_conv, &w.k_conv, &w.v_conv};
  if (ctx.batches.all.num_seqs > 0)
    for (int i = 0; i < 3; ++i)
      ctx.ops.kda_conv.run({ins[i]->view(), conv_weight(*weights[i]), conv_pool(conv_states, i), outs[i]->view(),
                            ctx.precision(), ctx.batches.all},
                           ctx.device());

  // The delta rule: decode sequences by the recurrent form, prefill sequences by the chunked form
  // (whose chunk grid lies on absolute positions, so a prefill split anywhere keeps it) or, when
  // chunked prefill is off, all of them by the recurrent form in one call.
  const auto run = [&](const kernels::OpTable<kernels::KdaAttentionArgs>& op, const kernels::SeqBatch& seqs) {
    if (seqs.num_seqs == 0) return;
    op.run({q.view(), k.view(), v.view(), decay.view(), beta.view(), w.a_log.view(), w.dt_bias.view(),
            ctx.kv.kda_states(layer).view(), o.view(), kc.num_heads, kc.head_dim, kc.gate_lower_bound,
            kc.chunk_size, ctx.precision(), seqs},
           ctx.device());
  };
  if (ctx.options.kda_chunked_prefill) {
    run(ctx.ops.kda_recurrent, ctx.batches.decode);
    run(ctx.ops.kda_chunked, ctx.batches.prefill);
  } else {
    run(ctx.ops.kda_recurrent, ctx.batches.all);
  }
  ctx.emit("kda.o", layer, o);

  core::Tensor y = ctx.alloc(rows, P);
  ctx.ops.kda_output_gate.run({o.view(), gate.view(), w.o_norm.view(), y.view(), kc.num_heads,
                               kc.head_dim, ctx.config.rms_norm_eps, ctx.precision()},
                              ctx.device());
  ctx.emit("kda.gated", layer, y);
  return ctx.row_parallel_linear(y, w.o_proj);  // TP: a partial sum, reduced in layer_forward
}

}  // namespace k3::model
