// model/layers/mla.cpp: a gated MLA (NoPE) attention sublayer (spec §6) for a batch of sequences.
#include "model/layers/context.h"

namespace k3::model {

namespace {
constexpr float kMlaNormEps = 1e-6f;  // q_a/kv_a layernorms: Moonshot reference default (spec §6.1)
}

core::Tensor attention(const ForwardContext& ctx, int layer, const MlaWeights& w, const core::Tensor& x) {
  const auto& mc = ctx.config.mla;
  const int64_t rows = x.dim(0);
  const core::Tensor q = ctx.linear(ctx.rmsnorm(ctx.linear(x, w.q_a_proj), w.q_a_norm, kMlaNormEps), w.q_b_proj);
  const core::Tensor kv = ctx.linear(x, w.kv_a_proj);  // [rows, kv_lora + rope]
  const core::Tensor c_n = ctx.rmsnorm(column_copy(kv, 0, mc.kv_lora_rank), w.kv_a_norm, kMlaNormEps);
  const core::Tensor k_pe = column_copy(kv, mc.kv_lora_rank, mc.cache_dim());
  core::Tensor o = ctx.alloc(rows, int64_t{mc.num_heads} * mc.v_head_dim);

  for (const Segment& s : ctx.segments) {
    MlaLayerCache& cache = s.state->mla.at(layer);
    K3_CHECK(cache.size == s.state->num_tokens, "MLA cache of layer " + std::to_string(layer) +
                                                    " is out of step with its sequence");
    const int64_t b = s.row_begin, e = s.row_end, start = cache.size, end = start + s.rows();
    cache.reserve_more(s.rows());
    ctx.ops.mla_cache_write.run({row_slice(c_n, b, e).view(), row_slice(k_pe, b, e).view(),
                                 cache.rows(start, end), ctx.options.kv_k_scale},
                                ctx.device());
    cache.size = end;
    kernels::MlaAttentionArgs a{row_slice(q, b, e).view(), cache.rows(0, end), ctx.options.kv_k_scale,
                                &w.kv_b_proj, row_slice(o, b, e).view(), mc.num_heads,
                                mc.qk_nope_head_dim, mc.qk_rope_head_dim, mc.v_head_dim,
                                mc.kv_lora_rank, mc.softmax_scale(), ctx.precision()};
    (s.kind == StepKind::prefill ? ctx.ops.mla_naive : ctx.ops.mla_absorbed).run(a, ctx.device());
  }
  ctx.emit("mla.o", layer, o);

  if (!mc.use_output_gate) return ctx.linear(o, w.o_proj);
  // Output gate from the layer input (after input_layernorm), then o_proj (spec §6.1).
  core::Tensor gated = ctx.alloc(rows, o.dim(1));
  ctx.ops.sigmoid_gate.run({o.view(), ctx.linear(x, w.g_proj).view(), gated.view(), ctx.precision()},
                           ctx.device());
  return ctx.linear(gated, w.o_proj);
}

}  // namespace k3::model
