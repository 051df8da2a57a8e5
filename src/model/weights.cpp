// model/weights.cpp: moving weights to a device.
#include "model/weights.h"

#include <type_traits>

namespace k3::model {

namespace {

// Calls fn(tensor&) for every tensor of the weights (the same order for every Weights).
template <class W, class Fn>
void for_each_tensor(W& w, Fn&& fn) {
  auto lin = [&](auto& l) { fn(l.weight), fn(l.scale); };
  auto res = [&](auto& r) { fn(r.query), fn(r.norm); };
  fn(w.embed);
  for (auto& l : w.layers) {
    fn(l.input_norm), fn(l.post_attn_norm);
    res(l.attn_res), res(l.mlp_res);
    std::visit(
        [&](auto& a) {
          if constexpr (std::is_same_v<std::decay_t<decltype(a)>, KdaWeights>) {
            for (auto* p : {&a.q_proj, &a.k_proj, &a.v_proj, &a.g_proj, &a.o_proj, &a.f_a_proj, &a.f_b_proj, &a.b_proj})
              lin(*p);
            for (auto* t : {&a.q_conv, &a.k_conv, &a.v_conv, &a.a_log, &a.dt_bias, &a.o_norm}) fn(*t);
          } else {
            for (auto* p : {&a.q_a_proj, &a.q_b_proj, &a.kv_a_proj, &a.kv_b_proj, &a.g_proj, &a.o_proj}) lin(*p);
            fn(a.q_a_norm), fn(a.kv_a_norm);
          }
        },
        l.attn);
    std::visit(
        [&](auto& f) {
          if constexpr (std::is_same_v<std::decay_t<decltype(f)>, DenseFfnWeights>) {
            lin(f.gate_proj), lin(f.up_proj), lin(f.down_proj);
          } else {
            lin(f.router), lin(f.latent_down), lin(f.latent_up);
            fn(f.router_bias), fn(f.latent_norm);
            for (auto* v : {&f.w1, &f.w3, &f.w2})
              for (auto& e : *v) lin(e);
            lin(f.shared_gate), lin(f.shared_up), lin(f.shared_down);
          }
        },
        l.ffn);
  }
  res(w.output_res);
  fn(w.final_norm);
  lin(w.lm_head);
}

}  // namespace

Weights to_device(const Weights& weights, core::DeviceMemory& memory) {
  Weights out = weights;  // shares every tensor; replaced below on a device
  if (memory.device() == core::Device::cpu) return out;
  for_each_tensor(out, [&](core::Tensor& t) {
    if (t.defined()) t = memory.upload(t.view());
  });
  memory.synchronize();
  return out;
}

int64_t weight_bytes(const Weights& weights) {
  int64_t bytes = 0;
  for_each_tensor(weights, [&](const core::Tensor& t) { bytes += t.defined() ? t.nbytes() : 0; });
  return bytes;
}

}  // namespace k3::model
