// kernels/dspark/reference.cpp: CPU references and argument checks of the dspark family (see
// dspark.h for the math).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/dspark/dspark.h"

namespace k3::kernels {

namespace {

std::string dims(int64_t rows, int64_t cols) { return rows_cols_str(rows, cols); }

bool f32_rows(const core::TensorView& v, int64_t rows, int64_t cols) {
  return v.defined() && v.dtype == core::DType::f32 && v.rank() == 2 && v.dim(0) == rows && v.dim(1) == cols &&
         v.strides[1] == 1 && (rows <= 1 || v.strides[0] >= cols);
}

bool dense_weight(const LinearWeight* w, int64_t out, int64_t in) {
  return w != nullptr && w->weight.defined() && !w->is_mxfp4() && w->out_features() == out && w->in_features() == in &&
         w->weight.view().strides[1] == 1;
}

}  // namespace

core::Status rope_pairs_check(const RopePairsArgs& a) {
  if (a.dim <= 0 || a.dim % 2 != 0 || a.heads <= 0)
    return core::Status::fail("dim " + std::to_string(a.dim) + " / heads " + std::to_string(a.heads) +
                              ": need an even dim > 0 and heads > 0");
  if (a.position < 0) return core::Status::fail("negative position " + std::to_string(a.position));
  if (a.x.rank() != 2 || a.x.dtype != core::DType::f32 || a.x.strides[1] != 1)
    return core::Status::fail("x must be f32 [n, cols] with unit inner stride, got " + describe_view(a.x));
  const int64_t last = a.offset + int64_t{a.heads - 1} * a.head_stride + a.dim;
  if (a.offset < 0 || a.head_stride < (a.heads > 1 ? a.dim : 0) || last > a.x.dim(1))
    return core::Status::fail("head slices at offset " + std::to_string(a.offset) + ", stride " +
                              std::to_string(a.head_stride) + " x " + std::to_string(a.heads) + " of " +
                              std::to_string(a.dim) + " do not fit in " + std::to_string(a.x.dim(1)) + " columns");
  if (a.inv_freq.rank() != 1 || a.inv_freq.dtype != core::DType::f32 || a.inv_freq.dim(0) != a.dim / 2 ||
      !a.inv_freq.is_contiguous() || a.inv_freq.device != a.x.device)
    return core::Status::fail("inv_freq must be f32 [" + std::to_string(a.dim / 2) + "] beside x, got " +
                              describe_view(a.inv_freq));
  return core::Status::ok();
}

void rope_pairs_reference(const RopePairsArgs& a) {
  const float* inv_freq = a.inv_freq.as<const float>();
  for (int64_t r = 0; r < a.x.dim(0); ++r) {
    const float pos = static_cast<float>(a.position + r);
    for (int h = 0; h < a.heads; ++h) {
      float* x = a.x.as<float>() + r * a.x.strides[0] + a.offset + int64_t{h} * a.head_stride;
      for (int i = 0; i < a.dim / 2; ++i) {
        const float angle = pos * inv_freq[i];
        const float c = std::cos(angle), s = std::sin(angle);
        const float u = x[2 * i], v = x[2 * i + 1];
        const float uc = u * c, vs = v * s, us = u * s, vc = v * c;  // no FMA: -ffp-contract=off
        x[2 * i] = round_act(uc - vs, a.precision);
        x[2 * i + 1] = round_act(us + vc, a.precision);
      }
    }
  }
}

core::Status mla_block_attention_check(const MlaBlockAttentionArgs& a) {
  const int64_t NH = a.num_heads, dn = a.nope_dim, dr = a.rope_dim, dv = a.v_dim;
  if (NH <= 0 || dn <= 0 || dr < 0 || dv <= 0)
    return core::Status::fail("heads " + std::to_string(NH) + ", nope " + std::to_string(dn) + ", rope " +
                              std::to_string(dr) + ", v " + std::to_string(dv) + ": need positive sizes");
  if (a.kv_b == nullptr || !a.kv_b->weight.defined() || a.kv_b->is_mxfp4() || a.kv_b->out_features() != NH * (dn + dv))
    return core::Status::fail("kv_b must be a dense [" + std::to_string(NH * (dn + dv)) + ", L] weight");
  const int64_t L = a.kv_b->in_features();
  if (!dense_weight(a.kv_b, NH * (dn + dv), L))
    return core::Status::fail("kv_b must be a dense weight with unit inner stride");
  const int64_t T = a.q.rank() == 2 ? a.q.dim(0) : -1;
  if (!f32_rows(a.q, T, NH * (dn + dr)))
    return core::Status::fail("q must be f32 [T, " + std::to_string(NH * (dn + dr)) + "], got " + describe_view(a.q));
  const int64_t P = a.context.rank() == 2 ? a.context.dim(0) : -1;
  if (!f32_rows(a.context, P, L + dr))
    return core::Status::fail("context must be f32 [P, " + std::to_string(L + dr) + "] latent rows, got " +
                              describe_view(a.context));
  if (!f32_rows(a.block, T, L + dr))
    return core::Status::fail("block must be f32 " + dims(T, L + dr) + ", got " + describe_view(a.block));
  if (!f32_rows(a.out, T, NH * dv))
    return core::Status::fail("out must be f32 " + dims(T, NH * dv) + ", got " + describe_view(a.out));
  if (row_views_overlap(a.out, a.q) || row_views_overlap(a.out, a.block) || row_views_overlap(a.out, a.context))
    return core::Status::fail("out overlaps an input");
  return core::Status::ok();
}

void mla_block_attention_reference(const MlaBlockAttentionArgs& a) {
  const int64_t T = a.q.dim(0), P = a.context.dim(0), S = P + T, L = a.kv_b->in_features();
  const int64_t nope = a.nope_dim, rope = a.rope_dim, vd = a.v_dim, NH = a.num_heads;
  const Precision precision = a.precision;
  auto latent = [&](int64_t j) {
    return j < P ? a.context.as<const float>() + j * a.context.strides[0]
                 : a.block.as<const float>() + (j - P) * a.block.strides[0];
  };
  std::vector<float> w(static_cast<size_t>((nope + vd) * L));  // one head's W_UK then W_UV rows
  std::vector<float> q_lat(static_cast<size_t>(L)), o_lat(static_cast<size_t>(L)), p(static_cast<size_t>(S));
  for (int64_t h = 0; h < NH; ++h) {
    for (int64_t r = 0; r < nope + vd; ++r) a.kv_b->load_row(h * (nope + vd) + r, w.data() + r * L);
    const float* w_uk = w.data();
    const float* w_uv = w.data() + nope * L;
    for (int64_t t = 0; t < T; ++t) {
      const float* q_nope = a.q.as<const float>() + t * a.q.strides[0] + h * (nope + rope);
      const float* q_pe = q_nope + nope;
      for (int64_t i = 0; i < L; ++i) {  // q_lat = W_UK^T q_nope, fp32 over the nope dims in order
        float acc = 0.0f;
        for (int64_t d = 0; d < nope; ++d) acc += q_nope[d] * w_uk[d * L + i];
        q_lat[static_cast<size_t>(i)] = round_act(acc, precision);
      }
      float mx = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        const float* row = latent(j);
        float acc = 0.0f;
        for (int64_t i = 0; i < L; ++i) acc += q_lat[static_cast<size_t>(i)] * row[i];
        for (int64_t r = 0; r < rope; ++r) acc += q_pe[r] * row[L + r];
        p[static_cast<size_t>(j)] = a.scale * acc;
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < S; ++j) {
        p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx);
        sum += p[static_cast<size_t>(j)];
      }
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      for (int64_t j = 0; j < S; ++j) {
        const float pj = p[static_cast<size_t>(j)] / sum;
        const float* row = latent(j);
        for (int64_t i = 0; i < L; ++i) o_lat[static_cast<size_t>(i)] += pj * row[i];
      }
      for (float& v : o_lat) v = round_act(v, precision);
      float* o = a.out.as<float>() + t * a.out.strides[0] + h * vd;
      for (int64_t e = 0; e < vd; ++e) {  // out = W_UV o_lat
        float acc = 0.0f;
        for (int64_t i = 0; i < L; ++i) acc += w_uv[e * L + i] * o_lat[static_cast<size_t>(i)];
        o[e] = round_act(acc, precision);
      }
    }
  }
}

