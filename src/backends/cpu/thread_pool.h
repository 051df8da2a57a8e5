// backends/cpu/thread_pool.h: a small fixed thread pool with a blocking parallel_for.
//
// The CPU oracle splits independent work (output rows, heads, tokens) across threads;
// each index is computed by exactly one thread in a fixed order, so results do not
// depend on the thread count.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace k3::backends::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 1: run inline
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Calls fn(begin, end) over [0, n) in contiguous chunks; returns when all are done.
  // Small n (below min_per_task * 2) runs inline.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_per_task = 1);

  // parallel_for calls made on this pool so far (n > 0), inline ones included: tests use it to
  // prove which pool an op ran on.
  int64_t calls() const { return calls_.load(); }

  // The machine's hardware threads (at least 1): the size an owner gives its pool by default.
  static int machine_threads();

 private:
  void worker_loop(int id);
  std::vector<std::thread> workers_;
  std::mutex mu_, call_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_parts_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::atomic<int64_t> calls_{0};
  std::exception_ptr worker_error_;
};

// pool->parallel_for(n, fn, min_per_task), or fn(0, n) on the calling thread when pool is null: the
// reference kernels take their pool from whoever registered them (kernels/op_table.h's CpuOps) and
// run inline when called directly without one. Same results either way.
void parallel_for(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                  int64_t min_per_task = 1);

}  // namespace k3::backends::cpu
