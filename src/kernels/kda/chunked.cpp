// kernels/kda/chunked.cpp: the KDA delta rule in chunks (spec §5.7), equal to the recurrent form
// (§5.5) up to fp32 rounding; the prefill form.
//
// Per sequence and head, per chunk of n <= chunk_size tokens r = 0..n-1 (chunks lie on the grid of
// absolute positions: the first may be short when the sequence's position is not a multiple of
// chunk_size, the last may be partial), with S_in the state before the chunk (stored V-major
// S[v][k]; the spec's K x V S_in is its transpose) and G_r = sum_{s<=r} g_s per channel:
//   L[r,j]   = beta_r * sum_i k_r[i] k_j[i] e^{G_r[i]-G_j[i]}     j < r (strictly lower)
//   W        = (I + L)^-1 diag(beta) (e^G . K)                    [n, D] by forward substitution
//   U        = (I + L)^-1 diag(beta) V                            [n, D] by forward substitution
//   Aqk[r,j] = sum_i q_r[i] k_j[i] e^{G_r[i]-G_j[i]}              j <= r (diagonal included)
//   Vt       = U - W S_in                                         [n, D]
//   O        = (e^G . Q) S_in + Aqk Vt                            [n, D]
//   S_out    = diag(e^{G_n}) S_in + (e^{G_n - G} . K)^T Vt
//
// Decays. Every exponent used is a segment sum sum_{s=j+1..r} g_s <= 0 (a decay DIFFERENCE
// G_r - G_j, with G_{-1} = 0 for e^{G_r}), so nothing overflows: e^{-G} alone (up to e^{320} over
// 64 tokens) is never formed. The segment sum is accumulated directly from the g_s instead of
// subtracting two cumulative sums: G_r and G_j each carry an fp32 error proportional to |G| (which
// grows to hundreds over a chunk), and that error would survive in a small difference G_r - G_j;
// accumulated directly, the error is proportional to the segment itself, as in the recurrent form's
// product of per-token alphas. This costs the same as the e^{...} evaluations it feeds (n^2 D / 2).
//
// Everything is fp32 (no double): the golden test holds chunked == recurrent to 1e-5 relative.
// In bf16 mode only o is rounded (an activation); the state stays fp32.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kernels/kda/gate.h"
#include "kernels/kda/kda_check.h"

namespace k3::kernels {

namespace {

// Scratch for one head's chunk; sized once per task for the largest chunk.
struct ChunkWorkspace {
  int cap = 0, D = 0;
  std::vector<float> q, k, v, g, beta;  // [n, D] prepared inputs (beta [n])
  std::vector<float> decay_from_start;  // [n, D] e^{G_r}
  std::vector<float> decay_to_end;      // [n, D] e^{G_{n-1} - G_j}
  std::vector<float> L, Aqk;            // [n, n] row-major
  std::vector<float> W, U, Vt;          // [n, D]
  std::vector<float> segment, decay;    // [D] running segment sum and its exp