core::Status markov_draft_check(const MarkovDraftArgs& a) {
  const int64_t K = a.block_size;
  if (K <= 0) return core::Status::fail("block_size must be > 0, got " + std::to_string(K));
  if (a.x0.rank() != 1 || a.x0.dtype != core::DType::i32 || !a.x0.is_contiguous())
    return core::Status::fail("x0 must be i32 [B], got " + describe_view(a.x0));
  const int64_t B = a.x0.dim(0);
  if (a.w1.rank() != 2 || (a.w1.dtype != core::DType::f32 && a.w1.dtype != core::DType::bf16) || a.w1.strides[1] != 1)
    return core::Status::fail("w1 must be f32 or bf16 [V, R], got " + describe_view(a.w1));
  const int64_t R = a.w1.dim(1);
  const int64_t Vd = a.base_logits.rank() == 2 ? a.base_logits.dim(1) : -1;
  if (!f32_rows(a.base_logits, B * K, Vd))
    return core::Status::fail("base_logits must be f32 " + dims(B * K, Vd) + ", got " + describe_view(a.base_logits));
  if (!dense_weight(a.w2, Vd, R))
    return core::Status::fail("w2 must be a dense [" + std::to_string(Vd) + ", " + std::to_string(R) + "] weight");
  const bool mapped = a.d2t.defined() && a.d2t.rank() == 1;
  if (mapped && (a.d2t.dtype != core::DType::i64 || a.d2t.dim(0) != Vd || !a.d2t.is_contiguous()))
    return core::Status::fail("d2t must be i64 [" + std::to_string(Vd) + "], got " + describe_view(a.d2t));
  if (!mapped && Vd != a.w1.dim(0))
    return core::Status::fail("without d2t the draft vocabulary (" + std::to_string(Vd) + ") must be the target's (" +
                              std::to_string(a.w1.dim(0)) + ")");
  const int64_t n = a.tokens.rank() == 2 ? a.tokens.dim(1) : -1;
  if (a.tokens.rank() != 2 || a.tokens.dtype != core::DType::i32 || a.tokens.dim(0) != B || n < 1 || n > K ||
      !a.tokens.is_contiguous())
    return core::Status::fail("tokens must be i32 [" + std::to_string(B) + ", n] with 1 <= n <= " + std::to_string(K) +
                              ", got " + describe_view(a.tokens));
  if (!f32_rows(a.logits, B * n, Vd) || !a.logits.is_contiguous())
    return core::Status::fail("logits must be f32 " + dims(B * n, Vd) + ", got " + describe_view(a.logits));
  const core::Device d = a.base_logits.device;
  for (const core::TensorView* v : {&a.x0, &a.w1, &a.tokens, &a.logits})
    if (v->device != d) return core::Status::fail("every tensor must be on the base logits' device");
  if (a.w2->weight.view().device != d || (mapped && a.d2t.device != d))
    return core::Status::fail("w2 and d2t must be on the base logits' device");
  return core::Status::ok();
}

