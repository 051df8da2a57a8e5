// comm/thread_comm_test.cpp: values of the CPU thread-rank collectives for 1, 2, 3, 4 and 8 ranks:
// all_reduce bit-exact against a serial rank-order sum (f32; bf16 rounded once), all_gather along
// the first and the last axis (vocab-parallel logits), reduce_scatter, broadcast and barrier, on odd
// sizes and the K3 hidden size, with NaN-poisoned outputs; zero-element collectives still
// synchronise; a thousand small all_reduces give exact sums without deadlock.
#include "comm/thread_comm.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "comm/comm_test_util.h"
#include "comm/rank_wait_test_util.h"

namespace k3::comm {
namespace {

using core::DType;
using core::Shape;
using core::TensorView;
using namespace k3::comm::testing;

TEST(ThreadComm, AllReduceF32IsTheSerialRankOrderSumOnEveryRank) {
  for (int n : kRankCounts) {
    for (int64_t count : kSizes) {
      std::vector<std::vector<float>> inputs;
      for (int r = 0; r < n; ++r) inputs.push_back(order_sensitive_values(1000 * n + r, count));
      const std::vector<float> expected = rank_order_sum(inputs);
      std::vector<std::vector<float>> results = inputs;
      run_ranks(n, [&](Communicator& c) {
        EXPECT_EQ(c.size(), n);
        EXPECT_EQ(c.device(), core::Device::cpu);
        auto& x = results[static_cast<size_t>(c.rank())];
        c.all_reduce_sum(TensorView::contiguous(x.data(), DType::f32, Shape{count}));
      });
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(first_bit_mismatch(results[static_cast<size_t>(r)], expected), -1)
            << n << " ranks, " << count << " elements, rank " << r;
      if (n >= 3 && count >= 7168) {
        // The data is order-sensitive, so the bit-exact match above really pins the order.
        std::vector<std::vector<float>> reversed(inputs.rbegin(), inputs.rend());
        EXPECT_NE(first_bit_mismatch(rank_order_sum(reversed), expected), -1) << n << " ranks";
      }
    }
  }
}

TEST(ThreadComm, AllReduceBf16AccumulatesInF32AndRoundsOnce) {
  for (int n : kRankCounts) {
    // 1 + (n-1) * 2^-8: each 2^-8 is half a bf16 ulp at 1, so rounding per hop would stay at 1.
    std::vector<std::vector<uint16_t>> tie(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) tie[static_cast<size_t>(r)] = to_bf16({r == 0 ? 1.0f : 0x1p-8f});
    run_ranks(n, [&](Communicator& c) {
      c.all_reduce_sum(TensorView::contiguous(tie[static_cast<size_t>(c.rank())].data(), DType::bf16, Shape{1}));
    });
    const float once = core::bf16_round(1.0f + static_cast<float>(n - 1) * 0x1p-8f);
    if (n >= 3) {
      EXPECT_NE(once, 1.0f);  // the case really separates once from per-hop rounding
    }
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(core::bf16_bits_to_f32(tie[static_cast<size_t>(r)][0]), once) << n << " ranks";

    for (int64_t count : kSizes) {
      std::vector<std::vector<uint16_t>> inputs;
      std::vector<std::vector<float>> as_f32;
      for (int r = 0; r < n; ++r) {
        inputs.push_back(to_bf16(order_sensitive_values(2000 * n + r, count)));
        as_f32.push_back(bf16_to_f32(inputs.back()));
      }
      const std::vector<uint16_t> expected = to_bf16(rank_order_sum(as_f32));
      run_ranks(n, [&](Communicator& c) {
        auto& x = inputs[static_cast<size_t>(c.rank())];
        c.all_reduce_sum(TensorView::contiguous(x.data(), DType::bf16, Shape{count}));
      });
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(first_bit_mismatch(inputs[static_cast<size_t>(r)], expected), -1)
            << n << " ranks, " << count << " elements, rank " << r;
    }
  }
}

// Rank q's element (row, col) of a [rows, cols] chunk, distinct for every (q, row, col).
float gather_value(int q, int64_t row, int64_t col) {
  return static_cast<float>(q * 1000003 + row * 1009 + col) * 0.25f;
}

TEST(ThreadComm, AllGatherConcatenatesAlongTheFirstAndTheLastAxis) {
  struct Case {
    int64_t rows, cols;
  };
  // Odd shapes, and a TP8 shard of vocab-parallel logits for two tokens: [2, 163840 / 8].
  const Case cases[] = {{1, 1}, {3, 17}, {2, 20480}};
  for (int n : kRankCounts) {
    for (const Case& cs : cases) {
      for (GatherAxis axis : {GatherAxis::first, GatherAxis::last}) {
        const int64_t count = cs.rows * cs.cols;
        const Shape out_shape = axis == GatherAxis::first ? Shape{n * cs.rows, cs.cols} : Shape{cs.rows, n * cs.cols};
        std::vector<std::vector<float>> ins(static_cast<size_t>(n)), outs(static_cast<size_t>(n));
        for (int q = 0; q < n; ++q) {
          auto& in = ins[static_cast<size_t>(q)];
          for (int64_t r = 0; r < cs.rows; ++r)
            for (int64_t c = 0; c < cs.cols; ++c) in.push_back(gather_value(q, r, c));
          outs[static_cast<size_t>(q)] = nan_filled(n * count);
        }
        run_ranks(n, [&](Communicator& c) {
          const size_t r = static_cast<size_t>(c.rank());
          c.all_gather(TensorView::contiguous(ins[r].data(), DType::f32, Shape{cs.rows, cs.cols}),
                       TensorView::contiguous(outs[r].data(), DType::f32, out_shape), axis);
        });
        for (int rank = 0; rank < n; ++rank) {
          const auto& out = outs[static_cast<size_t>(rank)];
          int64_t bad = 0;
          for (int q = 0; q < n; ++q)
            for (int64_t r = 0; r < cs.rows; ++r)
              for (int64_t c = 0; c < cs.cols; ++c) {
                const int64_t at = axis == GatherAxis::first ? (q * cs.rows + r) * cs.cols + c
                                                             : r * n * cs.cols + q * cs.cols + c;
                bad += out[static_cast<size_t>(at)] != gather_value(q, r, c);
              }
          EXPECT_EQ(bad, 0) << n << " ranks, [" << cs.rows << ", " << cs.cols << "], axis " << gather_axis_name(axis)
                            << ", rank " << rank;
        }
      }
    }
  }
}

TEST(ThreadComm, AllGatherCopiesBf16BitsAndAllowsInPlaceFirstAxis) {
  for (int n : kRankCounts) {
    const int64_t count = 17;
    // In place: rank q's input is already chunk q of its output buffer.
    std::vector<std::vector<uint16_t>> bufs(static_cast<size_t>(n),
                                            std::vector<uint16_t>(static_cast<size_t>(n * count), 0xffff));
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < count; ++i)
        bufs[static_cast<size_t>(q)][static_cast<size_t>(q * count + i)] = static_cast<uint16_t>(q * 100 + i);
    run_ranks(n, [&](Communicator& c) {
      auto& buf = bufs[static_cast<size_t>(c.rank())];
      c.all_gather(TensorView::contiguous(buf.data() + c.rank() * count, DType::bf16, Shape{count}),
                   TensorView::contiguous(buf.data(), DType::bf16, Shape{n * count}), GatherAxis::first);
    });
    for (int rank = 0; rank < n; ++rank)
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < count; ++i)
          ASSERT_EQ(bufs[static_cast<size_t>(rank)][static_cast<size_t>(q * count + i)], q * 100 + i)
              << n << " ranks, rank " << rank;
  }
}

