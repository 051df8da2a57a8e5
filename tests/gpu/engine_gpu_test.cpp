// tests/gpu/engine_gpu_test.cpp: the engine core serving requests on the GPU: staggered arrivals
// (mixed prefill/decode steps), a prefix-cache hit (shared MLA pages + a restored KDA checkpoint on
// the device) and greedy decoding give the tokens the CPU oracle engine gives, in exact mode, both
// eager and with decode steps replayed as CUDA graphs, with plain steps sampled on the device
// (runner::DeviceSampler: checked to have run), and with n-gram speculative decoding (verify rows
// through the CUDA no-commit KDA kernels, accepted rows replayed into the committed state); and the
// engine over a TP2 model on two GPUs (engine::TpExecutor) gives the same tokens.
#include <cstdio>
#include <filesystem>
#include <vector>

#include "core/rng.h"
#include "draft/draft_weights.h"
#include "draft/dspark_drafter.h"
#include "draft/eagle3_drafter.h"
#include "draft/eagle3_weights.h"
#include "engine/engine.h"
#include "engine/model_executor.h"
#include "engine/tp_executor.h"
#include "gpu_test_util.h"
#include "runner/device_sampler.h"
#include "runner/tp_runner.h"

namespace k3 {
namespace {

engine::EngineConfig engine_config() {
  engine::EngineConfig c;
  c.cache.block_size = 16;
  c.cache.num_blocks = 128;
  c.cache.num_slots = 4;
  c.cache.num_checkpoints = 16;
  c.cache.checkpoint_interval_blocks = 4;
  c.cache.enable_prefix_cache = true;
  c.scheduler.max_num_seqs = 4;
  c.scheduler.max_num_batched_tokens = 256;
  c.scheduler.long_prefill_token_threshold = 128;
  c.scheduler.max_partial_prefills = 4;
  c.scheduler.max_model_len = 400;
  c.scheduler.chunk_align_tokens = 64;
  c.eos_token_id = -1;
  return c;
}

std::vector<int32_t> tokens(uint64_t seed, int n) {
  core::Rng r(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(r.next_u64() % 1024);
  return t;
}

// Runs the same request mix on an engine over `runner` and returns every request's tokens; with
// `graphs`, pure-decode steps replay as CUDA graphs (and the test checks that they did). With
// `speculate`: n-gram drafts, or the model drafter `method` (dspark, eagle3) in `draft_dir` (its
// steps tap the target's hidden states, graphs included); `stats` gets the engine's counts. A model
// drafter's lengths are fixed (not adaptive: no timing-driven gate), so runs that differ only in
// graphs propose the same drafts.
std::vector<std::vector<int32_t>> serve(const runner::ModelRunner& runner, bool graphs, bool speculate = false,
                                        const std::filesystem::path& draft_dir = {},
                                        engine::EngineStats* stats = nullptr,
                                        spec::SpecMethod method = spec::SpecMethod::dspark, double shadow_rate = 0) {
  engine::EngineConfig c = engine_config();
  c.shadow_validate_rate = shadow_rate;
  std::unique_ptr<spec::Drafter> drafter;
  if (speculate && draft_dir.empty()) {
    c.speculative.method = spec::SpecMethod::ngram;
    c.speculative.num_speculative_tokens = 4;
  } else if (speculate) {
    c.speculative.adaptive = false;
    c.speculative.method = method;
    c.speculative.num_speculative_tokens = 3;
    if (method == spec::SpecMethod::dspark) {  // absorbed: the one form the GPU runs (the oracle's too)
      draft::DraftOptions o;
      o.absorbed_attention = true;
      drafter = draft::load_dspark_drafter(draft_dir, runner.config(), runner.host_weights(), runner.registry(), o, {},
                                           runner.model().memory(), &runner.model().weights());
    } else {  // on the target's device (the CPU oracle's draft on the CPU)
      drafter = draft::load_eagle3_drafter(draft_dir, runner.config(), runner.host_weights(), runner.registry(), {}, {},
                                           runner.model().memory(), runner.model().weights().embed);
    }
  }
  auto executor = std::make_unique<engine::ModelExecutor>(runner.model(), c.cache, model::KvCacheDtype::bf16,
                                                          graphs ? c.scheduler.max_model_len : 0);
  engine::ModelExecutor* exec = executor.get();
  engine::Engine e(c, std::move(executor), std::move(drafter));
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {17, 150, 97, 5}) prompts.push_back(tokens(100 + n, n));
  std::vector<int32_t> shared(prompts[1].begin(), prompts[1].begin() + 140);  // hit 128 of prompt 1
  const auto tail = tokens(7, 30);
  shared.insert(shared.end(), tail.begin(), tail.end());

  std::vector<engine::Engine::Submission> subs;
  for (const auto& p : prompts) {
    engine::GenerateRequest g;
    g.prompt = p;
    g.max_tokens = 24;
    subs.push_back(e.submit(std::move(g)));
    e.step();
    e.step();
  }
  e.run_until_idle();
  engine::GenerateRequest g;
  g.prompt = shared;
  g.max_tokens = 24;
  subs.push_back(e.submit(std::move(g)));
  e.run_until_idle();

  std::vector<std::vector<int32_t>> out;
  for (auto& s : subs) {
    std::vector<int32_t> t;
    int64_t cached = 0;
    while (auto ev = s.stream->try_next()) {
      if (ev->token >= 0) t.push_back(ev->token);
      if (ev->finished) cached = ev->stats.cached_prompt_tokens;
      if (ev->finished) EXPECT_EQ(ev->error, "") << "the request failed";
    }
    EXPECT_EQ(t.size(), 24u);
    if (&s == &subs.back()) {
      EXPECT_EQ(cached, 128) << "the last request should reuse 128 cached prompt tokens";
    }
    out.push_back(std::move(t));
  }
  if (graphs) {
    // A drafter's verify steps of unequal draft lengths run eagerly: fewer replays then.
    EXPECT_GT(exec->graph_replays(), draft_dir.empty() ? 20 : 0) << "decode steps should have replayed CUDA graphs";
  } else {
    EXPECT_EQ(exec->graph_replays(), 0);
  }
  if (runner.model().options().device == core::Device::cpu) {
    EXPECT_EQ(exec->device_sampler(), nullptr);
  } else {
    EXPECT_NE(exec->device_sampler(), nullptr);
    if (exec->device_sampler() && draft_dir.empty()) {  // a tapped step's logits come to the host
      EXPECT_GT(exec->device_sampler()->device_rows(), 50) << "plain steps should be sampled on the device";
    }
  }
  if (speculate) {
    const engine::EngineStats st = e.stats();
    EXPECT_GT(st.spec_num_draft_tokens, 0) << "the drafter never proposed: verify rows were not exercised";
    std::printf("%s speculation%s: %lld drafts, %lld accepted\n", st.spec_method.c_str(), graphs ? " (graphs)" : "",
                static_cast<long long>(st.spec_num_draft_tokens), static_cast<long long>(st.spec_num_accepted_tokens));
  }
  if (stats) *stats = e.stats();
  return out;
}

TEST(EngineGpu, ServesTheOracleTokensExactMode) {
  K3_REQUIRE_GPU();
  testing::TempDir tmp;
  const auto dir = gpu_test::write_sensitive_tiny(tmp);
  gpu_test::RunnerPair r(dir, kernels::Precision::fp32, model::KvCacheDtype::bf16);
  const auto want = serve(*r.cpu, false), eager = serve(*r.gpu, false), graphs = serve(*r.gpu, true);
  const auto speculative = serve(*r.gpu, true, /*speculate=*/true);
  ASSERT_EQ(eager.size(), want.size());
  ASSERT_EQ(graphs.size(), want.size());
  ASSERT_EQ(speculative.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(eager[i], want[i]) << "request " << i << " (eager)";
    EXPECT_EQ(graphs[i], want[i]) << "request " << i << " (CUDA graphs)";
    EXPECT_EQ(speculative[i], want[i]) << "request " << i << " (n-gram speculation, graphs for plain decode steps)";
  }
}

// Shadow validation on the GPU: every fused step (eager, and replayed as CUDA graphs) also runs the
// standard CUDA path on its inputs. In fp32 the served tokens are the ones served without it, and
// the fused kernels agree with the standard ones on every step.
TEST(EngineGpu, ShadowValidationOfTheFusedKernelsKeepsTheTokensFp32) {
  K3_REQUIRE_GPU();
  testing::TempDir tmp;
  const auto dir = gpu_test::write_sensitive_tiny(tmp);
  model::ModelOptions o = gpu_test::options(core::Device::cuda, kernels::Precision::fp32);
  o.decode_backend = model::DecodeBackend::latency_specialized;
  const auto fused = runner::ModelRunner::open(dir, o);
  for (bool graphs : {false, true}) {
    engine::EngineStats off, on;
    const auto want = serve(*fused, graphs, false, {}, &off);
    const auto got = serve(*fused, graphs, false, {}, &on, spec::SpecMethod::dspark, /*shadow_rate=*/1.0);
    EXPECT_EQ(got, want) << (graphs ? "graphs" : "eager");
    ASSERT_GT(on.decode_paths.fused_steps, 0);
    EXPECT_EQ(on.shadow.steps, on.decode_paths.fused_steps);
    EXPECT_EQ(on.shadow.divergent_rows, 0);
    std::printf("shadow validation%s: %lld steps, %lld rows, min cosine %.9f, max |diff| %.3g of the largest logit\n",
                graphs ? " (graphs)" : "", static_cast<long long>(on.shadow.steps),
                static_cast<long long>(on.shadow.rows), on.shadow.min_cosine, on.shadow.max_abs_rel);
  }
}

// The DSpark drafter over a GPU target, running on the target's GPU (the dspark ops' CUDA kernels,
// taps read in place): its steps tap the target's hidden states, and decode and verify steps replay
// CUDA graphs that tap them too. Greedy fp32 tokens equal the CPU oracle's, and the drafts (the same
// fp32 function through the CUDA ops) are the CPU draft's, eager and replayed.
TEST(EngineGpu, DsparkDraftsFromTappedGraphsGiveTheOracleTokens) {
  K3_REQUIRE_GPU();
  testing::TempDir tmp;
  const auto dir = gpu_test::write_sensitive_tiny(tmp);
  const auto draft_dir = tmp.path() / "draft";
  draft::write_random_draft(draft::builtin_draft_config("k3-tiny-dspark"), 3, draft_dir);
  gpu_test::RunnerPair r(dir, kernels::Precision::fp32, model::KvCacheDtype::bf16);
  engine::EngineStats cpu_stats, eager_stats, graph_stats;
  const auto want = serve(*r.cpu, false, true, draft_dir, &cpu_stats);
  const auto eager = serve(*r.gpu, false, true, draft_dir, &eager_stats);
  const auto graphs = serve(*r.gpu, true, true, draft_dir, &graph_stats);
  EXPECT_EQ(want, serve(*r.cpu, false));
  EXPECT_EQ(eager, want);
  EXPECT_EQ(graphs, want);
  EXPECT_GT(eager_stats.spec_num_draft_tokens, 0);
  EXPECT_EQ(eager_stats.spec_method, "dspark");
  EXPECT_EQ(eager_stats.spec_num_draft_tokens, cpu_stats.spec_num_draft_tokens);
  EXPECT_EQ(eager_stats.spec_num_accepted_tokens, cpu_stats.spec_num_accepted_tokens);
  EXPECT_EQ(graph_stats.spec_num_draft_tokens, eager_stats.spec_num_draft_tokens);
  EXPECT_EQ(graph_stats.spec_num_accepted_tokens, eager_stats.spec_num_accepted_tokens);
}

// The same with an EAGLE-3 draft (its taps are the inputs of target layers 1, 2 and 3), which runs
// on the target's device: on the GPU its drafts (the same fp32 function through the CUDA ops) are
// the CPU oracle's drafts, so the verified and accepted counts match the CPU run's too.
TEST(EngineGpu, Eagle3DraftsFromTappedGraphsGiveTheOracleTokens) {
  K3_REQUIRE_GPU();
  testing::TempDir tmp;
  const auto dir = gpu_test::write_sensitive_tiny(tmp);
  const auto draft_dir = tmp.path() / "draft";
  draft::write_random_eagle3(draft::builtin_eagle3_config("k3-tiny-eagle3"), 3, draft_dir);
  gpu_test::RunnerPair r(dir, kernels::Precision::fp32, model::KvCacheDtype::bf16);
  engine::EngineStats cpu_stats, eager_stats, graph_stats;
  const auto want = serve(*r.cpu, false, true, draft_dir, &cpu_stats, spec::SpecMethod::eagle3);
  const auto eager = serve(*r.gpu, false, true, draft_dir, &eager_stats, spec::SpecMethod::eagle3);
  const auto graphs = serve(*r.gpu, true, true, draft_dir, &graph_stats, spec::SpecMethod::eagle3);
  EXPECT_EQ(eager, want);
  EXPECT_EQ(graphs, want);
  EXPECT_GT(eager_stats.spec_num_draft_tokens, 0);
  EXPECT_EQ(eager_stats.spec_method, "eagle3");
  EXPECT_EQ(eager_stats.spec_num_draft_tokens, cpu_stats.spec_num_draft_tokens);
  EXPECT_EQ(eager_stats.spec_num_accepted_tokens, cpu_stats.spec_num_accepted_tokens);
  EXPECT_EQ(graph_stats.spec_num_draft_tokens, eager_stats.spec_num_draft_tokens);
  EXPECT_EQ(graph_stats.spec_num_accepted_tokens, eager_stats.spec_num_accepted_tokens);
}

// The engine serving a TP model on the GPUs (engine::TpExecutor: one ModelExecutor per rank, each
// capturing its decode steps with their collectives as CUDA graphs) gives, in fp32, the greedy
// tokens of the CPU engine over the plain model: staggered requests, chunked prefill beside
// decodes, a prefix hit.
TEST(EngineGpu, TensorParallelServesTheOracleTokensFp32) {
  K3_REQUIRE_GPUS(2);
  gpu_test::launch_with_nvls_off();
  testing::TempDir tmp;
  checkpoint::WriteOptions w;
  w.mxfp4 = true;
  const auto dir = testing::write_checkpoint(tmp, config::builtin_config("k3-tiny"), w);
  const engine::EngineConfig c = engine_config();
  // `graph_replays`: for the TP executor, rank 0's replays (read before the engine frees it).
  auto serve = [&](std::unique_ptr<engine::Executor> executor, int64_t* graph_replays) {
    engine::Executor* raw = executor.get();
    engine::Engine e(c, std::move(executor));
    const auto a = tokens(1, 150), b0 = tokens(3, 40);
    std::vector<int32_t> b(a.begin(), a.begin() + 130);
    const auto tail = tokens(2, 17);
    b.insert(b.end(), tail.begin(), tail.end());
    std::vector<std::shared_ptr<engine::TokenStream>> streams;
    for (const auto& p : {a, b0}) {
      engine::GenerateRequest g;
      g.prompt = p;
      g.max_tokens = 20;
      streams.push_back(e.submit(std::move(g)).stream);
      e.step();
    }
    e.run_until_idle();
    engine::GenerateRequest g;
    g.prompt = b;
    g.max_tokens = 20;
    streams.push_back(e.submit(std::move(g)).stream);
    e.run_until_idle();
    std::vector<std::vector<int32_t>> out;
    for (auto& st : streams) {
      out.emplace_back();
      while (auto ev = st->try_next())
        if (ev->token >= 0) out.back().push_back(ev->token);
    }
    if (graph_replays) *graph_replays = static_cast<engine::TpExecutor*>(raw)->rank(0).graph_replays();
    return out;
  };
  auto cpu = runner::ModelRunner::open(dir, gpu_test::options(core::Device::cpu, kernels::Precision::fp32),
                                       model::KvCacheDtype::bf16);
  const auto want = serve(std::make_unique<engine::ModelExecutor>(cpu->model(), c.cache, model::KvCacheDtype::bf16),
                          nullptr);
  auto ranks = runner::TpRunner::open(dir, 2, gpu_test::options(core::Device::cuda, kernels::Precision::fp32),
                                      model::KvCacheDtype::bf16);
  int64_t replays = 0;
  const auto got = serve(std::make_unique<engine::TpExecutor>(*ranks, c.cache, model::KvCacheDtype::bf16,
                                                              c.scheduler.max_model_len),
                         &replays);
  EXPECT_EQ(got, want);
  EXPECT_GT(replays, 10) << "TP decode steps should replay CUDA graphs on every rank";
}

}  // namespace
}  // namespace k3
