// comm/thread_comm_failure_test.cpp: the CPU thread-rank communicator never hangs on failure: a rank
// that throws, calls abort, or is aborted from outside makes the others throw core::Error; ranks
// out of step (different op, shape, dtype, root) and bad arguments are errors on every rank, with
// messages naming what differs. Every case runs under a hang guard, and the ranks that must be
// waiting in a collective when the failure comes are seen asleep there first (no sleeps).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "comm/comm_test_util.h"
#include "comm/rank_wait_test_util.h"
#include "comm/thread_comm.h"

namespace k3::comm {
namespace {

using core::DType;
using core::Shape;
using core::TensorView;
using namespace k3::comm::testing;
using namespace std::chrono_literals;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs fn on n ranks under a hang guard; returns each rank's error message ("" if it returned).
std::vector<std::string> rank_errors(ThreadGroup& group, const std::function<void(Communicator&)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(group.size()));
  with_hang_guard(30s, [&] {
    run_ranks(group, [&](Communicator& c) {
      try {
        fn(c);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(c.rank())] = e.what();
      }
    });
  });
  return errors;
}

TEST(ThreadCommFailure, ThrowingRankMakesTheOthersThrowAndRunRanksRethrowsTheFirst) {
  for (int n : {2, 4, 8}) {
    std::atomic<int> aborted_errors{0};
    RankThreads threads(n);
    std::vector<int> others;
    for (int r = 0; r < n - 1; ++r) others.push_back(r);
    try {
      with_hang_guard(30s, [&] {
        run_ranks(n, [&](Communicator& c) {
          float x[7] = {};
          c.all_reduce_sum(TensorView::contiguous(x, DType::f32, Shape{7}));  // one that succeeds
          if (c.rank() == n - 1) {
            // The others are blocked in the next collective before this rank fails.
            const std::string missed = wait_until_asleep(threads, others, "the second all_reduce_sum");
            if (!missed.empty()) throw std::runtime_error(missed);
            throw std::runtime_error("weights for rank failed to load");
          }
          try {
            threads.announce(c.rank());
            c.all_reduce_sum(TensorView::contiguous(x, DType::f32, Shape{7}));
          } catch (const core::Error& e) {
            if (contains(e.what(), "aborted") && contains(e.what(), "rank " + std::to_string(n - 1)) &&
                contains(e.what(), "weights for rank failed to load"))
              aborted_errors.fetch_add(1);
            throw;
          }
        });
      });
      FAIL() << "run_ranks did not rethrow";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "weights for rank failed to load") << n << " ranks";
    }
    EXPECT_EQ(aborted_errors.load(), n - 1) << n << " ranks";
  }
}

TEST(ThreadCommFailure, CommunicatorAbortWakesRanksWaitingInABarrier) {
  ThreadGroup group(4);
  RankThreads threads(4);
  std::string missed;
  const auto errors = rank_errors(group, [&](Communicator& c) {
    if (c.rank() == 1) {
      missed = wait_until_asleep(threads, {0, 2, 3}, "the barrier");  // they wait before it aborts
      c.abort("gave up on the step");
      return;
    }
    threads.announce(c.rank());
    c.barrier();
  });
  EXPECT_EQ(missed, "");
  EXPECT_TRUE(group.aborted());
  EXPECT_EQ(errors[1], "");
  for (int r : {0, 2, 3}) {
    EXPECT_TRUE(contains(errors[static_cast<size_t>(r)], "rank 1: gave up on the step"))
        << errors[static_cast<size_t>(r)];
  }
  // The group stays aborted: a later collective throws at once instead of waiting.
  EXPECT_THROW(group.rank(0).barrier(), core::Error);
}

TEST(ThreadCommFailure, GroupAbortFromOutsideReleasesEveryRank) {
  ThreadGroup group(3);
  RankThreads threads(3);
  std::string missed;
  std::thread killer([&] {
    missed = wait_until_asleep(threads, {0, 1}, "the all_reduce_sum");  // they wait for rank 2
    group.abort("engine shutting down");
  });
  const auto errors = rank_errors(group, [&](Communicator& c) {
    float x[3] = {};
    if (c.rank() == 2) {  // stuck elsewhere until the abort (polls the group's own flag)
      while (!group.aborted()) std::this_thread::sleep_for(1ms);
    } else {
      threads.announce(c.rank());
    }
    c.all_reduce_sum(TensorView::contiguous(x, DType::f32, Shape{3}));
  });
  killer.join();
  EXPECT_EQ(missed, "");
  for (const auto& e : errors) EXPECT_TRUE(contains(e, "engine shutting down")) << e;
}

TEST(ThreadCommFailure, RanksCallingDifferentCollectivesAllThrowNamingBoth) {
  ThreadGroup group(3);
  const auto errors = rank_errors(group, [](Communicator& c) {
    float x[4] = {};
    const TensorView v = TensorView::contiguous(x, DType::f32, Shape{4});
    if (c.rank() == 2) c.broadcast(v, 0);
    else c.all_reduce_sum(v);
  });
  for (const auto& e : errors) {
    EXPECT_TRUE(contains(e, "rank 2 called broadcast while rank 0 called all_reduce_sum")) << e;
  }
}

