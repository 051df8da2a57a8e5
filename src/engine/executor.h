// engine/executor.h: what runs a BatchPlan. ModelExecutor (model_executor.h) runs the model
// on its KvStorage; tests use a fake with the same contract.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "engine/plan.h"

namespace k3::engine {

class Executor {
 public:
  virtual ~Executor() = default;
  virtual int32_t vocab_size() const = 0;
  // Runs the plan: prepare, forward, saves. Returns f32 logits [plan.seqs.size(), vocab],
  // row i = the last token of plan.seqs[i] (rows of sequences that do not sample are
  // ignored). Throws on failure; the engine then fails the step's requests.
  virtual core::Tensor execute(const BatchPlan& plan) = 0;
  // The request left the engine (finished, aborted, failed): forget its sequence state.
  virtual void release(scheduler::RequestId id) = 0;
};

}  // namespace k3::engine
