// model/layers/attn_res.cpp: Block Attention Residuals, the Mix over bank ++ [prefix] (spec §3.1).
#include <vector>

#include "model/layers/context.h"

namespace k3::model {

core::Tensor attn_res_mix(const ForwardContext& ctx, std::span<const core::Tensor> bank, const core::Tensor& prefix,
                          const AttnResWeights& w) {
  if (bank.empty()) return prefix;  // layer 0, attention side: h = P
  std::vector<core::TensorView> sources;
  sources.reserve(bank.size() + 1);
  for (const auto& row : bank) sources.push_back(row.view());
  sources.push_back(prefix.view());
  core::Tensor out = ctx.alloc(prefix.dim(0), prefix.dim(1));
  // query is stored [1, hidden]; the op reads it as a vector.
  core::TensorView query = w.query.view();
  query = core::TensorView::contiguous(query.data, query.dtype, {query.numel()}, query.device);
  ctx.ops.attn_res_mix.run({sources, query, w.norm.view(), out.view(), ctx.config.rms_norm_eps, ctx.precision()},
                           ctx.device());
  return out;
}

}  // namespace k3::model
