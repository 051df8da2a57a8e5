// engine/step_masks.cpp: StepMasks.
#include "engine/step_masks.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace k3::engine {

StepMasks::StepMasks() : worker_([this] { worker_loop(); }) {}

StepMasks::~StepMasks() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void StepMasks::start(const scheduler::StepPlan& plan, int64_t words, MatcherOf matcher_of) {
  {  // a fill still running (a step that failed before waiting) ends before its rows are reused
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return !running_; });
    error_ = nullptr;
  }
  jobs_.clear();
  if (plan.num_mask_rows == 0) return;
  words_ = words;
  masks_.assign(static_cast<size_t>(plan.num_mask_rows * words), 0);
  for (const scheduler::ScheduledSequence& q : plan.seqs) {
    if (q.mask_row < 0) continue;
    structured::Matcher* m = matcher_of(q);
    K3_CHECK(m != nullptr, "StepMasks: request " + std::to_string(q.id) + " has mask rows but no grammar");
    const int32_t rows = q.verify() ? q.num_tokens : 1;
    K3_CHECK(q.mask_row + rows <= plan.num_mask_rows, "StepMasks: the plan's mask rows overlap its count");
    jobs_.push_back({m, q.mask_row, rows, q.verify() ? plan.tokens_of(q).subspan(1) : std::span<const int32_t>{}});
  }
  if (jobs_.size() > 1 && !pool_)
    pool_ = std::make_unique<backends::cpu::ThreadPool>(
        std::clamp(backends::cpu::ThreadPool::machine_threads() / 2, 1, 8));
  {
    std::lock_guard lk(mu_);
    pending_ = running_ = true;
    error_ = nullptr;
  }
  cv_.notify_all();
}

void StepMasks::wait() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !running_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

std::span<const uint32_t> StepMasks::row(int32_t r) const {
  return std::span(masks_).subspan(static_cast<size_t>(r * words_), static_cast<size_t>(words_));
}

void StepMasks::fill_job(const Job& job) {
  structured::Matcher& m = *job.matcher;
  const auto row_of = [&](int32_t j) {
    return std::span(masks_).subspan(static_cast<size_t>((job.first_row + j) * words_), static_cast<size_t>(words_));
  };
  int advanced = 0;
  int32_t j = 0;
  for (; j < job.rows; ++j) {
    m.fill_mask(row_of(j));
    if (j + 1 == job.rows || !m.accept(job.drafts[static_cast<size_t>(j)])) break;
    ++advanced;
    if (m.terminated()) break;
  }
  for (int32_t k = j + 1; k < job.rows; ++k) std::ranges::copy(row_of(j), row_of(k).begin());
  m.rollback(advanced);
}

void StepMasks::fill() {
  // Each job's matcher is its own; the grammars' shared mask caches are thread-safe.
  const auto fill_range = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fill_job(jobs_[static_cast<size_t>(i)]);
  };
  if (jobs_.size() > 1) pool_->parallel_for(static_cast<int64_t>(jobs_.size()), fill_range);
  else fill_range(0, static_cast<int64_t>(jobs_.size()));
}

void StepMasks::worker_loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return pending_ || stop_; });
    if (stop_) return;
    pending_ = false;
    lk.unlock();
    std::exception_ptr error;
    try {
      fill();
    } catch (...) {
      error = std::current_exception();
    }
    lk.lock();
    error_ = error;
    running_ = false;
    cv_.notify_all();
  }
}

}  // namespace k3::engine
