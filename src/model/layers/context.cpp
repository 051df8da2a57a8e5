// model/layers/context.cpp: ForwardContext helpers and row/column views.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "model/layers/context.h"

namespace k3::model {

std::string_view decode_backend_name(DecodeBackend b) {
  return b == DecodeBackend::latency_specialized ? "latency_specialized" : "auto";
}

DecodeBackend parse_decode_backend(std::string_view name) {
  if (name == "auto") return DecodeBackend::standard;
  if (name == "latency_specialized") return DecodeBackend::latency_specialized;
  throw core::Error("decode_backend '" + std::string(name) + "' is not one of: auto, latency_specialized");
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

core::Tensor ForwardContext::linear(const core::Tensor& x, const LinearWeight& w,
                                    bool round_output) const {
  // Unrounded outputs (router and lm_head logits) stay f32 on every device (spec §2).
  core::Tensor y = round_output ? alloc(x.dim(0), w.out_features()) : alloc_as(core::DType::f32, x.dim(0), w.out_features());
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
  ops.situ_glu.run({gate.view(), up.view(), y.view(), config.situ_beta, config.situ_linear_beta,
                    precision()},
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
  if (partial.dtype() != core::DType::f32 || precision() == kernels::Precision::fp32)
    return partial;
  return to_activation(partial.view());
}

core::Tensor ForwardContext::to_activation(const core::TensorView& x) const {
  core::Tensor y = alloc(x.dim(0), x.dim(1));
  ops.to_activation.run({x, y.view(), precision()}, device());
  return y;
}

core::Tensor row_slice(const core::Tensor& t, int64_t begin, int64_t end) {
  K3_CHECK(t.shape().rank() == 2 && 0 <= begin && begin <= end && end <= t.dim(0),
           "row_slice out of range");
  const int64_t cols = t.dim(1);
  char* base = static_cast<char*>(t.data<void>()) +
               begin * cols * static_cast<int64_t>(core::dtype_size(t.dtype()));
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

}  // namespace k3::model
