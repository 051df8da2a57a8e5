// engine/engine_model_test.cpp: the Engine over the real model (k3-tiny, 3 KDA + 1 MLA layers,
// CPU reference ops, random "sensitive" weights):
//   - a prefix hit (shared MLA pages + a restored KDA checkpoint) gives bit-identical logits
//     and the same greedy tokens as the same request on a fresh engine;
//   - a batch mixing prefills and decodes of different lengths gives bit-identical logits to
//     each request run alone;
//   - with chunk_align_tokens = the KDA chunk, a prompt's logits do not depend on what else
//     shares the step (a small budget cuts its chunks differently), hit or no hit;
//   - preemption (recompute) under tight memory gives the same greedy tokens as a roomy run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "engine/model_executor.h"
#include "runner/model_runner.h"

namespace k3::engine {
namespace {

// Records every sampled logits row, per request, then hands the logits back.
class RecordingExecutor final : public Executor {
 public:
  explicit RecordingExecutor(std::unique_ptr<ModelExecutor> inner) : inner_(std::move(inner)) {}
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  void release(RequestId id) override { inner_->release(id); }
  core::Tensor execute(const StepPlan& plan, core::LogitsAt) override {
    core::Tensor logits = inner_->execute(plan, core::LogitsAt::host);
    const int64_t v = logits.dim(1);
    int64_t row_end = 0;  // past sequence i's rows; its last is the sampled one
    for (const scheduler::ScheduledSequence& q : plan.seqs) {
      row_end += q.logit_rows();
      if (!q.sample) continue;
      const float* row = logits.data<const float>() + (row_end - 1) * v;
      rows[q.id].emplace_back(row, row + v);
    }
    ++steps;
    for (const auto& q : plan.seqs) mixed_prefill_decode |= q.kind != plan.seqs.front().kind;
    return logits;
  }
  std::map<RequestId, std::vector<std::vector<float>>> rows;
  int64_t steps = 0;
  bool mixed_prefill_decode = false;

 private:
  std::unique_ptr<ModelExecutor> inner_;
};

class EngineModel : public ::testing::TestWithParam<kernels::Precision> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("k3-engine-model-test-" + std::to_string(::getpid())));
    checkpoint::WriteOptions w;
    w.init = checkpoint::InitStyle::sensitive;
    checkpoint::write_random_checkpoint(config::builtin_config("k3-tiny"), w, *dir_);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    model::ModelOptions o;
    o.precision = GetParam();
    runner_ = runner::ModelRunner::open(*dir_, o);
  }

  // bs 16, a checkpoint every 4 pages = 64 tokens = the KDA chunk, so prefill chunks start on
  // KDA chunk boundaries whether or not a prefix was reused.
  EngineConfig config(int32_t blocks = 96, bool prefix_cache = true) const {
    EngineConfig c;
    c.cache.block_size = 16;
    c.cache.num_blocks = blocks;
    c.cache.num_slots = 4;
    c.cache.num_checkpoints = prefix_cache ? 16 : 0;
    c.cache.checkpoint_interval_blocks = 4;
    c.cache.enable_prefix_cache = prefix_cache;
    c.scheduler.max_num_seqs = 4;
    c.scheduler.max_num_batched_tokens = 512;
    c.scheduler.long_prefill_token_threshold = 256;
    c.scheduler.max_partial_prefills = 4;
    c.scheduler.max_model_len = 256;
    c.eos_token_id = -1;
    return c;
  }
  std::unique_ptr<Engine> make_engine(const EngineConfig& c, RecordingExecutor** rec) const {
    auto inner = std::make_unique<ModelExecutor>(runner_->model(), c.cache, model::KvCacheDtype::bf16);
    auto r = std::make_unique<RecordingExecutor>(std::move(inner));
    *rec = r.get();
    return std::make_unique<Engine>(c, std::move(r));
  }
  static std::vector<int32_t> tokens(uint64_t seed, int n) {
    core::Rng r(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(r.next_u64() % 1024);
    return t;
  }
  static GenerateRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
    GenerateRequest g;
    g.prompt = std::move(prompt);
    g.max_tokens = max_tokens;
    return g;
  }
  static std::vector<int32_t> output(TokenStream& s, TokenEvent* last = nullptr) {
    std::vector<int32_t> out;
    while (auto e = s.try_next()) {
      if (e->token >= 0) out.push_back(e->token);
      if (last && e->finished) *last = *e;
    }
    return out;
  }
  static bool bitwise_equal(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
        return false;
    return true;
  }

  static std::filesystem::path* dir_;
  std::unique_ptr<runner::ModelRunner> runner_;
};
std::filesystem::path* EngineModel::dir_ = nullptr;

