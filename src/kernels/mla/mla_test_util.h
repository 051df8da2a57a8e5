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
#include <initializer_list>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/fp8.h"
#include "core/rng.h"
#include "kernels/mla/cases.h"
#include "kernels/mla/mla.h"

namespace k3::kernels::mla_test {

// Runs a reference (its pool left null: inline) or any callable that takes the arguments only.
template <class Fn, class Args>
void run_op(Fn op, const Args& a) {
  if constexpr (std::is_invocable_v<Fn, const Args&>) op(a);
  else op(a, nullptr);
}

using MlaDims = kernels::MlaShape;  // kernels/mla/cases.h

inline core::Tensor nan_filled(core::Shape shape) {
  core::Tensor t = core::Tensor::zeros(core::DType::f32, shape);
  std::fill(t.span<float>().begin(), t.span<float>().end(), std::numeric_limits<float>::quiet_NaN());
  return t;
}

// A random permutation of 0 .. n-1 (core::Rng, Fisher-Yates).
inline std::vector<int32_t> shuffled_ids(int64_t n, core::Rng& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(i);
  for (int64_t i = n - 1; i > 0; --i) std::swap(ids[i], ids[rng.next_u64() % static_cast<uint64_t>(i + 1)]);
  return ids;
}

// Pages [num_blocks, block_size, width] poisoned with NaN (f32) or the E4M3 NaN code, so a read of
// a page or row never written shows up in the output.
inline core::Tensor poisoned_pages(core::DType dtype, int64_t num_blocks, int64_t block_size, int64_t width) {
  core::Tensor t = core::Tensor::zeros(dtype, {num_blocks, block_size, width});
  if (dtype == core::DType::f32)
    std::fill(t.span<float>().begin(), t.span<float>().end(), std::numeric_limits<float>::quiet_NaN());
  else std::memset(t.view().data, 0x7f, static_cast<size_t>(t.nbytes()));
  return t;
}

// An i32 tensor holding v (shape [v.size()] unless given).
inline core::Tensor i32_tensor(const std::vector<int32_t>& v, core::Shape shape = {}) {
  if (shape.rank() == 0) shape = core::Shape{static_cast<int64_t>(v.size())};
  core::Tensor t = core::Tensor::zeros(core::DType::i32, shape);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// One sequence: T queries at cache positions S-T .. S-1 over an S-entry cache held in pages of
// `block_size` tokens whose ids are a random permutation (plus spare pages never written), and
// kv_b. Inputs are bf16-representable (as the model hands them over); the cache is written
// through mla_cache_write_reference.
struct MlaProblem {
  MlaDims d{};
  int64_t S = 0, T = 0, block_size = 0;
  core::Tensor q;                 // f32 [T, H*(nope+rope)]
  core::Tensor c_n;               // f32 [S, kv_lora]  the values written into the cache
  core::Tensor k_pe;              // f32 [S, rope]
  core::Tensor pages;             // f32 or f8_e4m3 [num_blocks, block_size, kv_lora+rope]
  std::vector<int32_t> page_ids;  // the sequence's block table: page of position j = page_ids[j / block_size]
  core::Tensor row_begin, num_rows, position, block_table;  // i32 SeqBatch tables of the one sequence
  float k_scale = 1.0f;
  LinearWeight kv_b;  // bf16 or f32 [H*(nope+v), kv_lora]

  MlaProblem(MlaDims dims, int64_t s, int64_t t, core::DType cache_dtype, core::DType kv_b_dtype, float kscale,
             uint64_t seed, int64_t page_tokens = 16)
      : d(dims), S(s), T(t), block_size(page_tokens), k_scale(kscale) {
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
      if (kv_b_dtype == core::DType::bf16) kv_b.weight.data<uint16_t>()[i] = core::f32_to_bf16_bits(w);
      else kv_b.weight.data<float>()[i] = w;
    }
    // The page layout draws from its own stream, so the values above do not depend on it.
    core::Rng page_rng = rng.fork(0x9a6e);
    const int64_t blocks = (S + block_size - 1) / block_size, spare = 3;
    page_ids = shuffled_ids(blocks + spare, page_rng);
    page_ids.resize(static_cast<size_t>(blocks));
    pages = poisoned_pages(cache_dtype, blocks + spare, block_size, d.kv_lora + d.rope);
    std::vector<int32_t> table = page_ids;
    table.resize(table.size() + 2, -1);  // unused table entries: never read
    block_table = i32_tensor(table, {1, static_cast<int64_t>(table.size())});
    row_begin = i32_tensor({0});
    num_rows = i32_tensor({static_cast<int32_t>(T)});
    position = i32_tensor({static_cast<int32_t>(S - T)});
    rewrite_cache();
  }

  // Cache row of token position j.
  int64_t cache_row(int64_t j) const { return int64_t{page_ids[j / block_size]} * block_size + j % block_size; }

  // Writes c_n / k_pe (after edits) into the pages.
  void rewrite_cache() {
    std::vector<int32_t> rows(static_cast<size_t>(S));
    for (int64_t j = 0; j < S; ++j) rows[j] = static_cast<int32_t>(cache_row(j));
    const core::Tensor cache_rows = i32_tensor(rows);
    MlaCacheWriteArgs w;
    w.c_n = c_n.view();
    w.k_pe = k_pe.view();
    w.dst = pages.view();
    w.cache_rows = cache_rows.view();
    w.k_scale = k_scale;
    mla_cache_write_reference(w);
  }

  SeqBatch seqs() const {
    SeqBatch b;
    b.row_begin = row_begin.view();
    b.num_rows = num_rows.view();
    b.position = position.view();
    b.block_table = block_table.view();
    b.num_seqs = 1;
    b.max_rows = static_cast<int>(T);
    b.max_tokens = S;
    return b;
  }

  MlaAttentionArgs args(const core::Tensor& out, Precision precision, float scale) const {
    MlaAttentionArgs a;
    a.q = q.view();
    a.pages = pages.view();
    a.seqs = seqs();
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
    run_op(op, args(out, precision, scale > 0.0f ? scale : default_scale()));
    return out;
  }

  // The cache value at (position j, column i) as the spec defines reading it, in double.
  double cache_value(int64_t j, int64_t i) const {
    const int64_t width = d.kv_lora + d.rope, at = cache_row(j) * width + i;
    if (pages.dtype() == core::DType::f32) return pages.data<const float>()[at];
    const uint8_t code = pages.data<const uint8_t>()[at];
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

// Several MlaProblems (sharing dims, cache dtype and k_scale; the first one's kv_b) as ONE batched
// call: their query rows in a shuffled order, each after an unowned row (NaN in q, must stay NaN
// in out); their caches in one pool of pages of `block_size` tokens with shuffled ids, written by
// one mla_cache_write_reference (plus a skipped -1 row of NaN). max_rows / max_tokens have slack.
struct MlaBatch {
  std::vector<const MlaProblem*> probs;
  int64_t block_size = 0, rows = 0;
  std::vector<int64_t> first_row;  // per problem: its first row of q / out
  core::Tensor q, pages, row_begin, num_rows, position, block_table;
  int max_rows = 0;
  int64_t max_tokens = 0;

  MlaBatch(std::vector<const MlaProblem*> ps, int64_t page_tokens, uint64_t seed)
      : probs(std::move(ps)), block_size(page_tokens) {
    core::Rng rng(seed);
    const MlaProblem& p0 = *probs.front();
    const int64_t n = static_cast<int64_t>(probs.size()), qw = p0.q.dim(1), L = p0.d.kv_lora, R = p0.d.rope;
    // Rows: problems in a shuffled order, one unowned row before each and one at the end.
    first_row.assign(probs.size(), 0);
    for (int32_t k : shuffled_ids(n, rng)) {
      first_row[k] = rows + 1;
      rows += 1 + probs[k]->T;
    }
    ++rows;
    q = nan_filled({rows, qw});
    for (int64_t k = 0; k < n; ++k)
      std::memcpy(q.data<float>() + first_row[k] * qw, probs[k]->q.data<const float>(),
                  sizeof(float) * static_cast<size_t>(probs[k]->q.numel()));
    // Pages: every problem's blocks from one shuffled pool with spares.
    int64_t blocks = 0, max_blocks = 0;
    for (const MlaProblem* p : probs) {
      const int64_t b = (p->S + block_size - 1) / block_size;
      blocks += b;
      max_blocks = std::max(max_blocks, b + 1);
      max_rows = std::max(max_rows, static_cast<int>(p->T) + 1);
      max_tokens = std::max(max_tokens, p->S + 1);
    }
    const std::vector<int32_t> pool = shuffled_ids(blocks + 5, rng);
    pages = poisoned_pages(p0.pages.dtype(), blocks + 5, block_size, L + R);
    std::vector<int32_t> table(static_cast<size_t>(n * max_blocks), -1), begins, counts, positions, cache_rows;
    std::vector<float> c_vals, pe_vals;
    size_t next = 0;
    for (int64_t k = 0; k < n; ++k) {
      const MlaProblem& p = *probs[k];
      for (int64_t b = 0; b * block_size < p.S; ++b) table[k * max_blocks + b] = pool[next++];
      for (int64_t j = 0; j < p.S; ++j)
        cache_rows.push_back(table[k * max_blocks + j / block_size] * static_cast<int32_t>(block_size) +
                             static_cast<int32_t>(j % block_size));
      c_vals.insert(c_vals.end(), p.c_n.data<const float>(), p.c_n.data<const float>() + p.c_n.numel());
      pe_vals.insert(pe_vals.end(), p.k_pe.data<const float>(), p.k_pe.data<const float>() + p.k_pe.numel());
      begins.push_back(static_cast<int32_t>(first_row[k]));
      counts.push_back(static_cast<int32_t>(p.T));
      positions.push_back(static_cast<int32_t>(p.S - p.T));
    }
    cache_rows.push_back(-1);  // a padding row: never written anywhere
    c_vals.resize(c_vals.size() + static_cast<size_t>(L), std::numeric_limits<float>::quiet_NaN());
    pe_vals.resize(pe_vals.size() + static_cast<size_t>(R), std::numeric_limits<float>::quiet_NaN());
    const int64_t written = static_cast<int64_t>(cache_rows.size());
    const core::Tensor c_all = core::Tensor::zeros(core::DType::f32, {written, L});
    const core::Tensor pe_all = core::Tensor::zeros(core::DType::f32, {written, R});
    std::copy(c_vals.begin(), c_vals.end(), c_all.data<float>());
    std::copy(pe_vals.begin(), pe_vals.end(), pe_all.data<float>());
    const core::Tensor rows_t = i32_tensor(cache_rows);
    MlaCacheWriteArgs w;
    w.c_n = c_all.view();
    w.k_pe = pe_all.view();
    w.dst = pages.view();
    w.cache_rows = rows_t.view();
    w.k_scale = p0.k_scale;
    mla_cache_write_reference(w);
    row_begin = i32_tensor(begins);
    num_rows = i32_tensor(counts);
    position = i32_tensor(positions);
    block_table = i32_tensor(table, {n, max_blocks});
  }

  SeqBatch seqs() const {
    SeqBatch b;
    b.row_begin = row_begin.view();
    b.num_rows = num_rows.view();
    b.position = position.view();
    b.block_table = block_table.view();
    b.num_seqs = static_cast<int>(probs.size());
    b.max_rows = max_rows;
    b.max_tokens = max_tokens;
    return b;
  }

  // Runs one form over the whole batch on a NaN-poisoned [rows, H*v] output.
  template <class Fn>
  core::Tensor run(Fn op, Precision precision) const {
    const MlaProblem& p0 = *probs.front();
    core::Tensor out = nan_filled({rows, static_cast<int64_t>(p0.d.heads) * p0.d.v});
    MlaAttentionArgs a = p0.args(out, precision, p0.default_scale());
    a.q = q.view();
    a.pages = pages.view();
    a.seqs = seqs();
    run_op(op, a);
    return out;
  }

  // Problem k's rows of a batch output, as a [T_k, H*v] copy.
  core::Tensor rows_of(const core::Tensor& out, size_t k) const {
    const int64_t w = out.dim(1);
    core::Tensor r = core::Tensor::zeros(core::DType::f32, {probs[k]->T, w});
    std::memcpy(r.data<float>(), out.data<const float>() + first_row[k] * w, static_cast<size_t>(r.nbytes()));
    return r;
  }
  // Rows of the output that belong to no problem.
  std::vector<int64_t> unowned_rows() const {
    std::vector<bool> owned(static_cast<size_t>(rows), false);
    for (size_t k = 0; k < probs.size(); ++k)
      for (int64_t t = 0; t < probs[k]->T; ++t) owned[first_row[k] + t] = true;
    std::vector<int64_t> out;
    for (int64_t r = 0; r < rows; ++r)
      if (!owned[r]) out.push_back(r);
    return out;
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

// An f32 tensor's storage viewed with another shape of the same element count.
inline core::TensorView f32_view(const core::Tensor& t, core::Shape shape) {
  EXPECT_EQ(shape.numel(), t.numel());
  return core::TensorView::contiguous(t.view().data, core::DType::f32, shape);
}

// A check's failure, its reason naming every needle.
inline void expect_fail(const core::Status& st, std::initializer_list<std::string> needles) {
  ASSERT_FALSE(st.is_ok());
  for (const std::string& n : needles) EXPECT_NE(st.reason().find(n), std::string::npos) << st.reason();
}

// A case table (kernels/mla/cases.h) as a vector.
template <class T, size_t N>
std::vector<T> as_vector(const T (&a)[N]) {
  return std::vector<T>(std::begin(a), std::end(a));
}

}  // namespace k3::kernels::mla_test
