// engine/model_executor.cpp: ModelExecutor.
#include "engine/model_executor.h"

#include <algorithm>

#include "core/error.h"

namespace k3::engine {

namespace {
// A scheduler block of block_size tokens is block_size / dcp local positions on each rank under
// decode context parallelism (model/layers/context.h ContextSplit).
int32_t page_tokens(int32_t block_size, int dcp) {
  K3_CHECK(dcp >= 1 && block_size % dcp == 0, "decode context parallelism: the cache block_size " +
                                                  std::to_string(block_size) + " must be a multiple of dcp " +
                                                  std::to_string(dcp) +
                                                  " (each rank holds block_size / dcp of its tokens)");
  return block_size / dcp;
}

model::KvStorageConfig storage_config(const cache::CacheConfig& c, model::KvCacheDtype kv_dtype, int dcp) {
  c.validate();
  model::KvStorageConfig s;
  s.num_blocks = c.num_blocks;
  s.block_size = page_tokens(c.block_size, dcp);
  s.num_slots = c.num_slots;
  s.num_checkpoints = c.enable_prefix_cache ? c.num_checkpoints : 0;
  s.kv_dtype = kv_dtype;
  return s;
}
}  // namespace

cache::CacheConfig size_model_cache(const config::K3Config& config, model::KvCacheDtype kv_dtype,
                                    const cache::CacheConfig& base, int64_t budget_bytes, double checkpoint_fraction,
                                    int64_t max_model_len, int dcp) {
  cache::CacheBudget b;
  b.bytes = budget_bytes;
  b.bytes_per_block = model::KvStorage::bytes_per_block(config, page_tokens(base.block_size, dcp), kv_dtype);
  b.bytes_per_kda_state = model::KvStorage::bytes_per_kda_state(config);
  b.checkpoint_fraction = checkpoint_fraction;
  const auto min_blocks = static_cast<int32_t>((max_model_len + base.block_size - 1) / base.block_size);
  return cache::size_cache(b, base, min_blocks);
}

void apply_model_defaults(const config::K3Config& model, scheduler::SchedulerConfig& sched,
                          const cache::CacheConfig& cache, int32_t* eos_token_id) {
  if (sched.chunk_align_tokens == 0) {
    const int32_t kda = std::max(model.kda.chunk_size, 1);
    sched.chunk_align_tokens = (kda + cache.block_size - 1) / cache.block_size * cache.block_size;
  }
  if (eos_token_id) *eos_token_id = model.eos_token_id;
  sched.validate(cache);
}

ModelExecutor::ModelExecutor(const model::Model& model, const cache::CacheConfig& cache, model::KvCacheDtype kv_dtype,
                             int64_t graph_max_model_len)
    : model_(model),
      storage_(model.config(), storage_config(cache, kv_dtype, model.options().dcp), model.memory(),
               model.options().precision) {
  // Tensor-parallel ranks capture too: each rank's graph holds its step's collectives.
  if (graph_max_model_len > 0 && model.options().device != core::Device::cpu)
    graphs_ = std::make_unique<model::DecodeGraphs>(model_, storage_,
                                                    (graph_max_model_len + cache.block_size - 1) / cache.block_size);
  // Sampling on the device needs the logits on this model's device, which a TP rank's executor
  // does not hand out (engine/tp_executor.h returns rank 0's host logits).
  if (model.options().device != core::Device::cpu && model.tp_size() == 1)
    device_sampler_ = std::make_unique<runner::DeviceSampler>(model.ops(), model.memory());
}

core::Tensor ModelExecutor::execute(const BatchPlan& plan) {
  for (scheduler::RequestId id : plan.dropped) states_.erase(id);
  for (const SlotPrep& p : plan.prepare) {
    if (p.restore_checkpoint >= 0) storage_.restore_checkpoint(p.restore_checkpoint, p.slot);
    else storage_.reset_slot(p.slot);
  }
  batch_.clear();
  for (const PlannedSequence& q : plan.seqs) {
    model::SequenceState* st = nullptr;
    if (q.fresh) {
      st = &states_[q.id];
      st->num_tokens = q.start;
      st->kda_slot = q.kda_slot;
      st->block_table.assign(q.new_blocks.begin(), q.new_blocks.end());
    } else {
      const auto it = states_.find(q.id);
      K3_CHECK(it != states_.end(), "ModelExecutor: request " + std::to_string(q.id) + " continues but has no state");
      st = &it->second;
      K3_CHECK(st->num_tokens == q.start && st->kda_slot == q.kda_slot,
               "ModelExecutor: request " + std::to_string(q.id) + " state holds " + std::to_string(st->num_tokens) +
                   " tokens, the plan starts at " + std::to_string(q.start));
      st->block_table.insert(st->block_table.end(), q.new_blocks.begin(), q.new_blocks.end());
    }
    batch_.push_back(model::SequenceInput{q.tokens, st, q.kind, q.num_drafts > 0});
  }
  capture_.clear();  // a failed step may have left one: its requests are gone
  model::HiddenTaps* taps = taps_.layers.empty() ? nullptr : &taps_;
  const model::LogitRows rows = plan.num_verifies > 0 ? model::LogitRows::verify : model::LogitRows::last;
  // Plain steps on a GPU keep their logits there for the device sampler; verify steps (sampled
  // row by row against drafts on the host) and tapped steps bring them back.
  const model::LogitsAt at = device_sampler_ && plan.num_verifies == 0 && !taps ? model::LogitsAt::device
                                                                                : model::LogitsAt::host;
  // Pure-decode steps and verify steps of equal draft counts replay captured graphs (DecodeGraphs).
  core::Tensor logits = !taps && graphs_ && graphs_->eligible(batch_)
                            ? graphs_->forward(batch_, at, plan.num_verifies > 0 ? &capture_ : nullptr)
                            : model_.forward(storage_, batch_, rows, nullptr,
                                             plan.num_verifies > 0 ? &capture_ : nullptr, taps, at);
  if (taps) {  // host [rows, layers * hidden], row-major, the layers side by side
    const int64_t H = model_.config().hidden_size, n = static_cast<int64_t>(taps_.layers.size());
    taps_host_ = core::Tensor::zeros(core::DType::f32, {plan.num_tokens, n * H});
    for (int64_t i = 0; i < n; ++i) {
      const core::Tensor& v = taps_.values[static_cast<size_t>(i)];
      const core::Tensor host = v.view().device == core::Device::cpu && v.dtype() == core::DType::f32
                                    ? v
                                    : model_.memory()->download_f32(v.view());
      K3_CHECK(host.dim(0) == plan.num_tokens && host.dim(1) == H, "ModelExecutor: a tap has the wrong shape");
      for (int64_t r = 0; r < plan.num_tokens; ++r)
        std::copy_n(host.data<const float>() + r * H, H, taps_host_.data<float>() + (r * n + i) * H);
    }
  }
  for (const CheckpointSave& s : plan.saves) storage_.save_checkpoint(s.slot, s.checkpoint);
  return logits;
}

void ModelExecutor::commit_verified(std::span<const int32_t> accepted_rows) {
  // After a verify step replayed from a graph, its commit replays one too (DecodeGraphs tells).
  if (graphs_) graphs_->commit_verified(capture_, accepted_rows);
  else model_.commit_verified(storage_, capture_, accepted_rows);
}

void ModelExecutor::set_hidden_tap(std::span<const int32_t> layers) {
  for (int32_t l : layers)
    K3_CHECK(l >= 0 && l + 1 < model_.config().num_hidden_layers,
             "ModelExecutor: tap layer " + std::to_string(l) + " has no next layer (the model has " +
                 std::to_string(model_.config().num_hidden_layers) + ")");
  taps_.layers.assign(layers.begin(), layers.end());
}

}  // namespace k3::engine
