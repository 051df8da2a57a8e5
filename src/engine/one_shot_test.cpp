// engine/one_shot_test.cpp: generate and teacher-forced logits as engine requests (k3-tiny, CPU
// reference ops, random "sensitive" weights), against the model driven by hand with the same
// forward calls (one prefill, then one decode step per token): bit-identical rows and tokens. And
// the engine's scoring fields on their own: every prompt position's row once and in order when the
// prompt is cut into chunks, forced tokens next to a free request that does not notice them, and
// the errors for bad scoring parameters.
#include "engine/one_shot.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "engine/model_executor.h"
#include "model/local_cache.h"
#include "model/model.h"
#include "runner/model_runner.h"

namespace k3::engine {
namespace {

class OneShot : public ::testing::TestWithParam<kernels::Precision> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("k3-one-shot-test-" + std::to_string(::getpid())));
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
  static std::vector<int32_t> tokens(uint64_t seed, int n) {
    core::Rng r(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(r.next_u64() % 1024);
    return t;
  }
  // The model by hand: rows [T, vocab], the first `decode_from` tokens in one prefill.
  core::Tensor forward_by_hand(std::span<const int32_t> t, int64_t decode_from) const {
    const model::Model& m = runner_->model();
    const auto T = static_cast<int64_t>(t.size());
    const int64_t V = m.config().vocab_size;
    core::Tensor out = core::Tensor::zeros(core::DType::f32, {T, V});
    model::LocalCache cache(m.config(), 1, T, runner_->kv_cache(), 16, m.memory(), m.options().precision);
    model::SequenceState st = cache.new_sequence();
    auto run = [&](int64_t begin, int64_t n, model::StepKind kind) {
      const model::SequenceInput in{t.subspan(static_cast<size_t>(begin), static_cast<size_t>(n)), &st, kind};
      const core::Tensor rows = m.forward(cache.storage(), {&in, 1}, model::LogitRows::all);
      std::memcpy(out.data<float>() + begin * V, rows.data<const float>(), static_cast<size_t>(rows.numel()) * 4);
    };
    run(0, decode_from, model::StepKind::prefill);
    for (int64_t i = decode_from; i < T; ++i) run(i, 1, model::StepKind::decode);
    return out;
  }
  static bool bitwise_equal(const core::Tensor& a, const core::Tensor& b) {
    return a.shape() == b.shape() &&
           std::memcmp(a.data<const float>(), b.data<const float>(), static_cast<size_t>(a.numel()) * 4) == 0;
  }
  static int32_t argmax(std::span<const float> row) {
    return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  }

  static std::filesystem::path* dir_;
  std::unique_ptr<runner::ModelRunner> runner_;
};
std::filesystem::path* OneShot::dir_ = nullptr;

TEST_P(OneShot, TeacherForcedLogitsAreTheModelsRowsBitForBit) {
  const std::vector<int32_t> t = tokens(3, 90);  // 90 > the KDA chunk of 64: the prefill spans two chunks
  for (int64_t decode_from : {int64_t{90}, int64_t{70}, int64_t{1}}) {
    const core::Tensor got = engine::logits(*runner_, t, decode_from);
    EXPECT_TRUE(bitwise_equal(got, forward_by_hand(t, decode_from))) << "decode_from " << decode_from;
  }
}

TEST_P(OneShot, GreedyGenerationIsTheArgmaxOfTheModelsRows) {
  const std::vector<int32_t> prompt = tokens(5, 33);
  std::vector<int32_t> streamed;
  GenerateStats st;
  const std::vector<int32_t> got = engine::generate(
      *runner_, prompt, 12, {}, [&](int32_t id) { streamed.push_back(id); }, &st);
  ASSERT_EQ(got.size(), 12u);  // the random model emits no eos this early with this prompt
  EXPECT_EQ(streamed, got);
  EXPECT_EQ(st.prompt_tokens, 33);
  EXPECT_EQ(st.generated_tokens, 12);
  EXPECT_GE(st.prefill_seconds, 0);
  // Token i + 1 is the argmax of the row after the prompt and tokens 0..i, run by hand.
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), got.begin(), got.end() - 1);
  const core::Tensor rows = forward_by_hand(all, static_cast<int64_t>(prompt.size()));
  const int64_t V = rows.dim(1);
  for (size_t i = 0; i < got.size(); ++i) {
    const int64_t r = static_cast<int64_t>(prompt.size() + i) - 1;
    EXPECT_EQ(got[i], argmax(std::span(rows.data<const float>() + r * V, static_cast<size_t>(V)))) << "token " << i;
  }
  EXPECT_TRUE(engine::generate(*runner_, prompt, 0, {}).empty());
}

