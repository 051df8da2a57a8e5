// engine/executor.h: what runs a step's plan (scheduler/step_plan.h). ModelExecutor
// (model_executor.h) runs the model on its KvStorage; tests use a fake with the same contract.
#pragma once
#include <cstdint>
#include <span>

#include "core/error.h"
#include "core/tensor.h"
#include "scheduler/step_plan.h"
#include "scheduler/step_route.h"

namespace k3::runner {
class DeviceSampler;
}

namespace k3::engine {

using scheduler::StepPlan;
struct ShadowReport;  // engine/shadow_validation.h

class Executor {
 public:
  virtual ~Executor() = default;
  virtual int32_t vocab_size() const = 0;
  // Runs the plan: drops the preempted, prepares fresh slots, forward on the plan's route (its
  // decode path and graph bucket), saves. Returns f32 logits [plan.num_logit_rows, vocab]:
  // plan.seqs[i].logit_rows() rows per sequence in plan order (its last token's; every row of a
  // verify or every_row sequence; rows of sequences that neither sample nor hand out logits are
  // ignored), on the host or, with `at` device (the engine asks for
  // it only from an executor with a device_sampler(), for a step without verify rows or logits it
  // hands out), on the model's device, valid until the next execute(). Throws on failure; the
  // engine then fails the step's requests.
  virtual core::Tensor execute(const StepPlan& plan, core::LogitsAt at) = 0;
  // The sampler for device logits (runner::sample_rows(): tokens and logprobs come back rather than
  // logits); nullptr (the default): the executor always returns host logits.
  virtual runner::DeviceSampler* device_sampler() { return nullptr; }
  // The request left the engine (finished, aborted, failed): forget its sequence state.
  virtual void release(scheduler::RequestId id) = 0;

  // Speculative decoding. A plan sequence with num_drafts > 0 is a verify sequence: execute()
  // returns ALL its num_drafts + 1 rows (in order, where its single row would be) and leaves its
  // committed KDA state untouched. After acceptance
  // the engine calls commit_verified once with, per verify sequence in plan order, the rows it
  // keeps (accepted drafts + 1): the executor replays them into the committed state and truncates
  // the sequence to them (spec §5.9 (b)). Executors without it refuse verify plans.
  virtual bool supports_verify() const { return false; }
  virtual void commit_verified(std::span<const int32_t> accepted_rows) { (void)accepted_rows; }
  // Hidden-state taps for a model drafter (spec/drafter.h): after set_hidden_tap(layers), every
  // execute() leaves host f32 [plan.num_tokens, layers.size() * hidden] in hidden_taps(): per plan
  // row (sequences' tokens in plan order), the tapped mixtures concatenated in `layers` order.
  virtual void set_hidden_tap(std::span<const int32_t> layers) {
    if (!layers.empty()) throw core::Error("this executor cannot tap the target's hidden states");
  }
  virtual const core::Tensor* hidden_taps() const { return nullptr; }
  // What it runs: its decode path, the fused path's scope, the steps it replays as captured graphs
  // (the default: the standard path, every step eager). The scheduler routes every plan by it
  // (scheduler/step_route.h) and execute() follows the plan's route; the engine asks once, after
  // set_hidden_tap (a tapped step replays a graph that taps too).
  virtual scheduler::ExecutionScope scope() const { return {}; }
  // Shadow validation: after execute() of a plan whose route has `shadow`, the comparison of its
  // fused logits with the standard path's on the same inputs (engine/shadow_validation.h); null
  // after any other step. An executor that cannot run the standard path beside the fused one never
  // offers a fused path (scope()), so no plan routed by its scope asks for a shadow.
  virtual const ShadowReport* last_shadow() const { return nullptr; }
};

}  // namespace k3::engine
