// kernels/situ/reference.cpp: CPU reference SiTU-GLU (spec §8), libm tanhf/expf in fp32.
//
//   out = round( [beta * tanh(a / beta) * sigmoid(a)] * [linear_beta * tanh(c / linear_beta)] )
// a = gate pre-activation, c = up pre-activation. Both factors saturate: the gate side at
// beta (a >> 0) or 0 (a << 0), the up side at +-linear_beta, so |out| <= beta * linear_beta.
#include <algorithm>
#include <cmath>
#include <string>

#include "backends/cpu/thread_pool.h"
#include "kernels/situ/situ_glu.h"

namespace k3::kernels {

namespace {

std::string describe(const core::TensorView& v) { return std::string(core::dtype_name(v.dtype)) + " " + v.shape.str(); }

bool is_f32_rows(const core::TensorView& v) {  // f32, or bf16 on CUDA (is_activation_dtype)
  return is_activation_dtype(v) && v.rank() == 2 && v.strides[1] == 1;
}

}  // namespace

core::Status situ_glu_check(const SituGluArgs& a) {
  if (!is_f32_rows(a.gate))
    return core::Status::fail("gate must be f32 [T, I] with contiguous rows, got " + describe(a.gate));
  const std::string want = a.gate.shape.str();
  if (!is_f32_rows(a.up) || !(a.up.shape == a.gate.shape))
    return core::Status::fail("up must be f32 " + want + " like gate, got " + describe(a.up));
  if (!is_f32_rows(a.out) || !(a.out.shape == a.gate.shape))
    return core::Status::fail("out must be f32 " + want + " like gate, got " + describe(a.out));
  if (!(a.beta > 0.0f) || !(a.linear_beta > 0.0f))
    return core::Status::fail("beta and linear_beta must be > 0, got " + std::to_string(a.beta) + " and " +
                              std::to_string(a.linear_beta));
  return core::Status::ok();
}

void situ_glu_reference(const SituGluArgs& a, backends::cpu::ThreadPool* pool) {
  const int64_t T = a.gate.dim(0), I = a.gate.dim(1);
  const float beta = a.beta, linear_beta = a.linear_beta;
  const auto rows = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* gate = a.gate.as<const float>() + t * a.gate.strides[0];
      const float* up = a.up.as<const float>() + t * a.up.strides[0];
      float* out = a.out.as<float>() + t * a.out.strides[0];  // may alias gate or up
      for (int64_t i = 0; i < I; ++i) {
        const float g = gate[i], c = up[i];
        const float sigmoid = 1.0f / (1.0f + std::exp(-g));  // expf overflow -> inf -> 0: fine
        const float gate_act = beta * std::tanh(g / beta) * sigmoid;
        const float up_act = linear_beta * std::tanh(c / linear_beta);
        out[i] = round_act(gate_act * up_act, a.precision);
      }
    }
  };
  backends::cpu::parallel_for(pool, T, rows, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, I)));
}

core::Status silu_glu_check(const SiluGluArgs& a) {
  return situ_glu_check({a.gate, a.up, a.out, 4.0f, 25.0f, a.precision});  // the same tensor rules
}

void silu_glu_reference(const SiluGluArgs& a, backends::cpu::ThreadPool* pool) {
  const int64_t T = a.gate.dim(0), I = a.gate.dim(1);
  const auto rows = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* gate = a.gate.as<const float>() + t * a.gate.strides[0];
      const float* up = a.up.as<const float>() + t * a.up.strides[0];
      float* out = a.out.as<float>() + t * a.out.strides[0];
      for (int64_t i = 0; i < I; ++i) {
        const float g = gate[i];
        out[i] = round_act(g / (1.0f + std::exp(-g)) * up[i], a.precision);
      }
    }
  };
  backends::cpu::parallel_for(pool, T, rows, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, I)));
}

}  // namespace k3::kernels
