// kernels/kda/decode_reference.cpp: argument check and CPU reference of the fused KDA decode op.
//
// The reference is the standard path's op sequence (model/layers/kda.cpp) on the same views:
// linear_reference for f, kda_conv_reference on parts 0/1/2 of the conv storage, then
// kda_recurrent_reference and kda_output_gate_reference, with f32 scratch tensors in between. So it
// is bit-identical to the standard path by construction; the test proves the wiring (views, row
// strides, slices, no_commit) against the registry's op sequence.
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/kda/gate.h"
#include "kernels/kda/kda.h"
#include "kernels/kda/kda_check.h"
#include "kernels/kda/kda_decode.h"
#include "kernels/linear/linear.h"

namespace k3::kernels {

namespace {

using kda_detail::describe;
using kda_detail::expect_activation;
using kda_detail::expect_f32;

// A conv weight as the [P, K] view the conv op takes (the checkpoint's [P, 1, K] read as [P, K]).
core::TensorView conv_weight_2d(const core::TensorView& w) {
  if (w.rank() == 2) return w;
  return core::TensorView::contiguous(w.data, w.dtype, {w.dim(0), w.dim(2)}, w.device);
}

// Part i (0 q, 1 k, 2 v) of the conv storage [num_slots, 3, P, K-1] as the pool [num_slots, P, K-1]
// the conv op takes (strides {slot stride, K-1, 1}, same storage): model/layers/kda.cpp conv_pool.
core::TensorView conv_part(const core::TensorView& s, int64_t i) {
  core::TensorView v = s;
  v.data = static_cast<char*>(s.data) + i * s.strides[1] * static_cast<int64_t>(core::dtype_size(s.dtype));
  v.shape = core::Shape{s.dim(0), s.dim(2), s.dim(3)};
  v.strides = {s.strides[0], s.strides[2], s.strides[3], 0};
  return v;
}

core::Status check_conv_weight(const core::TensorView& w, const char* name, int64_t P, int64_t K) {
  if (auto s = expect_f32(w, name); !s) return s;
  const bool shape_ok = (w.rank() == 2 && w.dim(0) == P && w.dim(1) == K) ||
                        (w.rank() == 3 && w.dim(0) == P && w.dim(1) == 1 && w.dim(2) == K);
  if (!shape_ok || !w.is_contiguous())
    return core::Status::fail(std::string(name) + " must be contiguous F32 [" + std::to_string(P) + ", " +
                              std::to_string(K) + "] (P, K = q_conv's width; or [P, 1, K]), got " + describe(w));
  return core::Status::ok();
}

// Whether the spans of two views (rank 2 with row strides, or contiguous) overlap in memory.
bool views_overlap(const core::TensorView& a, const core::TensorView& b) {
  if (a.data == nullptr || b.data == nullptr || a.numel() == 0 || b.numel() == 0) return false;
  const auto span = [](const core::TensorView& v) {
    const auto* p = static_cast<const char*>(v.data);
    const int64_t last = v.rank() == 2 ? (v.dim(0) - 1) * v.strides[0] + v.dim(1) : v.numel();
    return std::pair{p, p + last * static_cast<int64_t>(core::dtype_size(v.dtype))};
  };
  const auto [a0, a1] = span(a);
  const auto [b0, b1] = span(b);
  return a0 < b1 && b0 < a1;
}

}  // namespace

core::Status kda_decode_check(const KdaDecodeArgs& a) {
  if (a.num_heads <= 0) return core::Status::fail("num_heads must be positive, got " + std::to_string(a.num_heads));
  if (a.head_dim <= 0) return core::Status::fail("head_dim must be positive, got " + std::to_string(a.head_dim));
  if (!(a.lower_bound < 0.0f) || !std::isfinite(a.lower_bound))
    return core::Status::fail("lower_bound must be finite and negative (the decay bound), got " +
                              std::to_string(a.lower_bound));
  if (!(a.rms_eps > 0.0f) || !std::isfinite(a.rms_eps))
    return core::Status::fail("rms_eps must be finite and positive, got " + std::to_string(a.rms_eps));
  const int64_t H = a.num_heads, D = a.head_dim, P = H * D;
  if (a.q_in.rank() != 2) return core::Status::fail("q_in must be rank 2 [T, P], got " + describe(a.q_in));
  const int64_t T = a.q_in.dim(0);
  const std::string tp = " (T, P = num_heads*head_dim)";
  const std::pair<const core::TensorView*, const char*> per_channel[] = {
      {&a.q_in, "q_in"}, {&a.k_in, "k_in"}, {&a.v_in, "v_in"}, {&a.g, "g"}, {&a.out, "out"}};
  for (const auto& [view, name] : per_channel)
    if (auto s = expect_activation(*view, name, T, P, tp); !s) return s;
  if (a.o_trace.data != nullptr)
    if (auto s = expect_activation(a.o_trace, "o_trace", T, P, tp); !s) return s;
  if (auto s = expect_activation(a.b, "b", T, H, " (T, num_heads)"); !s) return s;

  // f_b [P, R] dense, and f_a [T, R].
  if (a.f_b == nullptr) return core::Status::fail("f_b is null");
  const core::TensorView& fbw = a.f_b->weight.view();
  if (a.f_b->is_mxfp4() || !a.f_b->weight.defined() || fbw.rank() != 2 || !fbw.is_contiguous() ||
      (fbw.dtype != core::DType::bf16 && fbw.dtype != core::DType::f32) || fbw.dim(0) != P)
    return core::Status::fail("f_b.weight must be a contiguous dense BF16 or F32 [" + std::to_string(P) +
                              ", R] (P = num_heads*head_dim, not MXFP4), got " + describe(fbw));
  const int64_t R = fbw.dim(1);
  if (R < 1) return core::Status::fail("f_b.weight must have R >= 1 input columns, got " + describe(fbw));
  if (auto s = expect_activation(a.f_a, "f_a", T, R, " (T, R = f_b's input width)"); !s) return s;
  if (fbw.device != a.q_in.device)
    return core::Status::fail("f_b.weight must be on the device of q_in, got " + describe(fbw));

  // Conv weights [P, K] and the conv storage [num_slots, 3, P, K-1].
  if (auto s = expect_f32(a.q_conv, "q_conv"); !s) return s;
  if (a.q_conv.rank() < 2) return core::Status::fail("q_conv must be [P, K] or [P, 1, K], got " + describe(a.q_conv));
  const int64_t K = a.q_conv.dim(a.q_conv.rank() - 1);
  if (K < 2) return core::Status::fail("conv width K (q_conv's last dim) must be >= 2, got " + describe(a.q_conv));
  for (const auto& [w, name] : {std::pair{&a.q_conv, "q_conv"}, {&a.k_conv, "k_conv"}, {&a.v_conv, "v_conv"}})
    if (auto s = check_conv_weight(*w, name, P, K); !s) return s;
  if (!is_activation_dtype(a.conv_state))
    return core::Status::fail("conv_state must be F32 (or BF16 on CUDA), got " + describe(a.conv_state));
  if (auto s = kda_detail::expect_pool(a.conv_state, "conv_state", {3, P, K - 1}, " (q/k/v, P, K-1)"); !s) return s;

  // Per-head parameters and the recurrent state pool.
  if (auto s = expect_f32(a.a_log, "a_log"); !s) return s;
  if (a.a_log.rank() != 1 || a.a_log.dim(0) < H || !a.a_log.is_contiguous())
    return core::Status::fail("a_log must be a contiguous rank-1 F32 vector of at least num_heads = " +
                              std::to_string(H) + " entries, got " + describe(a.a_log));
  if (auto s = expect_f32(a.dt_bias, "dt_bias"); !s) return s;
  if (a.dt_bias.rank() != 1 || a.dt_bias.dim(0) != P || !a.dt_bias.is_contiguous())
    return core::Status::fail("dt_bias must be contiguous F32 [" + std::to_string(P) + "] (P), got " +
                              describe(a.dt_bias));
  if (a.o_norm.data == nullptr) return core::Status::fail("o_norm is not set");
  if ((a.o_norm.dtype != core::DType::f32 && a.o_norm.dtype != core::DType::bf16) || a.o_norm.rank() != 1 ||
      a.o_norm.dim(0) != D || !a.o_norm.is_contiguous())
    return core::Status::fail("o_norm must be contiguous F32 or BF16 [" + std::to_string(D) +
                              "] (head_dim, shared by all heads), got " + describe(a.o_norm));
  if (auto s = expect_f32(a.state, "state"); !s) return s;
  if (auto s = kda_detail::expect_pool(a.state, "state", {H, D, D}, " (num_heads, V=head_dim, K=head_dim)"); !s)
    return s;
  if (a.conv_state.dim(0) != a.state.dim(0))
    return core::Status::fail("conv_state has " + std::to_string(a.conv_state.dim(0)) + " slots but state has " +
                              std::to_string(a.state.dim(0)) + ": a sequence's slot indexes both pools");

  // One device for everything the op touches.
  const core::Device dev = a.q_in.device;
  const std::pair<const core::TensorView*, const char*> on_device[] = {{&a.k_in, "k_in"},
                                                                       {&a.v_in, "v_in"},
                                                                       {&a.g, "g"},
                                                                       {&a.f_a, "f_a"},
                                                                       {&a.b, "b"},
                                                                       {&a.q_conv, "q_conv"},
                                                                       {&a.k_conv, "k_conv"},
                                                                       {&a.v_conv, "v_conv"},
                                                                       {&a.conv_state, "conv_state"},
                                                                       {&a.a_log, "a_log"},
                                                                       {&a.dt_bias, "dt_bias"},
                                                                       {&a.state, "state"},
                                                                       {&a.o_norm, "o_norm"},
                                                                       {&a.out, "out"}};
  for (const auto& [view, name] : on_device)
    if (view->numel() > 0 && view->device != dev)
      return core::Status::fail(std::string(name) + " must be on the device of q_in (" +
                                std::string(core::device_name(dev)) + "), got " + describe(*view));
  if (a.o_trace.data != nullptr && a.o_trace.device != dev)
    return core::Status::fail("o_trace must be on the device of q_in, got " + describe(a.o_trace));

  // Outputs never overlap inputs (the CUDA kernel writes out while other CTAs still read inputs).
  const std::pair<const core::TensorView*, const char*> inputs[] = {
      {&a.q_in, "q_in"}, {&a.k_in, "k_in"}, {&a.v_in, "v_in"}, {&a.g, "g"}, {&a.f_a, "f_a"}, {&a.b, "b"}};
  for (const auto& [view, name] : inputs) {
    if (views_overlap(a.out, *view)) return core::Status::fail(std::string("out must not overlap ") + name);
    if (views_overlap(a.o_trace, *view)) return core::Status::fail(std::string("o_trace must not overlap ") + name);
  }
  if (views_overlap(a.out, a.o_trace)) return core::Status::fail("o_trace must not overlap out");
  return kda_detail::check_seq_batch(a.seqs, T, a.state.dim(0), dev, /*need_position=*/true);
}

void kda_decode_reference(const KdaDecodeArgs& a, backends::cpu::ThreadPool* pool) {
  if (core::Status s = kda_decode_check(a); !s) throw core::Error("kda_decode: " + s.reason());
  if (a.seqs.num_seqs == 0) return;
  const int64_t T = a.q_in.dim(0), P = static_cast<int64_t>(a.num_heads) * a.head_dim;
  const auto scratch = [&] { return core::Tensor::zeros(core::DType::f32, {T, P}); };
  core::Tensor f = scratch(), q = scratch(), k = scratch(), v = scratch(), o = scratch(), y = scratch();

  // f = round(f_a W_fb^T) over every row (rows no sequence covers are computed and dropped).
  LinearArgs lin;
  lin.x = a.f_a, lin.w = a.f_b, lin.out = f.view(), lin.round_output = true, lin.precision = a.precision;
  if (core::Status s = linear_check(lin); !s) throw core::Error("kda_decode (f_b): " + s.reason());
  linear_reference(lin, pool);

  // The three short convs, each on its part of the conv storage.
  const core::TensorView ins[3] = {a.q_in, a.k_in, a.v_in};
  const core::TensorView weights[3] = {conv_weight_2d(a.q_conv), conv_weight_2d(a.k_conv), conv_weight_2d(a.v_conv)};
  core::Tensor* outs[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) {
    KdaConvArgs c{ins[i], weights[i], conv_part(a.conv_state, i), outs[i]->view(), a.precision, a.seqs};
    c.no_commit = a.no_commit;
    kda_conv_reference(c, pool);
  }

  // The delta rule (recurrent form, as the standard path runs decode and verify sequences).
  KdaAttentionArgs r{q.view(),   k.view(),      v.view(),          f.view(),    a.b,
                     a.a_log,    a.dt_bias,     a.state,           o.view(),    a.num_heads,
                     a.head_dim, a.lower_bound, /*chunk_size=*/64, a.precision, a.seqs};
  r.no_commit = a.no_commit;
  kda_recurrent_reference(r, pool);

  // Output norm and gate over every row (rows of no sequence hold o = 0 and are dropped below).
  kda_output_gate_reference({o.view(), a.g, a.o_norm, y.view(), a.num_heads, a.head_dim, a.rms_eps, a.precision}, pool);

  // Only the sequences' rows reach out (and o_trace).
  for (const kda_detail::HostSeq& s : kda_detail::host_seqs(a.seqs, false))
    for (int64_t t = s.row_begin; t < s.row_begin + s.num_rows; ++t) {
      std::memcpy(kda_detail::row_f32_mut(a.out, t), y.data<float>() + t * P, sizeof(float) * P);
      if (a.o_trace.data != nullptr)
        std::memcpy(kda_detail::row_f32_mut(a.o_trace, t), o.data<float>() + t * P, sizeof(float) * P);
    }
}

}  // namespace k3::kernels
