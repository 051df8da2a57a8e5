// kernels/gqa/reference.cpp: CPU reference of rope_gqa_attention (see gqa.h for the math).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/gqa/gqa.h"

namespace k3::kernels {

namespace {

// Rotates x[0, d) by `position` with rotate-half pairs (x[j], x[j + d/2]).
void rotate_half(float* x, int d, int64_t position, const float* inv_freq, Precision p) {
  const float pos = static_cast<float>(position);
  for (int j = 0; j < d / 2; ++j) {
    const float angle = pos * inv_freq[j];
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = x[j], b = x[j + d / 2];
    const float ac = a * c, bs = b * s, as = a * s, bc = b * c;
    x[j] = round_act(ac - bs, p);
    x[j + d / 2] = round_act(bc + as, p);
  }
}

}  // namespace

core::Status rope_gqa_attention_check(const RopeGqaAttentionArgs& a) {
  const int NH = a.num_heads, NKV = a.num_kv_heads, d = a.head_dim;
  if (NH <= 0 || NKV <= 0 || d <= 0 || d % 2 != 0 || NH % NKV != 0)
    return core::Status::fail("heads " + std::to_string(NH) + " / KV heads " + std::to_string(NKV) + " / head_dim " +
                              std::to_string(d) + ": need positive sizes, an even head_dim and NKV dividing NH");
  const int64_t n = a.q.rank() == 2 ? a.q.dim(0) : -1;
  const int64_t qw = int64_t{NH} * d, kvw = int64_t{NKV} * d;
  if (!is_activation_rows(a.q, n, qw))
    return core::Status::fail("q must be an activation [n, " + std::to_string(qw) + "], got " + describe_view(a.q));
  if (!is_activation_rows(a.k, n, kvw) || a.k.dtype != a.q.dtype)
    return core::Status::fail("k must be [" + std::to_string(n) + ", " + std::to_string(kvw) + "] like q, got " +
                              describe_view(a.k));
  if (!is_activation_rows(a.v, n, kvw) || a.v.dtype != a.q.dtype)
    return core::Status::fail("v must be [" + std::to_string(n) + ", " + std::to_string(kvw) + "] like q, got " +
                              describe_view(a.v));
  if (!is_activation_rows(a.out, n, qw) || a.out.dtype != a.q.dtype)
    return core::Status::fail("out must be [" + std::to_string(n) + ", " + std::to_string(qw) + "] like q, got " +
                              describe_view(a.out));
  for (const auto* c : {&a.k_cache, &a.v_cache})
    if (c->dtype != core::DType::f32 || c->rank() != 2 || c->dim(1) != kvw || !c->is_contiguous())
      return core::Status::fail("k_cache and v_cache must be contiguous f32 [capacity, " + std::to_string(kvw) +
                                "], got " + describe_view(*c));
  if (a.k_cache.dim(0) != a.v_cache.dim(0))
    return core::Status::fail("k_cache and v_cache must have the same capacity");
  if (a.past < 0 || a.position < 0 || a.past + n > a.k_cache.dim(0))
    return core::Status::fail("past " + std::to_string(a.past) + " + " + std::to_string(n) + " new rows exceed the " +
                              std::to_string(a.k_cache.dim(0)) + " cache rows (or past/position is negative)");
  if (a.inv_freq.dtype != core::DType::f32 || a.inv_freq.rank() != 1 || a.inv_freq.dim(0) != d / 2 ||
      !a.inv_freq.is_contiguous())
    return core::Status::fail("inv_freq must be contiguous f32 [" + std::to_string(d / 2) + "], got " +
                              describe_view(a.inv_freq));
  if (a.q.device != a.k_cache.device || a.q.device != a.inv_freq.device || a.q.device != a.out.device)
    return core::Status::fail("every tensor must be on one device");
  return core::Status::ok();
}

void rope_gqa_attention_reference(const RopeGqaAttentionArgs& a) {
  const int NH = a.num_heads, NKV = a.num_kv_heads, d = a.head_dim, group = NH / NKV;
  const int64_t n = a.q.dim(0), kvw = int64_t{NKV} * d;
  const float* inv_freq = a.inv_freq.as<const float>();
  float* kc = a.k_cache.as<float>();
  float* vc = a.v_cache.as<float>();
  for (int64_t i = 0; i < n; ++i) {
    float* q = a.q.as<float>() + i * a.q.strides[0];
    float* k = a.k.as<float>() + i * a.k.strides[0];
    const float* v = a.v.as<const float>() + i * a.v.strides[0];
    for (int h = 0; h < NH; ++h) rotate_half(q + int64_t{h} * d, d, a.position + i, inv_freq, a.precision);
    for (int h = 0; h < NKV; ++h) rotate_half(k + int64_t{h} * d, d, a.position + i, inv_freq, a.precision);
    std::copy(k, k + kvw, kc + (a.past + i) * kvw);
    std::copy(v, v + kvw, vc + (a.past + i) * kvw);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> p;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t keys = a.past + i + 1;
    p.resize(static_cast<size_t>(keys));
    const float* q = a.q.as<const float>() + i * a.q.strides[0];
    float* out = a.out.as<float>() + i * a.out.strides[0];
    for (int h = 0; h < NH; ++h) {
      const float* qh = q + int64_t{h} * d;
      const int64_t off = int64_t{h / group} * d;
      float max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < keys; ++j) {
        const float* kj = kc + j * kvw + off;
        float dot = 0.0f;
        for (int e = 0; e < d; ++e) dot += qh[e] * kj[e];
        p[static_cast<size_t>(j)] = dot * scale;
        max = std::max(max, p[static_cast<size_t>(j)]);
      }
      float sum = 0.0f;
      for (float& s : p) sum += (s = std::exp(s - max));
      for (int e = 0; e < d; ++e) {
        float acc = 0.0f;
        for (int64_t j = 0; j < keys; ++j) acc += p[static_cast<size_t>(j)] * vc[j * kvw + off + e];
        out[int64_t{h} * d + e] = round_act(acc / sum, a.precision);
      }
    }
  }
}

}  // namespace k3::kernels