  ChunkWorkspace(int cap_, int D_) : cap(cap_), D(D_) {
    const size_t nd = static_cast<size_t>(cap) * D, nn = static_cast<size_t>(cap) * cap;
    for (auto* b : {&q, &k, &v, &g, &decay_from_start, &decay_to_end, &W, &U, &Vt}) b->resize(nd);
    beta.resize(cap);
    L.resize(nn);
    Aqk.resize(nn);
    segment.resize(D);
    decay.resize(D);
  }
};

// Fills decay_from_start, decay_to_end, L and Aqk of one chunk of n tokens (see file comment).
void chunk_decays_and_scores(ChunkWorkspace& w, int n) {
  const int D = w.D;
  // j = -1 is the chunk start: its segments give e^{G_r}.
  for (int j = -1; j < n; ++j) {
    std::fill(w.segment.begin(), w.segment.end(), 0.0f);
    std::fill(w.decay.begin(), w.decay.end(), 1.0f);  // the empty segment (j = n-1 to the end)
    const float* kj = j >= 0 ? &w.k[static_cast<size_t>(j) * D] : nullptr;
    for (int r = j + 1; r < n; ++r) {
      const float* gr = &w.g[static_cast<size_t>(r) * D];
      for (int i = 0; i < D; ++i) {
        w.segment[i] += gr[i];  // sum_{s=j+1..r} g_s
        w.decay[i] = std::exp(w.segment[i]);
      }
      if (j < 0) {
        std::copy(w.decay.begin(), w.decay.end(), w.decay_from_start.begin() + static_cast<size_t>(r) * D);
        continue;
      }
      const float* kr = &w.k[static_cast<size_t>(r) * D];
      const float* qr = &w.q[static_cast<size_t>(r) * D];
      float kk = 0.0f, qk = 0.0f;
      for (int i = 0; i < D; ++i) {
        kk += kr[i] * kj[i] * w.decay[i];
        qk += qr[i] * kj[i] * w.decay[i];
      }
      w.L[static_cast<size_t>(r) * n + j] = w.beta[r] * kk;
      w.Aqk[static_cast<size_t>(r) * n + j] = qk;
    }
    if (j >= 0) {
      std::copy(w.decay.begin(), w.decay.end(), w.decay_to_end.begin() + static_cast<size_t>(j) * D);
      // Diagonal of Aqk: e^{G_j - G_j} = 1.
      const float* qj = &w.q[static_cast<size_t>(j) * D];
      float qk = 0.0f;
      for (int i = 0; i < D; ++i) qk += qj[i] * kj[i];
      w.Aqk[static_cast<size_t>(j) * n + j] = qk;
    }
  }
}

// X = (I + L)^-1 X in place, for X [n, D] (L strictly lower, unit diagonal implied):
// forward substitution X_r -= sum_{j<r} L[r,j] X_j, rows in order.
void forward_substitute(const std::vector<float>& L, int n, int D, float* X) {
  for (int r = 1; r < n; ++r) {
    float* xr = X + static_cast<size_t>(r) * D;
    for (int j = 0; j < r; ++j) {
      const float l = L[static_cast<size_t>(r) * n + j];
      const float* xj = X + static_cast<size_t>(j) * D;
      for (int i = 0; i < D; ++i) xr[i] -= l * xj[i];
    }
  }
}

// One chunk of one head: tokens [t0, t0 + n), state S (V-major [D][D]) updated in place.
void run_chunk(const KdaAttentionArgs& a, int h, int64_t t0, int n, float* S, ChunkWorkspace& w) {
  const int D = w.D;
  for (int r = 0; r < n; ++r) {
    const size_t o = static_cast<size_t>(r) * D;
    kda_detail::kda_prepare_token(a, t0 + r, h, &w.q[o], &w.k[o], &w.v[o], &w.g[o], &w.beta[r]);
  }
  chunk_decays_and_scores(w, n);

  // Right-hand sides diag(beta)(e^G . K) and diag(beta) V, then both solves.
  for (int r = 0; r < n; ++r) {
    const size_t o = static_cast<size_t>(r) * D;
    for (int i = 0; i < D; ++i) {
      w.W[o + i] = w.beta[r] * (w.decay_from_start[o + i] * w.k[o + i]);
      w.U[o + i] = w.beta[r] * w.v[o + i];
    }
  }
  forward_substitute(w.L, n, D, w.W.data());
  forward_substitute(w.L, n, D, w.U.data());

  // Vt = U - W S_in: (W S_in)[r][v] = sum_k W[r][k] S[v][k].
  for (int r = 0; r < n; ++r) {
    const float* wr = &w.W[static_cast<size_t>(r) * D];
    for (int vi = 0; vi < D; ++vi) {
      const float* srow = S + static_cast<size_t>(vi) * D;
      float ws = 0.0f;
      for (int ki = 0; ki < D; ++ki) ws += wr[ki] * srow[ki];
      w.Vt[static_cast<size_t>(r) * D + vi] = w.U[static_cast<size_t>(r) * D + vi] - ws;
    }
  }

  // O = (e^G . Q) S_in + Aqk Vt, from the state before this chunk.
  std::vector<float>& qg = w.segment;  // reused as [D] scratch: e^{G_r} . q_r
  for (int r = 0; r < n; ++r) {
    const size_t o = static_cast<size_t>(r) * D;
    for (int i = 0; i < D; ++i) qg[i] = w.decay_from_start[o + i] * w.q[o + i];
    float* out = kda_detail::row_f32_mut(a.out, t0 + r) + static_cast<int64_t>(h) * D;
    for (int vi = 0; vi < D; ++vi) {
      const float* srow = S + static_cast<size_t>(vi) * D;
      float acc = 0.0f;
      for (int ki = 0; ki < D; ++ki) acc += qg[ki] * srow[ki];
      for (int j = 0; j <= r; ++j) acc += w.Aqk[static_cast<size_t>(r) * n + j] * w.Vt[static_cast<size_t>(j) * D + vi];
      out[vi] = round_act(acc, a.precision);  // o is an activation: rounded in bf16 mode
    }
  }

  // S_out[v][k] = e^{G_n}[k] S_in[v][k] + sum_j (e^{G_n - G_j} . k_j)[k] Vt[j][v], j in order.
  const float* decay_all = &w.decay_from_start[static_cast<size_t>(n - 1) * D];
  for (int vi = 0; vi < D; ++vi) {
    float* srow = S + static_cast<size_t>(vi) * D;
    for (int ki = 0; ki < D; ++ki) srow[ki] *= decay_all[ki];
  }
  for (int j = 0; j < n; ++j) {
    const size_t o = static_cast<size_t>(j) * D;
    for (int i = 0; i < D; ++i) qg[i] = w.decay_to_end[o + i] * w.k[o + i];  // scratch: e^{G_n-G_j} . k_j
    for (int vi = 0; vi < D; ++vi) {
      const float u = w.Vt[o + vi];
      float* srow = S + static_cast<size_t>(vi) * D;
      for (int ki = 0; ki < D; ++ki) srow[ki] += qg[ki] * u;
    }
  }
}

}  // namespace

void kda_chunked_reference(const KdaAttentionArgs& a, backends::cpu::ThreadPool* pool) {
  if (core::Status s = kda_attention_check(a); !s) throw core::Error("kda_chunked: " + s.reason());
  K3_CHECK(!a.no_commit, "kda_chunked: no_commit is not supported (verify rows use kda_recurrent)");
  const int H = a.num_heads, D = a.head_dim;
  const int64_t cs = a.chunk_size;
  const std::vector<kda_detail::HostSeq> seqs = kda_detail::host_seqs(a.seqs, true);
  if (seqs.empty()) return;
  int64_t longest = 0;
  for (const kda_detail::HostSeq& sq : seqs) longest = std::max(longest, sq.num_rows);
  const int cap = static_cast<int>(std::min<int64_t>(cs, longest));
  // (sequence, head) pairs are independent: one task per range of pairs; results do not depend on
  // the thread count or on the other sequences of the batch.
  const int64_t units = static_cast<int64_t>(seqs.size()) * H;
  backends::cpu::parallel_for(pool, units, [&](int64_t u_begin, int64_t u_end) {
    ChunkWorkspace w(cap, D);
    for (int64_t u = u_begin; u < u_end; ++u) {
      const kda_detail::HostSeq& sq = seqs[static_cast<size_t>(u / H)];
      const int h = static_cast<int>(u % H);
      float* S = a.state.as<float>() + sq.slot * a.state.strides[0] + static_cast<int64_t>(h) * D * D;
      // The chunk grid lies on absolute positions: the first chunk ends at the next multiple of
      // chunk_size after `position`, so where a prefill was split does not change the chunks.
      const int64_t end = sq.row_begin + sq.num_rows;
      int64_t n = cs - sq.position % cs;
      for (int64_t t0 = sq.row_begin; t0 < end; t0 += n, n = cs) {
        n = std::min(n, end - t0);
        run_chunk(a, h, t0, static_cast<int>(n), S, w);
      }
    }
  });
}

}  // namespace k3::kernels
