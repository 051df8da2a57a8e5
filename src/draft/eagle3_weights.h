// draft/eagle3_weights.h: every parameter of the EAGLE-3 draft model, its Hugging Face checkpoint
// names, loading and deterministic random checkpoints.
//
// Checkpoint tensor names, as SpecForge writes them and vLLM / SGLang load them (the decoder layer
// may also be stored as "layers.0." instead of "midlayer.", and every name may carry "model.").
// H = hidden, Ht = target hidden, n = taps, NH/NKV = heads / KV heads, hd = head_dim,
// I = intermediate, V / Vd = target / draft vocabulary:
//   fc.weight                                  [H, n*Ht]    the taps, concatenated, to H
//   midlayer.hidden_norm.weight                [H]          RMSNorm of the hidden input
//   midlayer.input_layernorm.weight            [H]          RMSNorm of the token embedding
//   midlayer.self_attn.{q}_proj.weight         [NH*hd, 2H]  input: [embedding ; hidden], normed
//   midlayer.self_attn.{k,v}_proj.weight       [NKV*hd, 2H]
//   midlayer.self_attn.o_proj.weight           [H, NH*hd]
//   midlayer.post_attention_layernorm.weight   [H]
//   midlayer.mlp.{gate_proj,up_proj}.weight    [I, H];  midlayer.mlp.down_proj.weight [H, I]
//   norm.weight                                [H]
//   lm_head.weight                             [Vd, H]
//   d2t                                        I64 [Vd]  only when Vd < V: target id = d + d2t[d]
//   embed_tokens.weight                        [V, H]    optional: without it the target's
//                                                        embed_tokens is used (needs H = Ht)
//   t2d                                        BOOL [V]  optional, ignored (as vLLM does)
// BF16 or F32 floats.
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include "core/tensor.h"
#include "draft/draft_weights.h"
#include "draft/eagle3_config.h"
#include "kernels/common.h"
#include "model/weights.h"

namespace k3::draft {

struct Eagle3Weights {
  Tensor embed;            // [V, H]: own, or the target's embed_tokens (shared storage)
  LinearWeight fc;         // [H, n*Ht]
  Tensor hidden_norm;      // [H]
  Tensor input_norm;       // [H]
  LinearWeight q_proj;     // [NH*hd, 2H]
  LinearWeight k_proj;     // [NKV*hd, 2H]
  LinearWeight v_proj;     // [NKV*hd, 2H]
  LinearWeight o_proj;     // [H, NH*hd]
  Tensor post_attn_norm;   // [H]
  LinearWeight gate_proj;  // [I, H]
  LinearWeight up_proj;    // [I, H]
  LinearWeight down_proj;  // [H, I]
  Tensor final_norm;       // [H]
  LinearWeight lm_head;    // [Vd, H]
  Tensor d2t;              // i64 [Vd] (undefined when Vd == V)
};

// The stored parameters in model order, with "midlayer." names; `with_embedding` adds
// embed_tokens.weight.
std::vector<DraftParamSpec> eagle3_params(const Eagle3Config& c, bool with_embedding = false);
int64_t eagle3_param_count(const Eagle3Config& c, bool with_embedding = false);

// Reads DIR/config.json and DIR's safetensors, checks the config against the target and every
// tensor against eagle3_params(); errors name the file and tensor. The embedding is the
// checkpoint's own when it has one, else the target's (aliased).
struct LoadedEagle3 {
  Eagle3Config config;
  Eagle3Weights weights;
};
LoadedEagle3 load_eagle3(const std::filesystem::path& dir, const config::K3Config& target_config,
                         const model::Weights& target_weights);

// Assembles weights from tensors by eagle3_params() name; `embed` is used when the tensors hold no
// embed_tokens.weight.
Eagle3Weights assemble_eagle3_weights(const Eagle3Config& c, const std::map<std::string, Tensor>& tensors,
                                      const Tensor& embed);
// The random rule of draft_weights.h (linear N(0, 1/fan_in), norms 1 + N(0, 0.05^2), d2t = 0).
Eagle3Weights random_eagle3_weights(const Eagle3Config& c, uint64_t seed, const Tensor& target_embed);
// DIR/config.json (to_json, loadable by vLLM) and DIR/model.safetensors; same seed, same bytes.
void write_random_eagle3(const Eagle3Config& c, uint64_t seed, const std::filesystem::path& out);

}  // namespace k3::draft
