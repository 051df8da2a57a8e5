// comm/nccl_comm_test.cpp: the NCCL communicator against the CPU contract, one thread per GPU:
// rank_order all-reduce / reduce-scatter bit-identical to the serial rank-order sum (f32, bf16
// rounded once), native NCCL sums close to it and identical across ranks, all-gather along both
// axes, broadcast, barrier; no group without NVLS off. Multi-GPU cases skip when fewer than 2 GPUs are visible.
#include "comm/nccl_comm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "backends/cuda/check.h"
#include "backends/cuda/device.h"
#include "comm/comm_test_util.h"
#include "comm/rank_sum.h"

namespace k3::comm {
namespace {

using core::DType;
using core::Shape;
using core::TensorView;
using namespace k3::comm::testing;

#define K3_REQUIRE_GPUS(n)                                                                \
  std::string why_;                                                                       \
  const int gpus_ = backends::cuda::device_count(&why_);                                  \
  if (gpus_ < (n)) {                                                                      \
    GTEST_SKIP() << "needs " << (n) << " CUDA devices, " << gpus_ << " visible " << why_; \
  }

// Group sizes to test on this machine: 2, 4, 8 as far as the GPUs go.
std::vector<int> group_sizes(int gpus) {
  std::vector<int> sizes;
  for (int n : {2, 4, 8})
    if (n <= gpus) sizes.push_back(n);
  return sizes;
}

// Runs fn(comm) on one thread per rank of a group over devices 0..n-1; rethrows the first error.
void run_gpu_ranks(NcclGroup& group, const std::function<void(NcclComm&)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(group.size()));
  for (int r = 0; r < group.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        K3_CUDA_CHECK(cudaSetDevice(group.rank(r).device_index()));
        fn(group.rank(r));
        K3_CUDA_CHECK(cudaStreamSynchronize(group.rank(r).stream()));
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        group.abort("rank " + std::to_string(r) + " failed");
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// A device buffer holding `host` (raw element bits), read back with download(). Both directions
// wait for the whole device: the collectives run on the communicator's non-blocking stream, which
// plain cudaMemcpy (legacy default stream) does not wait for.
template <class T>
struct DeviceBuffer {
  explicit DeviceBuffer(const std::vector<T>& host) : count(host.size()) {
    K3_CUDA_CHECK(cudaMalloc(&ptr, count * sizeof(T) + 1));
    K3_CUDA_CHECK(cudaMemcpy(ptr, host.data(), count * sizeof(T), cudaMemcpyHostToDevice));
    K3_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~DeviceBuffer() { (void)cudaFree(ptr); }
  std::vector<T> download() const {
    std::vector<T> host(count);
    K3_CUDA_CHECK(cudaDeviceSynchronize());
    K3_CUDA_CHECK(cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  TensorView view(DType dtype, Shape shape) const {
    return TensorView::contiguous(ptr, dtype, shape, core::Device::cuda);
  }
  void* ptr = nullptr;
  size_t count;
};

// Runs without a GPU too: the environment is checked before anything else.
TEST(NcclComm, RefusesToStartUnlessTheLauncherTurnedNvlinkMulticastOff) {
  const auto refusal = [](const char* value) {
    if (value) ::setenv("NCCL_NVLS_ENABLE", value, 1);
    else ::unsetenv("NCCL_NVLS_ENABLE");
    try {
      NcclGroup group({0});
    } catch (const core::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (const char* value : {static_cast<const char*>(nullptr), "1", ""}) {
    const std::string what = refusal(value);
    EXPECT_NE(what.find("NCCL_NVLS_ENABLE=0"), std::string::npos) << what;
    EXPECT_NE(what.find(value ? "'" + std::string(value) + "'" : std::string("unset")), std::string::npos) << what;
  }
  launch_with_nvls_off();
}

TEST(NcclComm, RejectsBadDeviceListsBeforeTouchingNccl) {
  launch_with_nvls_off();
  const auto error_of = [](std::vector<int> devices) {
    try {
      NcclGroup group(std::move(devices));
    } catch (const core::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of({}).find("device list is empty"), std::string::npos);
  EXPECT_NE(error_of({-1}).find("does not exist"), std::string::npos);
  const std::string twice = error_of({0, 0});
  EXPECT_TRUE(twice.find("listed twice") != std::string::npos || twice.find("does not exist") != std::string::npos)
      << twice;
}

TEST(NcclComm, RankOrderAllReduceIsBitIdenticalToTheCpuContract) {
  K3_REQUIRE_GPUS(2);
  for (int n : group_sizes(gpus_)) {
    std::vector<int> devices;
    for (int d = 0; d < n; ++d) devices.push_back(d);
    launch_with_nvls_off();
    NcclGroup group(devices);
    for (int64_t count : kSizes) {
      for (DType dtype : {DType::f32, DType::bf16}) {
        std::vector<std::vector<float>> inputs;
        for (int r = 0; r < n; ++r) {
          inputs.push_back(order_sensitive_values(5000 * n + r, count));
          if (dtype == DType::bf16) inputs.back() = bf16_to_f32(to_bf16(inputs.back()));
        }
        std::vector<float> expected = rank_order_sum(inputs);
        if (dtype == DType::bf16) expected = bf16_to_f32(to_bf16(expected));
        for (NcclSumMode mode : {NcclSumMode::rank_order, NcclSumMode::native}) {
          std::vector<std::vector<float>> results(static_cast<size_t>(n));
          run_gpu_ranks(group, [&](NcclComm& c) {
            const size_t r = static_cast<size_t>(c.rank());
            c.set_sum_mode(mode);
            if (dtype == DType::f32) {
              DeviceBuffer<float> x(inputs[r]);
              c.all_reduce_sum(x.view(dtype, Shape{count}));
              results[r] = x.download();
            } else {
              DeviceBuffer<uint16_t> x(to_bf16(inputs[r]));
              c.all_reduce_sum(x.view(dtype, Shape{count}));
              results[r] = bf16_to_f32(x.download());
            }
          });
          for (int r = 0; r < n; ++r) {
            const auto& got = results[static_cast<size_t>(r)];
            EXPECT_EQ(first_bit_mismatch(got, results[0]), -1) << "ranks disagree, rank " << r;
            if (mode == NcclSumMode::rank_order) {
              EXPECT_EQ(first_bit_mismatch(got, expected), -1)
                  << n << " GPUs, " << count << " " << core::dtype_name(dtype) << ", rank " << r;
            } else {  // NCCL's own order and per-hop bf16 rounding: close, not equal
              const float rel = dtype == DType::f32 ? 1e-5f : 0.05f;
              float scale = 0;
              for (float v : expected) scale = std::max(scale, std::fabs(v));
              for (size_t i = 0; i < got.size(); ++i)
                ASSERT_NEAR(got[i], expected[i], rel * scale) << "native, element " << i;
            }
          }
        }
      }
    }
  }
}

TEST(NcclComm, ReduceScatterAllGatherBroadcastAndBarrier) {
  K3_REQUIRE_GPUS(2);
  for (int n : group_sizes(gpus_)) {
    std::vector<int> devices;
    for (int d = 0; d < n; ++d) devices.push_back(d);
    launch_with_nvls_off();
    NcclGroup group(devices);
    const int64_t rows = 3, cols = 17;
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < n; ++r) inputs.push_back(order_sensitive_values(6000 + r, n * rows * cols));
    const std::vector<float> sum = rank_order_sum(inputs);
    run_gpu_ranks(group, [&](NcclComm& c) {
      const int r = c.rank();
      // reduce_scatter: rows [r*3, r*3+3) of the rank-order sum.
      DeviceBuffer<float> in(inputs[static_cast<size_t>(r)]);
      DeviceBuffer<float> out(nan_filled(rows * cols));
      c.reduce_scatter_sum(in.view(DType::f32, Shape{n * rows, cols}), out.view(DType::f32, Shape{rows, cols}));
      const std::vector<float> want(sum.begin() + r * rows * cols, sum.begin() + (r + 1) * rows * cols);
      EXPECT_EQ(first_bit_mismatch(out.download(), want), -1) << "reduce_scatter rank " << r;
      // all_gather along the last axis (vocab-parallel logits) and the first.
      std::vector<float> mine(static_cast<size_t>(rows * cols));
      for (int64_t i = 0; i < rows * cols; ++i) mine[static_cast<size_t>(i)] = static_cast<float>(r * 1000 + i);
      DeviceBuffer<float> part(mine);
      for (GatherAxis axis : {GatherAxis::last, GatherAxis::first}) {
        DeviceBuffer<float> all(nan_filled(n * rows * cols));
        const Shape out_shape = axis == GatherAxis::last ? Shape{rows, n * cols} : Shape{n * rows, cols};
        c.all_gather(part.view(DType::f32, Shape{rows, cols}), all.view(DType::f32, out_shape), axis);
        const auto got = all.download();
        int64_t bad = 0;
        for (int q = 0; q < n; ++q)
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < cols; ++j) {
              const int64_t at = axis == GatherAxis::last ? i * n * cols + q * cols + j : (q * rows + i) * cols + j;
              bad += got[static_cast<size_t>(at)] != static_cast<float>(q * 1000 + i * cols + j);
            }
        EXPECT_EQ(bad, 0) << "all_gather axis " << gather_axis_name(axis) << " rank " << r;
      }
      // broadcast from the last rank.
      DeviceBuffer<float> b(r == n - 1 ? inputs[0] : nan_filled(n * rows * cols));
      c.broadcast(b.view(DType::f32, Shape{n * rows * cols}), n - 1);
      EXPECT_EQ(first_bit_mismatch(b.download(), inputs[0]), -1) << "broadcast rank " << r;
      c.barrier();
    });
  }
}

TEST(RankSum, MatchesTheSerialSumOnOneGpu) {
  K3_REQUIRE_GPUS(1);
  const int n = 5;
  const int64_t count = 7168 * 3 + 5;
  std::vector<std::vector<float>> chunks;
  std::vector<float> packed;
  for (int q = 0; q < n; ++q) {
    chunks.push_back(order_sensitive_values(7000 + q, count));
    packed.insert(packed.end(), chunks.back().begin(), chunks.back().end());
  }
  DeviceBuffer<float> in(packed);
  DeviceBuffer<float> out(nan_filled(count));
  rank_sum(in.ptr, count, n, count, DType::f32, out.ptr, nullptr);
  EXPECT_EQ(first_bit_mismatch(out.download(), rank_order_sum(chunks)), -1);
}

}  // namespace
}  // namespace k3::comm
