// kernels/mla/mla.h: gated MLA (NoPE) attention over the latent cache (spec §6).
#pragma once
#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

// Writes T new cache entries [c_n | k_pe] (spec §6.3). f32 caches store the values as given
// (bf16 values in bf16 mode); f8_e4m3 caches store fp8(x / k_scale), saturating at +-448.
struct MlaCacheWriteArgs {
  core::TensorView c_n;    // f32 [T, kv_lora] (after kv_a_layernorm)
  core::TensorView k_pe;   // f32 [T, rope]
  core::TensorView dst;    // f32 or f8_e4m3 [T, kv_lora + rope] (rows of the cache)
  float k_scale = 1.0f;
};
core::Status mla_cache_write_check(const MlaCacheWriteArgs& a);
void mla_cache_write_reference(const MlaCacheWriteArgs& a);

// Causal attention of T query tokens (cache positions S-T .. S-1) over cache positions 0..S-1.
struct MlaAttentionArgs {
  core::TensorView q;              // f32 [T, H * (nope + rope)]: per head nope then rope part
  core::TensorView cache;          // f32 or f8_e4m3 [S, kv_lora + rope]
  float k_scale = 1.0f;            // dequant: value = fp8 * k_scale
  const LinearWeight* kv_b = nullptr;  // [H * (nope + v), kv_lora]: per head W_UK rows then W_UV rows
  core::TensorView out;            // f32 [T, H * v] = round(o)
  int num_heads = 0, qk_nope = 0, qk_rope = 0, v_head_dim = 0, kv_lora = 0;
  float scale = 0.0f;              // (nope + rope)^-1/2
  Precision precision = Precision::bf16;
};
core::Status mla_attention_check(const MlaAttentionArgs& a);
// Naive form (prefill): k_nope = round(W_UK c_n), v = round(W_UV c_n) per position, then softmax.
void mla_naive_reference(const MlaAttentionArgs& a);
// Absorbed form (decode, spec §6.2): q_lat = round(W_UK^T q_nope), scores against [c_n; k_pe],
// o_lat = round(sum p c_n), o = round(W_UV o_lat).
void mla_absorbed_reference(const MlaAttentionArgs& a);

}  // namespace k3::kernels
