// kernels/linear/reference.cpp: CPU reference y = x W^T, fp32 sums sequential over `in` (spec §2).
//
// Every output y[t][o] is the plain left-to-right fp32 sum  acc = 0; acc += x[t][i] * W[o][i]
// (no FMA: the build sets -ffp-contract=off), so any evaluation order of (t, o) pairs gives the
// same bits. Speed comes only from work that leaves each sum untouched:
//   * each weight row is decoded once per call (bf16/f32/MXFP4 -> f32), reused by all tokens;
//   * 8 output rows are summed side by side in SIMD lanes (one lane per row, each lane its own
//     sequential sum), for 4 tokens at a time (8 independent accumulator chains);
//   * row groups are split over the shared CPU pool; each row is computed by one thread.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kernels/linear/linear.h"

namespace k3::kernels {

namespace {

constexpr int64_t kRowGroup = 8;    // weight rows per SIMD vector (one lane per row)
constexpr int64_t kTokenGroup = 4;  // tokens summed side by side

// GCC/Clang vector extension: 4 floats, element-wise IEEE ops (one SSE register); a row group
// is two of them (rows 0-3 and 4-7).
typedef float Lanes4 __attribute__((vector_size(4 * sizeof(float))));

// y_rows[k][r] = sum_i x_k[i] * wt[i][r] for NT tokens, sequential over i in every lane.
// wt is the row group transposed: wt[i * 8 + r] = W[o0 + r][i].
template <int NT>
void dot_row_group(const float* wt, int64_t in, const float* const* xs, float (*y_rows)[kRowGroup]) {
  Lanes4 lo[NT] = {}, hi[NT] = {};
  for (int64_t i = 0; i < in; ++i) {
    Lanes4 w_lo, w_hi;
    std::memcpy(&w_lo, wt + i * kRowGroup, sizeof w_lo);
    std::memcpy(&w_hi, wt + i * kRowGroup + 4, sizeof w_hi);
    for (int k = 0; k < NT; ++k) {
      const float xi = xs[k][i];
      lo[k] += w_lo * xi;
      hi[k] += w_hi * xi;
    }
  }
  for (int k = 0; k < NT; ++k) {
    std::memcpy(y_rows[k], &lo[k], sizeof lo[k]);
    std::memcpy(y_rows[k] + 4, &hi[k], sizeof hi[k]);
  }
}

std::string describe(const core::TensorView& v) { return std::string(core::dtype_name(v.dtype)) + " " + v.shape.str(); }

core::Status check_weight(const LinearWeight& w) {
  const core::TensorView& wv = w.weight.view();
  if (!w.weight.defined() || wv.rank() != 2 || !wv.is_contiguous())
    return core::Status::fail("w.weight must be a contiguous rank-2 [out, in] tensor, got " + describe(wv));
  if (!w.is_mxfp4()) {
    if (wv.dtype != core::DType::bf16 && wv.dtype != core::DType::f32)
      return core::Status::fail("w.weight must be bf16 or f32 (or u8 with an MXFP4 scale), got " + describe(wv));
    return core::Status::ok();
  }
  const core::TensorView& sv = w.scale.view();
  if (wv.dtype != core::DType::u8)
    return core::Status::fail("MXFP4 w.weight must be u8 [out, in/2] packed codes, got " + describe(wv));
  const int64_t in = w.in_features();
  if (sv.dtype != core::DType::u8 || sv.rank() != 2 || !sv.is_contiguous() || sv.dim(0) != wv.dim(0) ||
      sv.dim(1) * 32 != in)
    return core::Status::fail("MXFP4 w.scale must be u8 [out, in/32] = [" + std::to_string(wv.dim(0)) + ", " +
                              std::to_string(in / 32) + "] (in = " + std::to_string(in) + ", a multiple of 32), got " +
                              describe(sv));
  return core::Status::ok();
}

}  // namespace

core::Status linear_check(const LinearArgs& a) {
  if (a.w == nullptr) return core::Status::fail("w is null");
  if (core::Status s = check_weight(*a.w); !s) return s;
  const int64_t in = a.w->in_features(), out = a.w->out_features();
  if (!is_activation_dtype(a.x) || a.x.rank() != 2 || a.x.strides[1] != 1 || a.x.dim(1) != in)
    return core::Status::fail("x must be f32 (or bf16 on CUDA) [T, " + std::to_string(in) +
                              "] with contiguous rows (in = w's input width), got " + describe(a.x));
  const int64_t T = a.x.dim(0);
  if (!is_activation_dtype(a.out) || a.out.rank() != 2 || a.out.strides[1] != 1 || a.out.dim(0) != T ||
      a.out.dim(1) != out)
    return core::Status::fail("out must be f32 (or bf16 on CUDA) [" + std::to_string(T) + ", " + std::to_string(out) +
                              "], got " + describe(a.out));
  if (T > 0 && a.out.data == a.x.data) return core::Status::fail("out must not alias x");
  return core::Status::ok();
}

void linear_reference(const LinearArgs& a, backends::cpu::ThreadPool* pool) {
  const LinearWeight& W = *a.w;
  const int64_t T = a.x.dim(0), in = W.in_features(), n_out = W.out_features();
  if (T == 0 || n_out == 0) return;
  const float* x = a.x.as<const float>();
  const int64_t x_stride = a.x.strides[0];
  float* y = a.out.as<float>();
  const int64_t y_stride = a.out.strides[0];
  const bool round = a.round_output;
  const Precision precision = a.precision;

  const auto run_groups = [&](int64_t g0, int64_t g1) {
    std::vector<float> row(static_cast<size_t>(in));
    std::vector<float> wt(static_cast<size_t>(kRowGroup * in));  // [in][8], zero lanes past n_out
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t o0 = g * kRowGroup, rows = std::min(kRowGroup, n_out - o0);
      if (rows < kRowGroup) std::fill(wt.begin(), wt.end(), 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        W.load_row(o0 + r, row.data());
        for (int64_t i = 0; i < in; ++i) wt[i * kRowGroup + r] = row[i];
      }
      for (int64_t t0 = 0; t0 < T; t0 += kTokenGroup) {
        const int64_t nt = std::min(kTokenGroup, T - t0);
        const float* xs[kTokenGroup];
        for (int64_t k = 0; k < nt; ++k) xs[k] = x + (t0 + k) * x_stride;
        float sums[kTokenGroup][kRowGroup];
        switch (nt) {
          case 4: dot_row_group<4>(wt.data(), in, xs, sums); break;
          case 3: dot_row_group<3>(wt.data(), in, xs, sums); break;
          case 2: dot_row_group<2>(wt.data(), in, xs, sums); break;
          default: dot_row_group<1>(wt.data(), in, xs, sums); break;
        }
        for (int64_t k = 0; k < nt; ++k)
          for (int64_t r = 0; r < rows; ++r)
            y[(t0 + k) * y_stride + o0 + r] = round ? round_act(sums[k][r], precision) : sums[k][r];
      }
    }
  };
  const int64_t n_groups = (n_out + kRowGroup - 1) / kRowGroup;
  // Keep tasks at >= ~256K multiply-adds so that small calls run inline.
  const int64_t work_per_group = std::max<int64_t>(1, kRowGroup * T * in);
  const int64_t min_groups = std::max<int64_t>(1, (int64_t{1} << 18) / work_per_group);
  backends::cpu::parallel_for(pool, n_groups, run_groups, min_groups);
}

}  // namespace k3::kernels
