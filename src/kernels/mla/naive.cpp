// kernels/mla/naive.cpp: MLA attention in the naive (prefill) form, spec §6.1.
//
// Per sequence (T rows at cache positions S-T .. S-1, S = position + T) and head h, the sequence's
// latent cache is expanded into real keys and values,
//   k_nope[j] = round(W_UK[h] c_n,j)   [S, nope]      v[j] = round(W_UV[h] c_n,j)   [S, v]
// (each an fp32 dot over kv_lora in index order, rounded like a linear output), then every
// query t (cache position S-T+t) attends causally to positions j <= S-T+t:
//   score(t,j) = scale * (q_nope,t . k_nope[j] + q_pe,t . k_pe,j)   one fp32 sum: nope dims, then rope
//   p = softmax_j(score)   (fp32, max-subtracted, p_j = e_j / sum e)
//   o_t = round(sum_j p_j v[j])   (fp32, in j order)
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_internal.h"

namespace k3::kernels {

namespace {

// One head of one sequence: out[row_begin + t, h*v .. (h+1)*v) for each of its T query rows.
void naive_head(const MlaAttentionArgs& a, const mla_detail::SeqRef& seq, const mla_detail::DequantCache& cache,
                const mla_detail::HeadWeights& w, int h) {
  const int64_t S = cache.positions, T = seq.num_rows, L = a.kv_lora;
  const int64_t nope = a.qk_nope, rope = a.qk_rope, vd = a.v_head_dim;

  std::vector<float> k_nope(static_cast<size_t>(S * nope)), v(static_cast<size_t>(S * vd));
  for (int64_t j = 0; j < S; ++j) {
    const float* c = cache.c_n_row(j);
    for (int64_t d = 0; d < nope; ++d) {
      const float* wr = w.w_uk.data() + d * L;
      float acc = 0.0f;
      for (int64_t i = 0; i < L; ++i) acc += wr[i] * c[i];
      k_nope[j * nope + d] = round_act(acc, a.precision);
    }
    for (int64_t e = 0; e < vd; ++e) {
      const float* wr = w.w_uv.data() + e * L;
      float acc = 0.0f;
      for (int64_t i = 0; i < L; ++i) acc += wr[i] * c[i];
      v[j * vd + e] = round_act(acc, a.precision);
    }
  }

  std::vector<float> p(static_cast<size_t>(S)), o(static_cast<size_t>(vd));
  for (int64_t t = 0; t < T; ++t) {
    const float* q_nope = mla_detail::row_ptr(a.q, seq.row_begin + t) + h * (nope + rope);
    const float* q_pe = q_nope + nope;
    const int64_t visible = S - T + t + 1;  // positions 0 .. S-T+t
    for (int64_t j = 0; j < visible; ++j) {
      const float* k = k_nope.data() + j * nope;
      const float* pe = cache.k_pe_row(j);
      float acc = 0.0f;
      for (int64_t d = 0; d < nope; ++d) acc += q_nope[d] * k[d];
      for (int64_t r = 0; r < rope; ++r) acc += q_pe[r] * pe[r];
      p[j] = a.scale * acc;
    }
    mla_detail::softmax_inplace(p.data(), visible);
    for (int64_t e = 0; e < vd; ++e) o[e] = 0.0f;
    for (int64_t j = 0; j < visible; ++j) {
      const float* vj = v.data() + j * vd;
      for (int64_t e = 0; e < vd; ++e) o[e] += p[j] * vj[e];
    }
    float* out = mla_detail::mutable_row_ptr(a.out, seq.row_begin + t) + h * vd;
    for (int64_t e = 0; e < vd; ++e) out[e] = round_act(o[e], a.precision);
  }
}

}  // namespace

void mla_naive_reference(const MlaAttentionArgs& a, backends::cpu::ThreadPool* pool) {
  const core::Status st = mla_attention_check(a);
  K3_CHECK(st.is_ok(), st.reason());
  K3_CHECK(a.q.device == core::Device::cpu, "mla_naive_reference: tensors must be on the CPU");
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
        naive_head(a, seq, cache, weights[static_cast<size_t>(h)], static_cast<int>(h));
    });
  }
}

}  // namespace k3::kernels
