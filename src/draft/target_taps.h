// draft/target_taps.h: the target-side tap DSpark needs (spec §13.2), computed through the
// model's TraceFn hook: for each tap layer l, the AttnRes mixture the attention side of layer l + 1
// computes ("attn_res.mix" of layer l + 1, emitted by model::layer_forward), per row of a step.
//
// This is the stand-alone form for tests, tools and the CLI; the engine's own tap path (spec/,
// HiddenTapRequest) hands the drafter the same values through Drafter::observe.
#pragma once
#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "model/model.h"

namespace k3::draft {

struct TargetStep {
  core::Tensor logits;  // f32 [T, vocab] (LogitRows::all)
  core::Tensor taps;    // f32 [T, tap_layers.size() * hidden], the taps in tap_layers order
};

// Runs `tokens` through `target` as one step of `kind` on top of `state` (which it advances, as
// Model::forward does) and collects the taps. Throws core::Error when a tap layer has no next
// layer or the target did not emit its mixture.
TargetStep run_target_with_taps(const model::Model& target, model::KvStorage& kv, model::SequenceState& state,
                                std::span<const int32_t> tokens, std::span<const int> tap_layers,
                                model::StepKind kind = model::StepKind::prefill);

}  // namespace k3::draft
