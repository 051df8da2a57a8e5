// kernels/kda/recurrent.cpp: the KDA delta rule, one token at a time (spec §5.5): the decode form and
// the oracle the chunked form (§5.7) is checked against.
//
// Per head h, state S = state[h] is V-major, S[v][k] at (h*D + v)*D + k, fp32. Per token, exactly:
//   1. decay:  S[v][k] *= alpha[k]                 (alpha = exp(g): decay along the KEY axis)
//   2. read:   r[v] = sum_k S[v][k] * k[k]
//   3. delta:  u[v] = beta * (v[v] - r[v])
//   4. write:  S[v][k] += u[v] * k[k]
//   5. output: o[v] = sum_k S[v][k] * q[k]        (post-update state)
// Every step acts on one row v of S at a time, so the five steps are done row by row; the float
// operations and their order are the same as five whole-matrix passes. Sums run k = 0..D-1.
// Each sequence of the batch walks its own rows with its own state slot.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kernels/kda/gate.h"
#include "kernels/kda/kda_check.h"

namespace k3::kernels {

void kda_recurrent_reference(const KdaAttentionArgs& a, backends::cpu::ThreadPool* pool) {
  if (core::Status s = kda_attention_check(a); !s) throw core::Error("kda_recurrent: " + s.reason());
  const int H = a.num_heads, D = a.head_dim;
  const std::vector<kda_detail::HostSeq> seqs = kda_detail::host_seqs(a.seqs, true);
  // (sequence, head) pairs are independent (own state slice, own output rows and columns): one task
  // per range of pairs, so the result does not depend on the thread count or the batch.
  const int64_t units = static_cast<int64_t>(seqs.size()) * H;
  backends::cpu::parallel_for(pool, units, [&](int64_t u_begin, int64_t u_end) {
    std::vector<float> q(D), k(D), v(D), g(D), alpha(D);
    std::vector<float> scratch(a.no_commit ? static_cast<size_t>(D) * D : 0);  // no_commit: a private copy
    for (int64_t u = u_begin; u < u_end; ++u) {
      const kda_detail::HostSeq& sq = seqs[static_cast<size_t>(u / H)];
      const int64_t h = u % H;
      float* S = a.state.as<float>() + sq.slot * a.state.strides[0] + h * D * D;
      if (a.no_commit) {  // verify rows run on a copy of the committed state (spec §5.9 (b))
        std::copy(S, S + static_cast<int64_t>(D) * D, scratch.begin());
        S = scratch.data();
      }
      for (int64_t t = sq.row_begin; t < sq.row_begin + sq.num_rows; ++t) {
        float beta = 0.0f;
        kda_detail::kda_prepare_token(a, t, static_cast<int>(h), q.data(), k.data(), v.data(), g.data(), &beta);
        for (int i = 0; i < D; ++i) alpha[i] = std::exp(g[i]);
        float* o = kda_detail::row_f32_mut(a.out, t) + h * D;
        for (int vi = 0; vi < D; ++vi) {
          float* row = S + static_cast<int64_t>(vi) * D;
          for (int ki = 0; ki < D; ++ki) row[ki] *= alpha[ki];  // 1. decay
          float read = 0.0f;
          for (int ki = 0; ki < D; ++ki) read += row[ki] * k[ki];  // 2. read
          const float u_v = beta * (v[vi] - read);                 // 3. delta
          for (int ki = 0; ki < D; ++ki) row[ki] += u_v * k[ki];   // 4. write
          float out = 0.0f;
          for (int ki = 0; ki < D; ++ki) out += row[ki] * q[ki];  // 5. output
          o[vi] = round_act(out, a.precision);                    // o is an activation: rounded in bf16 mode
        }
      }
    }
  });
}

}  // namespace k3::kernels
