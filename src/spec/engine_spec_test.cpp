// spec/engine_spec_test.cpp: speculative decoding end to end through the Engine on the real model
// (k3-tiny, CPU reference ops, random "sensitive" weights), fp32 and bf16:
//   - KDA replay: a verify step (no-commit) then commit_verified gives the KDA and conv states of
//     plain token-by-token decoding BIT FOR BIT, its rows give the decode logits bit for bit, and
//     the truncated MLA cache decodes on identically;
//   - greedy outputs are token-identical with and without speculation for the n-gram drafter, a
//     perfect oracle (fed the plain run's tokens: every draft accepted), an always-wrong drafter
//     (none accepted) and the EAGLE-3 and DSpark draft models (random weights, fed the taps), for
//     several batched requests with prefix hits; nothing leaks, no drafter keeps a finished request;
//   - sampled outputs (temperature 1, seeded) are token-identical too (oracle, n-gram, EAGLE-3,
//     DSpark), and the 2nd token's frequencies over 1000 seeded runs with a fixed draft match plain
//     sampling (chi-square);
//   - a stop token or max_tokens inside an accepted run cuts it there;
//   - preemption under tight memory (the oracle drafter, EAGLE-3, DSpark) and an abort between verify
//     steps leak no page or slot;
//   - a drafter asking for hidden-state taps observes exactly the committed rows (prefill chunks,
//     decodes, the kept rows of verify steps), equal to a plain forward's AttnRes mixtures;
//   - synthetic mode accepts exactly AL - 1 drafts per step and says so in the stats.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "checkpoint/checkpoint.h"
#include "core/rng.h"
#include "draft/draft_weights.h"
#include "draft/dspark_drafter.h"
#include "draft/eagle3_drafter.h"
#include "draft/eagle3_weights.h"
#include "engine/engine.h"
#include "engine/model_executor.h"
#include "runner/model_runner.h"

namespace k3::engine {
namespace {

using Outputs = std::map<std::vector<int32_t>, std::vector<int32_t>>;  // prompt -> output tokens

// Proposes the plain run's next tokens (perfect) or those plus one (always wrong).
class OracleDrafter final : public spec::Drafter {
 public:
  OracleDrafter(const Outputs& expected, bool wrong, int32_t vocab)
      : expected_(expected), wrong_(wrong), vocab_(vocab) {}
  std::string name() const override { return wrong_ ? "wrong" : "oracle"; }
  void propose(std::span<const spec::DraftQuery> batch, std::span<spec::Draft> out) override {
    for (size_t i = 0; i < batch.size(); ++i) {
      const spec::DraftQuery& q = batch[i];
      const std::vector<int32_t> prompt(q.tokens.begin(), q.tokens.begin() + q.prompt_len);
      const auto it = expected_.find(prompt);
      if (it == expected_.end()) continue;
      for (auto m = static_cast<size_t>(q.tokens.size() - static_cast<size_t>(q.prompt_len));
           m < it->second.size() && out[i].tokens.size() < static_cast<size_t>(q.max_drafts); ++m)
        out[i].tokens.push_back(wrong_ ? (it->second[m] + 1) % vocab_ : it->second[m]);
    }
  }
  void on_accepted(spec::RequestId, int32_t, int32_t) override { ++verifies; }
  void release(spec::RequestId) override { ++releases; }
  int64_t verifies = 0, releases = 0;

 private:
  Outputs expected_;
  bool wrong_;
  int32_t vocab_;
};

// Always proposes `token` as the one draft once a request has exactly one output token.
class FixedDrafter final : public spec::Drafter {
 public:
  explicit FixedDrafter(int32_t token) : token_(token) {}
  std::string name() const override { return "fixed"; }
  void propose(std::span<const spec::DraftQuery> batch, std::span<spec::Draft> out) override {
    for (size_t i = 0; i < batch.size(); ++i)
      if (static_cast<int64_t>(batch[i].tokens.size()) == batch[i].prompt_len + 1) out[i].tokens = {token_};
  }

