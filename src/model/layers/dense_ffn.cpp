// model/layers/dense_ffn.cpp: the dense SiTU-GLU FFN of the first layers (spec §3.2, §8).
#include "model/layers/context.h"

namespace k3::model {

core::Tensor ffn(const ForwardContext& ctx, int /*layer*/, const DenseFfnWeights& w, const core::Tensor& x) {
  return ctx.linear(ctx.situ_glu(ctx.linear(x, w.gate_proj), ctx.linear(x, w.up_proj)), w.down_proj);
}

}  // namespace k3::model
