// kernels/mla/prep_reference.cpp: CPU reference of mla_prep: rmsnorm_reference twice and
// mla_cache_write_reference on an f32 temporary, in model::attention's order (so it is that op
// sequence bit for bit); plus the argument check.
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/mla/mla.h"
#include "kernels/mla/mla_prep.h"

namespace k3::kernels {

namespace {

bool is_norm_weight(const core::TensorView& w, int64_t n) {
  return w.defined() && (w.dtype == core::DType::bf16 || w.dtype == core::DType::f32) && w.rank() == 1 &&
         w.dim(0) == n && w.is_contiguous();
}

// Columns [c0, c0 + cols) of a rank-2 row view, as a row-strided view (no copy).
core::TensorView columns(const core::TensorView& v, int64_t c0, int64_t cols) {
  core::TensorView c = v;
  c.data = static_cast<char*>(v.data) + c0 * static_cast<int64_t>(core::dtype_size(v.dtype));
  c.shape = core::Shape{v.dim(0), cols};
  return c;
}

// The cache write of the entries [c_n ; k_pe]: c_n is an f32 stand-in of kv's first kv_lora columns
// (the check only looks at its shape, dtype and device).
MlaCacheWriteArgs cache_write_args(const MlaPrepArgs& a, const core::TensorView& c_n) {
  const int64_t kv_lora = a.kv_a_norm.dim(0);
  return MlaCacheWriteArgs{c_n, columns(a.kv, kv_lora, a.kv.dim(1) - kv_lora), a.pages, a.cache_rows, a.k_scale};
}

}  // namespace

core::Status mla_prep_check(const MlaPrepArgs& a) {
  if (!a.q_a.defined() || !is_activation_dtype(a.q_a) || a.q_a.rank() != 2 || a.q_a.strides[1] != 1 || a.q_a.dim(1) < 1)
    return core::Status::fail("q_a must be f32 (or bf16 on CUDA) [T, q_lora >= 1] with unit inner stride, got " +
                              describe_view(a.q_a));
  const int64_t T = a.q_a.dim(0), q_lora = a.q_a.dim(1);
  if (!is_activation_rows(a.q_a, T, q_lora))
    return core::Status::fail("q_a rows overlap (row stride < q_lora), got " + describe_view(a.q_a));
  if (!is_norm_weight(a.q_a_norm, q_lora))
    return core::Status::fail("q_a_norm must be bf16 or f32 [" + std::to_string(q_lora) + "] (q_a's width), got " +
                              describe_view(a.q_a_norm));
  if (!is_activation_rows(a.q_a_out, T, q_lora))
    return core::Status::fail("q_a_out must be f32 (or bf16 on CUDA) " + rows_cols_str(T, q_lora) +
                              " (q_a's shape) with unit inner stride, got " + describe_view(a.q_a_out));
  if (!a.kv_a_norm.defined() || a.kv_a_norm.rank() != 1 || a.kv_a_norm.dim(0) < 1)
    return core::Status::fail("kv_a_norm must be bf16 or f32 [kv_lora >= 1], got " + describe_view(a.kv_a_norm));
  const int64_t kv_lora = a.kv_a_norm.dim(0);
  if (!a.kv.defined() || a.kv.rank() != 2 || a.kv.dim(1) <= kv_lora || !is_activation_rows(a.kv, T, a.kv.dim(1)))
    return core::Status::fail("kv must be f32 (or bf16 on CUDA) [T = " + std::to_string(T) +
                              ", kv_lora + rope] with kv_lora = " + std::to_string(kv_lora) +
                              " (kv_a_norm's length), rope >= 1, unit inner stride, got " + describe_view(a.kv));
  const int64_t width = a.kv.dim(1);
  if (!is_norm_weight(a.kv_a_norm, kv_lora))
    return core::Status::fail("kv_a_norm must be bf16 or f32 [" + std::to_string(kv_lora) + "] contiguous, got " +
                              describe_view(a.kv_a_norm));
  if (a.pages.dtype != core::DType::f32 && a.pages.dtype != core::DType::f8_e4m3 &&
      !(a.pages.dtype == core::DType::bf16 && a.pages.device == core::Device::cuda))
    return core::Status::fail("pages must be f32 or f8_e4m3 (or bf16 on CUDA), got " + describe_view(a.pages));
  if (!a.pages.defined() || a.pages.rank() != 3 || a.pages.dim(0) < 1 || a.pages.dim(1) < 1 ||
      a.pages.dim(2) != width || a.pages.strides[2] != 1 || (a.pages.dim(1) > 1 && a.pages.strides[1] < width) ||
      (a.pages.dim(0) > 1 && a.pages.strides[0] < (a.pages.dim(1) - 1) * a.pages.strides[1] + width))
    return core::Status::fail("pages must be [num_blocks >= 1, block_size >= 1, kv_lora + rope = " +
                              std::to_string(width) + "] with dense rows, got " + describe_view(a.pages));
  const core::TensorView& rows = a.cache_rows;
  if (!rows.defined() || rows.rank() != 1 || rows.dtype != core::DType::i32 || rows.dim(0) != T ||
      (T > 1 && rows.strides[0] != 1))
    return core::Status::fail("cache_rows must be a dense i32 [T = " + std::to_string(T) + "] tensor, got " +
                              describe_view(rows));
  if (!(std::isfinite(a.k_scale) && a.k_scale > 0.0f))
    return core::Status::fail("k_scale must be finite and > 0, got " + std::to_string(a.k_scale));
  if (!(a.eps >= 0.0f)) return core::Status::fail("eps must be >= 0, got " + std::to_string(a.eps));
  const core::Device dev = a.q_a.device;
  if (a.q_a_norm.device != dev || a.q_a_out.device != dev || a.kv.device != dev || a.kv_a_norm.device != dev ||
      a.pages.device != dev || (T > 0 && rows.device != dev))
    return core::Status::fail("q_a, q_a_norm, q_a_out, kv, kv_a_norm, pages and cache_rows must be on one device");
  if (row_views_overlap(a.q_a_out, a.q_a)) return core::Status::fail("q_a_out overlaps q_a");
  if (row_views_overlap(a.q_a_out, a.kv)) return core::Status::fail("q_a_out overlaps kv");
  // The cache rows' values (CPU tables: in range, no row twice): mla_cache_write's own check, with kv's
  // first columns standing in for c_n (same shape and device; only the shape is read).
  if (core::Status s = mla_cache_write_check(cache_write_args(a, columns(a.kv, 0, kv_lora))); !s)
    return core::Status::fail("cache write: " + s.reason());
  return core::Status::ok();
}

void mla_prep_reference(const MlaPrepArgs& a, backends::cpu::ThreadPool* pool) {
  const int64_t T = a.q_a.dim(0), kv_lora = a.kv_a_norm.dim(0);
  if (T == 0) return;
  // q_a = round(W_qa x) -> q_b's input (ctx.rmsnorm(q_a, q_a_norm, config::MlaConfig::kLatentNormEps)).
  rmsnorm_reference({a.q_a, a.q_a_norm, a.q_a_out, a.eps, a.style, a.precision}, pool);
  // c_n = rmsnorm(kv[:, 0:kv_lora]) into a temporary: column_copy's copy is exact, so normalising the
  // strided columns in place of the copy reads the same values.
  core::Tensor c_n = core::Tensor::zeros(core::DType::f32, {T, kv_lora});
  rmsnorm_reference({columns(a.kv, 0, kv_lora), a.kv_a_norm, c_n.view(), a.eps, a.style, a.precision}, pool);
  mla_cache_write_reference(cache_write_args(a, c_n.view()));
}

}  // namespace k3::kernels