 private:
  int32_t token_;
};

class EngineSpec : public ::testing::TestWithParam<kernels::Precision> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("k3-engine-spec-test-" + std::to_string(::getpid())));
    checkpoint::WriteOptions w;
    w.init = checkpoint::InitStyle::sensitive;
    checkpoint::write_random_checkpoint(config::builtin_config("k3-tiny"), w, *dir_);
    draft::write_random_eagle3(draft::builtin_eagle3_config("k3-tiny-eagle3"), 5, *dir_ / "eagle3");
    draft::write_random_draft(draft::builtin_draft_config("k3-tiny-dspark"), 6, *dir_ / "dspark");
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    model::ModelOptions o;
    o.precision = GetParam();
    o.poison_buffers = true;  // unwritten activations are NaN
    runner_ = runner::ModelRunner::open(*dir_, o);
  }

  // The model drafters (random weights) over the target's host weights.
  std::unique_ptr<draft::Eagle3Drafter> eagle3() const {
    return draft::load_eagle3_drafter(*dir_ / "eagle3", runner_->config(), runner_->host_weights(),
                                      runner_->registry());
  }
  std::unique_ptr<draft::DsparkDrafter> dspark() const {
    return draft::load_dspark_drafter(*dir_ / "dspark", runner_->config(), runner_->host_weights(),
                                      runner_->registry());
  }

  EngineConfig config(int32_t blocks = 96, int32_t slots = 4) const {
    EngineConfig c;
    c.cache.block_size = 16;
    c.cache.num_blocks = blocks;
    c.cache.num_slots = slots;
    c.cache.num_checkpoints = 16;
    c.cache.checkpoint_interval_blocks = 4;  // 64 tokens = the KDA chunk
    c.cache.enable_prefix_cache = true;
    c.scheduler.max_num_seqs = slots;
    c.scheduler.max_num_batched_tokens = 512;
    c.scheduler.long_prefill_token_threshold = 256;
    c.scheduler.max_partial_prefills = 4;
    c.scheduler.max_model_len = 256;
    c.scheduler.chunk_align_tokens = 64;
    c.eos_token_id = -1;
    return c;
  }
  EngineConfig spec_config(int32_t k, spec::SpecMethod m = spec::SpecMethod::ngram, int32_t blocks = 96,
                           int32_t slots = 4) const {
    EngineConfig c = config(blocks, slots);
    c.speculative.method = m;
    c.speculative.num_speculative_tokens = k;
    return c;
  }
  std::unique_ptr<Engine> make_engine(const EngineConfig& c, std::unique_ptr<spec::Drafter> drafter = nullptr) const {
    return std::make_unique<Engine>(
        c, std::make_unique<ModelExecutor>(runner_->model(), c.cache, model::KvCacheDtype::bf16), std::move(drafter));
  }
  static std::vector<int32_t> tokens(uint64_t seed, int n) {
    core::Rng r(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(r.next_u64() % 1024);
    return t;
  }
  // A prompt that repeats a motif (the n-gram drafter finds matches in it).
  static std::vector<int32_t> repetitive(uint64_t seed, int n) {
    const auto motif = tokens(seed, 5);
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(motif[static_cast<size_t>(i) % motif.size()]);
    return t;
  }
  static GenerateRequest request(std::vector<int32_t> prompt, int64_t max_tokens, float temperature = 0,
                                 uint64_t seed = 0) {
    GenerateRequest g;
    g.prompt = std::move(prompt);
    g.max_tokens = max_tokens;
    g.sampling.temperature = temperature;
    g.sampling.seed = seed;
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
  // Runs waves of requests (each wave after the previous finished: later waves hit the prefix
  // cache) and returns every request's output.
  static Outputs run_waves(Engine& e, const std::vector<std::vector<GenerateRequest>>& waves) {
    Outputs out;
    for (const auto& wave : waves) {
      std::vector<std::pair<std::vector<int32_t>, Engine::Submission>> subs;
      for (const GenerateRequest& g : wave) subs.emplace_back(g.prompt, e.submit(g));
      e.run_until_idle();
      for (auto& [prompt, sub] : subs) out[prompt] = output(*sub.stream);
    }
    return out;
  }
  static void expect_nothing_held(Engine& e) {
    const cache::CacheUsage u = e.scheduler().cache().usage();
    EXPECT_EQ(u.blocks_in_use, 0);
    EXPECT_EQ(u.slots_in_use, 0);
    EXPECT_EQ(u.checkpoints_pending, 0);
    EXPECT_EQ(e.scheduler().check(), "");
    EXPECT_EQ(dynamic_cast<ModelExecutor&>(e.executor()).num_states(), 0u);
  }

  static std::filesystem::path* dir_;
  std::unique_ptr<runner::ModelRunner> runner_;
};
std::filesystem::path* EngineSpec::dir_ = nullptr;

bool bits_equal(const core::TensorView& a, const core::TensorView& b) {
  return a.numel() == b.numel() && std::memcmp(a.data, b.data, static_cast<size_t>(a.numel()) * sizeof(float)) == 0;
}
bool rows_equal(const core::Tensor& a, int64_t ra, const core::Tensor& b, int64_t rb) {
  const int64_t v = a.dim(1);
  return std::memcmp(a.data<const float>() + ra * v, b.data<const float>() + rb * v,
                     static_cast<size_t>(v) * sizeof(float)) == 0;
}

TEST_P(EngineSpec, KdaReplayEqualsTokenByTokenDecodeBitForBit) {
  const model::Model& m = runner_->model();
  model::KvStorageConfig sc;
  sc.num_blocks = 8;
  sc.block_size = 16;
  sc.num_slots = 2;
  model::KvStorage kv(m.config(), sc, m.memory(), GetParam());
  const std::vector<int32_t> pages{0, 1, 2, 3, 4, 5, 6, 7};  // the two block tables view it
  model::SequenceState a{0, 0, std::span(pages).first(4)}, b{0, 1, std::span(pages).subspan(4)};
  const auto prompt = tokens(5, 37), drafts = tokens(6, 5);
  for (model::SequenceState* s : {&a, &b}) {
    const model::SequenceInput in{prompt, s, model::StepKind::prefill};
    m.forward(kv, std::span(&in, 1), model::LogitRows::last);
  }
  // a: decode d0, d1, d2 one at a time.
  std::vector<core::Tensor> decode_logits;
  for (int i = 0; i < 3; ++i) {
    const model::SequenceInput in{std::span(drafts).subspan(static_cast<size_t>(i), 1), &a, model::StepKind::decode};
    decode_logits.push_back(m.forward(kv, std::span(&in, 1), model::LogitRows::last));
  }
  // b: one verify step over d0..d4 (5 rows), batched with nothing else; its KDA slot is untouched.
  std::vector<core::Tensor> before;
  for (int l = 0; l < m.config().num_hidden_layers; ++l)
    if (m.config().attn_kind(l) == config::AttnKind::kda) {
      before.push_back(core::Tensor::copy_of(kv.kda_state(l, 1)));
      before.push_back(core::Tensor::copy_of(kv.conv_state(l, 1)));
    }
  model::VerifyCapture capture;
  model::SequenceInput vin{drafts, &b, model::StepKind::decode, /*verify=*/true};
  const core::Tensor verify_logits = m.forward(kv, std::span(&vin, 1), model::LogitRows::requested, nullptr, &capture);
  ASSERT_EQ(verify_logits.dim(0), 5);
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(rows_equal(verify_logits, i, decode_logits[static_cast<size_t>(i)], 0)) << "row " << i;
  size_t at = 0;
  for (int l = 0; l < m.config().num_hidden_layers; ++l)
    if (m.config().attn_kind(l) == config::AttnKind::kda) {
      EXPECT_TRUE(bits_equal(kv.kda_state(l, 1), before[at++].view())) << "verify changed the KDA state of layer " << l;
      EXPECT_TRUE(bits_equal(kv.conv_state(l, 1), before[at++].view()))
          << "verify changed the conv state of layer " << l;
    }
  // Accept 2 drafts: rows d0, d1, d2 are replayed into the slot.
  m.commit_verified(kv, capture, std::vector<int32_t>{3});
  EXPECT_EQ(b.num_tokens, a.num_tokens);
  EXPECT_TRUE(capture.empty());
  for (int l = 0; l < m.config().num_hidden_layers; ++l)
    if (m.config().attn_kind(l) == config::AttnKind::kda) {
      EXPECT_TRUE(bits_equal(kv.kda_state(l, 1), kv.kda_state(l, 0))) << "KDA state of layer " << l;
      EXPECT_TRUE(bits_equal(kv.conv_state(l, 1), kv.conv_state(l, 0))) << "conv state of layer " << l;
    }
  // Both decode on: the MLA rows b wrote for the rejected d3, d4 are overwritten.
  const int32_t next = 77;
  const model::SequenceInput na{std::span(&next, 1), &a, model::StepKind::decode};
  const model::SequenceInput nb{std::span(&next, 1), &b, model::StepKind::decode};
  const core::Tensor la = m.forward(kv, std::span(&na, 1), model::LogitRows::last);
  const core::Tensor lb = m.forward(kv, std::span(&nb, 1), model::LogitRows::last);
  EXPECT_TRUE(rows_equal(la, 0, lb, 0));
  // Bad counts are refused.
  model::SequenceInput v2{std::span(drafts).first(2), &b, model::StepKind::decode, true};
  m.forward(kv, std::span(&v2, 1), model::LogitRows::requested, nullptr, &capture);
  EXPECT_THROW(m.commit_verified(kv, capture, std::vector<int32_t>{3}), core::Error);
  EXPECT_THROW(m.forward(kv, std::span(&v2, 1), model::LogitRows::requested), core::Error);  // no capture
}

TEST_P(EngineSpec, GreedyOutputsIdenticalWithEveryDrafter) {
  const auto long_prompt = tokens(3, 97);
  std::vector<int32_t> shares_prefix(long_prompt.begin(), long_prompt.begin() + 80);  // hit 64
  const auto tail = tokens(4, 11);
  shares_prefix.insert(shares_prefix.end(), tail.begin(), tail.end());
  const std::vector<std::vector<GenerateRequest>> waves = {
      {request(repetitive(1, 40), 16), request(tokens(2, 17), 16), request(long_prompt, 16), request(tokens(7, 1), 16)},
      {request(shares_prefix, 16), request(repetitive(8, 54), 16)}};

  auto plain = make_engine(config());
  const Outputs expected = run_waves(*plain, waves);
  const EngineStats plain_stats = plain->stats();
  EXPECT_EQ(plain_stats.spec_method, "");
  EXPECT_GT(plain_stats.prefix_hit_tokens, 0);

  struct Case {
    const char* name;
    std::unique_ptr<spec::Drafter> drafter;
  };
  const int32_t vocab = runner_->model().config().vocab_size;
  std::vector<Case> cases;
  cases.push_back({"ngram", nullptr});
  cases.push_back({"oracle", std::make_unique<OracleDrafter>(expected, false, vocab)});
  cases.push_back({"wrong", std::make_unique<OracleDrafter>(expected, true, vocab)});
  cases.push_back({"eagle3", eagle3()});  // the second wave's prefix hit: it drafts from position 64 on
  cases.push_back({"dspark", dspark()});  // (DSpark does not draft for a request first seen mid-sequence)
  for (Case& c : cases) {
    auto* oracle = dynamic_cast<OracleDrafter*>(c.drafter.get());
    auto* e3 = dynamic_cast<draft::Eagle3Drafter*>(c.drafter.get());
    auto* ds = dynamic_cast<draft::DsparkDrafter*>(c.drafter.get());
    auto e = make_engine(spec_config(4), std::move(c.drafter));
    const Outputs got = run_waves(*e, waves);
    for (const auto& [prompt, out] : expected) {
      ASSERT_EQ(out.size(), 16u);
      EXPECT_EQ(got.at(prompt), out) << c.name << ": prompt of " << prompt.size() << " tokens";
    }
    const EngineStats s = e->stats();
    EXPECT_EQ(s.generated_tokens, plain_stats.generated_tokens) << c.name;
    EXPECT_GT(s.spec_num_drafts, 0) << c.name;
    EXPECT_GT(s.prefix_hit_tokens, 0) << c.name;
    ASSERT_EQ(s.spec_accepted_per_pos.size(), 4u);
    int64_t per_pos = 0;
    for (int64_t n : s.spec_accepted_per_pos) per_pos += n;
    EXPECT_EQ(per_pos, s.spec_num_accepted_tokens) << c.name;
    if (std::string(c.name) == "oracle") {
      EXPECT_EQ(s.spec_num_accepted_tokens, s.spec_num_draft_tokens) << "a perfect drafter must be fully accepted";
      EXPECT_LT(s.steps, plain_stats.steps);  // long accepted runs: fewer steps
      EXPECT_GT(oracle->releases, 0);
    }
    if (std::string(c.name) == "wrong") {
      EXPECT_EQ(s.spec_num_accepted_tokens, 0);
    }
    if (std::string(c.name) == "ngram") {
      EXPECT_EQ(s.spec_method, "ngram");
    }
    if (e3) {
      EXPECT_EQ(s.spec_method, "eagle3");
      EXPECT_EQ(e3->num_requests(), 0u) << "the drafter kept state of finished requests";
    }
    if (ds) {
      EXPECT_EQ(s.spec_method, "dspark");
      EXPECT_EQ(ds->num_requests(), 0u) << "the drafter kept state of finished requests";
    }
    EXPECT_FALSE(s.spec_synthetic);
    expect_nothing_held(*e);
  }
}

TEST_P(EngineSpec, DraftsThatNeverMatchStopCostingVerifySteps) {
  // A drafter whose every draft is wrong: the adaptive length shrinks to 1, then drafting pauses
  // (8, 16, 32 plain steps between one-draft probes), so 80 tokens take a handful of verify steps,
  // not one per token, and the output is the plain engine's.
  const std::vector<std::vector<GenerateRequest>> waves = {{request(tokens(21, 17), 80)}};
  auto plain = make_engine(config());
  const Outputs expected = run_waves(*plain, waves);
  auto e = make_engine(spec_config(4),
                       std::make_unique<OracleDrafter>(expected, true, runner_->model().config().vocab_size));
  EXPECT_EQ(run_waves(*e, waves), expected);
  const EngineStats s = e->stats();
  EXPECT_EQ(s.spec_num_accepted_tokens, 0);
  EXPECT_GE(s.spec_num_drafts, 7);   // 4, 2, 1, 1, ... drafts until the rate falls below 0.1
  EXPECT_LE(s.spec_num_drafts, 12);  // then probes only, after 8, 16, 32 plain steps
  expect_nothing_held(*e);
}

TEST_P(EngineSpec, SampledOutputsIdenticalWithTheSameSeeds) {
  std::vector<std::vector<GenerateRequest>> waves(1);
  for (uint64_t i = 0; i < 4; ++i) waves[0].push_back(request(repetitive(20 + i, 30), 20, 1.0f, 1000 + i));
  waves[0][1].sampling.top_k = 20;
  waves[0][2].sampling.top_p = 0.9f;
  waves[0][3].sampling.repetition_penalty = 1.3f;  // penalties see the accepted drafts
  auto plain = make_engine(config());
  const Outputs expected = run_waves(*plain, waves);
  const int32_t vocab = runner_->model().config().vocab_size;
  // Point-mass rejection sampling draws like plain sampling: with equal seeds the outputs are equal,
  // for a perfect drafter, n-gram, and EAGLE-3 (its drafts mostly rejected: the residual branch).
  for (const char* name : {"oracle", "ngram", "eagle3", "dspark"}) {
    const std::string n = name;
    std::unique_ptr<spec::Drafter> drafter;
    if (n == "oracle") drafter = std::make_unique<OracleDrafter>(expected, false, vocab);
    if (n == "eagle3") drafter = eagle3();
    if (n == "dspark") drafter = dspark();
    auto e = make_engine(spec_config(3), std::move(drafter));
    EXPECT_EQ(run_waves(*e, waves), expected) << name;
    if (n == "oracle") {
      EXPECT_EQ(e->stats().spec_num_accepted_tokens, e->stats().spec_num_draft_tokens);
    }
    if (n == "eagle3" || n == "dspark") {
      EXPECT_GT(e->stats().spec_num_draft_tokens, 0) << name;
    }
    expect_nothing_held(*e);
  }
}

TEST_P(EngineSpec, PreemptionAndAbortBetweenVerifyStepsLeakNothing) {
  std::vector<std::vector<GenerateRequest>> waves(1);
  for (uint64_t i = 0; i < 4; ++i) waves[0].push_back(request(tokens(30 + i, 60), 30));
  auto roomy = make_engine(config());
  const Outputs expected = run_waves(*roomy, waves);
  const int32_t vocab = runner_->model().config().vocab_size;
  // 20 pages of 16 for four requests growing to 90 tokens (6 pages each): preemption.
  auto tight = make_engine(spec_config(4, spec::SpecMethod::ngram, 20),
                           std::make_unique<OracleDrafter>(expected, false, vocab));
  EXPECT_EQ(run_waves(*tight, waves), expected);
  EXPECT_GT(tight->stats().preemptions, 0);
  EXPECT_GT(tight->stats().spec_num_accepted_tokens, 0);
  expect_nothing_held(*tight);
  // The model drafters under the same pressure: preempted requests restart their draft state.
  for (bool use_eagle3 : {true, false}) {
    std::unique_ptr<spec::Drafter> drafter;
    const draft::Eagle3Drafter* e3 = nullptr;
    const draft::DsparkDrafter* ds = nullptr;
    if (use_eagle3) {
      auto d = eagle3();
      e3 = d.get();
      drafter = std::move(d);
    } else {
      auto d = dspark();
      ds = d.get();
      drafter = std::move(d);
    }
    auto m = make_engine(spec_config(4, spec::SpecMethod::ngram, 20), std::move(drafter));
    EXPECT_EQ(run_waves(*m, waves), expected) << (use_eagle3 ? "eagle3" : "dspark");
    EXPECT_GT(m->stats().preemptions, 0);
    EXPECT_GT(m->stats().spec_num_draft_tokens, 0);
    EXPECT_EQ(e3 ? e3->num_requests() : ds->num_requests(), 0u);
    expect_nothing_held(*m);
  }

  // Abort one request after a few verify steps, while others continue.
  auto e = make_engine(spec_config(4), std::make_unique<OracleDrafter>(expected, false, vocab));
  auto victim = e->submit(waves[0][0]);
  auto other = e->submit(waves[0][1]);
  while (e->stats().spec_num_drafts < 3) ASSERT_TRUE(e->step());
  EXPECT_TRUE(e->abort(victim.id));
  e->run_until_idle();
  TokenEvent last;
  const auto partial = output(*victim.stream, &last);
  EXPECT_EQ(last.reason, FinishReason::abort);
  EXPECT_LT(partial.size(), 30u);
  const auto& full = expected.at(waves[0][0].prompt);
  EXPECT_TRUE(std::equal(partial.begin(), partial.end(), full.begin()));
  EXPECT_EQ(output(*other.stream), expected.at(waves[0][1].prompt));
  expect_nothing_held(*e);
}

TEST_P(EngineSpec, StopTokenAndMaxTokensCutAnAcceptedRun) {
  const auto prompt = tokens(70, 23);
  auto plain = make_engine(config());
  const Outputs expected = run_waves(*plain, {{request(prompt, 24)}});
  const std::vector<int32_t>& full = expected.at(prompt);
  const int32_t vocab = runner_->model().config().vocab_size;
  // A stop token first produced at index f (inside an accepted run of the oracle's drafts).
  const int32_t stop = full[9];
  const auto f = static_cast<size_t>(std::find(full.begin(), full.end(), stop) - full.begin());
  auto e = make_engine(spec_config(4), std::make_unique<OracleDrafter>(expected, false, vocab));
  GenerateRequest g = request(prompt, 24);
  g.stop_token_ids = {stop};
  auto sub = e->submit(g);
  auto capped = e->submit(request(prompt, 7));  // max_tokens 7: drafts are capped to fit
  e->run_until_idle();
  TokenEvent last;
  EXPECT_EQ(output(*sub.stream, &last),
            std::vector<int32_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(f) + 1));
  EXPECT_EQ(last.reason, FinishReason::stop);
  EXPECT_EQ(last.stats.output_tokens, static_cast<int64_t>(f) + 1);
  EXPECT_GT(last.stats.spec_accepted_tokens, 0);
  EXPECT_EQ(output(*capped.stream, &last), std::vector<int32_t>(full.begin(), full.begin() + 7));
  EXPECT_EQ(last.reason, FinishReason::length);
  expect_nothing_held(*e);
}

