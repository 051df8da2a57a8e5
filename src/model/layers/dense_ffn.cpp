// model/layers/dense_ffn.cpp: the dense SiTU-GLU FFN of the first layers (spec §3.2, §8). Under
// tensor parallelism (spec §11) gate/up are column-parallel and down_proj row-parallel: each rank's
// partial product is summed over the ranks and rounded once.
#include "model/layers/context.h"

namespace k3::model {

core::Tensor ffn(const ForwardContext& ctx, int /*layer*/, const DenseFfnWeights& w, const core::Tensor& x) {
  const core::Tensor h = ctx.situ_glu(ctx.linear(x, w.gate_proj), ctx.linear(x, w.up_proj));
  return ctx.reduce_partial(ctx.row_parallel_linear(h, w.down_proj));
}

}  // namespace k3::model
