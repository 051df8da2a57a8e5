// tests/gpu/gpu_test_util.h: skipping GPU tests cleanly, and CPU/CUDA runner pairs on one checkpoint.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "runner/model_runner.h"
#include "test_util.h"

#ifdef K3_HAVE_CUDA
#include "backends/cuda/device.h"
#endif

namespace k3::gpu_test {

// k3-tiny written into `tmp` with the sensitive init (activations O(1), softmaxes far from
// uniform: rounding differences show) and MXFP4 experts: the checkpoint the engine and fast-path
// equivalence tests compare on.
inline std::filesystem::path write_sensitive_tiny(const testing::TempDir& tmp) {
  checkpoint::WriteOptions w;
  w.init = checkpoint::InitStyle::sensitive;
  w.mxfp4 = true;
  return testing::write_checkpoint(tmp, config::builtin_config("k3-tiny"), w);
}

// Empty when a CUDA device is usable, else why not (the skip message).
inline std::string no_gpu_reason() {
#ifdef K3_HAVE_CUDA
  std::string why;
  if (backends::cuda::device_count(&why) > 0) return "";
  return "no usable CUDA device: " + why;
#else
  return "this build has no CUDA backend (nvcc was not found at configure time)";
#endif
}

#define K3_REQUIRE_GPU()                                                       \
  do {                                                                         \
    if (const std::string why = ::k3::gpu_test::no_gpu_reason(); !why.empty()) \
      GTEST_SKIP() << "GPU test skipped: " << why;                             \
  } while (0)

inline int usable_gpus() {
#ifdef K3_HAVE_CUDA
  return backends::cuda::device_count();
#else
  return 0;
#endif
}

#define K3_REQUIRE_GPUS(n)                                                                                          \
  do {                                                                                                              \
    K3_REQUIRE_GPU();                                                                                               \
    if (::k3::gpu_test::usable_gpus() < (n))                                                                        \
      GTEST_SKIP() << "GPU test skipped: needs " << (n) << " GPUs, " << ::k3::gpu_test::usable_gpus() << " usable"; \
  } while (0)

// What every launcher does before NCCL starts (comm/nccl_comm.h): NVLink multicast off. The GPU
// tests that run tensor parallel groups are their own launchers.
inline void launch_with_nvls_off() { ::setenv("NCCL_NVLS_ENABLE", "0", 1); }

inline model::ModelOptions options(core::Device device, kernels::Precision precision) {
  model::ModelOptions o;
  o.device = device;
  o.precision = precision;
  o.poison_buffers = true;  // an output an op forgets to write shows up as NaN logits
  return o;
}

// The CPU oracle and the CUDA model on the same checkpoint.
struct RunnerPair {
  std::unique_ptr<runner::ModelRunner> cpu, gpu;
  RunnerPair(const std::filesystem::path& dir, kernels::Precision p, model::KvCacheDtype kv,
             model::DecodeBackend backend = model::DecodeBackend::standard) {
    model::ModelOptions c = options(core::Device::cpu, p), g = options(core::Device::cuda, p);
    c.decode_backend = g.decode_backend = backend;
    cpu = runner::ModelRunner::open(dir, c, kv);
    gpu = runner::ModelRunner::open(dir, g, kv);
  }
};

// Top-1 agreement over the rows where the oracle's top-1 leads its runner-up by more than
// `margin` (rows closer than that are decided by rounding noise, not by the model), and how many
// rows that is.
// ||got - want|| / ||want|| over every value of two same-shape f32 tensors.
inline double rel_l2(const core::Tensor& got, const core::Tensor& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double e = double(got.data<const float>()[i]) - want.data<const float>()[i];
    num += e * e;
    den += double(want.data<const float>()[i]) * want.data<const float>()[i];
  }
  return std::sqrt(num / den);
}

inline std::pair<double, int64_t> decided_top1_agreement(const core::Tensor& got, const core::Tensor& want,
                                                         float margin) {
  const int64_t rows = want.dim(0), cols = want.dim(1);
  int64_t decided = 0, agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* w = want.data<const float>() + r * cols;
    const float* g = got.data<const float>() + r * cols;
    int64_t best = 0, gbest = 0;
    for (int64_t c = 1; c < cols; ++c) {
      if (w[c] > w[best]) best = c;
      if (g[c] > g[gbest]) gbest = c;
    }
    float second = -INFINITY;
    for (int64_t c = 0; c < cols; ++c)
      if (c != best) second = std::max(second, w[c]);
    if (w[best] - second <= margin) continue;
    ++decided;
    agree += gbest == best;
  }
  return {decided ? double(agree) / double(decided) : 1.0, decided};
}

}  // namespace k3::gpu_test
