// model/weights.h: every parameter of a K3-family model, as loaded (spec §4).
//
// Tensors keep their checkpoint dtype (BF16, F32, or MXFP4 packed + scales) and may point
// into an mmap'd checkpoint. Shapes below use K3 values as examples; the real shapes come
// from config::K3Config (checkpoint/param_inventory.h lists them per config).
#pragma once
#include <variant>
#include <vector>

#include "core/device_memory.h"
#include "core/tensor.h"
#include "kernels/common.h"

namespace k3::model {

using core::Tensor;
using kernels::LinearWeight;

struct KdaWeights {
  LinearWeight q_proj, k_proj, v_proj;  // [P=H*D, hidden] bf16 (P = 12288)
  LinearWeight g_proj;                  // [P, hidden] bf16, full-rank output gate
  LinearWeight o_proj;                  // [hidden, P] bf16
  LinearWeight f_a_proj;                // [D, hidden] bf16 (decay low-rank, width = head_dim)
  LinearWeight f_b_proj;                // [P, D] bf16
  LinearWeight b_proj;                  // [H, hidden] bf16
  Tensor q_conv, k_conv, v_conv;        // [P, 1, K] f32
  Tensor a_log;                         // [D] or [H] f32; first H used
  Tensor dt_bias;                       // [P] f32
  Tensor o_norm;                        // [D] f32
};

struct MlaWeights {
  LinearWeight q_a_proj;   // [q_lora, hidden] bf16
  Tensor q_a_norm;         // [q_lora] bf16 (eps 1e-6)
  LinearWeight q_b_proj;   // [H*(nope+rope), q_lora] bf16
  LinearWeight kv_a_proj;  // [kv_lora+rope, hidden] bf16 (kv_a_proj_with_mqa)
  Tensor kv_a_norm;        // [kv_lora] bf16 (eps 1e-6)
  LinearWeight kv_b_proj;  // [H*(nope+v), kv_lora] bf16: per head W_UK then W_UV
  LinearWeight g_proj;     // [H*v, hidden] bf16
  LinearWeight o_proj;     // [hidden, H*v] bf16
};

struct DenseFfnWeights {
  LinearWeight gate_proj, up_proj;  // [intermediate, hidden] bf16
  LinearWeight down_proj;           // [hidden, intermediate] bf16
};

struct MoeWeights {
  LinearWeight router;                  // [E, hidden] bf16 (gate.weight)
  Tensor router_bias;                   // [E] f32 (e_score_correction_bias)
  LinearWeight latent_down;             // [L, hidden] bf16 (routed_expert_down_proj)
  Tensor latent_norm;                   // [L] bf16 (routed_expert_norm)
  LinearWeight latent_up;               // [hidden, L] bf16 (routed_expert_up_proj)
  std::vector<LinearWeight> w1, w3;     // E x [I, L]: bf16, or MXFP4 u8 [I, L/2] + scales [I, L/32]
  std::vector<LinearWeight> w2;         // E x [L, I]: bf16, or MXFP4 u8 [L, I/2] + scales [L, I/32]
  LinearWeight shared_gate, shared_up;  // [S*I, hidden] bf16
  LinearWeight shared_down;             // [hidden, S*I] bf16
  // Expert parallelism (config::ShardOptions::expert_parallel): w1/w3/w2 hold the WHOLE experts
  // [expert_begin, expert_begin + w1.size()) of num_experts (E / tp of them, full I). num_experts
  // = 0: every expert (TP=1), or under plain TP a slice of every expert's intermediate.
  int64_t expert_begin = 0;
  int64_t num_experts = 0;
  bool expert_parallel() const { return num_experts > 0; }
};

struct AttnResWeights {
  Tensor query;  // [1, hidden] bf16 (…_res_proj.weight)
  Tensor norm;   // [hidden] bf16 (…_res_norm.weight)
};

struct LayerWeights {
  Tensor input_norm;        // [hidden] bf16 input_layernorm
  Tensor post_attn_norm;    // [hidden] bf16 post_attention_layernorm
  AttnResWeights attn_res;  // self_attention_res_{proj,norm}
  AttnResWeights mlp_res;   // mlp_res_{proj,norm}
  std::variant<KdaWeights, MlaWeights> attn;
  std::variant<DenseFfnWeights, MoeWeights> ffn;
};

struct Weights {
  Tensor embed;  // [V, hidden] bf16
  std::vector<LayerWeights> layers;
  AttnResWeights output_res;  // output_attn_res_{proj,norm}
  Tensor final_norm;          // [hidden] bf16
  LinearWeight lm_head;       // [V, hidden] bf16
};

// A copy of every tensor on `memory`'s device, dtypes kept (bf16 stays bf16, MXFP4 stays packed
// codes + scales: experts are never expanded). On the CPU it shares the tensors instead.
Weights to_device(const Weights& weights, core::DeviceMemory& memory);
// Bytes of every tensor (what to_device moves).
int64_t weight_bytes(const Weights& weights);

}  // namespace k3::model
