// draft/eagle3_drafter.cpp: Eagle3Drafter (see eagle3_drafter.h).
#include "draft/eagle3_drafter.h"

#include <algorithm>
#include <cstring>

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
                                                   Eagle3Options model_options, Eagle3DrafterOptions options) {
  auto owned = std::make_shared<OwnedEagle3>();
  owned->loaded = load_eagle3(dir, target_config, target_weights);
  owned->model = std::make_unique<Eagle3Model>(owned->loaded.config, owned->loaded.weights, ops, model_options);
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
  core::TensorView hidden = rows.hidden;
  core::Tensor host;
  if (hidden.device != core::Device::cpu || hidden.dtype != core::DType::f32) {
    K3_CHECK(options_.target_memory != nullptr,
             "Eagle3Drafter::observe: tap rows on the device but no target_memory to download them");
    host = options_.target_memory->download_f32(hidden);
    hidden = host.view();
  }
  K3_CHECK(hidden.rank() == 2 && hidden.dim(0) == rows.rows(), "Eagle3Drafter::observe: hidden has " +
                                                                   hidden.shape.str() + " for " +
                                                                   std::to_string(rows.rows()) + " rows");
  const int64_t H = model_.config().hidden_size, p = rows.position;
  auto it = requests_.find(id);
  if (it == requests_.end()) it = requests_.emplace(id, fresh(p)).first;
  Request& r = it->second;
  if (p > r.observed_end || p < r.cache.first_position) {
    r = fresh(p);                   // a gap (or rows before the first seen): start again from these rows
  } else if (p < r.observed_end) {  // rows re-run after a rollback
    if (p >= r.cache.end_position()) {
      r.pending.resize(static_cast<size_t>((p - r.cache.end_position()) * H));
    } else {
      model_.truncate(r.cache, p);
      r.pending.clear();
    }
    r.observed_end = p;
  }
  const core::Tensor fused = model_.fuse_taps(hidden);
  r.pending.insert(r.pending.end(), fused.data<const float>(), fused.data<const float>() + fused.numel());
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
  std::vector<float> hidden;
  for (size_t i = 0; i < batch.size(); ++i) {
    const spec::DraftQuery& q = batch[i];
    out[i].clear();
    auto it = requests_.find(q.id);
    if (it == requests_.end() || q.max_drafts <= 0) continue;
    Request& r = it->second;
    const int64_t begin = r.cache.end_position(), n = r.observed_end - begin;
    if (static_cast<int64_t>(q.tokens.size()) != r.observed_end + 1 || n <= 0) continue;
    active.push_back({i, &r, q.max_drafts});
    caches.push_back(&r.cache);
    rows.push_back(n);
    for (int64_t p = begin; p < r.observed_end; ++p) tokens.push_back(q.tokens[static_cast<size_t>(p + 1)]);
    hidden.insert(hidden.end(), r.pending.begin(), r.pending.end());
  }
  if (active.empty()) return;
  std::vector<Request*> drafted;
  for (const Active& a : active) drafted.push_back(a.request);

  // Step 0 over every pending context row; the chain continues from each request's last row.
  auto run = [&](const std::vector<float>& h) {
    core::Tensor x = core::Tensor::zeros(core::DType::f32, {static_cast<int64_t>(tokens.size()), H});
    std::copy(h.begin(), h.end(), x.data<float>());
    return model_.forward(caches, rows, tokens, x);
  };
  Eagle3Output o = run(hidden);
  std::vector<int64_t> last;  // each request's last row in the pass
  for (int64_t end = 0; int64_t n : rows) last.push_back((end += n) - 1);
  for (int32_t k = 0;; ++k) {
    const core::Tensor logits = [&] {  // the last row of each request only
      core::Tensor normed = core::Tensor::zeros(core::DType::f32, {static_cast<int64_t>(last.size()), H});
      for (size_t b = 0; b < last.size(); ++b)
        std::memcpy(normed.data<float>() + b * H, o.normed.data<const float>() + last[b] * H,
                    sizeof(float) * static_cast<size_t>(H));
      return model_.logits(normed);
    }();
    std::vector<Active> next;
    std::vector<Eagle3Cache*> next_caches;
    std::vector<int32_t> next_tokens;
    std::vector<float> next_hidden;
    for (size_t b = 0; b < active.size(); ++b) {
      const int32_t t = model_.greedy_token(logits.data<const float>() + b * logits.dim(1));
      out[active[b].query].tokens.push_back(t);
      if (k + 1 >= active[b].max_drafts) continue;
      next.push_back(active[b]);
      next_caches.push_back(caches[b]);
      next_tokens.push_back(t);
      const float* h = o.prenorm.data<const float>() + last[b] * H;
      next_hidden.insert(next_hidden.end(), h, h + H);
    }
    if (next.empty()) break;
    active = std::move(next);
    caches = std::move(next_caches);
    tokens = std::move(next_tokens);
    rows.assign(active.size(), 1);
    last.resize(active.size());
    for (size_t b = 0; b < last.size(); ++b) last[b] = static_cast<int64_t>(b);
    o = run(next_hidden);
  }
  // Keep only rows from committed taps, the newest of them pending again (see the header).
  for (Request* r : drafted) {
    const std::vector<float> newest(r->pending.end() - H, r->pending.end());
    model_.truncate(r->cache, r->observed_end - 1);
    r->pending = newest;
  }
}

void Eagle3Drafter::release(spec::RequestId id) { requests_.erase(id); }

int64_t Eagle3Drafter::cache_bytes() const {
  int64_t n = 0;
  for (const auto& [id, r] : requests_)
    n += r.cache.bytes() + static_cast<int64_t>(r.pending.capacity() * sizeof(float));
  return n;
}

int64_t Eagle3Drafter::observed_end(spec::RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? -1 : it->second.observed_end;
}

}  // namespace k3::draft