TEST(ThreadCommFailure, MismatchedShapeDtypeOrRootIsAnErrorOnEveryRank) {
  {
    ThreadGroup group(4);
    const auto errors = rank_errors(group, [](Communicator& c) {
      float x[18] = {};
      c.all_reduce_sum(TensorView::contiguous(x, DType::f32, Shape{c.rank() == 3 ? 18 : 17}));
    });
    for (const auto& e : errors) EXPECT_TRUE(contains(e, "rank 3") && contains(e, "[18]") && contains(e, "[17]")) << e;
  }
  {
    ThreadGroup group(2);
    const auto errors = rank_errors(group, [](Communicator& c) {
      float x[4] = {};
      c.all_reduce_sum(TensorView::contiguous(x, c.rank() == 1 ? DType::bf16 : DType::f32, Shape{4}));
    });
    for (const auto& e : errors) EXPECT_TRUE(contains(e, "BF16") && contains(e, "F32")) << e;
  }
  {
    ThreadGroup group(3);
    const auto errors = rank_errors(group, [](Communicator& c) {
      float x[4] = {};
      c.broadcast(TensorView::contiguous(x, DType::f32, Shape{4}), c.rank() == 0 ? 0 : 1);
    });
    for (const auto& e : errors) EXPECT_TRUE(contains(e, "broadcast root 1 but rank 0 root 0")) << e;
  }
}

TEST(ThreadCommFailure, BadArgumentOnOneRankReleasesTheOthers) {
  ThreadGroup group(3);
  const auto errors = rank_errors(group, [](Communicator& c) {
    int32_t ids[5] = {};
    float x[5] = {};
    if (c.rank() == 0) c.all_reduce_sum(TensorView::contiguous(ids, DType::i32, Shape{5}));
    else c.all_reduce_sum(TensorView::contiguous(x, DType::f32, Shape{5}));
  });
  EXPECT_TRUE(contains(errors[0], "x dtype must be F32 or BF16, got I32 [5]")) << errors[0];
  for (int r : {1, 2})
    EXPECT_TRUE(contains(errors[static_cast<size_t>(r)], "rank 0: ")) << errors[static_cast<size_t>(r)];
}

TEST(ThreadCommFailure, ArgumentChecksNameTheExpectedShape) {
  float buf[64] = {};
  const auto in = TensorView::contiguous(buf, DType::f32, Shape{2, 3});
  auto s = all_gather_check(in, TensorView::contiguous(buf, DType::f32, Shape{2, 6}), GatherAxis::first, 2,
                            core::Device::cpu);
  EXPECT_FALSE(s);
  EXPECT_TRUE(contains(s.reason(), "out shape must be [4, 3], got [2, 6]")) << s.reason();
  EXPECT_TRUE(all_gather_check(in, TensorView::contiguous(buf, DType::f32, Shape{2, 6}), GatherAxis::last, 2,
                               core::Device::cpu));
  s = all_gather_check(in, TensorView::contiguous(buf, DType::bf16, Shape{4, 3}), GatherAxis::first, 2,
                       core::Device::cpu);
  EXPECT_TRUE(contains(s.reason(), "out dtype must equal in dtype")) << s.reason();

  s = reduce_scatter_check(TensorView::contiguous(buf, DType::f32, Shape{5, 2}),
                           TensorView::contiguous(buf, DType::f32, Shape{2, 2}), 2, core::Device::cpu);
  EXPECT_TRUE(contains(s.reason(), "in dim 0 (5) must be a multiple of the group size 2")) << s.reason();
  s = reduce_scatter_check(TensorView::contiguous(buf, DType::f32, Shape{6, 2}),
                           TensorView::contiguous(buf, DType::f32, Shape{2, 2}), 2, core::Device::cpu);
  EXPECT_TRUE(contains(s.reason(), "out shape must be [3, 2], got [2, 2]")) << s.reason();

  s = broadcast_check(in, 2, 2, core::Device::cpu);
  EXPECT_TRUE(contains(s.reason(), "root 2 is not a rank of a group of 2")) << s.reason();

  auto on_gpu = in;
  on_gpu.device = core::Device::cuda;
  s = all_reduce_check(on_gpu, core::Device::cpu);
  EXPECT_TRUE(contains(s.reason(), "must be on cpu")) << s.reason();

  auto strided = in;
  strided.strides[0] = 4;
  s = all_reduce_check(strided, core::Device::cpu);
  EXPECT_TRUE(contains(s.reason(), "must be contiguous")) << s.reason();

  EXPECT_THROW(ThreadGroup(0), core::Error);
  ThreadGroup g(2);
  EXPECT_THROW(g.rank(2), core::Error);
}

}  // namespace
}  // namespace k3::comm
