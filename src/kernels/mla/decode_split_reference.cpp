// kernels/mla/decode_split_reference.cpp: the CPU model of the CUDA split-KV (flash-decoding) algorithm
// of mla_decode, so the algorithm is tested against the direct form before any kernel runs.
//
// Per query row and head: positions 0 .. visible-1 are cut into splits of split_len; split k keeps
//   m_k = max_j s(j),  l_k = sum_j e^{s(j) - m_k},  o_k = sum_j e^{s(j) - m_k} c_n,j      [kv_lora]
// (unnormalised, fp32, j in order); the combine weighs the non-empty splits by w_k = e^{m_k - M},
// M = max_k m_k:  o_lat = round(sum_k w_k o_k / sum_k w_k l_k). Everything else (q_lat, W_UV, the
// gate) has the rounding points of mla_decode_reference.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kernels/mla/mla_decode.h"
#include "kernels/mla/mla_internal.h"

namespace k3::kernels {

namespace {

// out[row_begin + t, h*v .. (h+1)*v) of one head of one sequence, for each of its rows.
void split_head(const MlaDecodeArgs& a, const mla_detail::SeqRef& seq, const mla_detail::DequantCache& cache,
                const mla_detail::HeadWeights& w, int h, int64_t split_len) {
  const int64_t L = a.kv_lora, nope = a.qk_nope, rope = a.qk_rope, vd = a.v_head_dim;
  std::vector<float> q_lat(static_cast<size_t>(L)), o_lat(static_cast<size_t>(L));
  std::vector<float> scores(static_cast<size_t>(split_len));
  std::vector<float> part_m, part_l, part_o;  // per split: m, l, o [L]
  for (int64_t t = 0; t < seq.num_rows; ++t) {
    const float* q_nope = mla_detail::row_ptr(a.q, seq.row_begin + t) + h * (nope + rope);
    const float* q_pe = q_nope + nope;
    std::fill(q_lat.begin(), q_lat.end(), 0.0f);
    for (int64_t d = 0; d < nope; ++d) {
      const float* wr = w.w_uk.data() + d * L;
      for (int64_t i = 0; i < L; ++i) q_lat[i] += wr[i] * q_nope[d];
    }
    for (float& x : q_lat) x = round_act(x, a.precision);

    const int64_t visible = seq.position + t + 1;
    const int64_t splits = (visible + split_len - 1) / split_len;  // the non-empty ones
    part_m.assign(static_cast<size_t>(splits), 0.0f);
    part_l.assign(static_cast<size_t>(splits), 0.0f);
    part_o.assign(static_cast<size_t>(splits * L), 0.0f);
    for (int64_t k = 0; k < splits; ++k) {
      const int64_t j0 = k * split_len, n = std::min(split_len, visible - j0);
      float m = -INFINITY;
      for (int64_t jj = 0; jj < n; ++jj) {
        const float* c = cache.c_n_row(j0 + jj);
        const float* pe = cache.k_pe_row(j0 + jj);
        float acc = 0.0f;
        for (int64_t i = 0; i < L; ++i) acc += q_lat[i] * c[i];
        for (int64_t r = 0; r < rope; ++r) acc += q_pe[r] * pe[r];
        scores[jj] = a.scale * acc;
        m = std::max(m, scores[jj]);
      }
      float l = 0.0f;
      float* o = part_o.data() + k * L;
      for (int64_t jj = 0; jj < n; ++jj) {
        const float e = std::exp(scores[jj] - m);
        l += e;
        const float* c = cache.c_n_row(j0 + jj);
        for (int64_t i = 0; i < L; ++i) o[i] += e * c[i];
      }
      part_m[k] = m;
      part_l[k] = l;
    }
    // Combine: log-sum-exp weights over the splits, in split order.
    const float M = *std::max_element(part_m.begin(), part_m.end());
    float Z = 0.0f;
    std::fill(o_lat.begin(), o_lat.end(), 0.0f);
    for (int64_t k = 0; k < splits; ++k) {
      const float wk = std::exp(part_m[k] - M);
      Z += wk * part_l[k];
      for (int64_t i = 0; i < L; ++i) o_lat[i] += wk * part_o[k * L + i];
    }
    for (float& x : o_lat) x = round_act(x / Z, a.precision);

    float* out = mla_detail::mutable_row_ptr(a.out, seq.row_begin + t) + h * vd;
    const float* gate = a.gate.data != nullptr ? mla_detail::row_ptr(a.gate, seq.row_begin + t) + h * vd : nullptr;
    for (int64_t e = 0; e < vd; ++e) {
      const float* wr = w.w_uv.data() + e * L;
      float acc = 0.0f;
      for (int64_t i = 0; i < L; ++i) acc += wr[i] * o_lat[i];
      const float o = round_act(acc, a.precision);
      if (gate == nullptr) {
        out[e] = o;
      } else {
        const float s = round_act(1.0f / (1.0f + std::exp(-gate[e])), a.precision);
        out[e] = round_act(o * s, a.precision);
      }
    }
  }
}

}  // namespace

void mla_decode_split_reference(const MlaDecodeArgs& a, int64_t split_len, backends::cpu::ThreadPool* pool) {
  const core::Status st = mla_decode_check(a);
  K3_CHECK(st.is_ok(), st.reason());
  K3_CHECK(a.q.device == core::Device::cpu, "mla_decode_split_reference: tensors must be on the CPU");
  K3_CHECK(split_len >= 1, "mla_decode_split_reference: split_len must be >= 1, got " + std::to_string(split_len));
  if (a.seqs.num_seqs == 0) return;
  const MlaAttentionArgs m = mla_decode_attention_args(a, a.out);
  const std::vector<mla_detail::HeadWeights> weights = mla_detail::load_all_head_weights(m, pool);
  for (int s = 0; s < a.seqs.num_seqs; ++s) {
    const mla_detail::SeqRef seq = mla_detail::seq_ref(a.seqs, s);
    const mla_detail::DequantCache cache = mla_detail::dequantize_sequence(a.pages, seq.block_table, seq.end(),
                                                                           a.k_scale, a.kv_lora, a.qk_rope);
    backends::cpu::parallel_for(pool, a.num_heads, [&](int64_t begin, int64_t end) {
      for (int64_t h = begin; h < end; ++h)
        split_head(a, seq, cache, weights[static_cast<size_t>(h)], static_cast<int>(h), split_len);
    });
  }
}

}  // namespace k3::kernels
