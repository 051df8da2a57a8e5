// kernels/moe/experts.cpp: CPU reference routed experts in latent space (spec §7).
//
// For token t and route j (expert e = ids[t][j], weight p = weights[t][j]):
//   h_tj = SiTU(round(W1_e z_t), round(W3_e z_t))   linear_reference + situ_glu_reference
//   e_tj = round(W2_e h_tj)                          linear_reference
//   u_t  = round(sum_j p_tj * e_tj)                  fp32, in route order j = 0..k-1
// (without round_output, a TP rank's partial sum: e_tj and u_t unrounded; an expert-parallel
// rank's (whole_experts): e_tj rounded, u_t not, and the sum runs over the routes whose expert
// the rank holds, [expert_begin, expert_begin + E), still in route order)
// The math lives in the linear and SiTU references; this file only groups the routes by expert
// (so every expert's weights are decoded once per call, whatever the token count) and combines.
// Each route's result depends only on its own token, so the grouping does not change any bit.
#include "kernels/moe/experts.h"

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/linear/linear.h"
#include "kernels/situ/situ_glu.h"

namespace k3::kernels {

namespace {

std::string describe(const core::TensorView& v) { return std::string(core::dtype_name(v.dtype)) + " " + v.shape.str(); }

bool is_matrix(const core::TensorView& v, core::DType dt, int64_t rows, int64_t cols) {
  return v.dtype == dt && v.rank() == 2 && v.strides[1] == 1 && v.dim(0) == rows && v.dim(1) == cols;
}

// Validates one expert weight with linear_check on empty activations of the expected widths.
core::Status check_expert_weight(const char* name, size_t e, const LinearWeight& w, int64_t in) {
  if (!w.weight.defined()) return core::Status::fail(std::string(name) + "[" + std::to_string(e) + "] is empty");
  const int64_t out = w.out_features();
  const core::TensorView x = core::TensorView::contiguous(nullptr, core::DType::f32, {0, in});
  const core::TensorView y = core::TensorView::contiguous(nullptr, core::DType::f32, {0, out});
  if (core::Status s = linear_check({x, &w, y}); !s)
    return core::Status::fail(std::string(name) + "[" + std::to_string(e) + "]: " + s.reason());
  return core::Status::ok();
}

// True when w has expert 0's format and layout exactly (so it passes whatever expert 0 passed).
bool same_layout(const LinearWeight& w, const LinearWeight& w0) {
  const auto same = [](const core::TensorView& x, const core::TensorView& y) {
    return x.dtype == y.dtype && x.shape == y.shape && x.strides == y.strides && x.data != nullptr;
  };
  return w.weight.defined() && w.is_mxfp4() == w0.is_mxfp4() && same(w.weight.view(), w0.weight.view()) &&
         (!w.is_mxfp4() || same(w.scale.view(), w0.scale.view()));
}

core::TensorView f32_view(std::vector<float>& buf, int64_t rows, int64_t cols) {
  return core::TensorView::contiguous(buf.data(), core::DType::f32, {rows, cols});
}

}  // namespace

core::Status moe_experts_check(const MoeExpertsArgs& a) {
  if (!is_activation_dtype(a.z) || a.z.rank() != 2 || a.z.strides[1] != 1)
    return core::Status::fail("z must be f32 (or bf16 on CUDA) [T, L] with contiguous rows, got " + describe(a.z));
  const int64_t T = a.z.dim(0), L = a.z.dim(1);
  if (a.ids.dtype != core::DType::i32 || a.ids.rank() != 2 || a.ids.strides[1] != 1 || a.ids.dim(0) != T)
    return core::Status::fail("ids must be i32 [" + std::to_string(T) + ", k], got " + describe(a.ids));
  const int64_t k = a.ids.dim(1);
  if (!is_matrix(a.weights, core::DType::f32, T, k))
    return core::Status::fail("weights must be f32 " + core::Shape{T, k}.str() + " like ids, got " +
                              describe(a.weights));
  const core::DType out_dtype = a.round_output ? a.z.dtype : core::DType::f32;
  if (!is_matrix(a.out, out_dtype, T, L))
    return core::Status::fail(
        "out must be " + std::string(core::dtype_name(out_dtype)) + " " + core::Shape{T, L}.str() +
        (a.round_output ? " like z" : " (unrounded partial sums: round_output is off)") + ", got " + describe(a.out));
  const size_t E = a.w1.size();
  if (E == 0 || a.w3.size() != E || a.w2.size() != E)
    return core::Status::fail("w1, w3, w2 must hold one weight per expert each, got " + std::to_string(a.w1.size()) +
                              ", " + std::to_string(a.w3.size()) + ", " + std::to_string(a.w2.size()));
  for (size_t e = 0; e < E; ++e) {
    // The common case, every expert laid out like expert 0, costs three compares (this check runs
    // on every call, and a full check of all 896 experts is costly host work: docs/perf/kernel-notes.md).
    if (e > 0 && same_layout(a.w1[e], a.w1[0]) && same_layout(a.w3[e], a.w3[0]) && same_layout(a.w2[e], a.w2[0]))
      continue;
    if (core::Status s = check_expert_weight("w1", e, a.w1[e], L); !s) return s;
    const int64_t I = a.w1[e].out_features();
    if (core::Status s = check_expert_weight("w3", e, a.w3[e], L); !s) return s;
    if (a.w3[e].out_features() != I)
      return core::Status::fail("w3[" + std::to_string(e) + "] has " + std::to_string(a.w3[e].out_features()) +
                                " rows, expected " + std::to_string(I) + " like w1");
    if (core::Status s = check_expert_weight("w2", e, a.w2[e], I); !s) return s;
    if (a.w2[e].out_features() != L)
      return core::Status::fail("w2[" + std::to_string(e) + "] has " + std::to_string(a.w2[e].out_features()) +
                                " rows, expected the latent width " + std::to_string(L));
  }
  if (!(a.beta > 0.0f) || !(a.linear_beta > 0.0f)) return core::Status::fail("beta and linear_beta must be > 0");
  // The held range (expert parallelism): [expert_begin, expert_begin + E) inside [0, total).
  const int64_t total = moe_total_experts(a), held = static_cast<int64_t>(E);
  if (a.num_experts < 0 || a.expert_begin < 0 || a.expert_begin > total - held || total > INT32_MAX)
    return core::Status::fail(
        "the held experts [" + std::to_string(a.expert_begin) + ", " + std::to_string(a.expert_begin + held) +
        ") (w1 holds " + std::to_string(held) + ") must lie inside the " + std::to_string(total) +
        " experts (num_experts = " + std::to_string(a.num_experts) + ", 0 meaning w1.size(); at most 2^31 - 1)");
  if (a.ids.device == core::Device::cpu) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t id = a.ids.as<const int32_t>()[t * a.ids.strides[0] + j];
        if (id < 0 || id >= total)
          return core::Status::fail("ids[" + std::to_string(t) + "][" + std::to_string(j) + "] = " +
                                    std::to_string(id) + " is outside the " + std::to_string(total) + " experts");
      }
  }
  return core::Status::ok();
}

