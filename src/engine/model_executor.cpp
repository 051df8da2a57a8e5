// engine/model_executor.cpp: ModelExecutor.
#include "engine/model_executor.h"

#include <algorithm>

#include "core/error.h"

namespace k3::engine {

namespace {
model::KvStorageConfig storage_config(const cache::CacheConfig& c, model::KvCacheDtype kv_dtype) {
  c.validate();
  model::KvStorageConfig s;
  s.num_blocks = c.num_blocks;
  s.block_size = c.block_size;
  s.num_slots = c.num_slots;
  s.num_checkpoints = c.enable_prefix_cache ? c.num_checkpoints : 0;
  s.kv_dtype = kv_dtype;
  return s;
}
}  // namespace

cache::CacheConfig size_model_cache(const config::K3Config& config, model::KvCacheDtype kv_dtype,
                                    const cache::CacheConfig& base, int64_t budget_bytes, double checkpoint_fraction,
                                    int64_t max_model_len) {
  cache::CacheBudget b;
  b.bytes = budget_bytes;
  b.bytes_per_block = model::KvStorage::bytes_per_block(config, base.block_size, kv_dtype);
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
    : model_(model), storage_(model.config(), storage_config(cache, kv_dtype), model.memory(), model.options().precision) {
  if (graph_max_model_len > 0 && model.options().device != core::Device::cpu && model.tp_size() == 1)
    graphs_ = std::make_unique<model::DecodeGraphs>(
        model_, storage_, (graph_max_model_len + cache.block_size - 1) / cache.block_size);
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
    batch_.push_back(model::SequenceInput{q.tokens, st, q.kind});
  }
  core::Tensor logits = graphs_ && graphs_->eligible(batch_) ? graphs_->forward(batch_)
                                                              : model_.forward(storage_, batch_, model::LogitRows::last);
  for (const CheckpointSave& s : plan.saves) storage_.save_checkpoint(s.slot, s.checkpoint);
  return logits;
}

}  // namespace k3::engine