TEST_P(EngineModel, PrefixHitThroughKdaAndMlaEqualsFreshRunBitForBit) {
  const auto a = tokens(1, 150);
  std::vector<int32_t> b(a.begin(), a.begin() + 140);  // shares 140 tokens: hit = 128
  const auto tail = tokens(2, 25);
  b.insert(b.end(), tail.begin(), tail.end());

  RecordingExecutor* cached_rec = nullptr;
  auto cached = make_engine(config(), &cached_rec);
  cached->submit(greedy(a, 3));
  cached->run_until_idle();
  auto sub_b = cached->submit(greedy(b, 8));
  cached->run_until_idle();
  TokenEvent last_b;
  const auto out_cached = output(*sub_b.stream, &last_b);
  EXPECT_EQ(last_b.stats.cached_prompt_tokens, 128);

  RecordingExecutor* fresh_rec = nullptr;
  auto fresh = make_engine(config(), &fresh_rec);
  auto sub_fresh = fresh->submit(greedy(b, 8));
  fresh->run_until_idle();
  const auto out_fresh = output(*sub_fresh.stream);

  ASSERT_EQ(out_fresh.size(), 8u);
  EXPECT_EQ(out_cached, out_fresh);
  EXPECT_TRUE(bitwise_equal(cached_rec->rows[sub_b.id], fresh_rec->rows[sub_fresh.id]));

  // The same with the prefix cache off entirely.
  RecordingExecutor* off_rec = nullptr;
  auto off = make_engine(config(96, false), &off_rec);
  off->submit(greedy(a, 3));
  auto sub_off = off->submit(greedy(b, 8));
  off->run_until_idle();
  EXPECT_EQ(output(*sub_off.stream), out_fresh);
}

// A cached prefix partly evicted under memory pressure: a sequence's last pages are evicted first,
// so a later request sharing the prefix hits only up to the last KDA checkpoint whose pages
// survived, restores the recurrent state from that checkpoint, recomputes the rest, and still gets
// a fresh run's logits bit for bit.
TEST_P(EngineModel, PrefixPartlyEvictedUnderPressureRestoresFromAnEarlierKdaCheckpoint) {
  const auto a = tokens(1, 150);
  std::vector<int32_t> b(a.begin(), a.begin() + 140);  // with all of a cached: hit = 128
  const auto tail = tokens(2, 25);
  b.insert(b.end(), tail.begin(), tail.end());

  // 20 pages of 16 tokens: a (150 + 3 tokens) leaves its 9 full pages cached, with KDA checkpoints
  // at 64 and 128 (64-token prefill chunks end there); the pressure request (200 + 8 tokens, 13
  // pages) takes the 11 free pages and evicts a's last 2, and with page 9 the checkpoint at 128.
  EngineConfig c = config(20);
  c.scheduler.max_num_batched_tokens = 64;  // alone, a prompt takes the budget: 64-token chunks
  RecordingExecutor* rec = nullptr;
  auto e = make_engine(c, &rec);
  e->submit(greedy(a, 3));
  e->run_until_idle();
  EXPECT_EQ(e->stats().cache.blocks_evictable, 9);
  e->submit(greedy(tokens(3, 200), 8));
  e->run_until_idle();
  auto sub_b = e->submit(greedy(b, 8));
  e->run_until_idle();
  TokenEvent last_b;
  const auto out_b = output(*sub_b.stream, &last_b);
  EXPECT_EQ(last_b.stats.cached_prompt_tokens, 64);  // pages 1-7 survived: restored from the checkpoint at 64
  EXPECT_EQ(e->stats().cache.blocks_in_use, 0);

  RecordingExecutor* fresh_rec = nullptr;
  auto fresh = make_engine(config(), &fresh_rec);
  auto sub_fresh = fresh->submit(greedy(b, 8));
  fresh->run_until_idle();
  const auto out_fresh = output(*sub_fresh.stream);
  ASSERT_EQ(out_fresh.size(), 8u);
  EXPECT_EQ(out_b, out_fresh);
  EXPECT_TRUE(bitwise_equal(rec->rows[sub_b.id], fresh_rec->rows[sub_fresh.id]));
}

TEST_P(EngineModel, MixedPrefillDecodeBatchEqualsEachAloneBitForBit) {
  const std::vector<int> lengths = {17, 54, 97, 5};
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < lengths.size(); ++i) prompts.push_back(tokens(10 + i, lengths[i]));

  RecordingExecutor* batch_rec = nullptr;
  auto batch = make_engine(config(), &batch_rec);
  std::vector<Engine::Submission> subs;
  // Staggered arrivals: later prompts prefill while earlier ones decode.
  for (size_t i = 0; i < prompts.size(); ++i) {
    subs.push_back(batch->submit(greedy(prompts[i], 6)));
    batch->step();
    batch->step();
  }
  batch->run_until_idle();
  EXPECT_TRUE(batch_rec->mixed_prefill_decode);

  for (size_t i = 0; i < prompts.size(); ++i) {
    RecordingExecutor* alone_rec = nullptr;
    auto alone = make_engine(config(), &alone_rec);
    auto sub = alone->submit(greedy(prompts[i], 6));
    alone->run_until_idle();
    EXPECT_EQ(output(*subs[i].stream), output(*sub.stream)) << "prompt " << i;
    EXPECT_TRUE(bitwise_equal(batch_rec->rows[subs[i].id], alone_rec->rows[sub.id])) << "prompt " << i;
  }
}

