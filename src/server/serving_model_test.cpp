// server/serving_model_test.cpp: what ServingModel::load takes from the model folder: the eos
// token comes from config.json (k3-tiny's eos_token_id is "<|end_of_msg|>", no special case in
// the server), the load progress callback sees every weight byte read in, and --tp 2 (also with
// --decode-context-parallel-size 2) serves the same greedy tokens as one rank (fp32).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "draft/draft_config.h"
#include "draft/draft_weights.h"
#include "draft/eagle3_config.h"
#include "draft/eagle3_weights.h"
#include "server/server_test_util.h"

namespace k3::server {
namespace {

TEST(ServingModel, EosIsTheConfigsEosTokenIdWhichIsEndOfMessage) {
  testing::ModelServer& s = testing::model_server();
  const int32_t eos = s.engine().config().eos_token_id;
  EXPECT_EQ(eos, s.model->config().eos_token_id);
  EXPECT_EQ(eos, s.tokenizer().special_id(tokenizer::k3_tokens::kEndOfMsg).value_or(-2));
  EXPECT_NE(s.model->description().find("eos id " + std::to_string(eos)), std::string::npos) << s.model->description();
}

TEST(ServingModel, LoadReportsProgressUpToEveryWeightByte) {
  ServingOptions o;
  o.model_dir = testing::tiny_model_dir();
  o.max_model_len = 128;
  o.max_num_seqs = 2;
  o.kv_cache_bytes = 8ll << 20;
  std::vector<checkpoint::LoadProgress> reports;
  o.load_progress = [&](const checkpoint::LoadProgress& p) { reports.push_back(p); };
  const auto model = ServingModel::load(o);
  ASSERT_GE(reports.size(), 3u);
  EXPECT_EQ(reports.front().bytes_done, 0);
  EXPECT_TRUE(reports.back().finished());
  EXPECT_GT(reports.back().bytes_total, 1'000'000);  // k3-tiny: about 6.5 MB of weights
  for (size_t i = 1; i < reports.size(); ++i) EXPECT_GT(reports[i].bytes_done, reports[i - 1].bytes_done) << i;
}

// The engine over a TP2 model (runner::TpRunner on CPU threads, engine::TpExecutor) gives the
// one-rank model's greedy tokens in fp32 mode; the description says it is tensor parallel.
TEST(ServingModel, TensorParallelServesTheSameGreedyTokens) {
  auto generate = [](int tp) {
    ServingOptions o;
    o.model_dir = testing::tiny_model_dir();
    o.model.precision = kernels::Precision::fp32;
    o.max_model_len = 128;
    o.max_num_seqs = 2;
    o.kv_cache_bytes = 8ll << 20;
    o.tp = tp;
    const auto model = ServingModel::load(o);
    EXPECT_EQ(model->description().find("tensor parallel") != std::string::npos, tp > 1) << model->description();
    engine::GenerateRequest r;
    r.prompt = {5, 17, 300, 42, 9, 77, 1000, 3};
    r.max_tokens = 16;
    r.ignore_eos = true;
    auto stream = model->engine().submit(std::move(r)).stream;
    model->engine().run_until_idle();
    std::vector<int32_t> out;
    while (auto e = stream->try_next())
      if (e->token >= 0) out.push_back(e->token);
    return out;
  };
  const auto one = generate(1);
  EXPECT_EQ(one.size(), 16u);
  EXPECT_EQ(generate(2), one);
}

// Shadow validation over tensor-parallel CPU ranks: every rank runs each shadowed step's standard
// path (its collectives too), the served tokens are those without it, and rank 0's comparison
// finds the fused path equal in fp32.
TEST(ServingModel, ShadowValidationOverTensorParallelRanksKeepsTheTokens) {
  auto generate = [](int tp, double rate, engine::EngineStats* stats) {
    ServingOptions o;
    o.model_dir = testing::tiny_model_dir();
    o.model.precision = kernels::Precision::fp32;
    o.model.decode_backend = model::DecodeBackend::latency_specialized;
    o.max_model_len = 128;
    o.max_num_seqs = 2;
    o.kv_cache_bytes = 8ll << 20;
    o.tp = tp;
    o.shadow_validate_rate = rate;
    const auto model = ServingModel::load(o);
    std::vector<std::shared_ptr<engine::TokenStream>> streams;
    for (int i = 0; i < 2; ++i) {
      engine::GenerateRequest r;
      r.prompt = {5, 17, 300, 42, 9, 77, 1000, 3 + i};
      r.max_tokens = 12;
      r.ignore_eos = true;
      streams.push_back(model->engine().submit(std::move(r)).stream);
    }
    model->engine().run_until_idle();
    std::vector<int32_t> out;
    for (auto& s : streams)
      while (auto e = s->try_next())
        if (e->token >= 0) out.push_back(e->token);
    *stats = model->engine().stats();
    return out;
  };
  engine::EngineStats off, on;
  const auto want = generate(2, 0, &off);
  EXPECT_EQ(generate(2, 1, &on), want);
  ASSERT_GT(on.decode_paths.fused_steps, 0);
  EXPECT_EQ(on.shadow.steps, on.decode_paths.fused_steps);
  EXPECT_EQ(on.shadow.divergent_rows, 0);
  EXPECT_GE(on.shadow.min_cosine, 1 - 1e-5);
  EXPECT_EQ(off.shadow.steps, 0);
}

// --decode-context-parallel-size 2 with --tp 2: the same greedy tokens, and the same byte budget
// holds twice the tokens (scheduler blocks of 2 * block_size tokens, as many of them).
TEST(ServingModel, DecodeContextParallelServesTheSameGreedyTokensInTwiceTheContext) {
  auto load = [](int tp, int dcp) {
    ServingOptions o;
    o.model_dir = testing::tiny_model_dir();
    o.model.precision = kernels::Precision::fp32;
    o.model.dcp = dcp;
    o.max_model_len = 128;
    o.max_num_seqs = 2;
    o.kv_cache_bytes = 8ll << 20;
    o.tp = tp;
    return ServingModel::load(o);
  };
  auto generate = [](ServingModel& model) {
    engine::GenerateRequest r;
    r.prompt = {5, 17, 300, 42, 9, 77, 1000, 3};
    r.max_tokens = 16;
    r.ignore_eos = true;
    auto stream = model.engine().submit(std::move(r)).stream;
    model.engine().run_until_idle();
    std::vector<int32_t> out;
    while (auto e = stream->try_next())
      if (e->token >= 0) out.push_back(e->token);
    return out;
  };
  const auto tp = load(2, 1), dcp = load(2, 2);
  EXPECT_NE(dcp->description().find("decode context parallel"), std::string::npos) << dcp->description();
  const cache::CacheConfig& a = tp->engine().config().cache;
  const cache::CacheConfig& b = dcp->engine().config().cache;
  EXPECT_EQ(b.block_size, 2 * a.block_size);
  EXPECT_GE(int64_t{b.num_blocks} * b.block_size, int64_t{2} * a.num_blocks * a.block_size * 9 / 10);
  const auto want = generate(*load(1, 1));
  EXPECT_EQ(want.size(), 16u);
  EXPECT_EQ(generate(*dcp), want);
  EXPECT_THROW(load(2, 4), core::Error);
}

// A model drafter's drafts (a random draft checkpoint for the tiny target) are verified losslessly:
// greedy fp32 outputs equal plain decoding, at TP 1 and over 2 CPU ranks (the draft replicated on
// the host, fed rank 0's taps), on both decode paths, and the engine counted verified drafts.
void expect_drafter_keeps_greedy_tokens(spec::SpecMethod method, const std::filesystem::path& draft_dir) {
  const std::string name = spec::to_string(method);
  auto generate = [&](bool speculate, engine::EngineStats* stats, int tp = 1,
                      model::DecodeBackend backend = model::DecodeBackend::standard) {
    ServingOptions o;
    o.tp = tp;
    o.model.decode_backend = backend;
    o.model_dir = testing::tiny_model_dir();
    o.model.precision = kernels::Precision::fp32;
    o.max_model_len = 128;
    o.max_num_seqs = 2;
    o.kv_cache_bytes = 8ll << 20;
    if (speculate) {
      o.speculative.method = method;
      o.speculative.num_speculative_tokens = 3;
      o.draft_model_dir = draft_dir;
    }
    const auto model = ServingModel::load(o);
    engine::GenerateRequest r;
    r.prompt = {5, 17, 300, 42, 9, 77, 1000, 3, 5, 17, 300};
    r.max_tokens = 24;
    r.ignore_eos = true;
    auto stream = model->engine().submit(std::move(r)).stream;
    model->engine().run_until_idle();
    std::vector<int32_t> out;
    while (auto e = stream->try_next())
      if (e->token >= 0) out.push_back(e->token);
    *stats = model->engine().stats();
    return out;
  };
  engine::EngineStats plain_stats, spec_stats;
  const auto plain = generate(false, &plain_stats);
  const auto speculative = generate(true, &spec_stats);
  EXPECT_EQ(speculative, plain) << name;
  EXPECT_GT(spec_stats.spec_num_draft_tokens, 0) << "the " << name << " drafter never proposed";
  EXPECT_EQ(spec_stats.spec_method, name);
  engine::EngineStats tp_stats;
  EXPECT_EQ(generate(true, &tp_stats, 2), plain) << name;
  EXPECT_GT(tp_stats.spec_num_draft_tokens, 0) << "the " << name << " drafter never proposed with --tp 2";
  EXPECT_EQ(tp_stats.spec_method, name);
  for (int tp : {1, 2}) {  // the fused decode path
    engine::EngineStats fused_stats;
    EXPECT_EQ(generate(true, &fused_stats, tp, model::DecodeBackend::latency_specialized), plain)
        << name << " tp " << tp;
    EXPECT_GT(fused_stats.spec_num_draft_tokens, 0) << name << " tp " << tp;
  }
}

TEST(ServingModel, DsparkSpeculationKeepsGreedyTokens) {
  const auto draft_dir = std::filesystem::temp_directory_path() / ("k3-serving-dspark-" + std::to_string(::getpid()));
  draft::write_random_draft(draft::builtin_draft_config("k3-tiny-dspark"), 3, draft_dir);
  expect_drafter_keeps_greedy_tokens(spec::SpecMethod::dspark, draft_dir);
  std::filesystem::remove_all(draft_dir);
}

TEST(ServingModel, Eagle3SpeculationKeepsGreedyTokens) {
  const auto draft_dir = std::filesystem::temp_directory_path() / ("k3-serving-eagle3-" + std::to_string(::getpid()));
  draft::write_random_eagle3(draft::builtin_eagle3_config("k3-tiny-eagle3"), 3, draft_dir);
  expect_drafter_keeps_greedy_tokens(spec::SpecMethod::eagle3, draft_dir);
  std::filesystem::remove_all(draft_dir);
}

TEST(ServingModel, ModelDraftersWithoutADraftModelAreAnError) {
  for (spec::SpecMethod m : {spec::SpecMethod::dspark, spec::SpecMethod::eagle3}) {
    ServingOptions o;
    o.model_dir = testing::tiny_model_dir();
    o.speculative.method = m;
    o.speculative.num_speculative_tokens = 3;
    try {
      (void)ServingModel::load(o);
      FAIL() << spec::to_string(m) << " without --speculative-model loaded";
    } catch (const core::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--speculative-model"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(spec::to_string(m)), std::string::npos) << e.what();
    }
  }
}

TEST(ServingModel, TensorParallelSizeTheModelCannotSplitIsAnError) {
  ServingOptions o;
  o.model_dir = testing::tiny_model_dir();
  o.tp = 3;  // k3-tiny's 4 heads and 1024 vocab do not split in 3
  try {
    (void)ServingModel::load(o);
    FAIL() << "tp 3 loaded";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tp=3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace k3::server
