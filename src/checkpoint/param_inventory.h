// checkpoint/param_inventory.h: every tensor a K3-family checkpoint holds, for any config
// (spec §4, "The same names for any K3-family config"): name, role, accepted dtypes and shapes.
//
// The loader checks a checkpoint against this list and the random writer writes exactly this
// list, so the two cannot drift apart. Names are given WITHOUT the "language_model." prefix.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/k3_config.h"
#include "core/tensor.h"

namespace k3::checkpoint {

// What a tensor is, which decides its random init (writer) and nothing else.
enum class ParamRole : uint8_t {
  embedding,       // model.embed_tokens.weight [V, hidden]
  linear,          // a dense linear weight [out, in]
  norm,            // an RMSNorm weight [n] (including the AttnRes score norms and KDA o_norm)
  attn_res_query,  // an AttnRes pseudo-query [1, hidden]
  kda_conv,        // short-conv weight [P, 1, K] f32
  kda_a_log,       // A_log f32 [head_dim] (K3) or [num_heads] (HF reference): first num_heads used
  kda_dt_bias,     // dt_bias f32 [P]
  router_bias,     // e_score_correction_bias f32 [E]
  expert_weight,   // a routed-expert weight in BF16 [out, in]
  expert_packed,   // a routed-expert weight in MXFP4: codes u8 [out, in/2]
  expert_scale,    // ... and its E8M0 scales u8 [out, in/32]
};

struct ParamSpec {
  std::string name;  // e.g. "model.layers.3.self_attn.q_b_proj.weight"
  ParamRole role = ParamRole::linear;
  std::vector<core::DType> dtypes;  // accepted; dtypes[0] is what the writer writes
  std::vector<core::Shape> shapes;  // accepted; shapes[0] is what the writer writes
  // For linear-like roles, the weight's logical [out, in] (for MXFP4: before packing); the
  // writer draws values of this shape. {0, 0} for the others.
  int64_t out_features = 0, in_features = 0;
  bool feeds_situ = false;  // a gate/up projection whose output enters SiTU (dense, shared, w1/w3)
  // Name whose RNG stream the values come from: the tensor's own name, except that an MXFP4
  // pair (weight_packed, weight_scale) shares the stream of "<...>.weight", so both halves
  // quantize one and the same matrix, the matrix a BF16 checkpoint of the same seed holds.
  std::string value_name;
  bool accepts_dtype(core::DType t) const;
  bool accepts_shape(const core::Shape& s) const;
  std::string describe() const;  // "BF16 [4, 256]" or "F32 [32] or [4]"
};

// The full list in model order (embedding, layers 0..L-1, final mix, norm, lm_head), for the
// config as given (config.mxfp4.enabled selects the expert form). Throws core::Error for a
// config outside what k3serve models (e.g. no q-LoRA, a low-rank KDA output gate, MXFP4
// widths not a multiple of 32, attn_kinds not one per layer).
std::vector<ParamSpec> expected_params(const config::K3Config& config);

// "language_model." — the real K3 checkpoint puts every text tensor behind it.
inline constexpr std::string_view kLanguageModelPrefix = "language_model.";
// vision_tower.* and mm_projector.* (with or without the prefix): present in the real
// multimodal checkpoint, skipped by a text-only loader.
bool is_skipped_tensor(std::string_view name);

}  // namespace k3::checkpoint
