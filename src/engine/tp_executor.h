// engine/tp_executor.h: an Executor over a tensor-parallel model (runner::TpRunner): one
// ModelExecutor per rank, each with its own KvStorage (the rank's KDA heads, a full copy of the
// MLA latent cache: spec §11) and its own CUDA graphs, run in lock step on the ranks' threads.
//
// Every rank executes the same plan (the scheduler, cache manager and request state stay single:
// the block ids and KDA slots a plan names are valid in every rank's storage because every rank's
// storage is built from the same CacheConfig). The logits every rank ends with are the same
// (vocab-parallel lm_head all-gathered), so rank 0's are returned; so are its hidden-state taps
// (the residual stream is replicated after each all-reduce). Sampling stays on the host.
//
// Decode context parallelism (the runner's options.dcp = tp): the MLA cache is split over the ranks
// by token instead of replicated; a block id of the plan names cache.block_size global tokens,
// cache.block_size / tp of them in each rank's pages (ModelExecutor), so the scheduler's blocks
// hold tp times the tokens of the same memory.
#pragma once
#include <memory>
#include <vector>

#include "engine/model_executor.h"

namespace k3::runner {
class TpRunner;
}

namespace k3::engine {

class TpExecutor final : public Executor {
 public:
  // `runner` must outlive the executor. The rank executors are built on the ranks' threads (each
  // allocates its storage on its own device).
  TpExecutor(const runner::TpRunner& runner, const cache::CacheConfig& cache, model::KvCacheDtype kv_dtype,
             int64_t graph_max_model_len = 0);
  ~TpExecutor() override;

  int32_t vocab_size() const override;
  core::Tensor execute(const StepPlan& plan, core::LogitsAt at) override;  // at: host only
  void release(scheduler::RequestId id) override;
  bool supports_verify() const override { return true; }
  void commit_verified(std::span<const int32_t> accepted_rows) override;
  void set_hidden_tap(std::span<const int32_t> layers) override;
  const core::Tensor* hidden_taps() const override { return ranks_.front()->hidden_taps(); }
  scheduler::ExecutionScope scope() const override { return ranks_.front()->scope(); }  // every rank's is the same
  // Every rank runs the shadow of a shadowed plan (its collectives too); rank 0's logits are compared.
  const ShadowReport* last_shadow() const override { return ranks_.front()->last_shadow(); }

  int tp() const { return static_cast<int>(ranks_.size()); }
  ModelExecutor& rank(int r) { return *ranks_.at(static_cast<size_t>(r)); }

 private:
  const runner::TpRunner& runner_;
  std::vector<std::unique_ptr<ModelExecutor>> ranks_;
};

}  // namespace k3::engine
