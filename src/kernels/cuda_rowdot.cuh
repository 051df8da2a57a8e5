// kernels/cuda_rowdot.cuh: weight-row dot products on CUDA cores for any weight format (f32, bf16,
// MXFP4 decoded in the inner loop) and any activation dtype: the linear fallback (f32 activations,
// MXFP4 or odd layouts cuBLASLt does not take), the routed experts and the MLA kv_b expansion.
//
// A warp is cut into segments of `width` lanes (a power of two); a segment owns one weight row and
// sums it against up to R input rows at once, so each weight element is read once per R inputs.
// Lane `sub` of a segment takes chunks sub, sub + width, ... of the row; a chunk is 16 bytes of
// weight (4 f32, 8 bf16 or 32 MXFP4 values = one scale group) on the vector path, one element on
// the scalar path (odd widths, unaligned rows). Partial sums meet through shuffles, so the sum
// order is fixed by (in, width) alone: results never depend on the grid.
#pragma once
#include "kernels/cuda_common.cuh"

namespace k3::kernels::cuda_detail {

template <WFmt F, bool VEC>
__host__ __device__ constexpr int chunk_elems() {
  if constexpr (!VEC) return 1;
  if constexpr (F == WFmt::f32) return 4;
  if constexpr (F == WFmt::bf16) return 8;
  return 32;
}

// Weight elements [c0, c0 + N) of row r as floats.
template <WFmt F, bool VEC, int N>
__device__ __forceinline__ void load_w_chunk(const WeightRef& w, int64_t r, int64_t c0, float (&v)[N]) {
  if constexpr (!VEC) {
    v[0] = weight_at<F>(w, r, c0);
  } else if constexpr (F == WFmt::f32) {
    const float4 q = *reinterpret_cast<const float4*>(static_cast<const float*>(w.data) + r * w.ld + c0);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else if constexpr (F == WFmt::bf16) {
    const uint4 q = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(w.data) + r * w.ld + c0);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(words[i] << 16);
      v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  } else {
    const uint4 q = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w.data) + r * w.ld + (c0 >> 1));
    const float s = e8m0_value(w.scale[r * w.scale_ld + (c0 >> 5)]);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int n = 0; n < 8; ++n) v[8 * i + n] = fp4_value((words[i] >> (4 * n)) & 15u) * s;
  }
}

// Input elements [0, N) at p (16-byte aligned on the vector path) as floats.
template <bool VEC, int N, class XT>
__device__ __forceinline__ void load_x_chunk(const XT* p, float (&v)[N]) {
  if constexpr (!VEC || N * sizeof(XT) < 16) {
#pragma unroll
    for (int e = 0; e < N; ++e) v[e] = to_f32(p[e]);
  } else if constexpr (sizeof(XT) == 4) {
#pragma unroll
    for (int e = 0; e < N; e += 4) {
      const float4 q = *reinterpret_cast<const float4*>(p + e);
      v[e] = q.x, v[e + 1] = q.y, v[e + 2] = q.z, v[e + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < N; e += 8) {
      const uint4 q = *reinterpret_cast<const uint4*>(p + e);
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[e + 2 * i] = __uint_as_float(words[i] << 16);
        v[e + 2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
      }
    }
  }
}

// acc[m][j] = sum_i W_m[r_m][i] * x_j[i] for MR weight rows at once (e.g. an expert's gate and up
// rows) and j < nr (nr <= R) inputs, complete in every lane of the segment. The MR rows' chunks are
// loaded together, so each lane keeps MR loads in flight. All 32 lanes of the warp must call it
// (the shuffles use the full mask); a segment without rows passes active = false and gets zeros.
template <WFmt F, bool VEC, class XT, int R, int MR>
__device__ __forceinline__ void segment_rows_dot(const WeightRef (&w)[MR], const int64_t (&r)[MR], int64_t in,
                                                 const XT* const (&x)[R], int nr, int sub, int width, bool active,
                                                 float (&acc)[MR][R]) {
  constexpr int N = chunk_elems<F, VEC>();
#pragma unroll
  for (int m = 0; m < MR; ++m)
#pragma unroll
    for (int j = 0; j < R; ++j) acc[m][j] = 0.0f;
  if (!active) {
    // nothing: zeros (the shuffles below still run in every lane)
  } else if constexpr (F == WFmt::mxfp4 && VEC) {
    // MXFP4 chunks of 32: the MR rows' 16 code bytes and scales are loaded first, then decoded 8
    // values at a time against 8 inputs of each route (few live registers, MR loads in flight).
    for (int64_t c0 = static_cast<int64_t>(sub) * N; c0 < in; c0 += static_cast<int64_t>(width) * N) {
      uint4 q[MR];
      float sc[MR];
#pragma unroll
      for (int m = 0; m < MR; ++m) {
        q[m] = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w[m].data) + r[m] * w[m].ld + (c0 >> 1));
        sc[m] = e8m0_value(w[m].scale[r[m] * w[m].scale_ld + (c0 >> 5)]);
      }
#pragma unroll
      for (int word = 0; word < 4; ++word) {
        float wv[MR][8];
#pragma unroll
        for (int m = 0; m < MR; ++m) {
          const uint32_t bits = word == 0 ? q[m].x : word == 1 ? q[m].y : word == 2 ? q[m].z : q[m].w;
#pragma unroll
          for (int n = 0; n < 8; ++n) wv[m][n] = fp4_value((bits >> (4 * n)) & 15u) * sc[m];
        }
#pragma unroll
        for (int j = 0; j < R; ++j) {
          if (j < nr) {
            float xv[8];
            load_x_chunk<VEC, 8>(x[j] + c0 + 8 * word, xv);
#pragma unroll
            for (int m = 0; m < MR; ++m)
#pragma unroll
              for (int e = 0; e < 8; ++e) acc[m][j] += wv[m][e] * xv[e];
          }
        }
      }
    }
  } else {
#pragma unroll 2
    for (int64_t c0 = static_cast<int64_t>(sub) * N; c0 < in; c0 += static_cast<int64_t>(width) * N) {
      float wv[MR][N];
#pragma unroll
      for (int m = 0; m < MR; ++m) load_w_chunk<F, VEC, N>(w[m], r[m], c0, wv[m]);
#pragma unroll
      for (int j = 0; j < R; ++j) {
        if (j < nr) {
          float xv[N];
          load_x_chunk<VEC, N>(x[j] + c0, xv);
#pragma unroll
          for (int m = 0; m < MR; ++m)
#pragma unroll
            for (int e = 0; e < N; ++e) acc[m][j] += wv[m][e] * xv[e];
        }
      }
    }
  }
  for (int o = width >> 1; o > 0; o >>= 1)
