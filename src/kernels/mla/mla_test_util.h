// kernels/mla/mla_test_util.h: random MLA problems and an independent double-precision oracle (tests only).
//
// The oracle follows spec §6.1 literally and shares no code with the ops: per head it
// materialises full keys K[j] = [W_UK c_n,j ; k_pe,j] and values V[j] = W_UV c_n,j in double,
// then runs causal softmax attention in double with no rounding at all.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/fp8.h"
#include "core/rng.h"
#include "kernels/mla/mla.h"

namespace k3::kernels::mla_test {

struct MlaDims {
  int heads, nope, rope, v, kv_lora;
};

inline core::Tensor nan_filled(core::Shape shape) {
  core::Tensor t = core::Tensor::zeros(core::DType::f32, shape);
  std::fill(t.span<float>().begin(), t.span<float>().end(), std::numeric_limits<float>::quiet_NaN());
  return t;
}

// q, cache and kv_b for T queries over an S-entry cache. Inputs are bf16-representable (as the
// model hands them over); the cache is written through mla_cache_write_reference.
struct MlaProblem {
  MlaDims d{};
  int64_t S = 0, T = 0;
  core::Tensor q;      // f32 [T, H*(nope+rope)]
  core::Tensor c_n;    // f32 [S, kv_lora]  the values written into the cache
  core::Tensor k_pe;   // f32 [S, rope]
  core::Tensor cache;  // f32 or f8_e4m3 [S, kv_lora+rope]
  float k_scale = 1.0f;
  LinearWeight kv_b;   // bf16 or f32 [H*(nope+v), kv_lora]

  MlaProblem(MlaDims dims, int64_t s, int64_t t, core::DType cache_dtype, core::DType kv_b_dtype,
             float kscale, uint64_t seed)
      : d(dims), S(s), T(t), k_scale(kscale) {
    core::Rng rng(seed);
    const int64_t H = d.heads;
    q = core::Tensor::zeros(core::DType::f32, {T, H * (d.nope + d.rope)});
    for (float& x : q.span<float>()) x = core::bf16_round(static_cast<float>(rng.normal()));
    c_n = core::Tensor::zeros(core::DType::f32, {S, d.kv_lora});
    for (float& x : c_n.span<float>()) x = core::bf16_round(static_cast<float>(rng.normal()));
    k_pe = core::Tensor::zeros(core::DType::f32, {S, d.rope});
    for (float& x : k_pe.span<float>()) x = core::bf16_round(static_cast<float>(rng.normal()));
    // W ~ N(0, 1/kv_lora) keeps W c_n ~ N(0, 1), so scores spread over a few units: a softmax
    // that is neither uniform nor one-hot.
    const int64_t rows = H * (d.nope + d.v);
    const double w_std = 1.0 / std::sqrt(static_cast<double>(d.kv_lora));
    kv_b.weight = core::Tensor::zeros(kv_b_dtype, {rows, d.kv_lora});
    for (int64_t i = 0; i < rows * d.kv_lora; ++i) {
      const float w = static_cast<float>(rng.normal(0.0, w_std));
      if (kv_b_dtype == core::DType::bf16)
        kv_b.weight.data<uint16_t>()[i] = core::f32_to_bf16_bits(w);
      else
        kv_b.weight.data<float>()[i] = w;
    }
    cache = core::Tensor::zeros(cache_dtype, {S, d.kv_lora + d.rope});
    rewrite_cache();
  }

  // Writes c_n / k_pe (after edits) into the cache.
  void rewrite_cache() {
    MlaCacheWriteArgs w;
    w.c_n = c_n.view();
    w.k_pe = k_pe.view();
    w.dst = cache.view();
    w.k_scale = k_scale;
    mla_cache_write_reference(w);
  }

  MlaAttentionArgs args(const core::Tensor& out, Precision precision, float scale) const {
    MlaAttentionArgs a;
    a.q = q.view();
    a.cache = cache.view();
    a.k_scale = k_scale;
    a.kv_b = &kv_b;
    a.out = out.view();
    a.num_heads = d.heads;
    a.qk_nope = d.nope;
    a.qk_rope = d.rope;
    a.v_head_dim = d.v;
    a.kv_lora = d.kv_lora;
    a.scale = scale;
    a.precision = precision;
    return a;
  }
  float default_scale() const { return 1.0f / std::sqrt(static_cast<float>(d.nope + d.rope)); }