void markov_draft_reference(const MarkovDraftArgs& a) {
  const int64_t B = a.x0.dim(0), K = a.block_size, n = a.tokens.dim(1), Vd = a.base_logits.dim(1);
  const int64_t R = a.w1.dim(1), V = a.w1.dim(0);
  const bool mapped = a.d2t.defined() && a.d2t.rank() == 1;
  std::vector<float> e(static_cast<size_t>(R)), w(static_cast<size_t>(R));
  for (int64_t b = 0; b < B; ++b) {
    int32_t prev = a.x0.as<const int32_t>()[b];
    for (int64_t k = 0; k < n; ++k) {
      K3_CHECK(prev >= 0 && prev < V, "markov_draft: token " + std::to_string(prev) + " outside the vocabulary [0, " +
                                          std::to_string(V) + ")");
      const core::TensorView w1_row = a.w1.row(prev);
      for (int64_t i = 0; i < R; ++i) e[static_cast<size_t>(i)] = load_f32(w1_row, i);
      const float* u = a.base_logits.as<const float>() + (b * K + k) * a.base_logits.strides[0];
      float* z = a.logits.as<float>() + (b * n + k) * Vd;
      int64_t best = 0;
      for (int64_t v = 0; v < Vd; ++v) {
        a.w2->load_row(v, w.data());
        float m = 0.0f;
        for (int64_t i = 0; i < R; ++i) m += e[static_cast<size_t>(i)] * w[static_cast<size_t>(i)];
        z[v] = u[v] + m;
        if (z[v] > z[best]) best = v;  // strict: ties keep the lowest id
      }
      prev = static_cast<int32_t>(mapped ? best + a.d2t.as<const int64_t>()[best] : best);
      a.tokens.as<int32_t>()[b * n + k] = prev;
    }
  }
}

}  // namespace k3::kernels