TEST(ThreadComm, ReduceScatterGivesEachRankItsRowsOfTheAllReduce) {
  struct Case {
    int64_t rows_per_rank, cols;
  };
  const Case cases[] = {{1, 1}, {3, 17}, {1, 7168}};
  for (int n : kRankCounts) {
    for (const Case& cs : cases) {
      for (DType dtype : {DType::f32, DType::bf16}) {
        const int64_t chunk = cs.rows_per_rank * cs.cols, count = n * chunk;
        std::vector<std::vector<float>> inputs;
        for (int r = 0; r < n; ++r) {
          inputs.push_back(order_sensitive_values(3000 * n + r, count));
          if (dtype == DType::bf16) inputs.back() = bf16_to_f32(to_bf16(inputs.back()));
        }
        std::vector<float> expected = rank_order_sum(inputs);
        if (dtype == DType::bf16) expected = bf16_to_f32(to_bf16(expected));
        std::vector<std::vector<float>> outs(static_cast<size_t>(n));
        run_ranks(n, [&](Communicator& c) {
          const size_t r = static_cast<size_t>(c.rank());
          const Shape in_shape{n * cs.rows_per_rank, cs.cols}, out_shape{cs.rows_per_rank, cs.cols};
          if (dtype == DType::f32) {
            outs[r] = nan_filled(chunk);
            c.reduce_scatter_sum(TensorView::contiguous(inputs[r].data(), dtype, in_shape),
                                 TensorView::contiguous(outs[r].data(), dtype, out_shape));
          } else {
            // In place: the output is this rank's chunk of its own input.
            std::vector<uint16_t> in = to_bf16(inputs[r]);
            uint16_t* mine = in.data() + c.rank() * chunk;
            c.reduce_scatter_sum(TensorView::contiguous(in.data(), dtype, in_shape),
                                 TensorView::contiguous(mine, dtype, out_shape));
            outs[r] = bf16_to_f32(std::vector<uint16_t>(mine, mine + chunk));
          }
        });
        for (int r = 0; r < n; ++r) {
          const std::vector<float> want(expected.begin() + r * chunk, expected.begin() + (r + 1) * chunk);
          EXPECT_EQ(first_bit_mismatch(outs[static_cast<size_t>(r)], want), -1)
              << n << " ranks, " << core::dtype_name(dtype) << " [" << cs.rows_per_rank << ", " << cs.cols << "], rank "
              << r;
        }
      }
    }
  }
}

