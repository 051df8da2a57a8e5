// tests/gpu/model_gpu_test.cpp: the K3 model end to end on the GPU through the same model code as
// the CPU oracle: logits in engine mode (bf16 activations on the device) within bf16 tolerances
// with top-1 agreement >= 99%, greedy generations identical in exact (fp32) mode, batched steps
// (mixed prefill/decode, verify rows) equal to one sequence at a time, for bf16 and MXFP4 experts,
// bf16 and fp8 latent caches, and the realistic and sensitive inits.
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "engine/one_shot.h"
#include "gpu_test_util.h"
#include "model/local_cache.h"

namespace k3 {
namespace {

using gpu_test::decided_top1_agreement;
using gpu_test::RunnerPair;
using model::KvCacheDtype;
using testing::compare;

using testing::random_tokens;

struct Case {
  const char* name;
  bool mxfp4;
  checkpoint::InitStyle init;
  KvCacheDtype kv;
};
const Case kCases[] = {
    {"bf16_realistic_bf16kv", false, checkpoint::InitStyle::realistic, KvCacheDtype::bf16},
    {"mxfp4_realistic_fp8kv", true, checkpoint::InitStyle::realistic, KvCacheDtype::fp8_e4m3},
    {"bf16_sensitive_bf16kv", false, checkpoint::InitStyle::sensitive, KvCacheDtype::bf16},
    {"mxfp4_sensitive_bf16kv", true, checkpoint::InitStyle::sensitive, KvCacheDtype::bf16},
};

class ModelGpu : public ::testing::TestWithParam<Case> {
 protected:
  std::filesystem::path checkpoint() {
    checkpoint::WriteOptions w;
    w.init = GetParam().init;
    w.mxfp4 = GetParam().mxfp4;
    return testing::write_checkpoint(tmp_, config::builtin_config("k3-tiny"), w);
  }
  testing::TempDir tmp_;
};

// Engine mode: prefill 150 tokens then 100 decode steps, every position's logits. The tiny random
// model's logits are nearly flat and its sigmoid router nearly tied, so bf16 summation-order noise
// flips some routing decisions (the trace test below shows where); those rows differ as any two
// bf16 engines differ. The bounds: top-1 agreement >= 99% over the rows whose top-1 is decided by
// more than 2% of the logit scale, >= 95% over all rows, and a close logit vector on average.
TEST_P(ModelGpu, LogitsMatchOracleBf16) {
  K3_REQUIRE_GPU();
  RunnerPair r(checkpoint(), kernels::Precision::bf16, GetParam().kv);
  const auto tokens = random_tokens(250, r.cpu->config().vocab_size, 11);
  const core::Tensor want = engine::logits(*r.cpu, tokens, 150), got = engine::logits(*r.gpu, tokens, 150);
  const testing::Diff d = compare(got, want);
  const auto [decided_agree, decided] = decided_top1_agreement(got, want, 0.02f * static_cast<float>(d.scale));
  const double rel_l2 = gpu_test::rel_l2(got, want);
  std::printf(
      "[%s] bf16 logits: rel_l2 %.4g, max_abs %.4g (scale %.4g), min row cosine %.6f, top-1 agreement %.4f "
      "(all %lld rows), %.4f (%lld decided rows)\n",
      GetParam().name, rel_l2, d.max_abs, d.scale, d.cosine, d.top1_agreement, static_cast<long long>(want.dim(0)),
      decided_agree, static_cast<long long>(decided));
  EXPECT_GE(decided_agree, 0.99);
  EXPECT_GE(decided, want.dim(0) / 2) << "too few decided rows for the agreement to mean anything";
  EXPECT_GE(d.top1_agreement, 0.95);
  EXPECT_LT(rel_l2, 0.06);
  EXPECT_GE(d.cosine, 0.97);
}

// Exact mode: 200 greedy tokens identical to the oracle's.
TEST_P(ModelGpu, GreedyGenerationMatchesOracleFp32) {
  K3_REQUIRE_GPU();
  RunnerPair r(checkpoint(), kernels::Precision::fp32, GetParam().kv);
  const auto prompt = random_tokens(37, r.cpu->config().vocab_size, 5);
  runner::SamplingParams greedy;
  greedy.temperature = 0;
  const auto want = engine::generate(*r.cpu, prompt, 200, greedy), got = engine::generate(*r.gpu, prompt, 200, greedy);
  ASSERT_EQ(got.size(), want.size());
  size_t first_diff = got.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      first_diff = i;
      break;
    }
  EXPECT_EQ(first_diff, got.size()) << "GPU greedy output diverges from the oracle at token " << first_diff;
}

INSTANTIATE_TEST_SUITE_P(Tiny, ModelGpu, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// One GPU step holding a prefill, a decode and a 4-row verify sequence gives the logits each
// sequence gets alone (fp32 mode: only summation order may differ).
TEST(ModelGpuBatch, MixedStepEqualsSeparateSequences) {
  K3_REQUIRE_GPU();
  testing::TempDir tmp;
  checkpoint::WriteOptions w;
  w.mxfp4 = true;
  const auto dir = testing::write_checkpoint(tmp, config::builtin_config("k3-tiny"), w);
  auto r = runner::ModelRunner::open(dir, gpu_test::options(core::Device::cuda, kernels::Precision::fp32),
                                     KvCacheDtype::bf16);
  const model::Model& m = r->model();
  const int vocab = r->config().vocab_size;
  const auto a = random_tokens(70, vocab, 1), b = random_tokens(41, vocab, 2), c = random_tokens(23, vocab, 3);

  // Separately: a = prefill 70; b = prefill 40 + decode 1; c = prefill 19 + verify 4.
  auto run_alone = [&](const std::vector<int32_t>& t, size_t pre, model::StepKind kind) {
    model::LocalCache cache(r->config(), 1, 128, KvCacheDtype::bf16, 16, m.memory(), kernels::Precision::fp32);
    model::SequenceState s = cache.new_sequence();
    std::span<const int32_t> all(t);
    if (pre < t.size()) {
      const model::SequenceInput in{all.first(pre), &s, model::StepKind::prefill};
      (void)m.forward(cache.storage(), {&in, 1}, model::LogitRows::last);
    }
    const model::SequenceInput in{pre < t.size() ? all.subspan(pre) : all, &s, kind};
    return m.forward(cache.storage(), {&in, 1}, model::LogitRows::all);
  };
  const core::Tensor la = run_alone(a, 70, model::StepKind::prefill);
  const core::Tensor lb = run_alone(b, 40, model::StepKind::decode);
  const core::Tensor lc = run_alone(c, 19, model::StepKind::decode);

  // Together, in one cache with shared storage and one forward for the last step.
  model::LocalCache cache(r->config(), 3, 128, KvCacheDtype::bf16, 16, m.memory(), kernels::Precision::fp32);
  model::SequenceState sa = cache.new_sequence(), sb = cache.new_sequence(), sc = cache.new_sequence();
  std::span<const int32_t> B(b), C(c);
  const model::SequenceInput pre[] = {{B.first(40), &sb, model::StepKind::prefill},
                                      {C.first(19), &sc, model::StepKind::prefill}};
  (void)m.forward(cache.storage(), pre, model::LogitRows::last);
  const model::SequenceInput step[] = {{B.subspan(40), &sb, model::StepKind::decode},
                                       {std::span<const int32_t>(a), &sa, model::StepKind::prefill},
                                       {C.subspan(19), &sc, model::StepKind::decode}};
  const core::Tensor all = m.forward(cache.storage(), step, model::LogitRows::all);  // rows: b(1), a(70), c(4)
  ASSERT_EQ(all.dim(0), 75);
  auto rows = [&](int64_t begin, int64_t n) {
    core::Tensor t = core::Tensor::zeros(core::DType::f32, {n, all.dim(1)});
    std::memcpy(t.data<float>(), all.data<const float>() + begin * all.dim(1), static_cast<size_t>(t.nbytes()));
    return t;
  };
  for (const auto& [got, want, name] : {std::tuple{rows(0, 1), lb, "decode"}, std::tuple{rows(1, 70), la, "prefill"},
                                        std::tuple{rows(71, 4), lc, "verify"}}) {
    const testing::Diff d = compare(got, want);
    EXPECT_LT(d.rel(), 1e-4) << name;
    EXPECT_EQ(d.top1_agreement, 1.0) << name;
  }
}

}  // namespace
}  // namespace k3

