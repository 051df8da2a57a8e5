// engine/tp_executor_test.cpp: the Engine serving a tensor-parallel model (TpExecutor over a CPU
// TpRunner, TP=2 and 4 on k3-tiny) gives, in fp32 mode, the greedy tokens of the same engine over
// the plain model: three requests batched together, one reusing another's prefix (shared MLA pages
// and a restored KDA checkpoint on every rank), prefill chunks mixed with decodes; the same with
// decode context parallelism (the MLA cache split over the ranks by token).
#include "engine/tp_executor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "checkpoint/checkpoint.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "runner/model_runner.h"
#include "runner/tp_runner.h"

namespace k3::engine {
namespace {

EngineConfig small_config() {
  EngineConfig c;
  c.cache.block_size = 16;
  c.cache.num_blocks = 96;
  c.cache.num_slots = 4;
  c.cache.num_checkpoints = 16;
  c.cache.checkpoint_interval_blocks = 4;
  c.cache.enable_prefix_cache = true;
  c.scheduler.max_num_seqs = 4;
  c.scheduler.max_num_batched_tokens = 128;  // small: prompts prefill in chunks beside decodes
  c.scheduler.long_prefill_token_threshold = 64;
  c.scheduler.max_partial_prefills = 4;
  c.scheduler.max_model_len = 256;
  c.eos_token_id = -1;
  return c;
}

std::vector<int32_t> tokens(uint64_t seed, int n) {
  core::Rng r(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(r.next_u64() % 1024);
  return t;
}

// Runs three greedy requests (b shares 130 tokens with a) and returns their outputs.
std::map<int, std::vector<int32_t>> serve(std::unique_ptr<Executor> executor) {
  Engine engine(small_config(), std::move(executor));
  const auto a = tokens(1, 150), c = tokens(3, 40);
  std::vector<int32_t> b(a.begin(), a.begin() + 130);
  const auto tail = tokens(2, 17);
  b.insert(b.end(), tail.begin(), tail.end());
  std::map<int, std::vector<int32_t>> out;
  std::vector<std::shared_ptr<TokenStream>> streams;
  for (const auto& prompt : {a, c}) {
    GenerateRequest g;
    g.prompt = prompt;
    g.max_tokens = 12;
    streams.push_back(engine.submit(std::move(g)).stream);
  }
  engine.run_until_idle();  // a is cached when b arrives
  GenerateRequest g;
  g.prompt = b;
  g.max_tokens = 12;
  streams.push_back(engine.submit(std::move(g)).stream);
  engine.run_until_idle();
  for (size_t i = 0; i < streams.size(); ++i)
    while (auto e = streams[i]->try_next())
      if (e->token >= 0) out[static_cast<int>(i)].push_back(e->token);
  EXPECT_GT(engine.stats().prefix_hit_tokens, 0) << "the prefix hit did not happen";
  return out;
}

TEST(TpExecutor, Fp32GreedyEqualsPlainModelEngine) {
  const auto dir = std::filesystem::temp_directory_path() / ("k3-tp-executor-test-" + std::to_string(::getpid()));
  checkpoint::write_random_checkpoint(config::builtin_config("k3-tiny"), {}, dir);
  model::ModelOptions o;
  o.precision = kernels::Precision::fp32;
  const auto plain = runner::ModelRunner::open(dir, o);
  const cache::CacheConfig cache = small_config().cache;
  const auto want = serve(std::make_unique<ModelExecutor>(plain->model(), cache, model::KvCacheDtype::bf16));
  ASSERT_EQ(want.size(), 3u);
  for (int tp : {2, 4}) {
    const auto ranks = runner::TpRunner::open(dir, tp, o, model::KvCacheDtype::bf16);
    auto executor = std::make_unique<TpExecutor>(*ranks, cache, model::KvCacheDtype::bf16);
    EXPECT_EQ(executor->tp(), tp);
    EXPECT_EQ(serve(std::move(executor)), want) << "tp " << tp;
  }
  std::filesystem::remove_all(dir);
}

// Decode context parallelism (dcp = tp): each rank's pages hold block_size / tp tokens of a block
// (the plan's block ids are the same), and the greedy tokens are still the plain engine's, prefix
// hit (shared split pages, restored KDA checkpoint) included.
TEST(TpExecutor, DecodeContextParallelFp32GreedyEqualsPlainModelEngine) {
  const auto dir = std::filesystem::temp_directory_path() / ("k3-tp-executor-dcp-" + std::to_string(::getpid()));
  checkpoint::write_random_checkpoint(config::builtin_config("k3-tiny"), {}, dir);
  model::ModelOptions o;
  o.precision = kernels::Precision::fp32;
  const auto plain = runner::ModelRunner::open(dir, o);
  const cache::CacheConfig cache = small_config().cache;
  const auto want = serve(std::make_unique<ModelExecutor>(plain->model(), cache, model::KvCacheDtype::bf16));
  for (int tp : {2, 4}) {
    o.dcp = tp;
    const auto ranks = runner::TpRunner::open(dir, tp, o, model::KvCacheDtype::bf16);
    auto executor = std::make_unique<TpExecutor>(*ranks, cache, model::KvCacheDtype::bf16);
    for (int r = 0; r < tp; ++r) EXPECT_EQ(executor->rank(r).storage().storage_config().block_size, 16 / tp);
    EXPECT_EQ(serve(std::move(executor)), want) << "tp = dcp = " << tp;
  }
  // A block that does not split evenly over the ranks.
  cache::CacheConfig odd = cache;
  odd.block_size = 6;
  o.dcp = 4;
  const auto ranks = runner::TpRunner::open(dir, 4, o, model::KvCacheDtype::bf16);
  try {
    TpExecutor(*ranks, odd, model::KvCacheDtype::bf16);
    ADD_FAILURE() << "no error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_size 6 must be a multiple of dcp 4"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(TpExecutor, RefusesAnotherKvDtype) {
  const auto dir = std::filesystem::temp_directory_path() / ("k3-tp-executor-dtype-" + std::to_string(::getpid()));
  checkpoint::write_random_checkpoint(config::builtin_config("k3-tiny"), {}, dir);
  const auto ranks = runner::TpRunner::open(dir, 2, {}, model::KvCacheDtype::bf16);
  EXPECT_THROW(TpExecutor(*ranks, small_config().cache, model::KvCacheDtype::fp8_e4m3), core::Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace k3::engine
