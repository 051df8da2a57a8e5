// kernels/testing/op_bench.h: the harness of the op benchmark k3bench_ops_gpu (CUDA builds only).
// Each family times its own ops in its folder (<family>/<family>_op_bench.cpp, one function
// declared below), at the K3 shapes of its case table (<family>/cases.h) where it has one;
// op_bench_main.cpp runs the families and writes the table and the JSON result bundle. A family's
// new op or implementation is benchmarked by editing its folder only.
//
// Every row is the median of `iters` timed runs, each after an L2 flush (so reused weights are not
// served from cache), timed with CUDA events; bytes are what the run must move (spec §12 counting:
// weights read, state read + written, cache read, activations in and out); the row reports GB/s and
// the time over the floor at 4.3 TB/s and at the device copy bandwidth measured in the same run.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/context.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "kernels/registry.h"

namespace k3::kernels {

inline constexpr double kOpBenchFloorBytesPerSecond = 4.3e12;  // spec §12

// 16 MiB host patterns of valid values per dtype, copied over device buffers by OpBench::fill.
struct OpBenchPatterns {
  std::vector<uint8_t> bf16_weight, bf16_act, f32_act, fp4_codes, e8m0, fp8_cache;
  explicit OpBenchPatterns(core::Rng& rng);
};

class OpBench {
 public:
  OpBench(int iters, std::vector<int64_t> batches);

  Registry& reg() { return reg_; }
  const std::shared_ptr<backends::cuda::Context>& ctx() const { return ctx_; }
  cudaStream_t stream() const { return ctx_->stream(); }
  const OpBenchPatterns& pat() const { return pat_; }
  core::Rng& rng() { return rng_; }
  const std::vector<int64_t>& batches() const { return batches_; }  // rows of a decode step to time
  double copy_bytes_per_second() const { return copy_bytes_per_second_; }
  const nlohmann::json& rows() const { return rows_; }

  core::Tensor empty(core::DType t, core::Shape s);
  core::Tensor upload(const core::Tensor& host);
  // Fills device memory with a repeating host pattern.
  void fill(const core::Tensor& t, const std::vector<uint8_t>& pattern);
  // Median microseconds of fn over `iters` runs, each after an L2 flush, timed with events.
  double time_us(const std::function<void()>& fn);
  // Times fn, prints one table row and records it in the bundle.
  void row(const std::string& family, const std::string& op, const std::string& shape, int64_t batch, double bytes,
           const std::function<void()>& fn);

 private:
  std::shared_ptr<backends::cuda::Context> ctx_;
  Registry reg_;
  core::Rng rng_;
  OpBenchPatterns pat_;
  std::vector<int64_t> batches_;
  core::Tensor flush_;  // written before each timed run: evicts L2
  int iters_;
  double copy_bytes_per_second_ = 0;
  nlohmann::json rows_ = nlohmann::json::array();
};

// The families' routines (each in its folder), in the order the benchmark runs them.
void bench_linear_ops(OpBench& b);       // linear/linear_op_bench.cpp
void bench_kda_ops(OpBench& b);          // kda/kda_op_bench.cpp
void bench_mla_ops(OpBench& b);          // mla/mla_op_bench.cpp
void bench_moe_ops(OpBench& b);          // moe/moe_op_bench.cpp
void bench_attn_res_ops(OpBench& b);     // attn_res/attn_res_op_bench.cpp
void bench_norm_ops(OpBench& b);         // norm/norm_op_bench.cpp
void bench_elementwise_ops(OpBench& b);  // elementwise/elementwise_op_bench.cpp
void bench_situ_ops(OpBench& b);         // situ/situ_op_bench.cpp
void bench_sampling_ops(OpBench& b);     // sampling/sampling_op_bench.cpp

struct OpBenchFamily {
  const char* name;
  void (*run)(OpBench&);
};
inline constexpr OpBenchFamily kOpBenchFamilies[] = {{"linear", bench_linear_ops},
                                                     {"kda", bench_kda_ops},
                                                     {"mla", bench_mla_ops},
                                                     {"moe", bench_moe_ops},
                                                     {"attn_res", bench_attn_res_ops},
                                                     {"norm", bench_norm_ops},
                                                     {"elementwise", bench_elementwise_ops},
                                                     {"situ", bench_situ_ops},
                                                     {"sampling", bench_sampling_ops}};

}  // namespace k3::kernels
