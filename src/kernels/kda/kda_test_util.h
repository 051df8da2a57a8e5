// kernels/kda/kda_test_util.h: helpers for the kernels/kda tests: random and NaN-poisoned tensors,
// error measures, random attention inputs, and naive double-precision forms of every KDA op written
// apart from the references (whole-matrix passes in the spec's exact step order).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <mutex>
#include <span>
#include <vector>

#include "core/bf16.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "kernels/kda/kda.h"

namespace k3::kernels::kda_test {

using core::Shape;
using core::Tensor;
using core::TensorView;

inline Tensor f32(Shape shape) { return Tensor::zeros(core::DType::f32, shape); }

// A tensor whose every value is NaN: an output the op forgot to write stays NaN and fails.
inline Tensor poisoned(Shape shape) {
  Tensor t = f32(shape);
  for (float& x : t.span<float>()) x = std::numeric_limits<float>::quiet_NaN();
  return t;
}

// N(mean, std) values; in bf16 mode rounded to bf16, as every activation upstream of KDA is.
inline Tensor random(core::Rng& rng, Shape shape, double mean, double std, Precision p = Precision::fp32) {
  Tensor t = f32(shape);
  for (float& x : t.span<float>()) x = round_act(static_cast<float>(rng.normal(mean, std)), p);
  return t;
}

inline Tensor copy(const Tensor& t) { return Tensor::copy_of(t.view()); }

// Rows [t0, t0+n) of a [T, X] view (a view into the same storage).
inline TensorView rows(const TensorView& v, int64_t t0, int64_t n) {
  TensorView r = v;
  r.data = static_cast<char*>(v.data) + t0 * v.strides[0] * static_cast<int64_t>(core::dtype_size(v.dtype));
  r.shape[0] = n;
  return r;
}

// Columns [c0, c0+n) of a [T, X] view: a row-strided view into the same storage.
inline TensorView cols(const TensorView& v, int64_t c0, int64_t n) {
  TensorView r = v;
  r.data = static_cast<char*>(v.data) + c0 * static_cast<int64_t>(core::dtype_size(v.dtype));
  r.shape[1] = n;
  return r;
}

// ---- sequence batches and state pools

// One sequence of a batched call: its activation rows, state slot and position.
struct SeqSpec {
  int64_t row_begin = 0, num_rows = 0, slot = 0, position = 0;
};

// The i32 host tables of a SeqBatch and the batch viewing them (copies share the storage).
struct HostSeqs {
  Tensor row_begin, num_rows, position, slot;
  SeqBatch batch;
};

inline HostSeqs make_seqs(const std::vector<SeqSpec>& specs) {
  const int64_t S = static_cast<int64_t>(specs.size());
  HostSeqs h;
  for (Tensor* t : {&h.row_begin, &h.num_rows, &h.position, &h.slot}) *t = Tensor::zeros(core::DType::i32, {S});
  int max_rows = 0;
  for (int64_t s = 0; s < S; ++s) {
    h.row_begin.data<int32_t>()[s] = static_cast<int32_t>(specs[s].row_begin);
    h.num_rows.data<int32_t>()[s] = static_cast<int32_t>(specs[s].num_rows);
    h.position.data<int32_t>()[s] = static_cast<int32_t>(specs[s].position);
    h.slot.data<int32_t>()[s] = static_cast<int32_t>(specs[s].slot);
    max_rows = std::max(max_rows, static_cast<int>(specs[s].num_rows));
  }
  h.batch.row_begin = h.row_begin.view(), h.batch.num_rows = h.num_rows.view();
  h.batch.position = h.position.view(), h.batch.slot = h.slot.view();
  h.batch.num_seqs = static_cast<int>(S);
  h.batch.max_rows = max_rows;
  for (const SeqSpec& sp : specs) h.batch.max_tokens = std::max(h.batch.max_tokens, sp.position + sp.num_rows);
  return h;
}

// A SeqBatch whose tables live to the end of the test program (for args built by helpers that
// return only views; a few bytes per call).
inline SeqBatch kept(HostSeqs h) {
  static std::mutex mu;
  static std::deque<HostSeqs> store;
  std::lock_guard<std::mutex> lk(mu);
  store.push_back(std::move(h));
  return store.back().batch;
}

// One sequence over all T rows, state slot 0, at `position` (no sequences when T == 0).
inline SeqBatch single_seq(int64_t T, int64_t position = 0) {
  return kept(make_seqs(T > 0 ? std::vector<SeqSpec>{{0, T, 0, position}} : std::vector<SeqSpec>{}));
}

// A state tensor [X...] as a one-slot pool [1, X...] (same storage).
inline TensorView pool1(const Tensor& state) {
  const TensorView v = state.view();
  if (v.rank() == 2) return TensorView::contiguous(v.data, v.dtype, {1, v.dim(0), v.dim(1)});
  return TensorView::contiguous(v.data, v.dtype, {1, v.dim(0), v.dim(1), v.dim(2)});
}

// Slot i of a contiguous pool tensor [N, X...] as a span of its elements.
inline std::span<float> slot_span(const Tensor& pool, int64_t i) {
  const int64_t per = pool.numel() / pool.dim(0);
  return {pool.data<float>() + i * per, static_cast<size_t>(per)};
}

// ||a - b|| / ||b|| over all elements (b the oracle).
inline double rel_err(std::span<const float> a, std::span<const double> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}
inline double rel_err(std::span<const float> a, std::span<const float> b) {
  std::vector<double> bd(b.begin(), b.end());
  return rel_err(a, std::span<const double>(bd));
}
inline bool all_finite(std::span<const float> a) {
  for (float x : a)
    if (!std::isfinite(x)) return false;
  return true;
}
inline bool bits_equal(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

// All inputs of one KDA attention call, [T, H*D] activations head-major.
struct AttnInputs {
  int T = 0, H = 0, D = 0;
  Tensor q, k, v, f, b, a_log, dt_bias, state0;

  // Random, O(1) values; f around -1 so decays range from strong to near 1; a non-zero,
  // non-symmetric initial state; a_log has 2H entries with non-zero junk beyond H.
  static AttnInputs random(uint64_t seed, int T, int H, int D, Precision p = Precision::fp32) {
    core::Rng rng(seed);
    AttnInputs in;
    in.T = T, in.H = H, in.D = D;
    const int64_t P = static_cast<int64_t>(H) * D;
    in.q = kda_test::random(rng, {T, P}, 0.0, 1.0, p);
    in.k = kda_test::random(rng, {T, P}, 0.0, 1.0, p);
    in.v = kda_test::random(rng, {T, P}, 0.0, 1.0, p);
    in.f = kda_test::random(rng, {T, P}, -1.0, 2.0, p);
    in.b = kda_test::random(rng, {T, H}, 0.0, 1.5, p);
    in.a_log = kda_test::random(rng, {2 * H}, 0.0, 0.5);
    in.dt_bias = kda_test::random(rng, {P}, 0.0, 1.0);
    in.state0 = kda_test::random(rng, {H, D, D}, 0.0, 0.5);
    return in;
  }

  // Args over tokens [t0, t0+n) of these inputs, writing `out` (rows [0, n)) and updating `state`
  // [H, D, D] (a one-slot pool): one sequence at position t0 (so the chunk grid stays on the
  // absolute positions of these inputs).
  KdaAttentionArgs args(const Tensor& state, const Tensor& out, Precision p, int chunk = 64, int64_t t0 = 0,
                        int64_t n = -1) const {
    if (n < 0) n = T - t0;
    KdaAttentionArgs a;
    a.q = rows(q.view(), t0, n);
    a.k = rows(k.view(), t0, n);
    a.v = rows(v.view(), t0, n);
    a.f = rows(f.view(), t0, n);
    a.b = rows(b.view(), t0, n);
    a.a_log = a_log.view();
    a.dt_bias = dt_bias.view();
    a.state = pool1(state);
    a.out = out.view();
    a.num_heads = H;
    a.head_dim = D;
    a.chunk_size = chunk;
    a.precision = p;
    a.seqs = single_seq(n, t0);
    return a;
  }
};

// ---- naive forms (double inside; fp32 only where the op's contract rounds) ----

inline double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Spec §5.2: out[t][c] = SiLU(sum_i w[c][i] * xs[t+i][c]) with xs = state ++ x, state <- last K-1 of xs.
inline std::vector<double> naive_conv(const std::vector<float>& x, const std::vector<float>& w,
                                      std::vector<float>& state, int T, int C, int K) {
  std::vector<double> out(static_cast<size_t>(T) * C);
  for (int c = 0; c < C; ++c) {
    std::vector<float> xs;
    for (int i = 0; i < K - 1; ++i) xs.push_back(state[static_cast<size_t>(c) * (K - 1) + i]);
    for (int t = 0; t < T; ++t) xs.push_back(x[static_cast<size_t>(t) * C + c]);
    for (int t = 0; t < T; ++t) {
      double sum = 0;
      for (int i = 0; i < K; ++i) sum += static_cast<double>(w[static_cast<size_t>(c) * K + i]) * xs[t + i];
      out[static_cast<size_t>(t) * C + c] = sum * sigmoid_d(sum);
    }
    for (int i = 0; i < K - 1; ++i) state[static_cast<size_t>(c) * (K - 1) + i] = xs[xs.size() - (K - 1) + i];
  }
  return out;
}

// Spec §5.3-5.5 over all tokens, state V-major [H][V][K] in double; returns o [T, H*D] (unrounded).
inline std::vector<double> naive_recurrent(const AttnInputs& in, std::vector<double>& S, float lower_bound = -5.0f) {
  const int T = in.T, H = in.H, D = in.D;
  const size_t P = static_cast<size_t>(H) * D;
  std::vector<double> out(static_cast<size_t>(T) * P);
  const float* q = in.q.data<float>();
  const float* k = in.k.data<float>();
  const float* v = in.v.data<float>();
  const float* f = in.f.data<float>();
  const float* b = in.b.data<float>();
  std::vector<double> qn(D), kn(D), alpha(D), r(D), u(D);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      const size_t c0 = t * P + static_cast<size_t>(h) * D;
      double sq = 0, sk = 0;
      for (int i = 0; i < D; ++i) sq += static_cast<double>(q[c0 + i]) * q[c0 + i];
      for (int i = 0; i < D; ++i) sk += static_cast<double>(k[c0 + i]) * k[c0 + i];
      for (int i = 0; i < D; ++i) qn[i] = q[c0 + i] / std::sqrt(sq + 1e-6) / std::sqrt(static_cast<double>(D));
      for (int i = 0; i < D; ++i) kn[i] = k[c0 + i] / std::sqrt(sk + 1e-6);
      const double A = std::exp(static_cast<double>(in.a_log.data<float>()[h]));
      for (int i = 0; i < D; ++i) {
        const double z = static_cast<double>(f[c0 + i]) + in.dt_bias.data<float>()[h * D + i];
        alpha[i] = std::exp(lower_bound * sigmoid_d(A * z));
      }
      const double beta = sigmoid_d(b[static_cast<size_t>(t) * H + h]);
      double* Sh = &S[static_cast<size_t>(h) * D * D];
      for (int vi = 0; vi < D; ++vi)  // 1. decay along the key axis
        for (int ki = 0; ki < D; ++ki) Sh[vi * D + ki] *= alpha[ki];
      for (int vi = 0; vi < D; ++vi) {  // 2. read
        r[vi] = 0;
        for (int ki = 0; ki < D; ++ki) r[vi] += Sh[vi * D + ki] * kn[ki];
      }
      for (int vi = 0; vi < D; ++vi) u[vi] = beta * (v[c0 + vi] - r[vi]);  // 3. delta
      for (int vi = 0; vi < D; ++vi)                                       // 4. write
        for (int ki = 0; ki < D; ++ki) Sh[vi * D + ki] += u[vi] * kn[ki];
      for (int vi = 0; vi < D; ++vi) {  // 5. output from the post-update state
        double o = 0;
        for (int ki = 0; ki < D; ++ki) o += Sh[vi * D + ki] * qn[ki];
        out[c0 + vi] = o;
      }
    }
  }
  return out;
}

