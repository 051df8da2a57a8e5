// draft/dspark_drafter.cpp: DsparkDrafter (see dspark_drafter.h).
#include "draft/dspark_drafter.h"

#include <vector>

#include "core/error.h"

namespace k3::draft {

DsparkDrafter::DsparkDrafter(const DraftModel& model, DsparkOptions options, std::shared_ptr<const void> keepalive)
    : keepalive_(std::move(keepalive)), model_(model), options_(std::move(options)) {}

namespace {

// What a drafter made by load_dspark_drafter owns: the loaded draft and the model over it.
struct OwnedDraft {
  LoadedDraft loaded;
  std::unique_ptr<DraftModel> model;
};

}  // namespace

std::unique_ptr<DsparkDrafter> load_dspark_drafter(const std::filesystem::path& dir,
                                                   const config::K3Config& target_config,
                                                   const model::Weights& target_weights, const kernels::Registry& ops,
                                                   DraftOptions draft_options, DsparkOptions options,
                                                   std::shared_ptr<core::DeviceMemory> memory,
                                                   const model::Weights* device_target) {
  auto owned = std::make_shared<OwnedDraft>();
  owned->loaded = load_draft(dir, target_config, target_weights);
  owned->model = std::make_unique<DraftModel>(owned->loaded.config, owned->loaded.weights, ops, draft_options,
                                              std::move(memory), device_target);
  const DraftModel& model = *owned->model;
  return std::make_unique<DsparkDrafter>(model, std::move(options), std::move(owned));
}

spec::HiddenTapRequest DsparkDrafter::hidden_tap() const {
  spec::HiddenTapRequest r;
  for (int l : model_.config().target_layer_ids) r.layers.push_back(l);
  return r;
}

void DsparkDrafter::observe(spec::RequestId id, const spec::HiddenTapRows& rows) {
  if (rows.rows() == 0) return;
  core::Tensor moved;
  const core::TensorView hidden = rows_on(model_.memory(), rows.hidden, options_.target_memory.get(), moved,
                                          "DsparkDrafter::observe");
  K3_CHECK(hidden.rank() == 2 && hidden.dim(0) == rows.rows(), "DsparkDrafter::observe: hidden has " +
                                                                   hidden.shape.str() + " for " +
                                                                   std::to_string(rows.rows()) + " rows");
  auto it = caches_.find(id);
  if (it == caches_.end()) it = caches_.emplace(id, model_.new_cache(rows.position)).first;
  DraftCache& cache = it->second;
  const int64_t p = rows.position;
  if (p > cache.end_position() || p < cache.first_position) {
    cache = model_.new_cache(p);  // a gap (or rows before the first seen): start again from these rows
  } else if (p < cache.end_position()) {
    model_.truncate(cache, p - cache.first_position);  // rows re-run after a rollback
  }
  model_.append_context(cache, hidden);
}

void DsparkDrafter::propose(std::span<const spec::DraftQuery> batch, std::span<spec::Draft> out) {
  K3_CHECK(out.size() == batch.size(), "DsparkDrafter::propose: out has " + std::to_string(out.size()) +
                                           " entries for " + std::to_string(batch.size()) + " queries");
  // The requests the cache can draft for, run as one batched block pass.
  std::vector<const DraftCache*> caches;
  std::vector<int32_t> x0;
  std::vector<int> max_tokens;
  std::vector<size_t> which;
  for (size_t i = 0; i < batch.size(); ++i) {
    const spec::DraftQuery& q = batch[i];
    out[i].clear();
    auto it = caches_.find(q.id);
    if (it == caches_.end() || q.tokens.empty() || q.max_drafts <= 0) continue;
    if (it->second.end_position() != static_cast<int64_t>(q.tokens.size()) - 1)
      continue;  // out of step with the target
    caches.push_back(&it->second);
    x0.push_back(q.tokens.back());
    max_tokens.push_back(q.max_drafts);
    which.push_back(i);
  }
  if (which.empty()) return;
  const std::vector<DraftResult> results = model_.draft_batch(caches, x0, max_tokens);
  for (size_t b = 0; b < which.size(); ++b) {
    const DraftResult& r = results[b];
    for (size_t k = 0; k < r.tokens.size(); ++k) {
      if (!r.confidence.empty() && r.confidence[k] < options_.min_confidence) break;
      out[which[b]].tokens.push_back(r.tokens[k]);
    }
  }
}

void DsparkDrafter::release(spec::RequestId id) { caches_.erase(id); }

int64_t DsparkDrafter::cache_bytes() const {
  int64_t n = 0;
  for (const auto& [id, c] : caches_) n += c.bytes();
  return n;
}

int64_t DsparkDrafter::context_rows(spec::RequestId id) const {
  auto it = caches_.find(id);
  return it == caches_.end() ? -1 : it->second.num_context;
}

int64_t DsparkDrafter::first_position(spec::RequestId id) const {
  auto it = caches_.find(id);
  return it == caches_.end() ? -1 : it->second.first_position;
}

}  // namespace k3::draft