TEST(ThreadComm, BroadcastCopiesTheRootsTensorToEveryRank) {
  for (int n : kRankCounts) {
    for (int root : {0, n / 2, n - 1}) {
      for (int64_t count : {int64_t{1}, int64_t{17}, int64_t{7168}}) {
        const std::vector<float> root_values = order_sensitive_values(4000 + root, count);
        std::vector<std::vector<float>> xs(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) xs[static_cast<size_t>(r)] = r == root ? root_values : nan_filled(count);
        run_ranks(n, [&](Communicator& c) {
          c.broadcast(TensorView::contiguous(xs[static_cast<size_t>(c.rank())].data(), DType::f32, Shape{1, count}),
                      root);
        });
        for (int r = 0; r < n; ++r)
          EXPECT_EQ(first_bit_mismatch(xs[static_cast<size_t>(r)], root_values), -1)
              << n << " ranks, root " << root << ", " << count << " elements, rank " << r;
      }
    }
  }
}

TEST(ThreadComm, BarrierReturnsOnlyAfterEveryRankArrived) {
  for (int n : kRankCounts) {
    std::atomic<int> arrived{0};
    std::atomic<int> early{0};
    run_ranks(n, [&](Communicator& c) {
      for (int round = 1; round <= 20; ++round) {
        arrived.fetch_add(1);
        c.barrier();
        if (arrived.load() < round * n) early.fetch_add(1);
        c.barrier();  // nobody starts the next round before everyone checked this one
      }
    });
    EXPECT_EQ(early.load(), 0) << n << " ranks";
    EXPECT_EQ(arrived.load(), 20 * n);
  }
}

