// kernels/moe/tail_reference.cpp: CPU reference of moe_tail_combine: the standard references
// (situ_glu, linear, rmsnorm, linear, add's math) in model::moe_tail's order on f32 temporaries, so it is
// that op sequence bit for bit; plus the argument check.
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/linear/linear.h"
#include "kernels/moe/moe_tail.h"
#include "kernels/situ/situ_glu.h"

namespace k3::kernels {

namespace {

core::Status check_weight(const LinearWeight* w, const char* name) {
  if (w == nullptr) return core::Status::fail(std::string(name) + " is null");
  const core::TensorView& wv = w->weight.view();
  if (!w->weight.defined() || wv.rank() != 2 || !wv.is_contiguous())
    return core::Status::fail(std::string(name) + ".weight must be a contiguous rank-2 [hidden, in] tensor, got " +
                              describe_view(wv));
  if (!w->is_mxfp4() && wv.dtype != core::DType::bf16 && wv.dtype != core::DType::f32)
    return core::Status::fail(std::string(name) + ".weight must be bf16 or f32 (or MXFP4), got " + describe_view(wv));
  return core::Status::ok();
}

// A contiguous f32 CPU temporary [rows, cols].
core::Tensor temp(int64_t rows, int64_t cols) { return core::Tensor::zeros(core::DType::f32, {rows, cols}); }

}  // namespace

core::Status moe_tail_combine_check(const MoeTailCombineArgs& a) {
  if (!is_activation_dtype(a.u) || a.u.rank() != 2 || a.u.strides[1] != 1)
    return core::Status::fail("u must be f32 (or bf16 on CUDA) [T, L] with contiguous rows, got " + describe_view(a.u));
  const int64_t T = a.u.dim(0), L = a.u.dim(1);
  if (!is_activation_rows(a.u, T, L))
    return core::Status::fail("u rows overlap (row stride < L), got " + describe_view(a.u));
  if (core::Status s = check_weight(a.latent_up, "latent_up"); !s) return s;
  const int64_t hidden = a.latent_up->out_features();
  if (a.latent_up->in_features() != L)
    return core::Status::fail("latent_up must be [hidden, L] = [" + std::to_string(hidden) + ", " + std::to_string(L) +
                              "] (L = u's width), got in = " + std::to_string(a.latent_up->in_features()));
  if (a.use_norm) {
    const core::TensorView& w = a.latent_norm;
    if (w.data == nullptr || (w.dtype != core::DType::bf16 && w.dtype != core::DType::f32) || w.rank() != 1 ||
        w.dim(0) != L || !w.is_contiguous())
      return core::Status::fail("latent_norm must be bf16 or f32 [" + std::to_string(L) + "] (use_norm), got " +
                                describe_view(w));
    if (!(a.eps >= 0.0f)) return core::Status::fail("eps must be >= 0, got " + std::to_string(a.eps));
  }
  if (a.has_shared()) {
    if (core::Status s = check_weight(a.shared_down, "shared_down"); !s) return s;
    if (a.shared_down->out_features() != hidden)
      return core::Status::fail("shared_down must have out = hidden = " + std::to_string(hidden) +
                                " (latent_up's out), got " + std::to_string(a.shared_down->out_features()));
    const int64_t SI = a.shared_down->in_features();
    if (!is_activation_rows(a.shared_gate, T, SI))
      return core::Status::fail("shared_gate must be f32 (or bf16 on CUDA) " + rows_cols_str(T, SI) +
                                " (T = u's rows, SI = shared_down's in), got " + describe_view(a.shared_gate));
    if (!is_activation_rows(a.shared_up, T, SI))
      return core::Status::fail("shared_up must be f32 (or bf16 on CUDA) " + rows_cols_str(T, SI) +
                                " (T = u's rows, SI = shared_down's in), got " + describe_view(a.shared_up));
    if (!(a.situ_beta > 0.0f) || !(a.situ_linear_beta > 0.0f))
      return core::Status::fail("situ_beta and situ_linear_beta must be > 0, got " + std::to_string(a.situ_beta) +
                                " and " + std::to_string(a.situ_linear_beta));
  }
  if (!is_activation_rows(a.out, T, hidden))
    return core::Status::fail("out must be f32 (or bf16 on CUDA) " + rows_cols_str(T, hidden) +
                              " (T = u's rows, hidden = " + "latent_up's out), got " + describe_view(a.out));
  if (row_views_overlap(a.out, a.u)) return core::Status::fail("out overlaps u");
  if (a.has_shared()) {
    if (row_views_overlap(a.out, a.shared_gate)) return core::Status::fail("out overlaps shared_gate");
    if (row_views_overlap(a.out, a.shared_up)) return core::Status::fail("out overlaps shared_up");
  }
  return core::Status::ok();
}

void moe_tail_combine_reference(const MoeTailCombineArgs& a, backends::cpu::ThreadPool* pool) {
  const int64_t T = a.u.dim(0), L = a.u.dim(1), hidden = a.latent_up->out_features();
  if (T == 0) return;
  // Shared experts first, as model::moe_tail orders them (the order does not change any value).
  core::Tensor ys;
  if (a.has_shared()) {
    const int64_t SI = a.shared_down->in_features();
    core::Tensor s = temp(T, SI);
    situ_glu_reference({a.shared_gate, a.shared_up, s.view(), a.situ_beta, a.situ_linear_beta, a.precision}, pool);
    ys = temp(T, hidden);
    linear_reference({s.view(), a.shared_down, ys.view(), /*round_output=*/true, a.precision}, pool);
  }
  core::TensorView un = a.u;
  core::Tensor normed;
  if (a.use_norm) {
    normed = temp(T, L);
    rmsnorm_reference({a.u, a.latent_norm, normed.view(), a.eps, a.style, a.precision}, pool);
    un = normed.view();
  }
  if (!a.has_shared()) {  // f = yr: the linear writes out directly
    linear_reference({un, a.latent_up, a.out, /*round_output=*/true, a.precision}, pool);
    return;
  }
  core::Tensor yr = temp(T, hidden);
  linear_reference({un, a.latent_up, yr.view(), /*round_output=*/true, a.precision}, pool);
  // f = round(yr + ys): add_reference's math, row by row because out may have a row stride.
  for (int64_t t = 0; t < T; ++t) {
    const float* r = yr.data<float>() + t * hidden;
    const float* sh = ys.data<float>() + t * hidden;
    float* f = a.out.as<float>() + t * a.out.strides[0];
    for (int64_t h = 0; h < hidden; ++h) f[h] = round_act(r[h] + sh[h], a.precision);
  }
}

}  // namespace k3::kernels
