// kernels/kda/cuda_chunked.cu: CUDA KDA delta rule in chunks (spec §5.7): the prefill form, equal to
// the recurrent form up to fp32 rounding.
//
// As in the recurrent kernel, a block owns kRows state rows v of one head of one sequence (grid:
// heads x D/kRows x sequences; rows, slot and position from the SeqBatch tables in device memory)
// and walks that sequence's chunks in order, its rows resident in shared memory (chunks depend on
// each other through the state, so they are a loop, never a grid dimension). The chunk length is
// C = min(chunk_size, 64), halved while shared memory is short; the chunk grid lies on absolute
// positions of C: the first chunk ends at the next multiple of C after the sequence's position
// (kda.h). Per chunk of n <= C tokens, with G_r = sum_{s<=r} g_s:
//   L[r,j]   = beta_r sum_i k_r[i] k_j[i] e^{G_r[i]-G_j[i]}   (j < r)
//   Aqk[r,j] = sum_i q_r[i] k_j[i] e^{G_r[i]-G_j[i]}          (j <= r)
//   W = (I+L)^-1 diag(beta)(e^G . K),  U = (I+L)^-1 diag(beta) V    (forward substitution per column)
//   Vt = U - W S_in^T,  O = (e^G . Q) S_in^T + Aqk Vt,  S_out = e^{G_n} . S_in + (e^{G_n-G} . K)^T Vt
// (rows of S are V-major S[v][k]; only the block's v columns of U, Vt and O are formed). The
// per-chunk quantities shared by all rows (L, Aqk, W) are recomputed by each of a head's blocks.
// Decays are differences of one fp32 cumulative sum, e^{G_r - G_j} with r >= j (never e^{-G}); the
// reference accumulates each segment directly, so the two differ by rounding only.
#include "kernels/kda/cuda_kda_common.cuh"
#include "kernels/kda/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kRows = 32;
constexpr int kThreads = 256;
constexpr int kMaxChunk = 64;

// Shared memory plan, in floats; rows of D-wide arrays are padded to D + 1 (no bank conflicts
// when threads walk different rows at one column).
struct ChunkSmem {
  int C, D, DP;
  __host__ __device__ ChunkSmem(int c, int d) : C(c), D(d), DP(d + 1) {}
  __host__ __device__ int q() const { return 0; }                       // [C][DP] q, then e^{G}.q
  __host__ __device__ int k() const { return C * DP; }                  // [C][DP] k, then e^{G_n - G}.k
  __host__ __device__ int g() const { return 2 * C * DP; }              // [C][DP] g, then G (cumsum)
  __host__ __device__ int w() const { return 3 * C * DP; }              // [C][DP] W
  __host__ __device__ int l() const { return 4 * C * DP; }              // [C][C]  L
  __host__ __device__ int a() const { return 4 * C * DP + C * C; }      // [C][C] Aqk
  __host__ __device__ int u() const { return 4 * C * DP + 2 * C * C; }  // [C][kRows] U, then Vt
  __host__ __device__ int s() const { return u() + C * kRows; }         // [kRows][DP] the block's state rows
  __host__ __device__ int beta() const { return s() + kRows * DP; }     // [C]
  __host__ __device__ int total() const { return beta() + C; }
};

