// tests/gpu/fastpath_gpu_test.cpp: the latency_specialized decode path on the GPU: its CUDA
// fused kernels ran (not a fallback, not the CPU references), greedy fp32 generations equal the
// standard GPU path and the CPU oracle, and bf16 decode logits track the standard GPU path.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "gpu_test_util.h"

namespace k3 {
namespace {

using testing::random_tokens;

std::unique_ptr<runner::ModelRunner> open(const std::filesystem::path& dir, core::Device device, kernels::Precision p,
                                          model::DecodeBackend backend, model::KvCacheDtype kv) {
  model::ModelOptions o = gpu_test::options(device, p);
  o.decode_backend = backend;
  return runner::ModelRunner::open(dir, o, kv);
}

struct Case {
  bool mxfp4;
  model::KvCacheDtype kv;
};

TEST(FastPathGpu, FusedKernelsRunAndGreedyFp32EqualsTheStandardPath) {
  K3_REQUIRE_GPU();
  for (const Case c : {Case{false, model::KvCacheDtype::bf16}, Case{true, model::KvCacheDtype::fp8_e4m3}}) {
    SCOPED_TRACE(c.mxfp4 ? "mxfp4 experts, fp8 cache" : "bf16, bf16 cache");
    testing::TempDir tmp;
    checkpoint::WriteOptions w;
    w.init = checkpoint::InitStyle::realistic;
    w.mxfp4 = c.mxfp4;
    const auto dir = testing::write_checkpoint(tmp, config::builtin_config("k3-tiny"), w);
    auto standard = open(dir, core::Device::cuda, kernels::Precision::fp32, model::DecodeBackend::standard, c.kv);
    auto fused = open(dir, core::Device::cuda, kernels::Precision::fp32, model::DecodeBackend::latency_specialized, c.kv);
    auto oracle = open(dir, core::Device::cpu, kernels::Precision::fp32, model::DecodeBackend::standard, c.kv);
    std::string plans;
    fused->set_explain([&](const std::string& s) { plans += s; });
    const auto prompt = random_tokens(40, fused->config().vocab_size, 11);
    const auto want = standard->generate(prompt, 120, {});
    const auto got = fused->generate(prompt, 120, {});
    const auto cpu = oracle->generate(prompt, 120, {});
    EXPECT_EQ(got, want);
    EXPECT_EQ(got, cpu);
    const auto at = plans.find("first decode step, 1 row: decode path latency_specialized (fused)");
    ASSERT_NE(at, std::string::npos) << plans;
    const std::string plan = plans.substr(at);
    for (const char* op : {"kda_decode -> cuda/", "mla_decode -> cuda/", "multi_linear -> cuda/", "attn_res_bank -> cuda/",
                           "attn_res_merge -> cuda/"})
      EXPECT_NE(plan.find(op), std::string::npos) << op << "\n" << plan;
    EXPECT_EQ(plan.find("not used"), std::string::npos) << plan;  // no fused op fell back to standard ops
    EXPECT_EQ(plan.find("/reference"), std::string::npos) << plan;
    std::cerr << plan;
    EXPECT_EQ(fused->model().decode_path_counters().fused_steps, 119);
  }
}

TEST(FastPathGpu, Bf16DecodeLogitsTrackTheStandardPath) {
  K3_REQUIRE_GPU();
  for (auto init : {checkpoint::InitStyle::realistic, checkpoint::InitStyle::sensitive}) {
    testing::TempDir tmp;
    checkpoint::WriteOptions w;
    w.init = init;
    const auto dir = testing::write_checkpoint(tmp, config::builtin_config("k3-tiny"), w);
    auto standard = open(dir, core::Device::cuda, kernels::Precision::bf16, model::DecodeBackend::standard,
                         model::KvCacheDtype::bf16);
    auto fused = open(dir, core::Device::cuda, kernels::Precision::bf16, model::DecodeBackend::latency_specialized,
                      model::KvCacheDtype::bf16);
    const auto tokens = random_tokens(160, fused->config().vocab_size, 12);
    const core::Tensor want = standard->logits(tokens, 100);  // rows 100..159: one decode step each
    const core::Tensor got = fused->logits(tokens, 100);
    const core::Tensor want_dec = model::row_slice(want, 100, 160), got_dec = model::row_slice(got, 100, 160);
    const auto d = testing::compare(got_dec, want_dec);
    EXPECT_GE(d.cosine, 0.999);
    const auto [agree, decided] = gpu_test::decided_top1_agreement(got_dec, want_dec, 0.05f);
    EXPECT_GE(agree, 0.99) << decided << " decided rows";
    EXPECT_EQ(fused->model().decode_path_counters().fused_steps, 60);
  }
}

}  // namespace
}  // namespace k3
