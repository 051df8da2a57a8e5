// kernels/mla/attention_common.cpp: argument check and helpers shared by both MLA attention forms.
#include <cmath>
#include <string>

#include "kernels/mla/mla.h"
#include "kernels/mla/mla_internal.h"

namespace k3::kernels {

namespace mla_detail {

bool is_rows(const core::TensorView& v) {
  if (v.rank() != 2 || !v.defined()) return false;
  if (v.numel() == 0) return true;
  return (v.dim(1) <= 1 || v.strides[1] == 1) && (v.dim(0) <= 1 || v.strides[0] >= v.dim(1));
}

std::string describe(const core::TensorView& v) {
  if (!v.defined() || v.rank() == 0) return "undefined";
  return std::string(core::dtype_name(v.dtype)) + " " + v.shape.str();
}

HeadWeights load_head_weights(const MlaAttentionArgs& a, int h) {
  // kv_b rows per head: [h*(nope+v), h*(nope+v)+nope) = W_UK[h], the next v rows = W_UV[h].
  const int64_t L = a.kv_lora, first = static_cast<int64_t>(h) * (a.qk_nope + a.v_head_dim);
  HeadWeights w;
  w.w_uk.resize(static_cast<size_t>(a.qk_nope * L));
  w.w_uv.resize(static_cast<size_t>(a.v_head_dim * L));
  for (int64_t d = 0; d < a.qk_nope; ++d) a.kv_b->load_row(first + d, w.w_uk.data() + d * L);
  for (int64_t e = 0; e < a.v_head_dim; ++e)
    a.kv_b->load_row(first + a.qk_nope + e, w.w_uv.data() + e * L);
  return w;
}

void softmax_inplace(float* s, int64_t n) {
  float m = s[0];
  for (int64_t j = 1; j < n; ++j) m = s[j] > m ? s[j] : m;
  float z = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    z += s[j];
  }
  for (int64_t j = 0; j < n; ++j) s[j] = s[j] / z;
}

}  // namespace mla_detail

using mla_detail::describe;
using mla_detail::is_rows;

core::Status mla_attention_check(const MlaAttentionArgs& a) {
  const auto fail = [](const std::string& why) { return core::Status::fail("mla_attention: " + why); };
  if (a.num_heads < 1 || a.qk_nope < 1 || a.qk_rope < 1 || a.v_head_dim < 1 || a.kv_lora < 1)
    return fail("num_heads, qk_nope, qk_rope, v_head_dim and kv_lora must all be >= 1, got " +
                std::to_string(a.num_heads) + ", " + std::to_string(a.qk_nope) + ", " +
                std::to_string(a.qk_rope) + ", " + std::to_string(a.v_head_dim) + ", " +
                std::to_string(a.kv_lora));
  if (!(std::isfinite(a.scale) && a.scale > 0.0f))
    return fail("scale must be finite and > 0 (normally (qk_nope + qk_rope)^-1/2), got " +
                std::to_string(a.scale));
  if (!(std::isfinite(a.k_scale) && a.k_scale > 0.0f))
    return fail("k_scale must be finite and > 0, got " + std::to_string(a.k_scale));
  const int64_t H = a.num_heads, q_width = H * (a.qk_nope + a.qk_rope);
  const int64_t entry = a.kv_lora + a.qk_rope, out_width = H * a.v_head_dim;
  if (!is_rows(a.q) || !is_activation_dtype(a.q) || a.q.dim(1) != q_width)
    return fail("q must be f32 (or bf16 on CUDA) [T, num_heads * (qk_nope + qk_rope)] = [T, " + std::to_string(q_width) +
                "] with unit inner stride, got " + describe(a.q));
  const int64_t T = a.q.dim(0);
  if (a.cache.dtype != core::DType::f32 && a.cache.dtype != core::DType::f8_e4m3 &&
      !(a.cache.dtype == core::DType::bf16 && a.cache.device == core::Device::cuda))
    return fail("cache must be f32 or f8_e4m3 (or bf16 on CUDA), got " + describe(a.cache));
  if (!is_rows(a.cache) || a.cache.dim(1) != entry)
    return fail("cache must be [S, kv_lora + qk_rope] = [S, " + std::to_string(entry) +
                "] with unit inner stride, got " + describe(a.cache));
  if (a.cache.dim(0) < T)
    return fail("cache must hold S >= T positions (the T queries are its last T), got S = " +
                std::to_string(a.cache.dim(0)) + ", T = " + std::to_string(T));
  if (a.kv_b == nullptr || !a.kv_b->weight.defined())
    return fail("kv_b is missing");
  const int64_t kv_b_rows = H * (a.qk_nope + a.v_head_dim);
  const core::TensorView& w = a.kv_b->weight.view();
  if (a.kv_b->is_mxfp4() || (w.dtype != core::DType::bf16 && w.dtype != core::DType::f32))
    return fail("kv_b must be a dense bf16 or f32 weight, got " + describe(w) +
                (a.kv_b->is_mxfp4() ? " (MXFP4)" : ""));
  if (w.rank() != 2 || w.dim(0) != kv_b_rows || w.dim(1) != a.kv_lora || !w.is_contiguous())
    return fail("kv_b must be contiguous [num_heads * (qk_nope + v_head_dim), kv_lora] = [" +
                std::to_string(kv_b_rows) + ", " + std::to_string(a.kv_lora) + "], got " + describe(w));
  if (!is_rows(a.out) || !is_activation_dtype(a.out) || a.out.dim(0) != T || a.out.dim(1) != out_width)
    return fail("out must be f32 (or bf16 on CUDA) [T, num_heads * v_head_dim] = [" + std::to_string(T) + ", " +
                std::to_string(out_width) + "] with unit inner stride, got " + describe(a.out));
  if (a.cache.device != a.q.device || a.out.device != a.q.device || w.device != a.q.device)
    return fail("q, cache, kv_b and out must be on one device");
  return core::Status::ok();
}

}  // namespace k3::kernels
