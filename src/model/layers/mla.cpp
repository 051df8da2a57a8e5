// model/layers/mla.cpp: a gated MLA (NoPE) attention sublayer (spec §6) for a batch of sequences.
#include "model/layers/context.h"

namespace k3::model {

namespace {

// The output gate (spec §6.1): round(o * round(sigmoid(gate))) [T, H * v].
core::Tensor apply_gate(const ForwardContext& ctx, const core::Tensor& o, const core::Tensor& gate) {
  core::Tensor gated = ctx.alloc(o.dim(0), o.dim(1));
  ctx.ops.sigmoid_gate.run({o.view(), gate.view(), gated.view(), ctx.precision()}, ctx.device());
  return gated;
}

// One MLA form (ctx.ops.mla_naive or mla_absorbed) for the rows of `seqs` over `pages`, into their
// rows of o [T, H * v] (the other rows are left as they are).
template <class Table>
void attend(const ForwardContext& ctx, const Table& table, const MlaWeights& w, const core::Tensor& q,
            const core::TensorView& pages, const kernels::SeqBatch& seqs, const core::Tensor& o) {
  if (seqs.num_seqs == 0) return;
  const auto& mc = ctx.config.mla;
  kernels::MlaAttentionArgs a;
  a.q = q.view();
  a.pages = pages;
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
}

// The absorbed form under decode context parallelism (kernels/mla/mla_cp.h) for the rows of `seqs`
// (decode and verify sequences): this rank's pages hold only the positions p % cp == rank, so it runs
// around three collectives, attending with every head of the group over this rank's tokens and
// combining the ranks' partial softmaxes by log-sum-exp. Writes the rows of `seqs` of out [T, H * v]
// (this rank's heads): round(o * round(sigmoid(gate))) with a gate, else o; step 4 applies W_UV and
// the gate in one op. The other rows' scratch (qc, o_part, o_lat) travels through the collectives
// unread.
void dcp_absorbed(const ForwardContext& ctx, const MlaWeights& w, const core::Tensor& q, const core::Tensor& pages,
                  const kernels::SeqBatch& seqs, const core::Tensor& gate, const core::Tensor& out) {
  const auto& mc = ctx.config.mla;
  const ContextSplit cp = ctx.context_split();
  const int64_t T = q.dim(0), H = mc.num_heads, L = mc.kv_lora_rank, E = mc.cache_dim(), G = cp.size;
  const auto f32 = [&](int64_t rows, int64_t cols) { return ctx.alloc_as(core::DType::f32, rows, cols); };
  const auto as = [&](const core::Tensor& t, core::Shape shape) {  // t's storage with another shape
    return core::TensorView::contiguous(t.view().data, core::DType::f32, shape, ctx.device());
  };

  // 1. qc = [round(W_UK^T q_nope); q_pe] of this rank's heads, gathered: [G, T, H, E] (owner-major).
  const core::Tensor qc = f32(T, H * E), qc_all = f32(G * T, H * E);
  ctx.ops.mla_q_absorb.run({q.view(), seqs, &w.kv_b_proj, as(qc, {T, H, E}), mc.num_heads, mc.qk_nope_head_dim,
                            mc.qk_rope_head_dim, mc.v_head_dim, mc.kv_lora_rank, ctx.precision()},
                           ctx.device());
  ctx.comm->all_gather(qc.view(), qc_all.view(), comm::GatherAxis::first);

  // 2. Every owner's heads over this rank's tokens: o_part [G, T, H, L], lse [G, T, H]; then every
  //    rank's lse: [cp, G, T, H].
  const core::Tensor o_part = f32(G * T, H * L), lse = f32(G * T, H), lse_all = f32(cp.size * G * T, H);
  kernels::MlaPartialAttentionArgs part;
  part.qc = as(qc_all, {G, T, H, E});
  part.pages = pages.view();
  part.seqs = seqs;  // positions global, block tables / max_tokens local
  part.k_scale = ctx.options.kv_k_scale;
  part.o_part = as(o_part, {G, T, H, L});
  part.lse = as(lse, {G, T, H});
  part.cp_size = cp.size;
  part.cp_rank = cp.rank;
  part.scale = mc.softmax_scale();
  part.precision = ctx.precision();  // bf16: qc holds bf16 values (step 1 rounded q_lat), tensor cores allowed
  ctx.ops.mla_partial_attention.run(part, ctx.device());
  ctx.comm->all_gather(lse.view(), lse_all.view(), comm::GatherAxis::first);

  // 3. Weigh this rank's partials by e^{lse_mine - logsumexp}, then sum the ranks' partials of this
  //    rank's heads (rank order, fp32): o_lat [T, H, L].
  ctx.ops.mla_lse_rescale.run({part.o_part, as(lse_all, {cp.size, G, T, H}), seqs, cp.rank}, ctx.device());
  const core::Tensor o_lat = f32(T, H * L);
  ctx.comm->reduce_scatter_sum(o_part.view(), o_lat.view());

  // 4. o = round(W_UV round(o_lat)), and out = round(o * round(sigmoid(gate))) in the same op.
  ctx.ops.mla_w_uv.run({as(o_lat, {T, H, L}), seqs, &w.kv_b_proj, gate.view(), out.view(), mc.num_heads,
                        mc.qk_nope_head_dim, mc.v_head_dim, mc.kv_lora_rank, ctx.precision()},
                       ctx.device());
}

// A pure decode / verify step under decode context parallelism: the absorbed form over every row,
// the gate fused into W_UV (the fast path depends on that). It emits "mla.o" (the ungated o, as every
// path does): with a trace and a gate it runs the unfused pair instead (mla_w_uv without the gate,
// then sigmoid_gate), which gives the same bits.
core::Tensor dcp_decode_attention(const ForwardContext& ctx, int layer, const MlaWeights& w, const core::Tensor& q,
                                  const core::Tensor& pages, const core::Tensor& gate) {
  const bool traced = ctx.trace != nullptr && *ctx.trace;
  const bool fuse_gate = gate.defined() && !traced;
  core::Tensor out = ctx.alloc(q.dim(0), int64_t{ctx.config.mla.num_heads} * ctx.config.mla.v_head_dim);
  dcp_absorbed(ctx, w, q, pages, ctx.batches.all, fuse_gate ? gate : core::Tensor(), out);
  if (fuse_gate) return out;
  ctx.emit("mla.o", layer, out);
  return gate.defined() ? apply_gate(ctx, out, gate) : out;
}

// The prefill sequences under decode context parallelism, in the naive form (as without DCP: the
// absorbed form's kv_lora-wide scores would cost several times the FLOPs on long prompts) over their
// whole context, gathered (StepBatches::DcpPrefill, kernels::MlaGatherPlan):
//   mla_cache_gather  this rank's entries of every prefill context -> pack [slots, width] (cache dtype)
//   all_gather(first)                                                -> [cp * slots, width]
//   mla_cache_gather  the gathered entries in position order        -> a temporary cache [blocks, bs, width]
//   mla_naive         over that cache: the entries and order the replicated cache gives, so the rows
//                     equal the non-DCP prefill at the same TP size bit for bit.
// fp8 codes travel as they are (same k_scale). Writes the prefill rows of o [T, H * v].
void dcp_prefill_attention(const ForwardContext& ctx, const MlaWeights& w, const core::Tensor& q,
                           const core::Tensor& pages, const core::Tensor& o) {
  const StepBatches::DcpPrefill& d = ctx.batches.dcp_prefill;
  const int64_t cp = ctx.context_split().size, bs = pages.dim(1), width = pages.dim(2);
  const core::DType dt = pages.dtype();
  const auto as_pages = [&](const core::Tensor& t, int64_t blocks, int64_t block_size) {
    return core::TensorView::contiguous(t.view().data, dt, {blocks, block_size, width}, ctx.device());
  };
  const core::Tensor cache = ctx.alloc_as(dt, d.blocks * bs, width);
  {  // the pack and gathered buffers are step scratch, released before the attention
    const core::Tensor pack = ctx.alloc_as(dt, d.slots, width), gathered = ctx.alloc_as(dt, cp * d.slots, width);
    ctx.ops.mla_cache_gather.run({pages.view(), d.pack_rows, as_pages(pack, d.slots, 1)}, ctx.device());
    ctx.comm->all_gather(pack.view(), gathered.view(), comm::GatherAxis::first);
    ctx.ops.mla_cache_gather.run({as_pages(gathered, cp * d.slots, 1), d.place_rows, as_pages(cache, d.blocks, bs)},
                                 ctx.device());
  }
  attend(ctx, ctx.ops.mla_naive, w, q, as_pages(cache, d.blocks, bs), d.seqs, o);
}

// Every step without DCP, and a DCP step with prefill sequences: the prefill sequences in the naive
// form and the decode / verify sequences in the absorbed form, one call each (without DCP over this
// rank's whole cache; under DCP the prefill sequences over their gathered context and the others by
// dcp_absorbed, whose collectives come first on every rank). Together they write every row of
// o [T, H * v], ungated.
core::Tensor mixed_attention(const ForwardContext& ctx, const MlaWeights& w, const core::Tensor& q,
                             const core::Tensor& pages) {
  const auto& mc = ctx.config.mla;
  core::Tensor o = ctx.alloc(q.dim(0), int64_t{mc.num_heads} * mc.v_head_dim);
  if (ctx.context_split().size == 1) {
    attend(ctx, ctx.ops.mla_naive, w, q, pages.view(), ctx.batches.prefill, o);
    attend(ctx, ctx.ops.mla_absorbed, w, q, pages.view(), ctx.batches.decode, o);
    return o;
  }
  if (ctx.batches.decode.num_seqs > 0) dcp_absorbed(ctx, w, q, pages, ctx.batches.decode, core::Tensor(), o);
  if (ctx.batches.dcp_prefill.seqs.num_seqs > 0) dcp_prefill_attention(ctx, w, q, pages, o);
  return o;
}

}  // namespace

core::Tensor attention(const ForwardContext& ctx, int layer, const MlaWeights& w, const core::Tensor& x) {
  const auto& mc = ctx.config.mla;
  const core::Tensor q = ctx.linear(
      ctx.rmsnorm(ctx.linear(x, w.q_a_proj), w.q_a_norm, config::MlaConfig::kLatentNormEps), w.q_b_proj);
  const core::Tensor kv = ctx.linear(x, w.kv_a_proj);  // [rows, kv_lora + rope]
  const core::Tensor c_n = ctx.rmsnorm(column_copy(ctx, kv, 0, mc.kv_lora_rank), w.kv_a_norm,
                                       config::MlaConfig::kLatentNormEps);
  const core::Tensor k_pe = column_copy(ctx, kv, mc.kv_lora_rank, mc.cache_dim());

  // Every new token's entry into its page (one call; cache_rows from the step's block tables;
  // under DCP only this rank's tokens, the others' rows are -1), then attention over the pages.
  const core::Tensor& pages = ctx.kv.mla_pages(layer);  // [num_blocks, block_size, width]
  ctx.ops.mla_cache_write.run({c_n.view(), k_pe.view(), pages.view(), ctx.batches.cache_rows, ctx.options.kv_k_scale},
                              ctx.device());
  // Output gate logits from the layer input (after input_layernorm), [T, H * v] (spec §6.1); none
  // without the gate.
  const core::Tensor gate = mc.use_output_gate ? ctx.linear(x, w.g_proj) : core::Tensor();
  // Decode context parallelism, a step without prefill sequences: the gate joins W_UV there (one op
  // after the reduce-scatter).
  if (ctx.context_split().size > 1 && ctx.batches.prefill.num_seqs == 0)
    return ctx.row_parallel_linear(dcp_decode_attention(ctx, layer, w, q, pages, gate), w.o_proj);
  const core::Tensor o = mixed_attention(ctx, w, q, pages);
  ctx.emit("mla.o", layer, o);
  // TP: reduced in layer_forward.
  return ctx.row_parallel_linear(gate.defined() ? apply_gate(ctx, o, gate) : o, w.o_proj);
}

}  // namespace k3::model