TEST_P(EngineSpec, SyntheticModeForcesTheAcceptanceLength) {
  EngineConfig c = spec_config(4, spec::SpecMethod::synthetic);
  c.speculative.synthetic_acceptance_length = 3;
  c.speculative.adaptive = false;
  auto e = make_engine(c);
  auto sub = e->submit(request(tokens(40, 20), 31));
  e->run_until_idle();
  EXPECT_EQ(output(*sub.stream).size(), 31u);
  const EngineStats s = e->stats();
  EXPECT_TRUE(s.spec_synthetic);
  EXPECT_EQ(s.spec_method, "synthetic");
  // Every verify step proposes AL - 1 = 2 drafts and accepts both: 3 tokens per step.
  EXPECT_EQ(s.spec_num_accepted_tokens, s.spec_num_draft_tokens);
  EXPECT_EQ(s.spec_num_draft_tokens, 2 * s.spec_num_drafts);
  EXPECT_EQ(s.spec_num_drafts, 10);  // 1 token from the prefill, then 10 steps of 3
  expect_nothing_held(*e);
}

// A drafter that asks for the target's hidden states (layers 0 and 2 of k3-tiny: the mixtures of
// layers 1 and 3) and drafts the plain run's tokens with the 3rd one wrong (so verify steps keep
// some of their rows and drop others); it records every committed tap row it observes.
class TapDrafter final : public spec::Drafter {
 public:
  TapDrafter(const Outputs& expected, int32_t vocab) : oracle_(expected, false, vocab), vocab_(vocab) {}
  std::string name() const override { return "tap"; }
  spec::HiddenTapRequest hidden_tap() const override { return {{0, 2}}; }
  void propose(std::span<const spec::DraftQuery> batch, std::span<spec::Draft> out) override {
    oracle_.propose(batch, out);
    for (spec::Draft& d : out)
      if (d.tokens.size() >= 3) d.tokens[2] = (d.tokens[2] + 1) % vocab_;
  }
  void observe(spec::RequestId id, const spec::HiddenTapRows& rows) override {
    Seen& s = seen[id];
    EXPECT_EQ(rows.position, static_cast<int64_t>(s.tokens.size())) << "tap rows must be contiguous";
    EXPECT_EQ(rows.hidden.dim(0), rows.rows());
    s.width = rows.hidden.dim(1);
    s.tokens.insert(s.tokens.end(), rows.tokens.begin(), rows.tokens.end());
    const float* p = rows.hidden.as<const float>();
    s.values.insert(s.values.end(), p, p + rows.rows() * s.width);
  }
  struct Seen {
    std::vector<int32_t> tokens;
    std::vector<float> values;
    int64_t width = 0;
  };
  std::map<spec::RequestId, Seen> seen;