namespace k3 {
namespace {

// Every traced intermediate (embed, per layer attn/ffn outputs, kda.o, mla.o, moe.latent, logits)
// of a bf16 prefill on the GPU against the CPU oracle's: relative L2 error and tokens off per name,
// so a rounding-point mismatch shows where it starts rather than only in the logits. Everything
// before the first router must agree to rounding noise on every token.
TEST(ModelGpuTrace, IntermediatesTrackTheOracleBf16) {
  K3_REQUIRE_GPU();
  testing::TempDir tmp;
  const auto dir = testing::write_checkpoint(tmp, config::builtin_config("k3-tiny"), {});
  RunnerPair r(dir, kernels::Precision::bf16, KvCacheDtype::bf16);
  const auto tokens = random_tokens(150, r.cpu->config().vocab_size, 21);

  using Trace = std::vector<std::pair<std::string, core::Tensor>>;
  auto run = [&](const runner::ModelRunner& runner) {
    Trace out;
    const model::TraceFn fn = [&](std::string_view name, int layer, const core::TensorView& v) {
      out.emplace_back(std::string(name) + "@" + std::to_string(layer), core::Tensor::copy_of(v));
    };
    const model::Model& m = runner.model();
    model::LocalCache cache(runner.config(), 1, 256, KvCacheDtype::bf16, 16, m.memory(), kernels::Precision::bf16);
    model::SequenceState s = cache.new_sequence();
    const model::SequenceInput in{std::span<const int32_t>(tokens), &s, model::StepKind::prefill};
    (void)m.forward(cache.storage(), {&in, 1}, model::LogitRows::all, &fn);
    return out;
  };
  const Trace want = run(*r.cpu), got = run(*r.gpu);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].first, want[i].first);
    const float* a = got[i].second.data<const float>();
    const float* b = want[i].second.data<const float>();
    double num = 0, den = 0;
    for (int64_t j = 0; j < want[i].second.numel(); ++j) {
      num += (double(a[j]) - b[j]) * (double(a[j]) - b[j]);
      den += double(b[j]) * b[j];
    }
    const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    // Rows (tokens) whose own relative error is above 2e-2: routing flips show up as a few such
    // rows, a wrong rounding point as most rows.
    const int64_t rows = want[i].second.dim(0), cols = want[i].second.numel() / rows;
    int64_t off_rows = 0;
    for (int64_t t = 0; t < rows; ++t) {
      double n = 0, d = 0;
      for (int64_t j = t * cols; j < (t + 1) * cols; ++j) {
        n += (double(a[j]) - b[j]) * (double(a[j]) - b[j]);
        d += double(b[j]) * b[j];
      }
      off_rows += (d > 0 ? std::sqrt(n / d) : std::sqrt(n)) > 2e-2;
    }
    std::printf("trace %-16s rel_l2 %.3e  rows off by > 2%%: %lld of %lld\n", got[i].first.c_str(), rel,
                static_cast<long long>(off_rows), static_cast<long long>(rows));
    const std::string& name = got[i].first;
    const bool before_first_router = name.find("@0") != std::string::npos || name == "embed@-1" || name == "kda.o@1" ||
                                     name == "kda.gated@1" || name == "attn.out@1";
    if (before_first_router) {
      EXPECT_LT(rel, 1e-2) << name << ": no routing yet, only rounding noise";
      EXPECT_EQ(off_rows, 0) << name;
    }
    // The first router's output: a near-tie may flip for a token or two (docs/perf/kernel-notes.md);
    // past it, a flipped token's difference travels on through the KDA state and MLA attention,
    // so later entries are reported, not bounded.
    if (name == "moe.latent@1") {
      EXPECT_LE(off_rows, 3) << name << ": more tokens off than routing near-ties explain";
    }
  }
  (void)worst;
}

}  // namespace
}  // namespace k3
