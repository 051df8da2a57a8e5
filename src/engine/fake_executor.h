// engine/fake_executor.h: an Executor without a model, for engine tests and benchmarks.
// Header only.
//
// It replays the plan on scheduler/fake_kv_storage.h (real data under the cache's ids, every
// KV read checked against the request's true tokens) and returns logits whose argmax is the
// fake's token, so greedy outputs depend only on each request's tokens when the bookkeeping
// is right. Optional: fail on a chosen step, count calls, skip the checks (benchmarks).
#pragma once
#include <functional>
#include <memory>

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
  size_t num_states() const { return kv_.num_sequences(); }

  int32_t vocab_size() const override { return vocab_; }
  void release(scheduler::RequestId id) override { kv_.drop(id); }

  core::Tensor execute(const BatchPlan& plan) override {
    ++calls_;
    if (calls_ == fail_on_) throw core::Error("fake executor: injected failure on call " + std::to_string(calls_));
    // The plan back in SchedulerOutput form, which the fake storage replays.
    out_.clear();
    out_.step = plan.step;
    out_.preempted = plan.dropped;
    for (const PlannedSequence& q : plan.seqs) {
      scheduler::ScheduledSequence s;
      s.id = q.id;
      s.start = q.start;
      s.num_tokens = static_cast<int32_t>(q.tokens.size());
      s.token_offset = static_cast<int32_t>(out_.tokens.size());
      out_.tokens.insert(out_.tokens.end(), q.tokens.begin(), q.tokens.end());
      s.block_offset = static_cast<int32_t>(out_.blocks.size());
      out_.blocks.insert(out_.blocks.end(), q.new_blocks.begin(), q.new_blocks.end());
      s.num_new_blocks = static_cast<int32_t>(q.new_blocks.size());
      s.kda_slot = q.kda_slot;
      s.sample = q.sample;
      if (q.fresh) {
        s.slot_init = scheduler::SlotInit::reset;
        for (const SlotPrep& p : plan.prepare)
          if (p.slot == q.kda_slot && p.restore_checkpoint >= 0) {
            s.slot_init = scheduler::SlotInit::restore;
            s.restore_checkpoint = p.restore_checkpoint;
          }
      }
      for (const CheckpointSave& c : plan.saves)
        if (c.slot == q.kda_slot) s.save_checkpoint = c.checkpoint;
      out_.seqs.push_back(s);
    }
    std::vector<int32_t> sampled;
    kv_.run_step(out_, tokens_of_, sampled);
    core::Tensor logits = core::Tensor::zeros(core::DType::f32, {static_cast<int64_t>(plan.seqs.size()), vocab_});
    size_t k = 0;
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      if (!plan.seqs[i].sample) continue;
      float* row = logits.data<float>() + static_cast<int64_t>(i) * vocab_;
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
  scheduler::SchedulerOutput out_;
  int64_t calls_ = 0, fail_on_ = 0;
};

}  // namespace k3::engine::testing
