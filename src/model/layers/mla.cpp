// model/layers/mla.cpp: a gated MLA (NoPE) attention sublayer (spec §6) for a batch of sequences.
#include "model/layers/context.h"

namespace k3::model {

namespace {
constexpr float kMlaNormEps = 1e-6f;  // q_a/kv_a layernorms: Moonshot reference default (spec §6.1)
}  // namespace

core::Tensor attention(const ForwardContext& ctx, int layer, const MlaWeights& w, const core::Tensor& x) {
  const auto& mc = ctx.config.mla;
  const int64_t rows = x.dim(0);
  const core::Tensor q = ctx.linear(ctx.rmsnorm(ctx.linear(x, w.q_a_proj), w.q_a_norm, kMlaNormEps), w.q_b_proj);
  const core::Tensor kv = ctx.linear(x, w.kv_a_proj);  // [rows, kv_lora + rope]
  const core::Tensor c_n = ctx.rmsnorm(column_copy(ctx, kv, 0, mc.kv_lora_rank), w.kv_a_norm, kMlaNormEps);
  const core::Tensor k_pe = column_copy(ctx, kv, mc.kv_lora_rank, mc.cache_dim());
  core::Tensor o = ctx.alloc(rows, int64_t{mc.num_heads} * mc.v_head_dim);

  // Every new token's entry into its page (one call; cache_rows from the step's block tables),
  // then attention over the pages: the prefill sequences in the naive form and the decode /
  // verify sequences in the absorbed form, one call each. Together they write every row of o.
  const core::Tensor& pages = ctx.kv.mla_pages(layer);  // [num_blocks, block_size, width]
  ctx.ops.mla_cache_write.run({c_n.view(), k_pe.view(), pages.view(), ctx.batches.cache_rows, ctx.options.kv_k_scale},
                              ctx.device());
  const auto attend = [&](const auto& table, const kernels::SeqBatch& seqs) {
    if (seqs.num_seqs == 0) return;
    kernels::MlaAttentionArgs a;
    a.q = q.view();
    a.pages = pages.view();
    a.seqs = seqs;
    a.k_scale = ctx.options.kv_k_scale;
    a.kv_b = &w.kv_b_proj;
    a.out = o.view();
    a.num_heads = mc.num_heads;
    a.qk_nope = mc.qk_nope_head_dim;
    a.qk_rope = mc.qk_rope_head_dim;
    a.v_head_dim = mc.v_head_dim;
    a.kv_lora = mc.kv_lora_rank;
    a.scale = mc.softmax_scale();
    a.precision = ctx.precision();
    table.run(a, ctx.device());
  };
  attend(ctx.ops.mla_naive, ctx.batches.prefill);
  attend(ctx.ops.mla_absorbed, ctx.batches.decode);
  ctx.emit("mla.o", layer, o);

  if (!mc.use_output_gate) return ctx.row_parallel_linear(o, w.o_proj);  // TP: reduced in layer_forward
  // Output gate from the layer input (after input_layernorm), then o_proj (spec §6.1).
  core::Tensor gated = ctx.alloc(rows, o.dim(1));
  ctx.ops.sigmoid_gate.run({o.view(), ctx.linear(x, w.g_proj).view(), gated.view(), ctx.precision()},
                           ctx.device());
  return ctx.row_parallel_linear(gated, w.o_proj);
}

}  // namespace k3::model
