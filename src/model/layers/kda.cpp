// model/layers/kda.cpp: a KDA attention sublayer (spec §5) for a batch of sequences.
#include <algorithm>

#include "model/layers/context.h"

namespace k3::model {

namespace {
// Conv weight [C, 1, K] read as [C, K].
core::TensorView conv_weight(const core::Tensor& w) {
  return core::TensorView::contiguous(w.data<void>(), w.dtype(), {w.dim(0), w.dim(2)});
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

  for (const Segment& s : ctx.segments) {  // conv and recurrence are per sequence
    const int64_t b = s.row_begin, e = s.row_end;
    const core::TensorView conv_state = ctx.kv.conv_state(layer, s.state->kda_slot);  // [3, P, K-1]
    const core::Tensor* ins[3] = {&q_in, &k_in, &v_in};
    core::Tensor* outs[3] = {&q, &k, &v};
    const core::Tensor* weights[3] = {&w.q_conv, &w.k_conv, &w.v_conv};
    for (int i = 0; i < 3; ++i)
      ctx.ops.kda_conv.run({row_slice(*ins[i], b, e).view(), conv_weight(*weights[i]),
                            conv_state.row(i), row_slice(*outs[i], b, e).view(), ctx.precision()},
                           ctx.device());
    auto run = [&](int64_t rb, int64_t re, bool chunked) {
      kernels::KdaAttentionArgs a{row_slice(q, rb, re).view(),     row_slice(k, rb, re).view(),
                                  row_slice(v, rb, re).view(),     row_slice(decay, rb, re).view(),
                                  row_slice(beta, rb, re).view(),  w.a_log.view(),
                                  w.dt_bias.view(),                ctx.kv.kda_state(layer, s.state->kda_slot),
                                  row_slice(o, rb, re).view(),     kc.num_heads,
                                  kc.head_dim,                     kc.gate_lower_bound,
                                  kc.chunk_size,                   ctx.precision()};
      (chunked ? ctx.ops.kda_chunked : ctx.ops.kda_recurrent).run(a, ctx.device());
    };
    if (s.kind == StepKind::prefill && ctx.options.kda_chunked_prefill) {
      // Keep the chunk grid on absolute positions (multiples of chunk_size from the start of
      // the sequence), so a prefill split at multiples of chunk_size - chunked prefill, a
      // prefix-cache hit - computes exactly what one unsplit prefill computes.
      const int64_t misalign = s.state->num_tokens % kc.chunk_size;
      const int64_t head = misalign ? std::min<int64_t>(e - b, kc.chunk_size - misalign) : 0;
      if (head > 0) run(b, b + head, true);
      if (b + head < e) run(b + head, e, true);
    } else {
      run(b, e, false);
    }
  }
  ctx.emit("kda.o", layer, o);

  core::Tensor y = ctx.alloc(rows, P);
  ctx.ops.kda_output_gate.run({o.view(), gate.view(), w.o_norm.view(), y.view(), kc.num_heads,
                               kc.head_dim, ctx.config.rms_norm_eps, ctx.precision()},
                              ctx.device());
  ctx.emit("kda.gated", layer, y);
  return ctx.linear(y, w.o_proj);
}

}  // namespace k3::model
