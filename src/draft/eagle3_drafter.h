// draft/eagle3_drafter.h: Eagle3Drafter, the EAGLE-3 draft model (draft/eagle3_model.h) behind
// spec::Drafter, drafting a chain of K tokens per request.
//
// Per request it keeps the draft's KV cache and the fused taps (fc outputs) of the committed target
// positions whose draft row has not run yet: a context row needs the token after its position,
// which for the newest committed position is only known at propose(). propose() then runs, as one
// batched forward over the drafting requests, every pending context row, and from the last one's
// output chains K - 1 more single-row passes (each on the draft's own pre-norm output and token),
// taking the greedy token each time. Drafts are point masses (Draft::probs empty). Afterwards the
// chain rows are dropped and the newest context row is kept pending (its token is re-read at the
// next propose), so the cache holds only rows from the target's committed taps.
//
// A request first observed at a position > 0 (a prefix-cache hit) drafts from there on: the draft
// attends over the positions it saw. A gap in the observed positions starts it afresh. The model's
// device holds everything (draft/eagle3_model.h): on the target's GPU each chain step brings back
// only its tokens. (The engine's executors gather the taps on the host today, so a GPU draft
// uploads them again: ~86 KB per row at K3's width; keeping them on the device is a follow-up.)
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/device_memory.h"
#include "draft/eagle3_model.h"
#include "spec/drafter.h"

namespace k3::draft {

struct Eagle3DrafterOptions {
  // Where the tap rows live when the target runs on another device than the draft (observe()
  // downloads them to a CPU draft); null: the rows are on the draft's device.
  std::shared_ptr<core::DeviceMemory> target_memory;
};

class Eagle3Drafter final : public spec::Drafter {
 public:
  // `model` must outlive the drafter, or be kept alive by `keepalive` (load_eagle3_drafter).
  explicit Eagle3Drafter(const Eagle3Model& model, Eagle3DrafterOptions options = {},
                         std::shared_ptr<const void> keepalive = nullptr);

  std::string name() const override { return "eagle3"; }
  spec::HiddenTapRequest hidden_tap() const override;
  void propose(std::span<const spec::DraftQuery> batch, std::span<spec::Draft> out) override;
  void observe(spec::RequestId id, const spec::HiddenTapRows& rows) override;
  void release(spec::RequestId id) override;

  // Introspection (tests, metrics).
  size_t num_requests() const { return requests_.size(); }
  int64_t cache_bytes() const;
  // Target positions observed for the request (its first observed position .. this - 1); -1: unknown.
  int64_t observed_end(spec::RequestId id) const;

 private:
  struct Request {
    Eagle3Cache cache;  // draft rows of positions [cache.first_position, cache.end_position())
    RowBuffer pending;  // fused taps [n, H] of positions cache.end_position() .. observed_end - 1
    int64_t observed_end = 0;
  };
  Request fresh(int64_t position) const;

  std::shared_ptr<const void> keepalive_;
  const Eagle3Model& model_;
  Eagle3DrafterOptions options_;
  std::unordered_map<spec::RequestId, Request> requests_;
};

// Loads the EAGLE-3 checkpoint in `dir` (load_eagle3) for a target and returns a drafter owning its
// config, weights and model. `target_weights` are the target's host weights (the draft may alias
// their embedding); they and `ops` must outlive the drafter. `memory`: where the draft runs (null:
// the CPU); on the target's GPU, `device_embed` is the target's device embedding (shared when the
// draft has none of its own) and the taps stay on the device.
std::unique_ptr<Eagle3Drafter> load_eagle3_drafter(const std::filesystem::path& dir,
                                                   const config::K3Config& target_config,
                                                   const model::Weights& target_weights, const kernels::Registry& ops,
                                                   Eagle3Options model_options = {}, Eagle3DrafterOptions options = {},
                                                   std::shared_ptr<core::DeviceMemory> memory = nullptr,
                                                   core::Tensor device_embed = {});

}  // namespace k3::draft
