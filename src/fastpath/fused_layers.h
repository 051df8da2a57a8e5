// fastpath/fused_layers.h: the fused path's sublayers (fastpath/fused_decode.h has the plan).
#pragma once
#include <cstdint>
#include <vector>

#include "model/layers/context.h"

namespace k3::fastpath {

// Where a Mix operator sits: the attention or FFN side of a layer, or the output Mix.
struct MixSite {
  enum class Side : uint8_t { attention, ffn, output } side;
  int layer;  // the layer (output: num_hidden_layers)
  static MixSite attention(int l) { return {Side::attention, l}; }
  static MixSite ffn(int l) { return {Side::ffn, l}; }
  static MixSite output(int num_layers) { return {Side::output, num_layers}; }
  bool operator==(const MixSite&) const = default;
};

// The AttnRes stream of one step (spec §3): the bank, and the bank part of every Mix that reads
// the current bank, computed once when the bank changes (attn_res_bank).
class AttnResStream {
 public:
  AttnResStream(const model::ForwardContext& ctx, const model::Weights& w, int64_t rows);
  // At write layer l: appends P (the finished block sum) to the bank and computes the bank part
  // of every Mix until the next write layer (that layer's attention side included) or the end.
  void write_bank(int l, const core::Tensor& P);
  // The sublayer tail (attn_res_merge): P becomes round(P + a), or a when restart, or stays when
  // a is null; returns x = RMSNorm(Mix(bank ++ [P]); norm_weight). The attention side's mixture
  // goes to the trace ("attn_res.mix") and the drafter taps when they ask for it.
  core::Tensor merge(core::Tensor& P, const core::Tensor* a, bool restart, MixSite site,
                     const core::Tensor& norm_weight);

 private:
  const model::AttnResWeights& mix_weights(MixSite site) const;
  bool wants_mixture(MixSite site) const;
  const model::ForwardContext& ctx_;
  const model::Weights& w_;
  int64_t rows_;
  std::vector<core::Tensor> bank_;  // [rows, hidden] each
  std::vector<MixSite> sites_;      // the Mix operators of the current bank, in acc order
  core::Tensor acc_, stats_;        // f32 [M * rows, hidden], [M * rows, 2]
};

// Attention sublayers (their o_proj output, reduced over the TP ranks), from the normed input x.
core::Tensor fused_attention(const model::ForwardContext& ctx, int layer, const model::KdaWeights& w,
                             const core::Tensor& x);
core::Tensor fused_attention(const model::ForwardContext& ctx, int layer, const model::MlaWeights& w,
                             const core::Tensor& x);
// The MoE sublayer: one fused front (router, latent down, shared gate/up), the standard tail.
core::Tensor fused_moe(const model::ForwardContext& ctx, int layer, const model::MoeWeights& w,
                       const core::Tensor& router_bias, const core::Tensor& x);

}  // namespace k3::fastpath