// Spec §5.6 (unrounded): per (t, h): o * rsqrt(mean(o^2) + eps) * w * sigmoid(g).
inline std::vector<double> naive_output_gate(const std::vector<float>& o, const std::vector<float>& gate,
                                             const std::vector<float>& w, int T, int H, int D, double eps) {
  std::vector<double> out(o.size());
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const size_t c0 = (static_cast<size_t>(t) * H + h) * D;
      double ms = 0;
      for (int i = 0; i < D; ++i) ms += static_cast<double>(o[c0 + i]) * o[c0 + i];
      ms /= D;
      for (int i = 0; i < D; ++i) out[c0 + i] = o[c0 + i] / std::sqrt(ms + eps) * w[i] * sigmoid_d(gate[c0 + i]);
    }
  return out;
}

inline std::vector<float> to_vec(const Tensor& t) { return {t.span<float>().begin(), t.span<float>().end()}; }
inline std::vector<double> to_dvec(const Tensor& t) { return {t.span<float>().begin(), t.span<float>().end()}; }

// bf16-mode check against an unrounded oracle: each value is bf16 and within one bf16 rounding
// (half an ulp: at most 2^-8 relative, plus fp32 noise) of the oracle.
inline ::testing::AssertionResult bf16_close(std::span<const float> a, std::span<const double> ref) {
  double max_ref = 0;
  for (double r : ref) max_ref = std::max(max_ref, std::abs(r));
  for (size_t i = 0; i < ref.size(); ++i) {
    if (core::bf16_round(a[i]) != a[i])
      return ::testing::AssertionFailure() << "element " << i << " = " << a[i] << " is not bf16";
    const double tol = std::abs(ref[i]) * (1.0 / 256) * 1.001 + max_ref * 1e-5;
    if (!(std::abs(a[i] - ref[i]) <= tol))
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << ref[i];
  }
  return ::testing::AssertionSuccess();
}

}  // namespace k3::kernels::kda_test
