// draft/dspark_drafter.h: DsparkDrafter, the DSpark draft model behind spec::Drafter.
//
// Per request it keeps a DraftCache (the draft layers' latent context rows) fed by observe() with
// the target's committed tap rows; propose() drafts when the cache ends exactly at the tokens run
// through the target (position tokens.size() - 1: the last token is the newest sampled one, x_0).
// Otherwise (no tap rows yet) it proposes nothing for that request, which the engine verifies as a
// plain decode step. A request first observed at a position > 0 (a prefix-cache hit: agentic
// turns reuse most of their prompt) drafts from there, its block attending over the positions the
// draft saw; a gap in the observed positions (a preemption) starts it afresh. The drafting requests of one propose() run as
// one batched block pass (DraftModel::draft_batch), on the model's device (the target's GPU at
// --tp 1: the taps are read there and only the drafted tokens come back). Drafts are greedy point masses (Draft::probs
// empty): U_k + Markov argmax, spec §13.2.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include "core/device_memory.h"
#include "draft/draft_model.h"
#include "spec/drafter.h"

namespace k3::draft {

struct DsparkOptions {
  // With a confidence head: stop drafting after the first position whose confidence is below
  // this (that position is not proposed). 0 never stops early.
  float min_confidence = 0.0f;
  // Where the tap rows live when the target runs on another device than the draft (observe()
  // downloads them to a CPU draft); null: the rows are on the draft's device or the host.
  std::shared_ptr<core::DeviceMemory> target_memory;
};

class DsparkDrafter final : public spec::Drafter {
 public:
  // `model` must outlive the drafter, or be kept alive by `keepalive` (load_dspark_drafter).
  explicit DsparkDrafter(const DraftModel& model, DsparkOptions options = {},
                         std::shared_ptr<const void> keepalive = nullptr);

  std::string name() const override { return "dspark"; }
  spec::HiddenTapRequest hidden_tap() const override;
  void propose(std::span<const spec::DraftQuery> batch, std::span<spec::Draft> out) override;
  void observe(spec::RequestId id, const spec::HiddenTapRows& rows) override;
  void release(spec::RequestId id) override;

  // Introspection (tests, metrics).
  size_t num_requests() const { return caches_.size(); }
  int64_t cache_bytes() const;                       // all requests' latent caches
  int64_t context_rows(spec::RequestId id) const;    // rows held; -1 when the request has no cache
  int64_t first_position(spec::RequestId id) const;  // of those rows; -1 likewise

 private:
  std::shared_ptr<const void> keepalive_;
  const DraftModel& model_;
  DsparkOptions options_;
  std::unordered_map<spec::RequestId, DraftCache> caches_;
};

// Loads the draft checkpoint in `dir` (load_draft) for a target and returns a drafter owning the
// draft's config, weights and model. `target_weights` are the target's HOST weights (e.g.
// checkpoint::LoadedModel::weights before model::to_device), whose embedding (and lm_head, when
// shared) the draft aliases; they and `ops` must outlive the drafter. `memory`: where the draft
// runs (null: the CPU); on the target's GPU, `device_target` is the target's device weights (the
// draft reads their embedding and a shared lm_head there) and the taps stay on the device.
std::unique_ptr<DsparkDrafter> load_dspark_drafter(const std::filesystem::path& dir,
                                                   const config::K3Config& target_config,
                                                   const model::Weights& target_weights, const kernels::Registry& ops,
                                                   DraftOptions draft_options = {}, DsparkOptions options = {},
                                                   std::shared_ptr<core::DeviceMemory> memory = nullptr,
                                                   const model::Weights* device_target = nullptr);

}  // namespace k3::draft
