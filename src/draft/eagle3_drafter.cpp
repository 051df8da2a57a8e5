// draft/eagle3_drafter.cpp: Eagle3Drafter (see eagle3_drafter.h).
#include "draft/eagle3_drafter.h"

#include <algorithm>

#include "core/error.h"

namespace k3::draft {

namespace {

struct OwnedEagle3 {
  LoadedEagle3 loaded;
  std::unique_ptr<Eagle3Model> model;
};

}  // namespace

Eagle3Drafter::Eagle3Drafter(const Eagle3Model& model, Eagle3DrafterOptions options,
                             std::shared_ptr<const void> keepalive)
    : keepalive_(std::move(keepalive)), model_(model), options_(std::move(options)) {}

std::unique_ptr<Eagle3Drafter> load_eagle3_drafter(const std::filesystem::path& dir,
                                                   const config::K3Config& target_config,
                                                   const model::Weights& target_weights, const kernels::Registry& ops,
                                                   Eagle3Options model_options, Eagle3DrafterOptions options,
                                                   std::shared_ptr<core::DeviceMemory> memory,
                                                   core::Tensor device_embed) {
  auto owned = std::make_shared<OwnedEagle3>();
  owned->loaded = load_eagle3(dir, target_config, target_weights);
  // The target's device embedding serves only a draft that shares the target's table.
  const bool shares = owned->loaded.weights.embed.data<void>() == target_weights.embed.data<void>();
  owned->model = std::make_unique<Eagle3Model>(owned->loaded.config, owned->loaded.weights, ops, model_options,
                                               std::move(memory), shares ? device_embed : core::Tensor{});
  const Eagle3Model& model = *owned->model;
  return std::make_unique<Eagle3Drafter>(model, std::move(options), std::move(owned));
}

spec::HiddenTapRequest Eagle3Drafter::hidden_tap() const {
  spec::HiddenTapRequest r;
  for (int l : model_.config().tap_layers()) r.layers.push_back(l);
  return r;
}

Eagle3Drafter::Request Eagle3Drafter::fresh(int64_t position) const {
  Request r;
  r.cache.first_position = position;
  r.observed_end = position;
  return r;
}

void Eagle3Drafter::observe(spec::RequestId id, const spec::HiddenTapRows& rows) {
  if (rows.rows() == 0) return;
  core::Tensor moved;
  const core::TensorView hidden = rows_on(model_.memory(), rows.hidden, options_.target_memory.get(), moved,
                                          "Eagle3Drafter::observe");
  K3_CHECK(hidden.rank() == 2 && hidden.dim(0) == rows.rows(), "Eagle3Drafter::observe: hidden has " +
                                                                   hidden.shape.str() + " for " +
                                                                   std::to_string(rows.rows()) + " rows");
  const int64_t p = rows.position;
  auto it = requests_.find(id);
  if (it == requests_.end()) it = requests_.emplace(id, fresh(p)).first;
  Request& r = it->second;
  if (p > r.observed_end || p < r.cache.first_position) {
    r = fresh(p);                   // a gap (or rows before the first seen): start again from these rows
  } else if (p < r.observed_end) {  // rows re-run after a rollback
    if (p >= r.cache.end_position()) {
      model_.keep_rows(r.pending, p - r.cache.end_position());
    } else {
      model_.truncate(r.cache, p);
      model_.keep_rows(r.pending, 0);
    }
    r.observed_end = p;
  }
  model_.append(r.pending, model_.fuse_taps(hidden).view());
  r.observed_end += rows.rows();
}

void Eagle3Drafter::propose(std::span<const spec::DraftQuery> batch, std::span<spec::Draft> out) {
  K3_CHECK(out.size() == batch.size(), "Eagle3Drafter::propose: out has " + std::to_string(out.size()) +
                                           " entries for " + std::to_string(batch.size()) + " queries");
  const int64_t H = model_.config().hidden_size;
  // The requests in step with the target: tokens[0, observed_end) ran through it, the last token
  // is the newest sampled one, and at least that position's context row is pending.
  struct Active {
    size_t query;
    Request* request;
    int32_t max_drafts;
  };
  std::vector<Active> active;
  std::vector<Eagle3Cache*> caches;
  std::vector<int64_t> rows;
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < batch.size(); ++i) {
    const spec::DraftQuery& q = batch[i];
    out[i].clear();
    auto it = requests_.find(q.id);
    if (it == requests_.end() || q.max_drafts <= 0) continue;
    Request& r = it->second;
    const int64_t begin = r.cache.end_position(), n = r.observed_end - begin;
    if (static_cast<int64_t>(q.tokens.size()) != r.observed_end + 1 || n <= 0 || r.pending.rows != n) continue;
    active.push_back({i, &r, q.max_drafts});
    caches.push_back(&r.cache);
    rows.push_back(n);
    for (int64_t p = begin; p < r.observed_end; ++p) tokens.push_back(q.tokens[static_cast<size_t>(p + 1)]);
  }
  if (active.empty()) return;
  std::vector<Request*> drafted;
  for (const Active& a : active) drafted.push_back(a.request);

