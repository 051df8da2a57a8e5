// engine/fake_executor.h: an Executor without a model, for engine tests and benchmarks.
// Header only.
//
// It runs the plan on scheduler/fake_kv_storage.h (real data under the cache's ids, every
// KV read checked against the request's true tokens) and returns logits whose argmax is the
// fake's token, so greedy outputs depend only on each request's tokens when the bookkeeping
// is right. Optional: fail on a chosen step, count calls, skip the checks (benchmarks).
#pragma once
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "engine/executor.h"
#include "scheduler/fake_kv_storage.h"

namespace k3::engine::testing {

class FakeExecutor final : public Executor {
 public:
  using TokensOf = scheduler::testing::FakeKvStorage::TokensOf;

  FakeExecutor(const cache::CacheConfig& cache, int32_t vocab) : kv_(cache, vocab), vocab_(vocab) {}

  // Where the request's true tokens come from (Engine::scheduler().find(id)->tokens()).
  void set_tokens_of(TokensOf f) { tokens_of_ = std::move(f); }
  // execute() throws on the n-th call (1-based; 0: never).
  void fail_on_call(int64_t n) { fail_on_ = n; }
  int64_t calls() const { return calls_; }
  // What it says it runs (scheduler/step_route.h; default: the standard path, no graphs), and the
  // route of every plan it ran, in order.
  void set_scope(scheduler::ExecutionScope scope) { scope_ = std::move(scope); }
  scheduler::ExecutionScope scope() const override { return scope_; }
  const std::vector<core::StepRoute>& routes() const { return routes_; }
  size_t num_states() const { return kv_.num_sequences(); }

  int32_t vocab_size() const override { return vocab_; }
  void release(scheduler::RequestId id) override { kv_.drop(id); }

  core::Tensor execute(const StepPlan& plan, core::LogitsAt) override {
    ++calls_;
    routes_.push_back(plan.route);
    if (calls_ == fail_on_) throw core::Error("fake executor: injected failure on call " + std::to_string(calls_));
    std::vector<int32_t> sampled;
    kv_.run_step(plan, tokens_of_, sampled);
    core::Tensor logits = core::Tensor::zeros(core::DType::f32, {plan.num_logit_rows, vocab_});
    size_t k = 0;
    int64_t row_end = 0;  // past sequence i's rows; its last row is the one sampled
    for (const scheduler::ScheduledSequence& q : plan.seqs) {
      row_end += q.logit_rows();
      if (!q.sample) continue;
      float* row = logits.data<float>() + (row_end - 1) * vocab_;
      // A peaked but smooth row: greedy picks the fake's token; sampling and logprobs see a
      // real distribution.
      for (int32_t v = 0; v < vocab_; ++v) row[v] = -0.01f * static_cast<float>((v * 7 + sampled[k]) % vocab_);
      row[sampled[k]] = 8.0f;
      ++k;
    }
    return logits;
  }

 private:
  scheduler::testing::FakeKvStorage kv_;
  int32_t vocab_;
  TokensOf tokens_of_;
  int64_t calls_ = 0, fail_on_ = 0;
  scheduler::ExecutionScope scope_;
  std::vector<core::StepRoute> routes_;
};

}  // namespace k3::engine::testing
