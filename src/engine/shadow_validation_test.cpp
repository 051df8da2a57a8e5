// engine/shadow_validation_test.cpp: shadow validation of the fused decode path.
//   - compare_logits: identical rows agree; bf16-sized noise and a flipped near tie stay within the
//     tolerance; a flipped clear winner, a low cosine, a large difference or a NaN diverge;
//   - through the engine on the tiny model (CPU: the fused path runs its references): with every
//     fused step shadowed, the clients get bit-identical logits and tokens to no shadow, plain and
//     speculative steps alike, and every fused step was compared and agreed; a sampled share
//     shadows only some; a deliberately wrong fused op is caught, logged with the step's shapes and
//     its kernel, and the clients still get what the fused path computed.
#include "engine/shadow_validation.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "checkpoint/checkpoint.h"
#include "core/device_memory.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/model_executor.h"
#include "fastpath/fused_decode.h"
#include "kernels/attn_res/attn_res_fused.h"
#include "kernels/registry.h"
#include "model/model.h"
#include "model/weights.h"
#include "scheduler/step_route.h"

namespace k3::engine {
namespace {

core::Tensor rows_of(std::initializer_list<std::vector<float>> rows) {
  const auto V = static_cast<int64_t>(rows.begin()->size());
  core::Tensor t = core::Tensor::zeros(core::DType::f32, {static_cast<int64_t>(rows.size()), V});
  int64_t r = 0;
  for (const auto& row : rows) std::memcpy(t.data<float>() + r++ * V, row.data(), row.size() * sizeof(float));
  return t;
}

TEST(CompareLogits, IdenticalRowsAgree) {
  const core::Tensor a = rows_of({{1, 5, -2, 0}, {0, 0, 0, 0}});
  const ShadowReport r = compare_logits(a, a, shadow_tolerance(false));
  EXPECT_EQ(r.rows, 2);
  EXPECT_EQ(r.divergent_rows, 0);
  EXPECT_EQ(r.top1_disagreements, 0);
  EXPECT_DOUBLE_EQ(r.min_cosine, 1);
  EXPECT_DOUBLE_EQ(r.max_abs, 0);
  EXPECT_FALSE(r.diverged());
}

TEST(CompareLogits, RoundingNoiseAndAFlippedNearTieStayWithinTheTolerance) {
  // bf16-sized noise (~0.4% of the scale), and tokens 1 and 2 within 0.1% of the range: the fused
  // path picks 2, the standard path 1.
  const core::Tensor fused = rows_of({{-4.01f, 7.99f, 8.004f, 1.0f}});
  const core::Tensor standard = rows_of({{-4.0f, 8.0f, 7.995f, 1.004f}});
  const ShadowReport r = compare_logits(fused, standard, shadow_tolerance(false));
  EXPECT_EQ(r.top1_disagreements, 1);
  EXPECT_EQ(r.divergent_rows, 0);
  EXPECT_GT(r.min_cosine, 0.9999);
  EXPECT_NEAR(r.max_abs, 0.01, 1e-5);
  EXPECT_NEAR(r.max_abs_rel, 0.01 / 8, 1e-6);
  // fp32's tolerance is far tighter: the same noise diverges there.
  EXPECT_EQ(compare_logits(fused, standard, shadow_tolerance(true)).divergent_rows, 1);
}

TEST(CompareLogits, AClearFlipALowCosineALargeDifferenceOrANanDiverges) {
  const ShadowTolerance tol = shadow_tolerance(false);
  const core::Tensor standard = rows_of({{0, 8, 2, 1}});
  EXPECT_EQ(compare_logits(rows_of({{0, 2, 8, 1}}), standard, tol).divergent_rows, 1);  // the winner moved
  const ShadowReport low = compare_logits(rows_of({{1, 8, 7, 7}}), standard, tol);      // same top-1, cosine 0.8
  EXPECT_EQ(low.top1_disagreements, 0);
  EXPECT_EQ(low.divergent_rows, 1);
  EXPECT_LT(low.min_cosine, 0.9);
  EXPECT_EQ(compare_logits(rows_of({{0, 8, 2, 1.6f}}), standard, tol).divergent_rows, 1);  // 0.6 > 5% of 8
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(compare_logits(rows_of({{0, 8, nan, 1}}), standard, tol).divergent_rows, 1);
  // Only the bad row of several counts.
  const ShadowReport two = compare_logits(rows_of({{0, 8, 2, 1}, {0, 2, 8, 1}}), rows_of({{0, 8, 2, 1}, {0, 8, 2, 1}}),
                                          tol);
  EXPECT_EQ(two.rows, 2);
  EXPECT_EQ(two.divergent_rows, 1);
}

TEST(CompareLogits, RefusesLogitsOfDifferentShapes) {
  try {
    (void)compare_logits(rows_of({{1, 2, 3}}), rows_of({{1, 2, 3}, {1, 2, 3}}), {});
    FAIL() << "rows of different counts were compared";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("differ in shape"), std::string::npos) << e.what();
  }
}

TEST(SummarizeKernels, EachPairOnceInFirstCallOrderWithItsCount) {
  const core::KernelList calls = {{"kda_decode", "reference"},
                                  {"attn_res_merge", "reference"},
                                  {"kda_decode", "reference"},
                                  {"mla_decode", "cuda_splitkv"},
                                  {"attn_res_merge", "reference"}};
  EXPECT_EQ(summarize_kernels(calls),
            "kda_decode=reference x2, attn_res_merge=reference x2, mla_decode=cuda_splitkv x1");
  EXPECT_EQ(summarize_kernels({}), "");
}

TEST(ShadowSampled, ReproducibleAndNearTheRate) {
  int64_t hits = 0;
  for (uint64_t step = 1; step <= 20000; ++step) {
    hits += scheduler::shadow_sampled(step, 0.1) ? 1 : 0;
    EXPECT_EQ(scheduler::shadow_sampled(step, 0.1), scheduler::shadow_sampled(step, 0.1));
    EXPECT_FALSE(scheduler::shadow_sampled(step, 0));
    EXPECT_TRUE(scheduler::shadow_sampled(step, 1));
  }
  EXPECT_NEAR(static_cast<double>(hits) / 20000, 0.1, 0.01);
}

// The tiny model (3 KDA + 1 MLA layers, random "sensitive" weights) on the CPU, fp32, with the
// fused path; `broken`: its attn_res_merge (a fused-path op) adds 0.5 to every output of the norm.
class ShadowEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("k3-shadow-test-" + std::to_string(::getpid())));
    checkpoint::WriteOptions w;
    w.init = checkpoint::InitStyle::sensitive;
    checkpoint::write_random_checkpoint(config::builtin_config("k3-tiny"), w, *dir_);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  struct Fused {
    explicit Fused(bool broken) : loaded(checkpoint::load_checkpoint(*dir_)) {
      if (broken)
        registry.attn_res_merge.add(
            {"broken_for_test", core::Device::cpu, nullptr, [](const kernels::AttnResMergeArgs& a) {
               kernels::attn_res_merge_reference(a);
               for (float& x : a.normed_out.span<float>()) x += 0.5f;
             }});
      kernels::register_reference_ops(registry);  // after it: registered first, the broken one is chosen
      memory = core::make_host_memory();
      weights = model::to_device(loaded.weights, *memory);
      model::ModelOptions o;
      o.precision = kernels::Precision::fp32;
      o.decode_backend = model::DecodeBackend::latency_specialized;
      model = std::make_unique<model::Model>(loaded.config, weights, registry, o, memory);
      fastpath::attach(*model, 0);
    }
    checkpoint::LoadedModel loaded;
    kernels::Registry registry;
    std::shared_ptr<core::DeviceMemory> memory;
    model::Weights weights;
    std::unique_ptr<model::Model> model;
  };

  static EngineConfig config(double rate, bool speculate) {
    EngineConfig c;
    c.cache.block_size = 16;
    c.cache.num_blocks = 64;
    c.cache.num_slots = 4;
    c.cache.num_checkpoints = 8;
    c.cache.checkpoint_interval_blocks = 4;
    c.scheduler.max_num_seqs = 4;
    c.scheduler.max_model_len = 256;
    c.eos_token_id = -1;
    c.shadow_validate_rate = rate;
    if (speculate) {
      c.speculative.method = spec::SpecMethod::ngram;
      c.speculative.num_speculative_tokens = 3;
    }
    return c;
  }

  struct Run {
    std::vector<std::vector<int32_t>> tokens;  // per request
    std::vector<std::vector<float>> logits;    // plain runs: every row handed out, requests in order
    EngineStats stats;
  };
  static Run run(const Fused& f, double rate, bool speculate) {
    Engine e(config(rate, speculate),
             std::make_unique<ModelExecutor>(*f.model, config(rate, speculate).cache, model::KvCacheDtype::bf16));
    Run out;
    std::vector<std::shared_ptr<TokenStream>> streams;
    std::vector<std::vector<std::vector<float>>> rows(3);
    for (int i = 0; i < 3; ++i) {
      GenerateRequest g;
      // Repeating prompts, so n-gram drafts are proposed (and some accepted).
      for (int k = 0; k < 24 + 9 * i; ++k) g.prompt.push_back((k % (5 + i)) * 37 + 11 * i + 3);
      g.max_tokens = 12;
      g.ignore_eos = true;
      // A logits sink turns drafting off for its request: speculative runs compare tokens only.
      auto* mine = &rows[static_cast<size_t>(i)];
      if (!speculate)
        g.on_logits = [mine](int64_t, std::span<const float> l) { mine->emplace_back(l.begin(), l.end()); };
      streams.push_back(e.submit(std::move(g)).stream);
    }
    e.run_until_idle();
    for (auto& s : streams) {
      out.tokens.emplace_back();
      while (auto ev = s->try_next())
        if (ev->token >= 0) out.tokens.back().push_back(ev->token);
    }
    for (auto& r : rows) out.logits.insert(out.logits.end(), r.begin(), r.end());
    out.stats = e.stats();
    EXPECT_EQ(out.stats.cache.blocks_in_use, 0);
    EXPECT_EQ(out.stats.cache.slots_in_use, 0);
    return out;
  }

  static std::filesystem::path* dir_;
};
std::filesystem::path* ShadowEngine::dir_ = nullptr;

