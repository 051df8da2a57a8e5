// draft/target_taps.cpp: taps of the target's AttnRes mixtures through the TraceFn hook.
#include "draft/target_taps.h"

#include <cstring>
#include <vector>

#include "core/error.h"

namespace k3::draft {

TargetStep run_target_with_taps(const model::Model& target, model::KvStorage& kv, model::SequenceState& state,
                                std::span<const int32_t> tokens, std::span<const int> tap_layers,
                                model::StepKind kind) {
  const config::K3Config& c = target.config();
  const int64_t T = static_cast<int64_t>(tokens.size()), H = c.hidden_size;
  const int64_t n = static_cast<int64_t>(tap_layers.size());
  for (int64_t i = 0; i < n; ++i)
    K3_CHECK(tap_layers[i] >= 0 && tap_layers[i] + 1 < c.num_hidden_layers,
             "run_target_with_taps: tap layer " + std::to_string(tap_layers[i]) +
                 " has no next layer (the target has " + std::to_string(c.num_hidden_layers) + ")");
  TargetStep out;
  out.taps = core::Tensor::zeros(core::DType::f32, {T, n * H});
  std::vector<int> filled(static_cast<size_t>(n), 0);
  const model::TraceFn trace = [&](std::string_view name, int layer, const core::TensorView& v) {
    if (name != "attn_res.mix") return;
    for (int64_t i = 0; i < n; ++i) {
      if (tap_layers[i] + 1 != layer) continue;
      K3_CHECK(v.dtype == core::DType::f32 && v.rank() == 2 && v.dim(0) == T && v.dim(1) == H,
               "run_target_with_taps: the mixture of layer " + std::to_string(layer) + " is " + v.shape.str());
      for (int64_t r = 0; r < T; ++r)
        std::memcpy(out.taps.data<float>() + r * n * H + i * H, v.as<const float>() + r * v.strides[0],
                    sizeof(float) * static_cast<size_t>(H));
      ++filled[static_cast<size_t>(i)];
    }
  };
  const model::SequenceInput in{tokens, &state, kind};
  out.logits = target.forward(kv, std::span<const model::SequenceInput>(&in, 1), model::LogitRows::all, &trace);
  for (int64_t i = 0; i < n; ++i)
    K3_CHECK(filled[static_cast<size_t>(i)] == 1,
             "run_target_with_taps: the target did not emit attn_res.mix for layer " +
                 std::to_string(tap_layers[i] + 1) + " (model::layer_forward must emit it)");
  return out;
}

}  // namespace k3::draft