void moe_experts_reference(const MoeExpertsArgs& a, backends::cpu::ThreadPool* pool) {
  const int64_t T = a.z.dim(0), L = a.z.dim(1), k = a.ids.dim(1);
  const int64_t E = static_cast<int64_t>(a.w1.size());
  // The held expert of a route (an index into w1/w3/w2), or -1 for another rank's expert.
  const auto held = [&](int64_t t, int64_t j) {
    const int64_t e = a.ids.as<const int32_t>()[t * a.ids.strides[0] + j] - a.expert_begin;
    return e >= 0 && e < E ? e : -1;
  };
  // Routes (flat index t * k + j) per held expert, in token order.
  std::vector<std::vector<int64_t>> routes(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      if (const int64_t e = held(t, j); e >= 0) routes[static_cast<size_t>(e)].push_back(t * k + j);
  const bool round_e = moe_rounds_expert_outputs(a);

  std::vector<float> expert_out(static_cast<size_t>(T * k * L));  // e_tj, [T, k, L]
  std::vector<float> z_rows, gate, up, act, down;
  for (size_t e = 0; e < routes.size(); ++e) {
    const std::vector<int64_t>& r = routes[e];
    if (r.empty()) continue;
    const int64_t n = static_cast<int64_t>(r.size()), I = a.w1[e].out_features();
    z_rows.resize(static_cast<size_t>(n * L));
    for (int64_t m = 0; m < n; ++m) {
      const float* src = a.z.as<const float>() + (r[m] / k) * a.z.strides[0];
      std::copy(src, src + L, z_rows.begin() + m * L);
    }
    gate.resize(static_cast<size_t>(n * I));
    up.resize(static_cast<size_t>(n * I));
    act.resize(static_cast<size_t>(n * I));
    down.resize(static_cast<size_t>(n * L));
    linear_reference({f32_view(z_rows, n, L), &a.w1[e], f32_view(gate, n, I), true, a.precision}, pool);
    linear_reference({f32_view(z_rows, n, L), &a.w3[e], f32_view(up, n, I), true, a.precision}, pool);
    situ_glu_reference(
        {f32_view(gate, n, I), f32_view(up, n, I), f32_view(act, n, I), a.beta, a.linear_beta, a.precision}, pool);
    linear_reference({f32_view(act, n, I), &a.w2[e], f32_view(down, n, L), round_e, a.precision}, pool);
    for (int64_t m = 0; m < n; ++m)
      std::copy(down.begin() + m * L, down.begin() + (m + 1) * L, expert_out.begin() + r[m] * L);
  }
  // Combine the held routes in route order. out may alias z: z is no longer read.
  std::vector<char> route_held(static_cast<size_t>(k));
  for (int64_t t = 0; t < T; ++t) {
    const float* p = a.weights.as<const float>() + t * a.weights.strides[0];
    float* out = a.out.as<float>() + t * a.out.strides[0];
    for (int64_t j = 0; j < k; ++j) route_held[static_cast<size_t>(j)] = held(t, j) >= 0;
    for (int64_t h = 0; h < L; ++h) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j)
        if (route_held[static_cast<size_t>(j)]) acc += p[j] * expert_out[(t * k + j) * L + h];
      out[h] = a.round_output ? round_act(acc, a.precision) : acc;
    }
  }
}

}  // namespace k3::kernels
