// model/layers/mla.cpp: a gated MLA (NoPE) attention sublayer (spec §6) for a batch of sequences.
#include <algorithm>
#include <cstring>

#include "model/layers/context.h"

namespace k3::model {

namespace {
constexpr float kMlaNormEps = 1e-6f;  // q_a/kv_a layernorms: Moonshot reference default (spec §6.1)

// `count` consecutive cache rows starting at token position `pos` (all within one page).
core::TensorView page_rows(const core::Tensor& pages, const std::vector<int32_t>& table, int64_t pos, int64_t count) {
  const int64_t bs = pages.dim(1), width = pages.dim(2);
  const core::TensorView page = pages.view().row(table.at(static_cast<size_t>(pos / bs)));
  char* base = static_cast<char*>(page.data) + (pos % bs) * width * static_cast<int64_t>(core::dtype_size(pages.dtype()));
  return core::TensorView::contiguous(base, pages.dtype(), {count, width});
}

// Rows [0, tokens) of a sequence's cache, copied out of its pages in token order.
core::Tensor gather_pages(const core::Tensor& pages, const std::vector<int32_t>& table, int64_t tokens) {
  const int64_t bs = pages.dim(1), width = pages.dim(2);
  core::Tensor out = core::Tensor::zeros(pages.dtype(), {tokens, width});
  const size_t row_bytes = static_cast<size_t>(width) * core::dtype_size(pages.dtype());
  for (int64_t p = 0; p < tokens; p += bs) {
    const int64_t n = std::min(bs, tokens - p);
    std::memcpy(static_cast<char*>(out.data<void>()) + static_cast<size_t>(p) * row_bytes,
                page_rows(pages, table, p, n).data, static_cast<size_t>(n) * row_bytes);
  }
  return out;
}
}  // namespace

core::Tensor attention(const ForwardContext& ctx, int layer, const MlaWeights& w, const core::Tensor& x) {
  const auto& mc = ctx.config.mla;
  const int64_t rows = x.dim(0), block_size = ctx.kv.storage_config().block_size;
  const core::Tensor q = ctx.linear(ctx.rmsnorm(ctx.linear(x, w.q_a_proj), w.q_a_norm, kMlaNormEps), w.q_b_proj);
  const core::Tensor kv = ctx.linear(x, w.kv_a_proj);  // [rows, kv_lora + rope]
  const core::Tensor c_n = ctx.rmsnorm(column_copy(kv, 0, mc.kv_lora_rank), w.kv_a_norm, kMlaNormEps);
  const core::Tensor k_pe = column_copy(kv, mc.kv_lora_rank, mc.cache_dim());
  core::Tensor o = ctx.alloc(rows, int64_t{mc.num_heads} * mc.v_head_dim);

  const core::Tensor& pages = ctx.kv.mla_pages(layer);  // [num_blocks, block_size, width]
  for (const Segment& s : ctx.segments) {
    const int64_t b = s.row_begin, e = s.row_end, start = s.state->num_tokens, end = start + s.rows();
    // Write the new entries into their pages, one run per page touched.
    for (int64_t p = start; p < end;) {
      const int64_t run = std::min(end, (p / block_size + 1) * block_size) - p;
      const int64_t r = b + (p - start);
      ctx.ops.mla_cache_write.run({row_slice(c_n, r, r + run).view(), row_slice(k_pe, r, r + run).view(),
                                   page_rows(pages, s.state->block_table, p, run), ctx.options.kv_k_scale},
                                  ctx.device());
      p += run;
    }
    // The reference attention reads a contiguous [end, width] copy of the sequence's pages.
    const core::Tensor cache = gather_pages(pages, s.state->block_table, end);
    kernels::MlaAttentionArgs a{row_slice(q, b, e).view(), cache.view(), ctx.options.kv_k_scale,
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
