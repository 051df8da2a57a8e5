// model/layers/context.cpp: ForwardContext helpers and row/column views.
#include "model/layers/context.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace k3::model {

std::string_view decode_backend_name(DecodeBackend b) {
  return b == DecodeBackend::latency_specialized ? "latency_specialized" : "auto";
}

DecodeBackend parse_decode_backend(std::string_view name) {
  if (name == "auto") return DecodeBackend::standard;
  if (name == "latency_specialized") return DecodeBackend::latency_specialized;
  throw core::Error("decode_backend '" + std::string(name) + "' is not one of: auto, latency_specialized");
}

void check_dcp_size(int dcp, int tp_size) {
  if (dcp != 1 && dcp != tp_size)
    throw core::Error("dcp " + std::to_string(dcp) + " must be 1 or the tensor-parallel size " +
                      std::to_string(tp_size));
}

core::Tensor ForwardContext::alloc_as(core::DType dtype, int64_t rows, int64_t cols) const {
  core::Tensor t = memory.empty(dtype, {rows, cols});
  if (options.poison_buffers) memory.fill_bytes(t.view(), 0xff);  // NaN (f32, bf16), -1 (i32)
  return t;
}

void ForwardContext::emit(std::string_view name, int layer, const core::Tensor& t) const {
  if (!trace || !*trace) return;
  if (t.view().device == core::Device::cpu) {
    (*trace)(name, layer, t.view());
  } else {
    const core::Tensor host = memory.download_f32(t.view());
    (*trace)(name, layer, host.view());
  }
}

core::Tensor ForwardContext::linear(const core::Tensor& x, const LinearWeight& w, bool round_output) const {
  // Unrounded outputs (router and lm_head logits) stay f32 on every device (spec §2).
  core::Tensor y = round_output ? alloc(x.dim(0), w.out_features())
                                : alloc_as(core::DType::f32, x.dim(0), w.out_features());
  ops.linear.run({x.view(), &w, y.view(), round_output, precision()}, device());
  return y;
}

core::Tensor ForwardContext::rmsnorm(const core::Tensor& x, const core::Tensor& w, float eps) const {
  core::Tensor y = alloc(x.dim(0), x.dim(1));
  ops.rmsnorm.run({x.view(), w.view(), y.view(), eps, options.rmsnorm_style, precision()}, device());
  return y;
}

core::Tensor ForwardContext::situ_glu(const core::Tensor& gate, const core::Tensor& up) const {
  core::Tensor y = alloc(gate.dim(0), gate.dim(1));
  ops.situ_glu.run({gate.view(), up.view(), y.view(), config.situ_beta, config.situ_linear_beta, precision()},
                   device());
  return y;
}

core::Tensor ForwardContext::add(const core::Tensor& a, const core::Tensor& b) const {
  core::Tensor y = alloc(a.dim(0), a.dim(1));
  ops.add.run({a.view(), b.view(), y.view(), precision()}, device());
  return y;
}

core::Tensor ForwardContext::row_parallel_linear(const core::Tensor& x, const LinearWeight& w) const {
  return linear(x, w, /*round_output=*/!tensor_parallel());
}

core::Tensor ForwardContext::reduce_partial(const core::Tensor& partial) const {
  if (!tensor_parallel()) return partial;
  comm->all_reduce_sum(partial.view());
  // A bf16 partial (a layer that rounded its row-parallel output) is already summed and rounded
  // once by the collective; an f32 sum in fp32 mode needs no rounding.
  if (partial.dtype() != core::DType::f32 || precision() == kernels::Precision::fp32) return partial;
  return to_activation(partial.view());
}

core::Tensor ForwardContext::to_activation(const core::TensorView& x) const {
  core::Tensor y = alloc(x.dim(0), x.dim(1));
  ops.to_activation.run({x, y.view(), precision()}, device());
  return y;
}

core::Tensor row_slice(const core::Tensor& t, int64_t begin, int64_t end) {
  K3_CHECK(t.shape().rank() == 2 && 0 <= begin && begin <= end && end <= t.dim(0), "row_slice out of range");
  const int64_t cols = t.dim(1);
  char* base = static_cast<char*>(t.data<void>()) + begin * cols * static_cast<int64_t>(core::dtype_size(t.dtype()));
  // Shares t's storage: the slice keeps a copy of t (and so its keep-alive).
  auto keep = std::make_shared<core::Tensor>(t);
  return core::Tensor(core::TensorView::contiguous(base, t.dtype(), {end - begin, cols}, t.view().device), keep);
}

core::Tensor column_copy(const ForwardContext& ctx, const core::Tensor& t, int64_t begin, int64_t end) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  K3_CHECK(t.shape().rank() == 2 && t.view().is_contiguous() && 0 <= begin && begin <= end && end <= cols,
           "column_copy out of range");
  core::TensorView src = t.view();  // columns [begin, end) as a row-strided view
  src.data = static_cast<char*>(src.data) + begin * static_cast<int64_t>(core::dtype_size(t.dtype()));
  src.shape = {rows, end - begin};
  core::Tensor out = ctx.alloc_as(t.dtype(), rows, end - begin);
  ctx.memory.copy(out.view(), src);
  return out;
}

core::Tensor verify_rows(const ForwardContext& ctx, const core::Tensor& t) {
  // A batch of verify sequences only (the speculative steps' usual case): the rows are already
  // compact and in order, so the capture holds t itself (no copy; t is this step's own buffer).
  bool all_verify = t.dim(0) == ctx.capture->total_rows && t.view().is_contiguous();
  for (const Segment& s : ctx.segments) all_verify = all_verify && s.verify;
  if (all_verify) return t;
  core::Tensor out = ctx.alloc_as(t.dtype(), ctx.capture->total_rows, t.dim(1));
  int64_t at = 0;
  for (const Segment& s : ctx.segments) {
    if (!s.verify) continue;
    ctx.memory.copy(row_slice(out, at, at + s.rows()).view(), row_slice(t, s.row_begin, s.row_end).view());
    at += s.rows();
  }
  return out;
}

core::Tensor embed_tokens(const ForwardContext& ctx, const Weights& w, const core::TensorView& ids) {
  core::Tensor prefix = ctx.alloc(ids.numel(), ctx.config.hidden_size);
  kernels::EmbeddingArgs embed{ids, w.embed.view(), prefix.view()};
  if (ctx.tensor_parallel()) {  // vocab-parallel: each rank fills its rows, the sum has them all
    embed.vocab_begin = int64_t{ctx.config.vocab_size} * ctx.comm->rank();
    embed.vocab_size = int64_t{ctx.config.vocab_size} * ctx.comm->size();
  }
  ctx.ops.embedding.run(embed, ctx.device());
  if (ctx.tensor_parallel()) ctx.comm->all_reduce_sum(prefix.view());  // one nonzero term: exact
  ctx.emit("embed", -1, prefix);
  return prefix;
}

core::Tensor lm_head_logits(const ForwardContext& ctx, const Weights& w, const core::Tensor& x) {
  core::Tensor logits = ctx.linear(x, w.lm_head, /*round_output=*/false);  // [rows, V / tp]
  if (ctx.tensor_parallel()) {  // vocab-parallel lm_head: concatenate the ranks' vocabulary slices
    core::Tensor full = ctx.alloc_as(core::DType::f32, logits.dim(0),
                                     int64_t{ctx.config.vocab_size} * ctx.comm->size());
    ctx.comm->all_gather(logits.view(), full.view(), comm::GatherAxis::last);
    logits = full;
  }
  ctx.emit("logits", -1, logits);
  return logits;
}

}  // namespace k3::model
