// backends/cpu/thread_pool.cpp: ThreadPool.
#include "backends/cpu/thread_pool.h"

#include <algorithm>
#include <exception>

namespace k3::backends::cpu {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

// True on a thread that is running a part of some pool's job (a worker, or the caller of
// parallel_for): a parallel_for issued from there runs inline instead of waiting for call_mu_,
// which the outer call holds (a worker calling back into its own pool would deadlock).
static thread_local bool t_inside_job = false;

static void run_part(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int parts, int part) {
  const int64_t begin = n * part / parts, end = n * (part + 1) / parts;
  if (begin < end) fn(begin, end);
}

void ThreadPool::worker_loop(int id) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    int parts;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      parts = job_parts_;
    }
    std::exception_ptr err;
    if (id < parts) {
      t_inside_job = true;
      try {
        run_part(*job, n, parts, id);
      } catch (...) {
        err = std::current_exception();
      }
      t_inside_job = false;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (err && !worker_error_) worker_error_ = err;
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_per_task) {
  if (n <= 0) return;
  ++calls_;
  const int parts = static_cast<int>(std::min<int64_t>(size(), n / std::max<int64_t>(1, min_per_task)));
  if (parts <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  // One job at a time; nested calls from inside a task (on any thread) run inline.
  if (t_inside_job) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> call_lock(call_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_parts_ = parts;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  cv_.notify_all();
  t_inside_job = true;
  std::exception_ptr err;
  try {
    run_part(fn, n, parts, 0);
  } catch (...) {
    err = std::current_exception();
  }
  t_inside_job = false;
  {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (!err) err = worker_error_;
    worker_error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

int ThreadPool::machine_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

void parallel_for(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_per_task) {
  if (pool) return pool->parallel_for(n, fn, min_per_task);
  if (n > 0) fn(0, n);
}

}  // namespace k3::backends::cpu