// A collective with nothing to move is still a barrier: no rank leaves it before every rank
// arrived. Rank 0 arrives last on purpose, once the others are seen blocked in the collective;
// one that did not wait would have left already, and counted itself early.
TEST(ThreadComm, ZeroElementCollectivesStillSynchronise) {
  struct Op {
    const char* name;
    std::function<void(Communicator&)> call;
  };
  float dummy = 0;
  const std::vector<Op> ops = {
      {"all_reduce_sum",
       [&](Communicator& c) { c.all_reduce_sum(TensorView::contiguous(&dummy, DType::f32, Shape{0})); }},
      {"all_gather (first axis)",
       [&](Communicator& c) {
         c.all_gather(TensorView::contiguous(&dummy, DType::f32, Shape{0, 3}),
                      TensorView::contiguous(&dummy, DType::f32, Shape{0, 3}), GatherAxis::first);
       }},
      {"all_gather (last axis)",
       [&](Communicator& c) {
         c.all_gather(TensorView::contiguous(&dummy, DType::f32, Shape{2, 0}),
                      TensorView::contiguous(&dummy, DType::f32, Shape{2, 0}), GatherAxis::last);
       }},
      {"reduce_scatter_sum",
       [&](Communicator& c) {
         c.reduce_scatter_sum(TensorView::contiguous(&dummy, DType::f32, Shape{0, 2}),
                              TensorView::contiguous(&dummy, DType::f32, Shape{0, 2}));
       }},
      {"broadcast", [&](Communicator& c) { c.broadcast(TensorView::contiguous(&dummy, DType::f32, Shape{0}), 1); }},
  };
  for (int n : {2, 3, 8}) {
    std::vector<int> others;
    for (int r = 1; r < n; ++r) others.push_back(r);
    for (const Op& op : ops) {
      RankThreads threads(n);
      std::atomic<int> arrived{0}, early{0};
      std::string missed;
      with_hang_guard(std::chrono::seconds(60), [&] {
        run_ranks(n, [&](Communicator& c) {
          if (c.rank() == 0) missed = wait_until_asleep(threads, others, std::string("the zero-element ") + op.name);
          else threads.announce(c.rank());
          arrived.fetch_add(1);
          op.call(c);
          if (arrived.load() < n) early.fetch_add(1);
        });
      });
      EXPECT_EQ(missed, "") << n << " ranks";
      EXPECT_EQ(early.load(), 0) << op.name << " returned before every rank arrived, " << n << " ranks";
      EXPECT_EQ(arrived.load(), n);
    }
  }
}

// No timing bound: how long it takes is the bench's business (a loaded CI machine is slow); the
// time is recorded. A deadlock trips the hang guard, which names it.
TEST(ThreadComm, ThousandSmallAllReducesGiveExactSumsWithoutDeadlock) {
  for (int n : {2, 8}) {
    const auto start = std::chrono::steady_clock::now();
    with_hang_guard(std::chrono::seconds(60), [&] {
      run_ranks(n, [&](Communicator& c) {
        float x[17];
        for (int iter = 0; iter < 1000; ++iter) {
          for (int i = 0; i < 17; ++i) x[i] = static_cast<float>(c.rank() + iter + i);
          c.all_reduce_sum(TensorView::contiguous(x, DType::f32, Shape{17}));
          // sum_q (q + iter + i) = n(n-1)/2 + n(iter + i), exact in f32 at these magnitudes.
          for (int i = 0; i < 17; ++i)
            if (x[i] != static_cast<float>(n * (n - 1) / 2 + n * (iter + i)))
              throw core::Error("wrong sum at iteration " + std::to_string(iter));
        }
      });
    });
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    RecordProperty("ms_for_1000_all_reduces_" + std::to_string(n) + "_ranks", static_cast<int>(ms));
  }
}

}  // namespace
}  // namespace k3::comm