  // Runs one form on a NaN-poisoned [T, H*v] output.
  template <class Fn>
  core::Tensor run(Fn op, Precision precision, float scale = 0.0f) const {
    core::Tensor out = nan_filled({T, static_cast<int64_t>(d.heads) * d.v});
    op(args(out, precision, scale > 0.0f ? scale : default_scale()));
    return out;
  }

  // The cache value at (j, i) as the spec defines reading it, in double.
  double cache_value(int64_t j, int64_t i) const {
    const int64_t width = d.kv_lora + d.rope;
    if (cache.dtype() == core::DType::f32) return cache.data<const float>()[j * width + i];
    const uint8_t code = cache.data<const uint8_t>()[j * width + i];
    return static_cast<double>(core::fp8_e4m3_to_f32(code)) * static_cast<double>(k_scale);
  }

  // Double-precision oracle: [T, H*v], no rounding anywhere.
  std::vector<double> oracle(double scale) const {
    const int64_t H = d.heads, L = d.kv_lora, qk = d.nope + d.rope;
    std::vector<double> w(static_cast<size_t>(H * (d.nope + d.v) * L));
    std::vector<float> row(static_cast<size_t>(L));
    for (int64_t r = 0; r < H * (d.nope + d.v); ++r) {
      kv_b.load_row(r, row.data());
      std::copy(row.begin(), row.end(), w.begin() + r * L);
    }
    const int64_t width = L + d.rope;
    std::vector<double> entry(static_cast<size_t>(S * width));  // the cache, read once
    for (int64_t j = 0; j < S; ++j)
      for (int64_t i = 0; i < width; ++i) entry[j * width + i] = cache_value(j, i);
    std::vector<double> result(static_cast<size_t>(T * H * d.v));
    std::vector<double> K(static_cast<size_t>(S * qk)), V(static_cast<size_t>(S * d.v));
    for (int64_t h = 0; h < H; ++h) {
      const double* w_uk = w.data() + h * (d.nope + d.v) * L;
      const double* w_uv = w_uk + d.nope * L;
      for (int64_t j = 0; j < S; ++j) {
        const double* c = entry.data() + j * width;
        for (int64_t k = 0; k < d.nope; ++k) {
          double s = 0;
          for (int64_t i = 0; i < L; ++i) s += w_uk[k * L + i] * c[i];
          K[j * qk + k] = s;
        }
        for (int64_t r = 0; r < d.rope; ++r) K[j * qk + d.nope + r] = c[L + r];
        for (int64_t e = 0; e < d.v; ++e) {
          double s = 0;
          for (int64_t i = 0; i < L; ++i) s += w_uv[e * L + i] * c[i];
          V[j * d.v + e] = s;
        }
      }
      for (int64_t t = 0; t < T; ++t) {
        const float* qh = q.data<const float>() + t * H * qk + h * qk;
        const int64_t visible = S - T + t + 1;
        std::vector<double> p(static_cast<size_t>(visible));
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          double s = 0;
          for (int64_t k = 0; k < qk; ++k) s += static_cast<double>(qh[k]) * K[j * qk + k];
          p[j] = scale * s;
          m = std::max(m, p[j]);
        }
        double z = 0;
        for (double& x : p) z += (x = std::exp(x - m));
        for (int64_t e = 0; e < d.v; ++e) {
          double o = 0;
          for (int64_t j = 0; j < visible; ++j) o += p[j] / z * V[j * d.v + e];
          result[t * H * d.v + h * d.v + e] = o;
        }
      }
    }
    return result;
  }
};

// max |a - b| / max |b|: the error relative to the output's scale (element-wise relative error
// is meaningless for outputs near zero). Any non-finite value gives +inf.
inline double rel_err(const core::Tensor& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a.data<const float>()[i]) || !std::isfinite(b[i]))
      return std::numeric_limits<double>::infinity();
    num = std::max(num, std::fabs(static_cast<double>(a.data<const float>()[i]) - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return num / std::max(den, 1e-30);
}
inline std::vector<double> as_double(const core::Tensor& a) {
  return std::vector<double>(a.data<const float>(), a.data<const float>() + a.numel());
}
inline double rel_err(const core::Tensor& a, const core::Tensor& b) { return rel_err(a, as_double(b)); }

inline bool all_finite(const core::Tensor& a) {
  for (float x : a.span<const float>())
    if (!std::isfinite(x)) return false;
  return true;
}

}  // namespace k3::kernels::mla_test
