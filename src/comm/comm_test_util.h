// comm/comm_test_util.h: helpers shared by the comm tests: per-rank random data whose sums depend
// on the order they are taken in, serial rank-order reference sums, and a hang guard.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <limits>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "core/rng.h"

namespace k3::comm::testing {

// What every launcher does before NCCL starts (comm/nccl_comm.h): NVLink multicast off. The tests
// that build an NcclGroup are their own launchers.
inline void launch_with_nvls_off() { ::setenv("NCCL_NVLS_ENABLE", "0", 1); }

// Group sizes every CPU test runs with (TP=1 and the TP degrees spec §11 cares about, plus 3).
inline const int kRankCounts[] = {1, 2, 3, 4, 8};
// Element counts: 1, odd, the K3 hidden size, and three hidden rows plus an odd tail.
inline const int64_t kSizes[] = {1, 17, 7168, 7168 * 3 + 5};

// Values spread over six decades, so fp32 sums of them round differently in different orders.
inline std::vector<float> order_sensitive_values(uint64_t seed, int64_t count) {
  core::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(count));
  for (auto& x : v) x = static_cast<float>(rng.normal() * std::pow(10.0, rng.uniform(-3.0, 3.0)));
  return v;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = core::f32_to_bf16_bits(v[i]);
  return out;
}

// The contract's sum: acc = x_0[i]; acc = acc + x_q[i] for q = 1..n-1 (fp32).
inline std::vector<float> rank_order_sum(const std::vector<std::vector<float>>& per_rank) {
  std::vector<float> acc = per_rank[0];
  for (size_t q = 1; q < per_rank.size(); ++q)
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = acc[i] + per_rank[q][i];
  return acc;
}

inline std::vector<float> bf16_to_f32(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = core::bf16_bits_to_f32(v[i]);
  return out;
}

inline std::vector<float> nan_filled(int64_t count) {
  return std::vector<float>(static_cast<size_t>(count), std::numeric_limits<float>::quiet_NaN());
}

// Index of the first element whose bits differ, or -1 (bitwise, so NaN poison counts as a miss).
template <class T>
int64_t first_bit_mismatch(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return -1;
}

// Runs body on another thread; if it has not finished within `limit`, a collective hung: print
// and abort the test program (a hung thread cannot be cancelled, and CI must not wait forever).
template <class F>
void with_hang_guard(std::chrono::seconds limit, F&& body) {
  std::packaged_task<void()> task(std::forward<F>(body));
  auto done = task.get_future();
  std::thread runner(std::move(task));
  if (done.wait_for(limit) == std::future_status::timeout) {
    std::fprintf(stderr, "comm test hung for %lld s: a collective did not return\n",
                 static_cast<long long>(limit.count()));
    std::abort();
  }
  runner.join();
  done.get();  // rethrows what body threw
}

}  // namespace k3::comm::testing