  // Step 0 over every pending context row; the chain continues from each request's last row.
  core::Tensor hidden = model_.alloc(static_cast<int64_t>(tokens.size()), H);
  for (int64_t row = 0; const Active& a : active) {
    model_.copy_rows(hidden, row, a.request->pending.view());
    row += a.request->pending.rows;
  }
  Eagle3Output o = model_.forward(caches, rows, tokens, hidden.view());
  std::vector<int64_t> last;  // each request's last row in the pass
  for (int64_t end = 0; int64_t n : rows) last.push_back((end += n) - 1);
  for (int32_t k = 0;; ++k) {
    // The last row of each request: its draft token, and (prenorm) the next chain row's hidden.
    const core::Tensor normed = model_.alloc(static_cast<int64_t>(last.size()), H);
    core::Tensor next_hidden = model_.alloc(static_cast<int64_t>(last.size()), H);
    for (size_t b = 0; b < last.size(); ++b) {
      model_.copy_rows(normed, static_cast<int64_t>(b), rows_of(o.normed.view(), last[b], 1));
      model_.copy_rows(next_hidden, static_cast<int64_t>(b), rows_of(o.prenorm.view(), last[b], 1));
    }
    const std::vector<int32_t> drafts = model_.greedy_tokens(model_.logits(normed.view()).view());
    std::vector<Active> next;
    std::vector<Eagle3Cache*> next_caches;
    std::vector<int32_t> next_tokens;
    std::vector<int64_t> keep;  // rows of next_hidden that go on
    for (size_t b = 0; b < active.size(); ++b) {
      out[active[b].query].tokens.push_back(drafts[b]);
      if (k + 1 >= active[b].max_drafts) continue;
      next.push_back(active[b]);
      next_caches.push_back(caches[b]);
      next_tokens.push_back(drafts[b]);
      keep.push_back(static_cast<int64_t>(b));
    }
    if (next.empty()) break;
    if (keep.size() != active.size()) {  // some requests finished their chain: compact the hidden rows
      core::Tensor compact = model_.alloc(static_cast<int64_t>(keep.size()), H);
      for (size_t j = 0; j < keep.size(); ++j)
        model_.copy_rows(compact, static_cast<int64_t>(j), rows_of(next_hidden.view(), keep[j], 1));
      next_hidden = compact;
    }
    active = std::move(next);
    caches = std::move(next_caches);
    tokens = std::move(next_tokens);
    rows.assign(active.size(), 1);
    last.resize(active.size());
    for (size_t b = 0; b < last.size(); ++b) last[b] = static_cast<int64_t>(b);
    o = model_.forward(caches, rows, tokens, next_hidden.view());
  }
  // Keep only rows from committed taps, the newest of them pending again (see the header).
  for (Request* r : drafted) {
    const int64_t n = r->pending.rows;
    RowBuffer newest;
    model_.append(newest, rows_of(r->pending.view(), n - 1, 1));
    model_.truncate(r->cache, r->observed_end - 1);
    r->pending = std::move(newest);
  }
}

void Eagle3Drafter::release(spec::RequestId id) { requests_.erase(id); }

int64_t Eagle3Drafter::cache_bytes() const {
  int64_t n = 0;
  for (const auto& [id, r] : requests_) n += r.cache.bytes() + r.pending.bytes();
  return n;
}

int64_t Eagle3Drafter::observed_end(spec::RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? -1 : it->second.observed_end;
}

}  // namespace k3::draft
