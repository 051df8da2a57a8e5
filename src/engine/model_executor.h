// engine/model_executor.h: runs step plans on a model::Model over a model::KvStorage sized
// from the cache config, keeping one model::SequenceState per running request.
//
// An engine over a model (the ModelRunner owns config, weights, registry and Model):
//   EngineConfig ec;  ec.cache.num_slots = ec.scheduler.max_num_seqs = 64;  (+ other limits)
//   ec.cache = size_model_cache(cfg, kv_dtype, ec.cache, budget_bytes, 0.2, ec.scheduler.max_model_len);
//   apply_model_defaults(cfg, ec.scheduler, ec.cache, &ec.eos_token_id);
//   Engine engine(ec, std::make_unique<ModelExecutor>(runner->model(), ec.cache, kv_dtype));
#pragma once
#include <cstdint>
#include <memory>
#include <span>

#include "cache/cache_config.h"
#include "engine/executor.h"
#include "scheduler/scheduler_config.h"

namespace k3::config {
struct K3Config;
}
namespace k3::model {
class Model;
class KvStorage;
class DecodeGraphs;
struct SequenceInput;
enum class KvCacheDtype : uint8_t;  // model/kv_storage.h
}  // namespace k3::model

namespace k3::engine {

// Cache counts for a model from a byte budget, at KvStorage's prices per page and per KDA
// state: base gives block_size, num_slots (= max running sequences), checkpoint interval and
// whether the prefix cache is on; the budget must hold one max_model_len sequence. Under decode
// context parallelism (`dcp` ranks, model::ModelOptions::dcp) a block of base.block_size tokens
// costs each rank the pages of base.block_size / dcp local positions: dcp times the tokens per byte.
cache::CacheConfig size_model_cache(const config::K3Config& config, model::KvCacheDtype kv_dtype,
                                    const cache::CacheConfig& base, int64_t budget_bytes, double checkpoint_fraction,
                                    int64_t max_model_len, int dcp = 1);

// What the engine should take from the model: its eos, and chunk_align_tokens = the KDA chunk
// size (rounded up to a page multiple) when left at 0, so prefill chunks start on KDA chunk
// boundaries and a prompt's logits do not depend on the batch or on prefix hits. Throws when
// the prefix cache's checkpoint interval is not a multiple of that alignment.
void apply_model_defaults(const config::K3Config& model, scheduler::SchedulerConfig& sched,
                          const cache::CacheConfig& cache, int32_t* eos_token_id);

// What `model` runs, as the scheduler routes by it (scheduler/step_route.h): its decode path and
// the fused path's scope, and with `graphs` (null: every step eager) the steps replayed as
// captured graphs. ModelExecutor::scope(), and benchmarks that drive a Model directly.
scheduler::ExecutionScope execution_scope(const model::Model& model, const model::DecodeGraphs* graphs);

// The route the scheduler gives a step of these sequences (scheduler::route_step over the same plan
// shape, by execution_scope(model, graphs)): for callers that drive a Model directly (benchmarks,
// eval, tests) and must run each step on the path the engine would.
core::StepRoute route_batch(const model::Model& model, const model::DecodeGraphs* graphs,
                            std::span<const model::SequenceInput> batch);

class ModelExecutor final : public Executor {
 public:
  // `model` must outlive the executor. Allocates the storage for `cache`'s counts (under decode
  // context parallelism, model.options().dcp > 1, pages of cache.block_size / dcp tokens: a block id
  // names the same block_size global tokens in every rank's storage, each rank holding its share). With
  // `graph_max_model_len` > 0, pure-decode steps of up to 64 sequences no longer than that many
  // tokens replay as CUDA graphs on devices that can capture (model/decode_graphs.h); 0: eager.
  ModelExecutor(const model::Model& model, const cache::CacheConfig& cache, model::KvCacheDtype kv_dtype,
                int64_t graph_max_model_len = 0);
  ~ModelExecutor() override;

  int32_t vocab_size() const override;
  core::Tensor execute(const StepPlan& plan, core::LogitsAt at) override;
  void release(scheduler::RequestId id) override;
  bool supports_verify() const override { return true; }
  void commit_verified(std::span<const int32_t> accepted_rows) override;
  void set_hidden_tap(std::span<const int32_t> layers) override;
  const core::Tensor* hidden_taps() const override;
  // On a GPU (one rank), plain steps leave their logits on the device for this sampler.
  runner::DeviceSampler* device_sampler() override;
  scheduler::ExecutionScope scope() const override;
  const ShadowReport* last_shadow() const override;

  model::KvStorage& storage();
  size_t num_states() const;
  // Decode steps served by a graph replay so far (0 without graphs).
  int64_t graph_replays() const;

 private:
  struct State;  // the model's storage, the running sequences' states, graphs, taps (model_executor.cpp)
  std::unique_ptr<State> s_;
};

}  // namespace k3::engine
