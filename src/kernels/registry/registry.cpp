// kernels/registry.cpp: registration of the CPU reference implementations.
#include "kernels/registry.h"

namespace k3::kernels {

namespace {
template <class Args>
void register_reference(OpTable<Args>& t, void (*fn)(const Args&)) {
  t.add(OpImpl<Args>{"reference", core::Device::cpu, nullptr, fn});
}
}  // namespace

void register_reference_ops(Registry& r) {
  register_reference(r.embedding, embedding_reference);
  register_reference(r.rmsnorm, rmsnorm_reference);
  register_reference(r.linear, linear_reference);
  register_reference(r.attn_res_mix, attn_res_mix_reference);
  register_reference(r.situ_glu, situ_glu_reference);
  register_reference(r.router_topk, router_topk_reference);
  register_reference(r.moe_experts, moe_experts_reference);
  register_reference(r.kda_conv, kda_conv_reference);
  register_reference(r.kda_recurrent, kda_recurrent_reference);
  register_reference(r.kda_chunked, kda_chunked_reference);
  register_reference(r.kda_output_gate, kda_output_gate_reference);
  register_reference(r.mla_cache_write, mla_cache_write_reference);
  register_reference(r.mla_naive, mla_naive_reference);
  register_reference(r.mla_absorbed, mla_absorbed_reference);
  // MLA under decode context parallelism (kernels/mla/mla_cp.h):
  register_reference(r.mla_q_absorb, mla_q_absorb_reference); register_reference(r.mla_partial_attention, mla_partial_attention_reference);
  register_reference(r.mla_lse_rescale, mla_lse_rescale_reference); register_reference(r.mla_w_uv, mla_w_uv_reference);
  register_reference(r.mla_cache_gather, mla_cache_gather_reference);
  register_reference(r.add, add_reference);
  register_reference(r.sigmoid_gate, sigmoid_gate_reference);
  register_reference(r.to_activation, to_activation_reference);
  register_reference(r.sample, sample_reference);
  // fused ops (fastpath/), one line each:
  register_reference(r.multi_linear, multi_linear_reference);
  register_reference(r.attn_res_bank, attn_res_bank_reference); register_reference(r.attn_res_merge, attn_res_merge_reference);
  register_reference(r.kda_decode, kda_decode_reference);
  register_reference(r.mla_decode, mla_decode_reference);
  register_reference(r.moe_tail_combine, moe_tail_combine_reference);
  register_reference(r.mla_prep, mla_prep_reference);
}

#ifndef K3_HAVE_CUDA
void register_cuda_ops(Registry&) {}  // no CUDA backend in this build (kernels/registry/cuda_registry.cpp)
#endif

}  // namespace k3::kernels