template <class T>
__global__ void __launch_bounds__(kThreads) kda_chunked_kernel(KdaParams<T> p, int C) {
  extern __shared__ float sm[];
  const ChunkSmem L(C, p.D);
  const int D = p.D, DP = L.DP, h = blockIdx.x, v0 = blockIdx.y * kRows;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  float *q = sm + L.q(), *k = sm + L.k(), *G = sm + L.g(), *W = sm + L.w(), *Lm = sm + L.l(), *A = sm + L.a();
  float *U = sm + L.u(), *S = sm + L.s(), *beta = sm + L.beta();
  const int64_t c0 = static_cast<int64_t>(h) * D;
  const float a_log = p.a_log[h];
  // This block's sequence (the same for every thread: the chunk loop below is uniform).
  const KdaSeq seq = kda_seq(p, blockIdx.z);
  float* state = seq.state + c0 * D;  // head h of the sequence's slot: [D][D]
  // First chunk: up to the next multiple of C after the position (a full chunk on the grid).
  const int position = p.position[blockIdx.z];
  int first = C - (position >= 0 ? position % C : 0);

  for (int e = tid; e < kRows * D; e += blockDim.x) {
    const int c = e / D, kk = e % D;
    S[c * DP + kk] = v0 + c < D ? state[static_cast<int64_t>(v0 + c) * D + kk] : 0.0f;
  }

  for (int done = 0; done < seq.rows;) {
    const int n = seq.rows - done < first ? seq.rows - done : first;
    const int64_t t0 = seq.row0 + done;  // activation row of the chunk's first token
    done += n;
    first = C;
    // 1. Per token (a warp each): L2-normalised q (scaled) and k, g, beta; the block's v columns.
    for (int r = warp; r < n; r += warps) {
      const int64_t t = t0 + r;
      float qq = 0.0f, kk = 0.0f;
      for (int i = lane; i < D; i += 32) {
        const float qi = to_f32(p.q[t * p.q_ld + c0 + i]), ki = to_f32(p.k[t * p.k_ld + c0 + i]);
        qq += qi * qi;
        kk += ki * ki;
      }
      const float q_norm = sqrtf(warp_sum(qq) + kKdaL2Eps), k_norm = sqrtf(warp_sum(kk) + kKdaL2Eps);
      for (int i = lane; i < D; i += 32) {
        q[r * DP + i] = to_f32(p.q[t * p.q_ld + c0 + i]) / q_norm * p.q_scale;
        k[r * DP + i] = to_f32(p.k[t * p.k_ld + c0 + i]) / k_norm;
        G[r * DP + i] = kda_gate(to_f32(p.f[t * p.f_ld + c0 + i]), p.dt_bias[c0 + i], a_log, p.lower_bound);
      }
      if (lane == 0) beta[r] = sigmoid_f32(to_f32(p.b[t * p.b_ld + h]));
    }
    for (int e = tid; e < n * kRows; e += blockDim.x) {
      const int r = e / kRows, c = e % kRows;
      U[r * kRows + c] = v0 + c < D ? to_f32(p.v[(t0 + r) * p.v_ld + c0 + v0 + c]) : 0.0f;
    }
    __syncthreads();
    // 2. G = cumulative sum of g over the chunk, per channel.
    for (int i = tid; i < D; i += blockDim.x)
      for (int r = 1; r < n; ++r) G[r * DP + i] += G[(r - 1) * DP + i];
    __syncthreads();
    // 3. L (strictly lower) and Aqk (diagonal included).
    for (int e = tid; e < n * n; e += blockDim.x) {
      const int r = e / n, j = e % n;
      if (j > r) continue;
      const float *qr = q + r * DP, *kr = k + r * DP, *kj = k + j * DP, *Gr = G + r * DP, *Gj = G + j * DP;
      float kk = 0.0f, qk = 0.0f;
      if (j == r) {
        for (int i = 0; i < D; ++i) qk += qr[i] * kj[i];
      } else {
        for (int i = 0; i < D; ++i) {
          const float d = expf(Gr[i] - Gj[i]);
          kk += kr[i] * kj[i] * d;
          qk += qr[i] * kj[i] * d;
        }
        Lm[r * C + j] = beta[r] * kk;
      }
      A[r * C + j] = qk;
    }
    // Right-hand sides: W = beta (e^G . k), U = beta v.
    for (int e = tid; e < n * D; e += blockDim.x) {
      const int r = e / D, i = e % D;
      W[r * DP + i] = beta[r] * (expf(G[r * DP + i]) * k[r * DP + i]);
    }
    for (int e = tid; e < n * kRows; e += blockDim.x) U[e] = beta[e / kRows] * U[e];
    __syncthreads();
    // q -> e^{G_r} . q_r, k -> e^{G_last - G_j} . k_j (what O and S_out read from now on).
    for (int e = tid; e < n * D; e += blockDim.x) {
      const int r = e / D, i = e % D;
      q[r * DP + i] *= expf(G[r * DP + i]);
      k[r * DP + i] *= expf(G[(n - 1) * DP + i] - G[r * DP + i]);
    }
    // 4. Forward substitution X_r -= sum_{j<r} L[r,j] X_j, each thread one column of W or U.
    if (tid < D + kRows) {
      float* X = tid < D ? W + tid : U + (tid - D);
      const int stride = tid < D ? DP : kRows;
      for (int r = 1; r < n; ++r) {
        float xr = X[r * stride];
        for (int j = 0; j < r; ++j) xr -= Lm[r * C + j] * X[j * stride];
        X[r * stride] = xr;
      }
    }
    __syncthreads();
    // 5. Vt = U - W S_in^T (in place in U).
    for (int e = tid; e < n * kRows; e += blockDim.x) {
      const int r = e / kRows, c = e % kRows;
      const float *wr = W + r * DP, *sc = S + c * DP;
      float ws = 0.0f;
      for (int i = 0; i < D; ++i) ws += wr[i] * sc[i];
      U[e] = U[e] - ws;
    }
    __syncthreads();
    // 6. O = (e^G . Q) S_in^T + Aqk Vt, from the state before this chunk.
    for (int e = tid; e < n * kRows; e += blockDim.x) {
      const int r = e / kRows, c = e % kRows;
      if (v0 + c >= D) continue;
      const float *qr = q + r * DP, *sc = S + c * DP;
      float acc = 0.0f;
      for (int i = 0; i < D; ++i) acc += qr[i] * sc[i];
      for (int j = 0; j <= r; ++j) acc += A[r * C + j] * U[j * kRows + c];
      store_act(p.out + (t0 + r) * p.out_ld + c0 + v0 + c, acc, p.round);
    }
    __syncthreads();
    // 7. S_out = e^{G_last} . S_in + sum_j (e^{G_last - G_j} . k_j) Vt_j, j in order.
    for (int e = tid; e < kRows * D; e += blockDim.x) {
      const int c = e / D, i = e % D;
      float sv = S[c * DP + i] * expf(G[(n - 1) * DP + i]);
      for (int j = 0; j < n; ++j) sv += k[j * DP + i] * U[j * kRows + c];
      S[c * DP + i] = sv;
    }
    __syncthreads();
  }

  for (int e = tid; e < kRows * D; e += blockDim.x) {
    const int c = e / D, kk = e % D;
    if (v0 + c < D) state[static_cast<int64_t>(v0 + c) * D + kk] = S[c * DP + kk];
  }
}

