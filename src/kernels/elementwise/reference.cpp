// kernels/elementwise/reference.cpp: CPU reference of the elementwise ops.
#include <cmath>

#include "kernels/elementwise/elementwise.h"

namespace k3::kernels {

namespace {
core::Status same_2d_f32(const char* op, const char* an, const core::TensorView& a, const char* bn,
                         const core::TensorView& b, const core::TensorView& out) {
  const std::string p = std::string(op) + ": ";
  for (auto [name, v] : {std::pair{an, &a}, std::pair{bn, &b}, std::pair{"out", &out}}) {
    if (!is_activation_dtype(*v) || !v->is_contiguous())
      return core::Status::fail(p + name + " must be a contiguous f32 (or bf16 on CUDA) tensor");
    if (!(v->shape == a.shape))
      return core::Status::fail(p + name + " has shape " + v->shape.str() + ", expected " + a.shape.str());
  }
  return core::Status::ok();
}
}  // namespace

core::Status add_check(const AddArgs& a) { return same_2d_f32("add", "a", a.a, "b", a.b, a.out); }

void add_reference(const AddArgs& a) {
  const float* x = a.a.as<const float>();
  const float* y = a.b.as<const float>();
  float* o = a.out.as<float>();
  for (int64_t i = 0, n = a.out.numel(); i < n; ++i) o[i] = round_act(x[i] + y[i], a.precision);
}

core::Status sigmoid_gate_check(const SigmoidGateArgs& a) {
  return same_2d_f32("sigmoid_gate", "x", a.x, "gate", a.gate, a.out);
}

void sigmoid_gate_reference(const SigmoidGateArgs& a) {
  const float* x = a.x.as<const float>();
  const float* g = a.gate.as<const float>();
  float* o = a.out.as<float>();
  for (int64_t i = 0, n = a.out.numel(); i < n; ++i) {
    const float s = round_act(1.0f / (1.0f + std::exp(-g[i])), a.precision);
    o[i] = round_act(x[i] * s, a.precision);
  }
}

core::Status to_activation_check(const ToActivationArgs& a) {
  const auto rows_ok = [](const core::TensorView& v) { return v.rank() == 2 && v.strides[1] == 1; };
  if (a.x.dtype != core::DType::f32 || !rows_ok(a.x))
    return core::Status::fail("to_activation: x must be an f32 [T, D] tensor with contiguous rows, got " +
                              std::string(core::dtype_name(a.x.dtype)) + " " + a.x.shape.str());
  if (!is_activation_dtype(a.out) || !rows_ok(a.out) || !(a.out.shape == a.x.shape))
    return core::Status::fail("to_activation: out must be an f32 (or bf16 on CUDA) " + a.x.shape.str() +
                              " tensor with contiguous rows like x, got " + std::string(core::dtype_name(a.out.dtype)) +
                              " " + a.out.shape.str());
  return core::Status::ok();
}

void to_activation_reference(const ToActivationArgs& a) {
  const int64_t T = a.x.dim(0), D = a.x.dim(1);
  for (int64_t t = 0; t < T; ++t) {
    const float* x = a.x.as<const float>() + t * a.x.strides[0];
    float* o = a.out.as<float>() + t * a.out.strides[0];
    for (int64_t d = 0; d < D; ++d) o[d] = round_act(x[d], a.precision);
  }
}

}  // namespace k3::kernels