 private:
  OracleDrafter oracle_;
  int32_t vocab_;
};

TEST_P(EngineSpec, DrafterObservesTheCommittedTapRows) {
  const std::vector<std::vector<GenerateRequest>> waves = {
      {request(repetitive(60, 70), 20), request(tokens(61, 9), 12)}};
  auto plain = make_engine(config());
  const Outputs expected = run_waves(*plain, waves);
  auto drafter = std::make_unique<TapDrafter>(expected, runner_->model().config().vocab_size);
  TapDrafter* tap = drafter.get();
  auto e = make_engine(spec_config(3), std::move(drafter));
  auto a = e->submit(waves[0][0]);
  auto b = e->submit(waves[0][1]);
  e->run_until_idle();
  const EngineStats st = e->stats();
  EXPECT_GT(st.spec_num_accepted_tokens, 0);
  EXPECT_LT(st.spec_num_accepted_tokens, st.spec_num_draft_tokens);
  const model::Model& m = runner_->model();
  const int64_t H = m.config().hidden_size;
  for (auto* sub : {&a, &b}) {
    const std::vector<int32_t> out = output(*sub->stream);
    const TapDrafter::Seen& s = tap->seen.at(sub->id);
    // The committed tokens: prompt ++ output without its last token (never run through the model).
    const GenerateRequest& g = sub == &a ? waves[0][0] : waves[0][1];
    std::vector<int32_t> committed = g.prompt;
    committed.insert(committed.end(), out.begin(), out.end() - 1);
    ASSERT_EQ(s.tokens, committed);
    ASSERT_EQ(s.width, 2 * H);
    // Reference: one prefill over the committed tokens with a trace of the layer 1 and 3 mixtures.
    model::KvStorageConfig sc;
    sc.num_blocks = 8;
    sc.block_size = 16;
    sc.num_slots = 1;
    model::KvStorage kv(m.config(), sc, m.memory(), GetParam());
    const std::vector<int32_t> pages{0, 1, 2, 3, 4, 5, 6, 7};  // the block table views it
    model::SequenceState st{0, 0, pages};
    const auto T = static_cast<int64_t>(committed.size());
    std::vector<float> want(static_cast<size_t>(T * 2 * H));
    const model::TraceFn trace = [&](std::string_view name, int layer, const core::TensorView& v) {
      if (name != "attn_res.mix" || (layer != 1 && layer != 3)) return;
      const int64_t col = layer == 1 ? 0 : H;
      for (int64_t r = 0; r < T; ++r) std::copy_n(v.as<const float>() + r * H, H, want.data() + r * 2 * H + col);
    };
    const model::SequenceInput in{committed, &st, model::StepKind::prefill};
    m.forward(kv, std::span(&in, 1), model::LogitRows::all, &trace);
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      num += (s.values[i] - want[i]) * (s.values[i] - want[i]);
      den += want[i] * want[i];
    }
    // Chunked vs recurrent KDA and naive vs absorbed MLA: equal up to rounding.
    EXPECT_LT(std::sqrt(num / den), GetParam() == kernels::Precision::fp32 ? 1e-4 : 3e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, EngineSpec, ::testing::Values(kernels::Precision::fp32, kernels::Precision::bf16),
                         [](const auto& info) { return info.param == kernels::Precision::fp32 ? "fp32" : "bf16"; });

// The 2nd generated token's frequencies over 1000 seeded runs with a fixed draft equal plain
// sampling's (two-sample chi-square), fp32 only (the cost is the 2000 requests).
class EngineSpecDistribution : public EngineSpec {};

TEST_P(EngineSpecDistribution, SecondTokenFrequenciesMatchPlainSampling) {
  const auto prompt = tokens(50, 1);  // one token: the model's cost here is per token
  constexpr int kRuns = 1000;
  auto second_tokens = [&](std::unique_ptr<spec::Drafter> drafter, EngineStats* stats) {
    EngineConfig c = drafter ? spec_config(1, spec::SpecMethod::ngram, 256, 200) : config(256, 200);
    c.speculative.adaptive = false;          // every run's second token is verified (no gate, no pause)
    c.scheduler.max_partial_prefills = 200;  // a whole wave prefills in one step
    c.scheduler.max_num_batched_tokens = 2048;
    auto e = make_engine(c, std::move(drafter));
    std::map<int32_t, int> counts;
    for (int base = 0; base < kRuns; base += 200) {
      std::vector<Engine::Submission> subs;
      for (int i = base; i < base + 200 && i < kRuns; ++i)
        subs.push_back(e->submit(request(prompt, 3, 1.0f, static_cast<uint64_t>(i))));
      e->run_until_idle();
      for (auto& s : subs) ++counts[output(*s.stream).at(1)];
    }
    if (stats) *stats = e->stats();
    return counts;
  };
  const auto plain = second_tokens(nullptr, nullptr);
  int32_t most_likely = plain.begin()->first;
  for (const auto& [t, n] : plain)
    if (n > plain.at(most_likely)) most_likely = t;
  EngineStats s;
  const auto spec = second_tokens(std::make_unique<FixedDrafter>(most_likely), &s);
  // Both branches ran: some drafts accepted, some rejected.
  EXPECT_GT(s.spec_num_accepted_tokens, 0);
  EXPECT_LT(s.spec_num_accepted_tokens, s.spec_num_draft_tokens);
  EXPECT_EQ(s.spec_num_draft_tokens, kRuns);
  // Two-sample chi-square over the tokens seen (bins with few counts pooled).
  double chi2 = 0;
  int bins = 0, pool_a = 0, pool_b = 0;
  std::map<int32_t, std::pair<int, int>> joint;
  for (const auto& [t, n] : plain) joint[t].first = n;
  for (const auto& [t, n] : spec) joint[t].second = n;
  for (const auto& [t, ab] : joint) {
    if (ab.first + ab.second < 10) {
      pool_a += ab.first, pool_b += ab.second;
      continue;
    }
    chi2 += std::pow(ab.first - ab.second, 2) / (ab.first + ab.second);
    ++bins;
  }
  if (pool_a + pool_b > 0) {
    chi2 += std::pow(pool_a - pool_b, 2) / (pool_a + pool_b);
    ++bins;
  }
  const double df = std::max(bins - 1, 1);
  EXPECT_LT(chi2, df + 4 * std::sqrt(2 * df)) << bins << " bins";
  // (Point-mass acceptance draws exactly like plain sampling: with equal seeds the runs agree.)
  EXPECT_EQ(plain, spec);
}

INSTANTIATE_TEST_SUITE_P(Fp32, EngineSpecDistribution, ::testing::Values(kernels::Precision::fp32),
                         [](const auto&) { return std::string("fp32"); });

}  // namespace
}  // namespace k3::engine