// Chunk length used on this device: the requested one (at most 64), halved while its shared
// memory plan does not fit.
int device_chunk(const CudaOps& ops, const KdaAttentionArgs& a) {
  int C = a.chunk_size < kMaxChunk ? a.chunk_size : kMaxChunk;
  while (C > 1 && ChunkSmem(C, a.head_dim).total() * sizeof(float) > ops.ctx->smem_optin()) C /= 2;
  return C;
}

}  // namespace

void register_kda_chunked_cuda(KdaOps& r, const CudaOps& ops) {
  r.kda_chunked.add(
      {"cuda_chunked", core::Device::cuda,
       [ops](const KdaAttentionArgs& a) {
         if (auto s = kda_supports(ops, a); !s) return s;
         if (a.no_commit)
           return core::Status::fail("no_commit is not supported by the chunked form (use kda_recurrent)");
         const int C = device_chunk(ops, a);
         if (ChunkSmem(C, a.head_dim).total() * sizeof(float) > ops.ctx->smem_optin())
           return core::Status::fail("not enough shared memory for head_dim " + std::to_string(a.head_dim));
         return core::Status::ok();
       },
       [ops](const KdaAttentionArgs& a) {
         if (a.q.dim(0) == 0 || a.seqs.num_seqs == 0) return;
         const int C = device_chunk(ops, a);
         const size_t smem = ChunkSmem(C, a.head_dim).total() * sizeof(float);
         with_act(a.q.dtype, [&](auto tag) {
           using E = typename decltype(tag)::type;
           allow_smem(ops, kda_chunked_kernel<E>, smem);
           const dim3 grid(static_cast<unsigned>(a.num_heads), grid_for(a.head_dim, kRows),
                           static_cast<unsigned>(a.seqs.num_seqs));
           kda_chunked_kernel<E><<<grid, kThreads, smem, ops.ctx->stream()>>>(kda_params<E>(a), C);
           K3_CUDA_CHECK_LAUNCH("kda_chunked_kernel");
         });
       }});
}

}  // namespace k3::kernels
