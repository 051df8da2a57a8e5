// bench/layer_gpu_weights.h: random device weights for bench/layer_gpu.cpp (k3-layer-tp8 shapes,
// spec §14.2): fast multithreaded PRNG fills generated on the host and uploaded in chunks (GBs in
// about a second, no per-value Box-Muller), and one KDA+MoE or MLA+MoE LayerWeights built from them.
// Values are for timing only: linears U(-a, a) with std 1/sqrt(in), norms 1 + U(-0.1, 0.1), MXFP4
// experts random codes with E8M0 scales near 2^-7 / 2^-6 (not a quantized matrix). Also the bytes
// one decode step of such a layer reads and writes, by spec §12's counting rules (LayerBytes).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/check.h"
#include "config/k3_config.h"
#include "core/bf16.h"
#include "core/device_memory.h"
#include "core/rng.h"
#include "model/kv_storage.h"
#include "model/weights.h"

namespace k3::bench {

using core::DType;
using core::Tensor;

// What the bytes of a tensor hold: uniform values center + amp * U(-1, 1) in bf16 or f32, raw random
// bytes (FP4 codes), E8M0 scales base-1..base+1, or fp8 e4m3 values of magnitude 0.25..3.75.
struct Fill {
  enum Kind { bf16, f32, bytes, e8m0, fp8 } kind = bytes;
  float center = 0, amp = 0;
  int e8m0_base = 127;
};

inline float uniform_pm1(uint64_t r) {
  return static_cast<float>(static_cast<int64_t>(r >> 40) - (int64_t{1} << 23)) * 0x1p-23f;
}

inline uint8_t fill_byte(const Fill& f, uint64_t r) {
  if (f.kind == Fill::e8m0) return static_cast<uint8_t>(f.e8m0_base - 1 + static_cast<int>(r % 3));
  // fp8 e4m3: sign, exponent field 5..8 (2^-2..2^1), any mantissa: never NaN (exponent 15, mantissa 7)
  return static_cast<uint8_t>(((r >> 8) & 0x80) | ((5 + ((r >> 3) & 3)) << 3) | (r & 7));
}

// Fills nbytes at p (host) as `f` says, on up to hardware_concurrency threads (own Rng stream each).
inline void fill_host(uint8_t* p, size_t nbytes, const Fill& f, uint64_t seed) {
  const size_t unit = f.kind == Fill::bf16 ? 2 : f.kind == Fill::f32 ? 4 : f.kind == Fill::bytes ? 8 : 1;
  const size_t n = nbytes / unit;
  const size_t threads = std::clamp<size_t>(n >> 20, 1, std::max(1u, std::thread::hardware_concurrency()));
  auto work = [&](size_t t) {
    core::Rng rng = core::Rng(seed).fork(t);
    for (size_t i = n * t / threads, end = n * (t + 1) / threads; i < end; ++i) {
      const uint64_t r = rng.next_u64();
      if (f.kind == Fill::bf16) {
        const uint16_t v = core::f32_to_bf16_bits(f.center + f.amp * uniform_pm1(r));
        std::memcpy(p + 2 * i, &v, 2);
      } else if (f.kind == Fill::f32) {
        const float v = f.center + f.amp * uniform_pm1(r);
        std::memcpy(p + 4 * i, &v, 4);
      } else if (f.kind == Fill::bytes) {
        std::memcpy(p + 8 * i, &r, 8);
      } else {
        p[i] = fill_byte(f, r);
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  if (f.kind == Fill::bytes) {  // the tail that is not a whole u64
    core::Rng tail(seed ^ 0x7a11);
    for (size_t i = n * 8; i < nbytes; ++i) p[i] = static_cast<uint8_t>(tail.next_u64());
  }
}

// Device tensors filled as a Fill says: generated on the host in chunks of at most 256 MiB (one
// buffer, reused) and copied to the device. The values depend on (seed, name, shape) only.
struct Filler {
  core::DeviceMemory& memory;
  cudaStream_t stream;
  uint64_t seed;
  std::vector<uint8_t> host;

  void fill(const core::TensorView& dst, const Fill& f, const char* name) {
    const size_t total = static_cast<size_t>(dst.nbytes()), chunk_bytes = size_t{256} << 20;
    if (host.size() < std::min(total, chunk_bytes)) host.resize(std::min(total, chunk_bytes));
    for (size_t off = 0, chunk = 0; off < total; off += chunk_bytes, ++chunk) {
      const size_t n = std::min(chunk_bytes, total - off);
      fill_host(host.data(), n, f, seed ^ core::Rng::hash(name) ^ (chunk * 0x9e3779b97f4a7c15ull));
      K3_CUDA_CHECK(
          cudaMemcpyAsync(static_cast<char*>(dst.data) + off, host.data(), n, cudaMemcpyHostToDevice, stream));
      K3_CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` is refilled next
    }
  }
  Tensor make(DType t, core::Shape s, const Fill& f, const char* name) {
    Tensor x = memory.empty(t, s);
    fill(x.view(), f, name);
    return x;
  }
  // bf16 [out, in], values of standard deviation 1/sqrt(in) (activations stay O(1)).
  kernels::LinearWeight linear(int64_t out, int64_t in, const char* name) {
    return {make(DType::bf16, {out, in}, {Fill::bf16, 0.0f, std::sqrt(3.0f / static_cast<float>(in))}, name), Tensor()};
  }
  // A norm weight: 1 + U(-0.1, 0.1).
  Tensor norm(int64_t n, DType t, const char* name) {
    return make(t, {n}, {t == DType::f32 ? Fill::f32 : Fill::bf16, 1.0f, 0.1f}, name);
  }
};

// E MXFP4 experts [out, in]: one slab of codes [E*out, in/2] and one of scales [E*out, in/32];
// expert e is a view of rows [e*out, (e+1)*out) of both. Scales near 2^-7 (w1/w3, in = 3584) or
// 2^-6 (w2, in = 384) keep random FP4 codes (RMS ~2.9) at about 1/sqrt(in).
inline std::vector<kernels::LinearWeight> mxfp4_experts(Filler& fl, int64_t E, int64_t out, int64_t in,
                                                        const char* name) {
  const Tensor codes = fl.make(DType::u8, {E * out, in / 2}, {Fill::bytes}, name);
  Fill sf{Fill::e8m0};
  sf.e8m0_base = in >= 2048 ? 120 : 121;
  const Tensor scales = fl.make(DType::u8, {E * out, in / 32}, sf, (std::string(name) + ".scale").c_str());
  auto keep_codes = std::make_shared<Tensor>(codes), keep_scales = std::make_shared<Tensor>(scales);
  std::vector<kernels::LinearWeight> w(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    w[e].weight = Tensor(core::TensorView::contiguous(codes.data<uint8_t>() + e * out * (in / 2), DType::u8,
                                                      {out, in / 2}, core::Device::cuda),
                         keep_codes);
    w[e].scale = Tensor(core::TensorView::contiguous(scales.data<uint8_t>() + e * out * (in / 32), DType::u8,
                                                     {out, in / 32}, core::Device::cuda),
                        keep_scales);
  }
  return w;
}

inline model::MoeWeights make_moe(Filler& fl, const config::K3Config& c) {
  const int64_t H = c.hidden_size, L = c.moe.routed_expert_hidden_size, I = c.moe.moe_intermediate_size;
  const int64_t E = c.moe.num_experts, S = c.moe.shared_intermediate();
  model::MoeWeights m;
  m.router = fl.linear(E, H, "moe.router");
  m.router_bias = fl.make(DType::f32, {E}, {Fill::f32, 0.0f, 0.01f}, "moe.router_bias");
  m.latent_down = fl.linear(L, H, "moe.latent_down");
  m.latent_norm = fl.norm(L, DType::bf16, "moe.latent_norm");
  m.latent_up = fl.linear(H, L, "moe.latent_up");
  m.w1 = mxfp4_experts(fl, E, I, L, "moe.w1");
  m.w3 = mxfp4_experts(fl, E, I, L, "moe.w3");
  m.w2 = mxfp4_experts(fl, E, L, I, "moe.w2");
  m.shared_gate = fl.linear(S, H, "moe.shared_gate");
  m.shared_up = fl.linear(S, H, "moe.shared_up");
  m.shared_down = fl.linear(H, S, "moe.shared_down");
  return m;
}

inline model::KdaWeights make_kda(Filler& fl, const config::K3Config& c) {
  const int64_t H = c.hidden_size, P = c.kda.proj_dim(), D = c.kda.head_dim, K = c.kda.short_conv_kernel_size;
  model::KdaWeights k;
  k.q_proj = fl.linear(P, H, "kda.q"), k.k_proj = fl.linear(P, H, "kda.k"), k.v_proj = fl.linear(P, H, "kda.v");
  k.g_proj = fl.linear(P, H, "kda.g"), k.o_proj = fl.linear(H, P, "kda.o");
  k.f_a_proj = fl.linear(D, H, "kda.f_a"), k.f_b_proj = fl.linear(P, D, "kda.f_b"),
  k.b_proj = fl.linear(c.kda.num_heads, H, "kda.b");
  k.q_conv = fl.make(DType::f32, {P, 1, K}, {Fill::f32, 0.0f, 0.5f}, "kda.q_conv");
  k.k_conv = fl.make(DType::f32, {P, 1, K}, {Fill::f32, 0.0f, 0.5f}, "kda.k_conv");
  k.v_conv = fl.make(DType::f32, {P, 1, K}, {Fill::f32, 0.0f, 0.5f}, "kda.v_conv");
  k.a_log = fl.make(DType::f32, {D}, {Fill::f32, 1.35f, 1.35f}, "kda.a_log");  // A = exp(A_log) in [1, 15]
  k.dt_bias = fl.make(DType::f32, {P}, {Fill::f32, 0.0f, 0.5f}, "kda.dt_bias");
  k.o_norm = fl.make(DType::f32, {D}, {Fill::f32, 1.0f, 0.1f}, "kda.o_norm");
  return k;
}

inline model::MlaWeights make_mla(Filler& fl, const config::K3Config& c) {
  const auto& m = c.mla;
  const int64_t H = c.hidden_size, heads = m.num_heads;
  model::MlaWeights w;
  w.q_a_proj = fl.linear(m.q_lora_rank, H, "mla.q_a");
  w.q_a_norm = fl.norm(m.q_lora_rank, DType::bf16, "mla.q_a_norm");
  w.q_b_proj = fl.linear(heads * m.q_head_dim(), m.q_lora_rank, "mla.q_b");
  w.kv_a_proj = fl.linear(m.cache_dim(), H, "mla.kv_a");
  w.kv_a_norm = fl.norm(m.kv_lora_rank, DType::bf16, "mla.kv_a_norm");
  w.kv_b_proj = fl.linear(heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, "mla.kv_b");
  w.g_proj = fl.linear(heads * m.v_head_dim, H, "mla.g");
  w.o_proj = fl.linear(H, heads * m.v_head_dim, "mla.o");
  return w;
}

inline model::LayerWeights make_layer(Filler& fl, const config::K3Config& c, int layer) {
  const int64_t H = c.hidden_size;
  model::LayerWeights lw;
  lw.input_norm = fl.norm(H, DType::bf16, "input_norm");
  lw.post_attn_norm = fl.norm(H, DType::bf16, "post_attn_norm");
  lw.attn_res = {fl.make(DType::bf16, {1, H}, {Fill::bf16, 0.0f, 0.05f}, "attn_res.q"),
                 fl.norm(H, DType::bf16, "attn_res.n")};
  lw.mlp_res = {fl.make(DType::bf16, {1, H}, {Fill::bf16, 0.0f, 0.05f}, "mlp_res.q"),
                fl.norm(H, DType::bf16, "mlp_res.n")};
  if (c.attn_kind(layer) == config::AttnKind::kda) lw.attn = make_kda(fl, c);
  else lw.attn = make_mla(fl, c);
  lw.ffn = make_moe(fl, c);
  return lw;
}

// ------------------------------------------------------------------ bytes a step reads (spec §12 rules)

inline int64_t bytes_of(const kernels::LinearWeight& w) {
  return w.weight.nbytes() + (w.scale.defined() ? w.scale.nbytes() : 0);
}

inline int64_t attn_weight_bytes(const model::LayerWeights& lw) {
  int64_t n = 0;
  if (const auto* k = std::get_if<model::KdaWeights>(&lw.attn)) {
    for (const auto* w :
         {&k->q_proj, &k->k_proj, &k->v_proj, &k->g_proj, &k->o_proj, &k->f_a_proj, &k->f_b_proj, &k->b_proj})
      n += bytes_of(*w);
    for (const Tensor* t : {&k->q_conv, &k->k_conv, &k->v_conv, &k->a_log, &k->dt_bias, &k->o_norm}) n += t->nbytes();
  } else {
    const auto& m = std::get<model::MlaWeights>(lw.attn);
    for (const auto* w : {&m.q_a_proj, &m.q_b_proj, &m.kv_a_proj, &m.kv_b_proj, &m.g_proj, &m.o_proj})
      n += bytes_of(*w);
    n += m.q_a_norm.nbytes() + m.kv_a_norm.nbytes();
  }
  return n;
}
inline int64_t norm_bytes(const model::LayerWeights& lw) {  // layer norms and the two AttnRes query/norm pairs
  return lw.input_norm.nbytes() + lw.post_attn_norm.nbytes() + lw.attn_res.query.nbytes() + lw.attn_res.norm.nbytes() +
         lw.mlp_res.query.nbytes() + lw.mlp_res.norm.nbytes();
}
inline int64_t moe_front_bytes(const model::MoeWeights& m) {  // router (+ bias), latent down/up (+ routed norm)
  return bytes_of(m.router) + bytes_of(m.latent_down) + bytes_of(m.latent_up) + m.router_bias.nbytes() +
         m.latent_norm.nbytes();
}
inline int64_t shared_bytes(const model::MoeWeights& m) {
  return bytes_of(m.shared_gate) + bytes_of(m.shared_up) + bytes_of(m.shared_down);
}
inline int64_t expert_bytes(const model::MoeWeights& m, size_t e) {
  return bytes_of(m.w1[e]) + bytes_of(m.w3[e]) + bytes_of(m.w2[e]);
}
// Every weight byte of the layer (what make_layer generated and uploaded).
inline int64_t layer_weight_bytes(const model::LayerWeights& lw) {
  const auto& moe = std::get<model::MoeWeights>(lw.ffn);
  int64_t n = norm_bytes(lw) + attn_weight_bytes(lw) + moe_front_bytes(moe) + shared_bytes(moe);
  for (size_t e = 0; e < moe.w1.size(); ++e) n += expert_bytes(moe, e);
  return n;
}

struct LayerBytes {
  double attn_weights = 0, norms = 0, state = 0, kv = 0, moe_front = 0, shared = 0, routed = 0, attn_res = 0;
  double expected_experts = 0, per_expert = 0;
  double total() const { return attn_weights + norms + state + kv + moe_front + shared + routed + attn_res; }
  nlohmann::json json() const {
    return {{"attn_weights", attn_weights},
            {"norms_and_attnres_weights", norms},
            {"kda_state_rw", state},
            {"mla_kv_read_write", kv},
            {"moe_router_latent", moe_front},
            {"shared_experts", shared},
            {"routed_experts", routed},
            {"attnres_activations", attn_res},
            {"expected_distinct_experts", expected_experts},
            {"bytes_per_touched_expert", per_expert},
            {"total", total()}};
  }
};

inline LayerBytes count_bytes(const config::K3Config& c, const model::LayerWeights& lw, const model::KvStorage& kv,
                              int layer, int64_t batch, int ctx_tokens, size_t bank_rows) {
  LayerBytes b;
  const double B = static_cast<double>(batch);
  const auto& moe = std::get<model::MoeWeights>(lw.ffn);
  b.norms = static_cast<double>(norm_bytes(lw));
  b.attn_weights = static_cast<double>(attn_weight_bytes(lw));
  b.moe_front = static_cast<double>(moe_front_bytes(moe));
  b.shared = static_cast<double>(shared_bytes(moe));
  if (c.attn_kind(layer) == config::AttnKind::kda) {  // state and conv state: read + written once
    const int32_t slots = kv.storage_config().num_slots;
    b.state = 2.0 * B * static_cast<double>(kv.kda_states(layer).nbytes() + kv.conv_states(layer).nbytes()) / slots;
  } else {  // every cached token and the new one read, the new one written
    const double row = static_cast<double>(c.mla.cache_dim() * core::dtype_size(kv.mla_pages(layer).dtype()));
    b.kv = B * (static_cast<double>(ctx_tokens + 1) * row + row);
  }
  const double E = c.moe.num_experts, k = c.moe.num_experts_per_token;
  b.expected_experts = E * (1.0 - std::pow(1.0 - k / E, B));  // uniform independent routing, n = B tokens
  b.per_expert = static_cast<double>(expert_bytes(moe, 0));
  b.routed = b.expected_experts * b.per_expert;
  // Both Mix sides read bank ++ [prefix]: (rows + 1) x 2 sources of [hidden] bf16 per token.
  b.attn_res = B * 2.0 * static_cast<double>(bank_rows + 1) * static_cast<double>(c.hidden_size) * 2.0;
  return b;
}

}  // namespace k3::bench
