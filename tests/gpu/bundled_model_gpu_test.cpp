// tests/gpu/bundled_model_gpu_test.cpp: the bundled trained model (models/k3-code-15m) at a
// 32K-token context on the GPU's bf16 paths against the CPU oracle. On a trained model a task
// metric is sharp where cosine on random weights is not: the next-token accuracy (and loss) over
// a held-out text of 32,769 tokens (tests/gpu/data/k3-code-15m-heldout.u32: train/*.py and
// docs/architecture.md as of the model's commit, tokenized by `k3serve encode-corpus --tokenizer
// models/k3-code-15m`; never in the training corpus) must stay within 1 point of the oracle's, on
// the standard path (one 32K prefill: KDA chunks, tensor-core MLA over the whole context) and on
// the fused path (a prefill, then the last 512 tokens decoded one at a time at 31.7K-32K context).
#include <cmath>
#include <fstream>
#include <vector>

#include "engine/one_shot.h"
#include "gpu_test_util.h"

namespace k3 {
namespace {

const std::filesystem::path kModel = std::filesystem::path(K3_SOURCE_DIR) / "models" / "k3-code-15m";

std::vector<int32_t> heldout_tokens() {
  std::ifstream f(std::filesystem::path(K3_SOURCE_DIR) / "tests" / "gpu" / "data" / "k3-code-15m-heldout.u32",
                  std::ios::binary);
  std::vector<int32_t> ids;
  for (uint32_t v = 0; f.read(reinterpret_cast<char*>(&v), 4);) ids.push_back(static_cast<int32_t>(v));
  return ids;
}

struct Score {
  double accuracy = 0, loss = 0;  // next-token top-1 accuracy and cross-entropy (nats) over the rows
};

// Rows [r0, rows) of logits [T, V] predict tokens[r + 1].
Score score(const core::Tensor& logits, const std::vector<int32_t>& tokens, int64_t r0) {
  const int64_t rows = logits.dim(0) - 1, vocab = logits.dim(1);
  Score s;
  for (int64_t r = r0; r < rows; ++r) {
    const float* l = logits.data<const float>() + r * vocab;
    int64_t best = 0;
    double mx = l[0];
    for (int64_t c = 1; c < vocab; ++c)
      if (l[c] > l[best]) best = c, mx = l[c];
    double z = 0;
    for (int64_t c = 0; c < vocab; ++c) z += std::exp(double(l[c]) - mx);
    const int32_t next = tokens[static_cast<size_t>(r + 1)];
    s.accuracy += best == next;
    s.loss += std::log(z) + mx - l[next];
  }
  s.accuracy /= double(rows - r0);
  s.loss /= double(rows - r0);
  return s;
}

TEST(BundledModelGpu, Accuracy32KWithinOnePointOfTheOracleOnBothPaths) {
  K3_REQUIRE_GPU();
  const std::vector<int32_t> tokens = heldout_tokens();
  ASSERT_EQ(tokens.size(), 32769u) << "tests/gpu/data/k3-code-15m-heldout.u32";
  constexpr int64_t kDecoded = 512;
  const auto t = static_cast<int64_t>(tokens.size());
  const kernels::Precision bf16 = kernels::Precision::bf16;
  auto cpu = runner::ModelRunner::open(kModel, gpu_test::options(core::Device::cpu, bf16));
  const core::Tensor want = engine::logits(*cpu, tokens, t);
  const Score oracle = score(want, tokens, 0), oracle_tail = score(want, tokens, t - kDecoded);
  // The model is trained: far better than chance, and the oracle is the reference both paths meet.
  EXPECT_GT(oracle.accuracy, 0.3);
  EXPECT_LT(oracle.loss, 4.0);

  for (const model::DecodeBackend backend :
       {model::DecodeBackend::standard, model::DecodeBackend::latency_specialized}) {
    model::ModelOptions o = gpu_test::options(core::Device::cuda, bf16);
    o.decode_backend = backend;
    auto gpu = runner::ModelRunner::open(kModel, o);
    const bool fused = backend == model::DecodeBackend::latency_specialized;
    core::DecodePathCounters paths;
    const core::Tensor got = engine::logits(*gpu, tokens, fused ? t - kDecoded : t, &paths);
    const Score all = score(got, tokens, 0), tail = score(got, tokens, t - kDecoded);
    const auto [agree, decided] = gpu_test::decided_top1_agreement(got, want, 0.05f);
    std::printf(
        "%s: accuracy %.4f (oracle %.4f), loss %.4f (oracle %.4f); last %lld rows accuracy %.4f (oracle %.4f); "
        "top-1 agreement %.4f over %lld decided rows\n",
        fused ? "fused" : "standard", all.accuracy, oracle.accuracy, all.loss, oracle.loss,
        static_cast<long long>(kDecoded), tail.accuracy, oracle_tail.accuracy, agree, static_cast<long long>(decided));
    EXPECT_LE(std::abs(all.accuracy - oracle.accuracy), 0.01);
    EXPECT_LE(std::abs(tail.accuracy - oracle_tail.accuracy), 0.01);
    EXPECT_LE(std::abs(all.loss - oracle.loss), 0.02);
    EXPECT_GE(agree, 0.99);
    if (fused) EXPECT_GE(paths.fused_steps, kDecoded - 1) << "the decode steps must run on the fused path";
  }
}

}  // namespace
}  // namespace k3
