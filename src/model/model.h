// model/model.h: the K3-family text model assembled from its layer schedule (spec §3).
//
// Config, Weights and per-sequence RunState (SequenceState) are kept apart; the model
// holds references to the first two and the op registry, and runs a batch of sequences,
// each with its own tokens, state and step kind. Ops are called through the registry,
// so the same code runs on every backend that implements them.
#pragma once
#include <span>

#include "config/k3_config.h"
#include "kernels/registry.h"
#include "model/layers/context.h"
#include "model/weights.h"

namespace k3::model {

enum class LogitRows : uint8_t {
  all,   // one row per input token, in batch order
  last,  // the last token of each sequence
};

class Model {
 public:
  // Validates that the weights match the config's layer schedule.
  Model(const config::K3Config& config, const Weights& weights, const kernels::Registry& ops,
        ModelOptions options);

  const config::K3Config& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  // Runs every sequence's tokens on top of its state in `kv` (advancing num_tokens) and
  // returns f32 logits [rows, vocab]. Each state's block_table must already cover
  // num_tokens + its new tokens and its slot must be valid. Throws core::Error on bad input.
  core::Tensor forward(KvStorage& kv, std::span<const SequenceInput> batch, LogitRows rows,
                       const TraceFn* trace = nullptr) const;

 private:
  const config::K3Config& config_;
  const Weights& weights_;
  const kernels::Registry& ops_;
  ModelOptions options_;
  // e_score_correction_bias as the router sees it: bf16-rounded in bf16 mode (spec §4).
  std::vector<core::Tensor> router_bias_;
};

}  // namespace k3::model
