// kernels/testing/op_bench.cpp: the op benchmark's harness (op_bench.h).
#include "kernels/testing/op_bench.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "backends/cuda/check.h"
#include "backends/cuda/device_tensor.h"
#include "backends/cuda/stream.h"
#include "core/bf16.h"
#include "core/fp8.h"

namespace k3::kernels {

namespace {

std::vector<uint8_t> pattern_of(size_t bytes, const std::function<void(uint8_t*, size_t)>& gen) {
  std::vector<uint8_t> p(bytes);
  gen(p.data(), bytes);
  return p;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

OpBenchPatterns::OpBenchPatterns(core::Rng& rng) {
  const size_t n = size_t{16} << 20;
  const auto bf16 = [&](double std) {
    return pattern_of(n, [&](uint8_t* p, size_t b) {
      for (size_t i = 0; i < b / 2; ++i) {
        const uint16_t v = core::f32_to_bf16_bits(static_cast<float>(rng.uniform(-std, std) * 1.7320508));
        std::memcpy(p + 2 * i, &v, 2);
      }
    });
  };
  bf16_weight = bf16(0.02);
  bf16_act = bf16(1.0);
  f32_act = pattern_of(n, [&](uint8_t* p, size_t b) {
    for (size_t i = 0; i < b / 4; ++i) {
      const float v = static_cast<float>(rng.uniform(-2.0, 2.0));
      std::memcpy(p + 4 * i, &v, 4);
    }
  });
  fp4_codes = pattern_of(n, [&](uint8_t* p, size_t b) {
    for (size_t i = 0; i < b; ++i) p[i] = static_cast<uint8_t>(rng.next_u64());
  });
  e8m0 = pattern_of(n, [&](uint8_t* p, size_t b) {  // 2^-9 .. 2^-1: no NaN (0xff), sane magnitudes
    for (size_t i = 0; i < b; ++i) p[i] = static_cast<uint8_t>(118 + rng.next_u64() % 9);
  });
  fp8_cache = pattern_of(n, [&](uint8_t* p, size_t b) {
    for (size_t i = 0; i < b; ++i) p[i] = core::f32_to_fp8_e4m3(static_cast<float>(rng.uniform(-3.0, 3.0)));
  });
}

OpBench::OpBench(int iters, std::vector<int64_t> batches)
    : ctx_(backends::cuda::Context::create(0)), rng_(42), pat_(rng_), batches_(std::move(batches)), iters_(iters) {
  register_cuda_ops(reg_, ctx_);
  // Twice the L2, so a flush leaves nothing of the previous run in it.
  flush_ = empty(core::DType::u8,
                 {static_cast<int64_t>(std::max<size_t>(ctx_->info().l2_bytes * 2, size_t{256} << 20))});
  const int64_t bytes = int64_t{1} << 31;  // 2 GiB each way
  const core::Tensor src = empty(core::DType::u8, {bytes}), dst = empty(core::DType::u8, {bytes});
  K3_CUDA_CHECK(cudaMemsetAsync(src.view().data, 1, static_cast<size_t>(bytes), stream()));
  const double us = time_us([&] {
    K3_CUDA_CHECK(cudaMemcpyAsync(dst.view().data, src.view().data, static_cast<size_t>(bytes),
                                  cudaMemcpyDeviceToDevice, stream()));
  });
  copy_bytes_per_second_ = 2.0 * static_cast<double>(bytes) / (us * 1e-6);  // read + write
}

core::Tensor OpBench::empty(core::DType t, core::Shape s) { return backends::cuda::empty(ctx_->pool(), t, s); }

core::Tensor OpBench::upload(const core::Tensor& host) {
  return backends::cuda::upload(host.view(), ctx_->pool(), stream());
}

void OpBench::fill(const core::Tensor& t, const std::vector<uint8_t>& pattern) {
  const size_t total = static_cast<size_t>(t.nbytes());
  for (size_t off = 0; off < total; off += pattern.size())
    K3_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(t.view().data) + off, pattern.data(),
                                  std::min(pattern.size(), total - off), cudaMemcpyHostToDevice, stream()));
  K3_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

double OpBench::time_us(const std::function<void()>& fn) {
  for (int i = 0; i < 2; ++i) fn();  // warm-up: plans, table uploads, lazy module loading
  backends::cuda::Event start, stop;
  std::vector<double> us;
  for (int i = 0; i < iters_; ++i) {
    K3_CUDA_CHECK(cudaMemsetAsync(flush_.view().data, i & 0xff, static_cast<size_t>(flush_.nbytes()), stream()));
    start.record(stream());
    fn();
    stop.record(stream());
    stop.synchronize();
    us.push_back(1e3 * stop.elapsed_ms_since(start));
  }
  return median_of(us);
}

void OpBench::row(const std::string& family, const std::string& op, const std::string& shape, int64_t batch,
                  double bytes, const std::function<void()>& fn) {
  const double us = time_us(fn);
  const double gbps = bytes / (us * 1e-6) / 1e9;
  const double floor_us = bytes / kOpBenchFloorBytesPerSecond * 1e6;
  const double copy_floor_us = bytes / copy_bytes_per_second_ * 1e6;
  std::printf("%-11s %-24s %-30s %5lld %10.2f %12.3f %9.1f %8.2f %8.2f\n", family.c_str(), op.c_str(), shape.c_str(),
              static_cast<long long>(batch), us, bytes / 1e6, gbps, us / floor_us, us / copy_floor_us);
  std::fflush(stdout);
  rows_.push_back({{"group", family},
                   {"op", op},
                   {"shape", shape},
                   {"batch", batch},
                   {"median_us", us},
                   {"bytes", bytes},
                   {"GBps", gbps},
                   {"floor_us_4p3TBps", floor_us},
                   {"ratio_to_4p3TBps_floor", us / floor_us},
                   {"ratio_to_measured_copy", us / copy_floor_us}});
}

}  // namespace k3::kernels