TEST_P(OneShot, BadInputNamesWhatIsWrong) {
  auto expect_error = [](const std::function<void()>& f, const std::string& want) {
    try {
      f();
      ADD_FAILURE() << "no error; wanted one mentioning " << want;
    } catch (const core::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  const std::vector<int32_t> t{3, 4, 5};
  expect_error([&] { engine::logits(*runner_, std::vector<int32_t>{3, 1024}, 2); }, "token id 1024");
  expect_error([&] { engine::logits(*runner_, t, 0); }, "--decode-from must be in [1, 3]");
  expect_error([&] { engine::logits(*runner_, t, 4); }, "--decode-from must be in [1, 3]");
  expect_error([&] { engine::logits(*runner_, std::vector<int32_t>{}, 1); }, "no token ids");
  expect_error([&] { engine::generate(*runner_, t, -1, {}); }, "max_tokens must be >= 0");
}

// Scoring requests inside a shared engine: small prefill chunks, a free request beside them.
class EngineScoring : public OneShot {
 protected:
  EngineConfig config() const {
    EngineConfig c;
    c.cache.block_size = 16;
    c.cache.num_blocks = 64;
    c.cache.num_slots = 2;
    c.cache.enable_prefix_cache = false;
    c.scheduler.max_num_seqs = 2;
    c.scheduler.max_num_batched_tokens = 128;
    c.scheduler.long_prefill_token_threshold = 64;  // one KDA chunk per step
    c.scheduler.max_model_len = 512;
    apply_model_defaults(runner_->config(), c.scheduler, c.cache, nullptr);
    c.eos_token_id = -1;
    return c;
  }
  std::unique_ptr<Engine> engine() const {
    const EngineConfig c = config();
    return std::make_unique<Engine>(c, std::make_unique<ModelExecutor>(runner_->model(), c.cache, runner_->kv_cache()));
  }
};

TEST_P(EngineScoring, ChunkedPromptRowsComeOncePerPositionInOrder) {
  const std::vector<int32_t> t = tokens(7, 150);  // three chunks: 64 + 64 + 22
  std::unique_ptr<Engine> e = engine();
  GenerateRequest score;
  score.prompt = t;
  score.max_tokens = 1;
  score.prompt_logits = true;
  std::vector<int64_t> positions;
  const int64_t V = runner_->config().vocab_size;
  core::Tensor rows = core::Tensor::zeros(core::DType::f32, {150, V});
  score.on_logits = [&](int64_t p, std::span<const float> row) {
    positions.push_back(p);
    ASSERT_EQ(static_cast<int64_t>(row.size()), V);
    std::memcpy(rows.data<float>() + p * V, row.data(), row.size_bytes());
  };
  GenerateRequest free;
  free.prompt = tokens(8, 20);
  free.max_tokens = 6;
  const std::vector<int32_t> free_alone = engine::generate(*runner_, free.prompt, 6, {});
  const Engine::Submission s1 = e->submit(std::move(score)), s2 = e->submit(std::move(free));
  e->run_until_idle();
  std::vector<int64_t> want(150);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(positions, want);
  // Chunks start on KDA chunk boundaries, so cutting the prompt changes no row.
  EXPECT_TRUE(bitwise_equal(rows, forward_by_hand(t, 150)));
  std::vector<int32_t> free_out;
  while (auto ev = s2.stream->try_next())
    if (ev->token >= 0) free_out.push_back(ev->token);
  EXPECT_EQ(free_out, free_alone);
}

TEST_P(EngineScoring, ForcedTokensAreTheOutputAndTheirRowsComeBack) {
  std::unique_ptr<Engine> e = engine();
  GenerateRequest r;
  r.prompt = tokens(9, 10);
  r.forced_output = {5, 6, 7};
  r.max_tokens = 5;  // 3 forced, then 2 sampled
  std::vector<int64_t> positions;
  r.on_logits = [&](int64_t p, std::span<const float>) { positions.push_back(p); };
  const Engine::Submission s = e->submit(std::move(r));
  e->run_until_idle();
  std::vector<int32_t> out;
  while (auto ev = s.stream->try_next())
    if (ev->token >= 0) {
      out.push_back(ev->token);
      if (out.size() <= 3) EXPECT_TRUE(std::isnan(ev->logprob));
    }
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 3), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(positions, (std::vector<int64_t>{9, 10, 11, 12, 13}));  // the sampled rows only
  // Output 4 is the greedy token after prompt ++ {5, 6, 7}.
  std::vector<int32_t> all = tokens(9, 10);
  all.insert(all.end(), {5, 6, 7});
  EXPECT_EQ(engine::generate(*runner_, all, 1, {}).front(), out[3]);
}

TEST_P(EngineScoring, BadScoringParametersAreRefusedAtSubmit) {
  std::unique_ptr<Engine> e = engine();
  auto expect_error = [&](GenerateRequest r, const std::string& want) {
    try {
      e->submit(std::move(r));
      ADD_FAILURE() << "accepted; wanted an error mentioning " << want;
    } catch (const core::Error& ex) {
      EXPECT_NE(std::string(ex.what()).find(want), std::string::npos) << ex.what();
    }
  };
  GenerateRequest base;
  base.prompt = {1, 2, 3};
  base.max_tokens = 2;
  GenerateRequest r = base;
  r.prompt_logits = true;
  expect_error(r, "prompt_logits needs an on_logits sink");
  r = base;
  r.forced_output = {1, 2, 3};
  expect_error(r, "forced_output has 3 tokens, more than max_tokens (2)");
  r = base;
  r.forced_output = {1024};
  expect_error(r, "forced_output token 0 (id 1024) is outside the vocabulary");
  r = base;
  r.forced_output = {1};
  r.sampling.logprobs = 2;
  expect_error(r, "no logprobs");
}

INSTANTIATE_TEST_SUITE_P(Precisions, OneShot, ::testing::Values(kernels::Precision::fp32, kernels::Precision::bf16));
INSTANTIATE_TEST_SUITE_P(Precisions, EngineScoring,
                         ::testing::Values(kernels::Precision::fp32, kernels::Precision::bf16));

}  // namespace
}  // namespace k3::engine