#pragma unroll
    for (int m = 0; m < MR; ++m)
#pragma unroll
      for (int j = 0; j < R; ++j) acc[m][j] += __shfl_xor_sync(kFullMask, acc[m][j], o);
}

// The single-row form: acc[j] = sum_i W[r][i] * x_j[i].
template <WFmt F, bool VEC, class XT, int R>
__device__ __forceinline__ void segment_row_dot(const WeightRef& w, int64_t r, int64_t in, const XT* const (&x)[R],
                                                int nr, int sub, int width, bool active, float (&acc)[R]) {
  const WeightRef ws[1] = {w};
  const int64_t rs[1] = {r};
  float a[1][R];
  segment_rows_dot<F, VEC, XT, R, 1>(ws, rs, in, x, nr, sub, width, active, a);
#pragma unroll
  for (int j = 0; j < R; ++j) acc[j] = a[0][j];
}

// Segment width for rows of `in` elements: enough lanes for the row's chunks, at most a warp.
template <WFmt F, bool VEC>
inline int segment_width(int64_t in) {
  const int64_t chunks = (in + chunk_elems<F, VEC>() - 1) / chunk_elems<F, VEC>();
  int w = 1;
  while (w < 32 && w < chunks) w *= 2;
  return w;
}

// Whether rows of this weight and these inputs can take the 16-byte vector path.
inline bool vector_ok(WFmt f, const WeightRef& w, int64_t in, const void* x, int64_t x_ld, size_t x_elem) {
  const int n = f == WFmt::f32 ? 4 : f == WFmt::bf16 ? 8 : 32;
  const size_t w_row_bytes = static_cast<size_t>(w.ld) * (f == WFmt::f32 ? 4 : f == WFmt::bf16 ? 2 : 1);
  if (in % n != 0 || !aligned16(w.data) || w_row_bytes % 16 != 0) return false;
  return aligned16(x) && (static_cast<size_t>(x_ld) * x_elem) % 16 == 0;
}

constexpr int kRowdotThreads = 256;
constexpr int kRowdotInputs = 8;  // R: input rows per pass over a weight row

// y[t][o] = store(sum_i W[o][i] * x[t][i]) for t < T, o < out. Grid: (rows / segments, T / R).
template <WFmt F, bool VEC, class XT, class YT>
__global__ void __launch_bounds__(kRowdotThreads)
    linear_rowdot_kernel(WeightRef w, int64_t out, int64_t in, const XT* x, int64_t x_ld, YT* y, int64_t y_ld,
                         int64_t T, int width, bool round) {
  constexpr int R = kRowdotInputs;
  const int sub = threadIdx.x % width;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / width) + threadIdx.x / width;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * R;
  const int nr = static_cast<int>(T - t0 < R ? T - t0 : R);
  const XT* xs[R];
#pragma unroll
  for (int j = 0; j < R; ++j) xs[j] = x + (t0 + (j < nr ? j : 0)) * x_ld;
  float acc[R];
  const bool active = row < out;
  segment_row_dot<F, VEC, XT, R>(w, row, in, xs, nr, sub, width, active, acc);
  if (active && sub == 0)
#pragma unroll
    for (int j = 0; j < R; ++j)
      if (j < nr) store_act(y + (t0 + j) * y_ld + row, acc[j], round);
}

// Host launcher: y[T, out] (YT) = x[T, in] (XT) W^T, W in format F. `round`: round to bf16 when
// y is f32 (bf16 y always rounds).
template <class XT, class YT>
void launch_linear_rowdot(WFmt f, const WeightRef& w, int64_t out, int64_t in, const XT* x, int64_t x_ld, YT* y,
                          int64_t y_ld, int64_t T, bool round, cudaStream_t stream) {
  if (T == 0 || out == 0) return;
  const bool vec = vector_ok(f, w, in, x, x_ld, sizeof(XT));
  with_wfmt(f, [&](auto fc) {
    constexpr WFmt FC = decltype(fc)::value;
    const auto launch = [&](auto kernel, int width) {
      const dim3 grid(grid_for(out, kRowdotThreads / width), grid_for(T, kRowdotInputs));
      kernel<<<grid, kRowdotThreads, 0, stream>>>(w, out, in, x, x_ld, y, y_ld, T, width, round);
      K3_CUDA_CHECK_LAUNCH("linear_rowdot_kernel");
    };
    if (vec) launch(linear_rowdot_kernel<FC, true, XT, YT>, segment_width<FC, true>(in));
    else launch(linear_rowdot_kernel<FC, false, XT, YT>, segment_width<FC, false>(in));
  });
}

}  // namespace k3::kernels::cuda_detail
