// engine/step_masks.h: the grammar masks of a step's constrained rows, filled on a background thread
// while the executor runs the step.
//
// The plan gives every sampled sequence of a constrained request its mask rows
// (scheduler::ScheduledSequence::mask_row; StepPlan::num_mask_rows in all): one per logits row it
// samples. start() hands the fill to the worker and returns at once, so the host walks the
// grammars while the forward runs (on the GPU, or on the CPU's other threads); wait() returns when
// every row is filled, before the step samples. A row's mask is its grammar's after the tokens
// before it: a plain row's is the matcher's state now; row j of a verify sequence follows drafts
// d_1..d_j (the matcher advances over them, then rolls back to where it was); the rows after a
// draft the grammar refuses, or after an accepted end token, repeat the last mask (that draft's
// row has it at -inf, so acceptance stops before them). Between start() and wait() only the worker
// touches the plan's matchers and the plan; the caller keeps both alive and unchanged.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "scheduler/step_plan.h"
#include "structured/matcher.h"

namespace k3::engine {

class StepMasks {
 public:
  using MatcherOf = std::function<structured::Matcher*(const scheduler::ScheduledSequence&)>;
  StepMasks();
  ~StepMasks();
  StepMasks(const StepMasks&) = delete;
  StepMasks& operator=(const StepMasks&) = delete;

  // Starts filling the plan's num_mask_rows rows of `words` words each (ceil(vocab / 32): bit t of
  // word t / 32 set = token t allowed). matcher_of(q) is sequence q's matcher, for every q with a
  // mask row. A plan without mask rows starts nothing.
  void start(const scheduler::StepPlan& plan, int64_t words, MatcherOf matcher_of);
  // Waits for the fill started last (if any); rethrows its error (a sequence without a matcher).
  void wait();
  // Row r of the last filled plan (valid until the next start()).
  std::span<const uint32_t> row(int32_t r) const;

 private:
  struct Job {
    structured::Matcher* matcher;
    int32_t first_row, rows;
    std::span<const int32_t> drafts;  // a verify sequence's: rows - 1 of them
  };
  void fill();  // on the worker: every job, over the pool
  void fill_job(const Job& job);
  void worker_loop();

  int64_t words_ = 0;
  std::vector<uint32_t> masks_;  // [rows, words_]
  std::vector<Job> jobs_;
  std::unique_ptr<backends::cpu::ThreadPool> pool_;  // made when a step first has two jobs
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false, running_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;  // last: started after everything it reads
};

}  // namespace k3::engine