TEST_F(ShadowEngine, EveryFusedStepShadowedGivesTheClientsTheSameLogitsAndTokens) {
  const Fused f(false);
  for (bool speculate : {false, true}) {
    SCOPED_TRACE(speculate ? "ngram speculation" : "plain decoding");
    const Run off = run(f, 0, speculate), on = run(f, 1, speculate);
    EXPECT_EQ(on.tokens, off.tokens);
    ASSERT_EQ(on.logits.size(), off.logits.size());
    for (size_t i = 0; i < on.logits.size(); ++i)
      ASSERT_EQ(std::memcmp(on.logits[i].data(), off.logits[i].data(), on.logits[i].size() * sizeof(float)), 0)
          << "logits row " << i << " changed under shadow validation";
    EXPECT_EQ(off.stats.shadow.steps, 0);
    ASSERT_GT(on.stats.decode_paths.fused_steps, 0);
    EXPECT_EQ(on.stats.shadow.steps, on.stats.decode_paths.fused_steps);  // rate 1: every fused step
    EXPECT_GE(on.stats.shadow.rows, on.stats.shadow.steps);
    EXPECT_EQ(on.stats.shadow.divergent_steps, 0);
    EXPECT_EQ(on.stats.shadow.top1_disagreements, 0);
    EXPECT_GE(on.stats.shadow.min_cosine, 1 - 1e-5);
    EXPECT_LE(on.stats.shadow.max_abs_rel, 1e-4);
    EXPECT_GT(on.stats.shadow.seconds, 0);
    if (speculate) EXPECT_GT(on.stats.spec_num_draft_tokens, 0) << "no verify step ran";
  }
}