TEST_P(EngineModel, AlignedChunksMakeLogitsIndependentOfTheBatch) {
  const auto a = tokens(3, 200);
  std::vector<int32_t> b(a.begin(), a.begin() + 70);  // hit 64
  const auto tail = tokens(4, 130);
  b.insert(b.end(), tail.begin(), tail.end());

  EngineConfig busy_cfg = config();
  busy_cfg.scheduler.max_num_batched_tokens = 100;  // chunks cut by the budget ...
  busy_cfg.scheduler.chunk_align_tokens = 64;       // ... but only at multiples of 64
  RecordingExecutor* busy_rec = nullptr;
  auto busy = make_engine(busy_cfg, &busy_rec);
  busy->submit(greedy(a, 2));
  busy->run_until_idle();
  busy->submit(greedy(tokens(5, 150), 20));
  busy->step();
  busy->submit(greedy(tokens(6, 90), 20));
  auto sub_b = busy->submit(greedy(b, 6));
  busy->run_until_idle();
  TokenEvent last;
  const auto out_busy = output(*sub_b.stream, &last);
  EXPECT_EQ(last.stats.cached_prompt_tokens, 64);

  RecordingExecutor* alone_rec = nullptr;
  auto alone = make_engine(config(), &alone_rec);
  auto sub_alone = alone->submit(greedy(b, 6));
  alone->run_until_idle();
  EXPECT_EQ(out_busy, output(*sub_alone.stream));
  EXPECT_TRUE(bitwise_equal(busy_rec->rows[sub_b.id], alone_rec->rows[sub_alone.id]));
}

TEST_P(EngineModel, PreemptionByRecomputeKeepsGreedyTokens) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(tokens(20 + static_cast<uint64_t>(i), 40 + 20 * i));
  auto run = [&](int32_t blocks, int64_t* preemptions) {
    EngineConfig c = config(blocks);
    RecordingExecutor* rec = nullptr;
    auto e = make_engine(c, &rec);
    std::vector<Engine::Submission> subs;
    for (const auto& p : prompts) subs.push_back(e->submit(greedy(p, 40)));
    e->run_until_idle();
    *preemptions = e->stats().preemptions;
    EXPECT_EQ(e->stats().cache.blocks_in_use, 0);
    std::vector<std::vector<int32_t>> outs;
    for (auto& s : subs) outs.push_back(output(*s.stream));
    return outs;
  };
  int64_t roomy_preempt = 0, tight_preempt = 0;
  const auto roomy = run(96, &roomy_preempt);
  const auto tight = run(17, &tight_preempt);  // 16 pages hold one 256-token request
  EXPECT_EQ(roomy_preempt, 0);
  EXPECT_GT(tight_preempt, 0);
  EXPECT_EQ(tight, roomy);
}

TEST(EngineModelDefaults, ChunkAlignmentFollowsTheKdaChunk) {
  const config::K3Config tiny = config::builtin_config("k3-tiny");  // kda_chunk_size 64
  cache::CacheConfig c;
  c.block_size = 16;
  c.num_blocks = 64;
  c.num_slots = 4;
  c.num_checkpoints = 8;
  c.checkpoint_interval_blocks = 8;  // 128 tokens: a multiple of 64
  scheduler::SchedulerConfig s;
  s.max_num_seqs = 4;
  s.max_model_len = 512;
  int32_t eos = 5;
  apply_model_defaults(tiny, s, c, &eos);
  EXPECT_EQ(s.chunk_align_tokens, 64);
  EXPECT_EQ(eos, tiny.eos_token_id);
  c.block_size = 48;  // 64 rounds up to a page multiple
  c.checkpoint_interval_blocks = 2;
  s.chunk_align_tokens = 0;
  apply_model_defaults(tiny, s, c, nullptr);
  EXPECT_EQ(s.chunk_align_tokens, 96);
  c.block_size = 16;
  c.checkpoint_interval_blocks = 2;  // 32 tokens: checkpoints would break the alignment
  s.chunk_align_tokens = 0;
  EXPECT_THROW(apply_model_defaults(tiny, s, c, nullptr), core::Error);
}

INSTANTIATE_TEST_SUITE_P(Precisions, EngineModel, ::testing::Values(kernels::Precision::bf16, kernels::Precision::fp32),
                         [](const auto& info) { return info.param == kernels::Precision::bf16 ? "bf16" : "fp32"; });

}  // namespace
}  // namespace k3::engine
