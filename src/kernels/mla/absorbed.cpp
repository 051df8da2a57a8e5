// kernels/mla/absorbed.cpp: MLA attention in the absorbed (decode) form, spec §6.2.
//
// W_UK is folded into the query and W_UV applied after the softmax, so the cache is read as one
// shared 576-wide key/value head (MQA) and never expanded. Per sequence (T rows at cache positions
// S-T .. S-1, S = position + T), head h and query t (position S-T+t):
//   q_lat    = round(W_UK[h]^T q_nope,t)                 [kv_lora], fp32 sum over nope in index order
//   s(j)     = scale * (q_lat . c_n,j + q_pe,t . k_pe,j)  one fp32 sum: latent dims, then rope; j <= S-T+t
//   p        = softmax_j(s)                              fp32, max-subtracted, p_j = e_j / sum e
//   o_lat    = round(sum_j p_j c_n,j)                     [kv_lora], fp32 in j order
//   o_t      = round(W_UV[h] o_lat)                       [v], fp32 sum over kv_lora in index order
// T > 1 covers speculative-verify rows; it is the same per-query computation with its own mask.
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_internal.h"

namespace k3::kernels {

namespace {

// One head of one sequence: out[row_begin + t, h*v .. (h+1)*v) for each of its T query rows.
void absorbed_head(const MlaAttentionArgs& a, const mla_detail::SeqRef& seq, const mla_detail::DequantCache& cache,
                   const mla_detail::HeadWeights& w, int h) {
  const int64_t S = cache.positions, T = seq.num_rows, L = a.kv_lora;
  const int64_t nope = a.qk_nope, rope = a.qk_rope, vd = a.v_head_dim;

  std::vector<float> q_lat(static_cast<size_t>(L)), o_lat(static_cast<size_t>(L));
  std::vector<float> p(static_cast<size_t>(S));
  for (int64_t t = 0; t < T; ++t) {
    const float* q_nope = mla_detail::row_ptr(a.q, seq.row_begin + t) + h * (nope + rope);
    const float* q_pe = q_nope + nope;

    // q_lat[i] = sum_d W_UK[d][i] q_nope[d]; the d-outer loop keeps each i's sum in d order.
    for (int64_t i = 0; i < L; ++i) q_lat[i] = 0.0f;
    for (int64_t d = 0; d < nope; ++d) {
      const float* wr = w.w_uk.data() + d * L;
      const float qd = q_nope[d];
      for (int64_t i = 0; i < L; ++i) q_lat[i] += wr[i] * qd;
    }
    for (int64_t i = 0; i < L; ++i) q_lat[i] = round_act(q_lat[i], a.precision);

    const int64_t visible = S - T + t + 1;  // positions 0 .. S-T+t
    for (int64_t j = 0; j < visible; ++j) {
      const float* c = cache.c_n_row(j);
      const float* pe = cache.k_pe_row(j);
      float acc = 0.0f;
      for (int64_t i = 0; i < L; ++i) acc += q_lat[i] * c[i];
      for (int64_t r = 0; r < rope; ++r) acc += q_pe[r] * pe[r];
      p[j] = a.scale * acc;
    }
    mla_detail::softmax_inplace(p.data(), visible);

    for (int64_t i = 0; i < L; ++i) o_lat[i] = 0.0f;
    for (int64_t j = 0; j < visible; ++j) {
      const float* c = cache.c_n_row(j);
      const float pj = p[j];
      for (int64_t i = 0; i < L; ++i) o_lat[i] += pj * c[i];
    }
    for (int64_t i = 0; i < L; ++i) o_lat[i] = round_act(o_lat[i], a.precision);

    float* out = mla_detail::mutable_row_ptr(a.out, seq.row_begin + t) + h * vd;
    for (int64_t e = 0; e < vd; ++e) {
      const float* wr = w.w_uv.data() + e * L;
      float acc = 0.0f;
      for (int64_t i = 0; i < L; ++i) acc += wr[i] * o_lat[i];
      out[e] = round_act(acc, a.precision);
    }
  }
}

}  // namespace

void mla_absorbed_reference(const MlaAttentionArgs& a, backends::cpu::ThreadPool* pool) {
  const core::Status st = mla_attention_check(a);
  K3_CHECK(st.is_ok(), st.reason());
  K3_CHECK(a.q.device == core::Device::cpu, "mla_absorbed_reference: tensors must be on the CPU");
  if (a.seqs.num_seqs == 0) return;
  const std::vector<mla_detail::HeadWeights> weights = mla_detail::load_all_head_weights(a, pool);
  // One sequence at a time over a dense copy of its cache rows 0 .. end-1 (the same bytes a
  // contiguous cache gives); heads are independent and each writes only its own output columns.
  for (int s = 0; s < a.seqs.num_seqs; ++s) {
    const mla_detail::SeqRef seq = mla_detail::seq_ref(a.seqs, s);
    const mla_detail::DequantCache cache = mla_detail::dequantize_sequence(a.pages, seq.block_table, seq.end(),
                                                                           a.k_scale, a.kv_lora, a.qk_rope);
    backends::cpu::parallel_for(pool, a.num_heads, [&](int64_t begin, int64_t end) {
      for (int64_t h = begin; h < end; ++h)
        absorbed_head(a, seq, cache, weights[static_cast<size_t>(h)], static_cast<int>(h));
    });
  }
}

}  // namespace k3::kernels