TEST_F(ShadowEngine, ASampledShareOfTheFusedStepsIsShadowed) {
  const Fused f(false);
  const Run some = run(f, 0.4, false);
  EXPECT_GT(some.stats.shadow.steps, 0);
  EXPECT_LT(some.stats.shadow.steps, some.stats.decode_paths.fused_steps);
  EXPECT_EQ(some.stats.shadow.divergent_steps, 0);
}

TEST_F(ShadowEngine, AWrongFusedOpIsCaughtAndLoggedWhileClientsGetTheFusedOutput) {
  const Fused broken(true);
  const Run off = run(broken, 0, false);
  ::testing::internal::CaptureStderr();
  const Run on = run(broken, 1, false);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(on.tokens, off.tokens) << "shadow validation changed what the clients got";
  ASSERT_GT(on.stats.shadow.steps, 0);
  EXPECT_EQ(on.stats.shadow.divergent_steps, on.stats.shadow.steps);
  EXPECT_LT(on.stats.shadow.min_cosine, 0.999);
  EXPECT_NE(log.find("shadow validation: the fused path diverged from the standard one"), std::string::npos) << log;
  EXPECT_NE(log.find("attn_res_merge=broken_for_test"), std::string::npos) << log;
  EXPECT_NE(log.find("sequences,"), std::string::npos) << log;  // the step's shapes
}

TEST_F(ShadowEngine, ARateOutsideZeroToOneOrAStandardOnlyExecutorIsRefused) {
  const Fused f(false);
  auto message = [&](double rate, const model::Model& m) {
    try {
      Engine e(config(rate, false),
               std::make_unique<ModelExecutor>(m, config(rate, false).cache, model::KvCacheDtype::bf16));
    } catch (const core::Error& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  EXPECT_NE(message(1.5, *f.model).find("shadow_validate_rate must be in [0, 1], got 1.5"), std::string::npos);
  EXPECT_NE(message(-0.1, *f.model).find("shadow_validate_rate must be in [0, 1]"), std::string::npos);
  EXPECT_EQ(message(0.5, *f.model), "");
  model::ModelOptions standard;
  standard.precision = kernels::Precision::fp32;
  const model::Model plain(f.loaded.config, f.weights, f.registry, standard, f.memory);
  EXPECT_NE(message(0.5, plain).find("runs the standard path only"), std::string::npos);
}

}  // namespace
}  // namespace k3::engine
