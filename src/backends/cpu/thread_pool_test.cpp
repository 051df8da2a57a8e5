// backends/cpu/thread_pool_test.cpp: ThreadPool: every index visited exactly once in contiguous,
// deterministic chunks; exceptions propagate; 1-thread pools run inline; nested calls (also
// from worker threads) do not deadlock; the pool survives many back-to-back jobs.
#include "backends/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace k3::backends::cpu {
namespace {

// Runs one parallel_for and returns the sorted chunks it produced.
std::vector<std::pair<int64_t, int64_t>> chunks_of(ThreadPool& pool, int64_t n, int64_t min_per_task,
                                                   std::vector<std::atomic<int>>* visits) {
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  pool.parallel_for(
      n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) (*visits)[static_cast<size_t>(i)]++;
        std::lock_guard<std::mutex> lk(mu);
        chunks.emplace_back(begin, end);
      },
      min_per_task);
  std::sort(chunks.begin(), chunks.end());
  return chunks;
}

TEST(ThreadPool, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), std::max(threads, 1));
    for (int64_t n : {0, 1, 2, 3, 7, 17, 54, 97, 1000, 100003}) {
      for (int64_t min_per_task : {1, 16, 1000}) {
        std::vector<std::atomic<int>> visits(static_cast<size_t>(n));
        const auto chunks = chunks_of(pool, n, min_per_task, &visits);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(visits[static_cast<size_t>(i)].load(), 1)
              << "threads " << threads << " n " << n << " min " << min_per_task << " index " << i;
        // Contiguous, non-empty, non-overlapping, covering [0, n).
        int64_t next = 0;
        for (const auto& [b, e] : chunks) {
          EXPECT_EQ(b, next);
          EXPECT_LT(b, e);
          next = e;
        }
        EXPECT_EQ(next, n);
        EXPECT_LE(static_cast<int>(chunks.size()), pool.size());
        // Small jobs stay on one chunk (inline): fewer than 2 * min_per_task items.
        if (n < 2 * min_per_task) {
          EXPECT_LE(chunks.size(), 1u);
        }
      }
    }
  }
}

TEST(ThreadPool, ChunksAreDeterministic) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> visits(97);
  const auto first = chunks_of(pool, 97, 1, &visits);
  for (int rep = 0; rep < 20; ++rep) {
    std::vector<std::atomic<int>> v(97);
    EXPECT_EQ(chunks_of(pool, 97, 1, &v), first);
  }
  EXPECT_EQ(first.size(), 4u);
}

TEST(ThreadPool, OneThreadRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1);
  const auto caller = std::this_thread::get_id();
  int calls = 0;
  pool.parallel_for(1000, [&](int64_t b, int64_t e) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 1000);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  ThreadPool zero(0);  // <= 1 means inline too
  EXPECT_EQ(zero.size(), 1);
  int64_t sum = 0;
  zero.parallel_for(10, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum, 45);
}

TEST(ThreadPool, UsesSeveralThreads) {
  ThreadPool pool(4);
  std::mutex mu;
  std::vector<std::thread::id> ids;
  pool.parallel_for(4, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lk(mu);
    ids.push_back(std::this_thread::get_id());
  });
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()) - ids.begin(), 4);
}

TEST(ThreadPool, ExceptionsPropagateAndPoolStaysUsable) {
  ThreadPool pool(4);
  // Thrown in the caller's chunk (index 0), in a worker's chunk (last index), in all chunks.
  for (int64_t bad : {int64_t{0}, int64_t{99}, int64_t{-1}}) {
    try {
      pool.parallel_for(100, [&](int64_t b, int64_t e) {
        if (bad < 0 || (bad >= b && bad < e)) throw std::runtime_error("task failed at " + std::to_string(bad));
      });
      ADD_FAILURE() << "no exception for bad index " << bad;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "task failed at " + std::to_string(bad));
    }
    // The next job runs normally, and the error does not leak into it.
    std::vector<std::atomic<int>> visits(100);
    chunks_of(pool, 100, 1, &visits);
    for (auto& v : visits) ASSERT_EQ(v.load(), 1);
  }
  ThreadPool inline_pool(1);
  EXPECT_THROW(inline_pool.parallel_for(5, [](int64_t, int64_t) { throw std::logic_error("x"); }), std::logic_error);
}

TEST(ThreadPool, NestedCallsRunInlineWithoutDeadlock) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> visits(64 * 64);
  pool.parallel_for(64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      // Called from the caller thread and from worker threads alike.
      pool.parallel_for(64, [&](int64_t b2, int64_t e2) {
        for (int64_t j = b2; j < e2; ++j) visits[static_cast<size_t>(i * 64 + j)]++;
      });
    }
  });
  for (size_t k = 0; k < visits.size(); ++k) ASSERT_EQ(visits[k].load(), 1) << k;
}

TEST(ThreadPool, ManyBackToBackJobs) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  for (int rep = 0; rep < 3000; ++rep) {
    pool.parallel_for(7, [&](int64_t b, int64_t e) { total += e - b; });
  }
  EXPECT_EQ(total.load(), 3000 * 7);
}

TEST(ThreadPool, MachineThreadsIsAtLeastOne) { EXPECT_GE(ThreadPool::machine_threads(), 1); }

// The free parallel_for: with a pool it is the pool's; without one it runs the whole range inline,
// once, on the calling thread (how a reference kernel called directly runs).
TEST(ThreadPool, FreeParallelForUsesThePoolOrRunsInline) {
  ThreadPool pool(4);
  for (ThreadPool* p : {&pool, static_cast<ThreadPool*>(nullptr)}) {
    std::atomic<int64_t> sum{0};
    std::atomic<int> calls{0};
    std::atomic<bool> other_thread{false};
    const auto caller = std::this_thread::get_id();
    parallel_for(p, 1000, [&](int64_t b, int64_t e) {
      int64_t s = 0;
      for (int64_t i = b; i < e; ++i) s += i;
      sum += s;
      ++calls;
      if (std::this_thread::get_id() != caller) other_thread = true;
    });
    EXPECT_EQ(sum.load(), 999 * 1000 / 2);
    if (p) {
      EXPECT_EQ(calls.load(), 4);
      EXPECT_TRUE(other_thread.load());
    } else {
      EXPECT_EQ(calls.load(), 1);
      EXPECT_FALSE(other_thread.load());
    }
  }
  int calls = 0;
  parallel_for(nullptr, 0, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace k3::backends::cpu
