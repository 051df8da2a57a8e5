// engine/engine_constrained_test.cpp: constrained decoding through the Engine on the real model
// (k3-tiny, CPU reference ops, random "sensitive" weights, fp32), over a vocabulary shaped like a
// BPE one (every byte, then multi-byte pieces) so the grammar's masks cut inside tokens:
//   - every output, greedy and sampled, is a sentence of the grammar ending in the end token,
//     and its text is JSON that meets the schema;
//   - the fused decode path gives the standard path's tokens (fp32);
//   - n-gram speculation gives the tokens of plain decoding (greedy and seeded sampling): verify
//     rows are masked along their drafts and the matcher rolls back what is rejected;
//   - bad combinations are refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "engine/model_executor.h"
#include "runner/model_runner.h"
#include "spec/drafter.h"
#include "structured/ebnf.h"
#include "structured/json_schema.h"

namespace k3::engine {
namespace {

constexpr int32_t kEnd = 1023;  // the end token (eos)

// ids 0..255: bytes; 256..1022: pieces over a JSON alphabet; 1023: the end token.
std::shared_ptr<const structured::Vocabulary> vocabulary() {
  std::vector<std::pair<int32_t, structured::Vocabulary::Token>> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back({b, {std::string(1, static_cast<char>(b)), -1}});
  core::Rng rng(11);
  const std::string alphabet = "{}[]\":, 0123456789abcdefghij-tn";
  for (int32_t id = 256; id < kEnd; ++id) {
    std::string t;
    for (int k = 0, n = 2 + static_cast<int>(rng.next_u64() % 4); k < n; ++k)
      t += alphabet[rng.next_u64() % alphabet.size()];
    tokens.push_back({id, {t, -1}});
  }
  tokens.push_back({kEnd, {"", 0}});
  return std::make_shared<const structured::Vocabulary>(1024, tokens, std::vector<std::string>{"<|end|>"},
                                                        std::vector<int32_t>{kEnd});
}

// A schema whose every sentence is short (enums, bounded numbers and arrays), so random weights
// finish inside max_tokens.
const nlohmann::ordered_json kSchema = {
    {"type", "object"},
    {"properties",
     {{"name", {{"enum", {"ab", "cd", "efg"}}}},
      {"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 99}}},
      {"tags", {{"type", "array"}, {"items", {{"type", "boolean"}}}, {"maxItems", 3}}},
      {"ok", {{"type", "boolean"}}}}},
    {"required", {"name", "n"}},
    {"additionalProperties", false}};

std::shared_ptr<const structured::CompiledGrammar> schema_grammar() {
  static const auto g = [] {
    structured::EbnfRules rules;
    structured::JsonSchemaConverter c(rules, "s");
    rules.add("root", c.convert(kSchema));
    auto v = vocabulary();
    return std::make_shared<const structured::CompiledGrammar>(
        structured::parse_ebnf(rules.text(), [v](std::string_view n) { return v->special(n); }), v);
  }();
  return g;
}

class EngineConstrained : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("k3-engine-constrained-test-" + std::to_string(::getpid())));
    checkpoint::WriteOptions w;
    w.init = checkpoint::InitStyle::sensitive;
    checkpoint::write_random_checkpoint(config::builtin_config("k3-tiny"), w, *dir_);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  std::unique_ptr<runner::ModelRunner> open(model::DecodeBackend backend) const {
    model::ModelOptions o;
    o.precision = kernels::Precision::fp32;
    o.decode_backend = backend;
    return runner::ModelRunner::open(*dir_, o);
  }
  static EngineConfig config(int32_t k = 0) {
    EngineConfig c;
    c.cache.block_size = 16;
    c.cache.num_blocks = 128;
    c.cache.num_slots = 4;
    c.cache.num_checkpoints = 16;
    c.cache.checkpoint_interval_blocks = 4;
    c.scheduler.max_num_seqs = 4;
    c.scheduler.max_num_batched_tokens = 512;
    c.scheduler.max_model_len = 400;
    c.scheduler.chunk_align_tokens = 64;
    c.eos_token_id = kEnd;
    if (k > 0) {
      c.speculative.method = spec::SpecMethod::ngram;
      c.speculative.num_speculative_tokens = k;
    }
    return c;
  }
  static GenerateRequest request(uint64_t seed, float temperature) {
    GenerateRequest r;
    core::Rng rng(seed);
    for (int i = 0; i < 24; ++i) r.prompt.push_back(static_cast<int32_t>(256 + rng.next_u64() % 700));
    r.max_tokens = 300;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.grammar = schema_grammar();
    return r;
  }
  // Runs the requests together; each one's tokens and finish reason.
  static std::vector<std::pair<std::vector<int32_t>, FinishReason>> run(
      const runner::ModelRunner& runner, const EngineConfig& c, std::vector<GenerateRequest> requests,
      EngineStats* stats = nullptr, std::unique_ptr<spec::Drafter> drafter = nullptr) {
    Engine e(c, std::make_unique<ModelExecutor>(runner.model(), c.cache, model::KvCacheDtype::bf16),
             std::move(drafter));
    std::vector<std::shared_ptr<TokenStream>> streams;
    for (GenerateRequest& r : requests) streams.push_back(e.submit(std::move(r)).stream);
    e.run_until_idle();
    if (stats) *stats = e.stats();
    std::vector<std::pair<std::vector<int32_t>, FinishReason>> out;
    for (auto& s : streams) {
      out.emplace_back();
      while (auto ev = s->try_next()) {
        if (ev->token >= 0) out.back().first.push_back(ev->token);
        if (ev->finished) out.back().second = ev->reason;
      }
    }
    return out;
  }
  static inline std::filesystem::path* dir_ = nullptr;
};

std::string text_of(const std::vector<int32_t>& tokens) {
  auto v = vocabulary();
  std::string s;
  for (int32_t t : tokens)
    for (structured::Symbol x : v->symbols(t)) s += static_cast<char>(x);
  return s;
}

void expect_valid(const std::vector<int32_t>& tokens) {
  ASSERT_FALSE(tokens.empty());
  EXPECT_EQ(tokens.back(), kEnd) << "the output must end where the grammar does";
  structured::Matcher m(schema_grammar());
  for (int32_t t : tokens) ASSERT_TRUE(m.accept(t)) << t;
  const auto j = nlohmann::json::parse(text_of(tokens));  // throws when it is not JSON
  EXPECT_TRUE(j.contains("name") && j.contains("n")) << j.dump();
  EXPECT_TRUE(j["name"] == "ab" || j["name"] == "cd" || j["name"] == "efg") << j.dump();
  EXPECT_TRUE(j["n"].is_number_integer() && j["n"] >= 0 && j["n"] <= 99) << j.dump();
  if (j.contains("tags")) EXPECT_LE(j["tags"].size(), 3u);
  for (const auto& [k, _] : j.items()) EXPECT_TRUE(k == "name" || k == "n" || k == "tags" || k == "ok") << k;
}

std::vector<GenerateRequest> requests(float temperature) {
  std::vector<GenerateRequest> rs;
  for (uint64_t s = 1; s <= 4; ++s) rs.push_back(EngineConstrained::request(s, temperature));
  return rs;
}

TEST_F(EngineConstrained, EveryOutputIsASentenceOfTheGrammar) {
  const auto runner = open(model::DecodeBackend::standard);
  for (float t : {0.0f, 1.0f})
    for (const auto& [tokens, reason] : run(*runner, config(), requests(t))) {
      EXPECT_EQ(reason, FinishReason::stop);
      expect_valid(tokens);
    }
}

TEST_F(EngineConstrained, FusedPathGivesTheStandardPathsTokens) {
  const auto standard = open(model::DecodeBackend::standard);
  const auto fused = open(model::DecodeBackend::latency_specialized);
  for (float t : {0.0f, 1.0f}) {
    const auto a = run(*standard, config(), requests(t));
    EngineStats stats;
    const auto b = run(*fused, config(), requests(t), &stats);
    EXPECT_GT(stats.decode_paths.fused_steps, 0) << "the fused path must have served decode steps";
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].first, b[i].first) << "request " << i << " temperature " << t;
  }
}

TEST_F(EngineConstrained, SpeculationGivesThePlainTokens) {
  const auto runner = open(model::DecodeBackend::standard);
  for (float t : {0.0f, 1.0f}) {
    const auto plain = run(*runner, config(), requests(t));
    EngineStats stats;
    const auto spec = run(*runner, config(4), requests(t), &stats);
    EXPECT_GT(stats.spec_num_draft_tokens, 0) << "drafts must have been verified";
    EXPECT_GT(stats.spec_num_accepted_tokens, 0) << "and some accepted";
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(plain[i].first, spec[i].first) << "request " << i << " temperature " << t;
      expect_valid(spec[i].first);
    }
  }
}

// Drafts the plain run's next tokens (an oracle: they are accepted), and past its end token one
// token more: accepted runs end in the end token with a token after it, which must be cut with
// the request and never reach the matcher.
class OracleEndDrafter final : public spec::Drafter {
 public:
  explicit OracleEndDrafter(std::map<std::vector<int32_t>, std::vector<int32_t>> expected)
      : expected_(std::move(expected)) {}
  std::string name() const override { return "oracle-end"; }
  void propose(std::span<const spec::DraftQuery> batch, std::span<spec::Draft> out) override {
    for (size_t i = 0; i < batch.size(); ++i) {
      const spec::DraftQuery& q = batch[i];
      const auto it = expected_.find(std::vector<int32_t>(q.tokens.begin(), q.tokens.begin() + q.prompt_len));
      if (it == expected_.end()) continue;
      const auto m = static_cast<size_t>(q.tokens.size()) - static_cast<size_t>(q.prompt_len);
      for (size_t k = m; k < m + static_cast<size_t>(q.max_drafts); ++k)
        out[i].tokens.push_back(k < it->second.size() ? it->second[k] : 300);
    }
  }

 private:
  std::map<std::vector<int32_t>, std::vector<int32_t>> expected_;
};

TEST_F(EngineConstrained, AcceptedEndTokensCutWhatFollows) {
  const auto runner = open(model::DecodeBackend::standard);
  const auto plain = run(*runner, config(), requests(0.0f));
  std::map<std::vector<int32_t>, std::vector<int32_t>> expected;
  const auto rs = requests(0.0f);
  for (size_t i = 0; i < rs.size(); ++i) expected[rs[i].prompt] = plain[i].first;
  EngineStats stats;
  const auto spec = run(*runner, config(3), requests(0.0f), &stats, std::make_unique<OracleEndDrafter>(expected));
  EXPECT_GT(stats.spec_num_accepted_tokens, 0);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(plain[i].first, spec[i].first) << "request " << i;
    EXPECT_EQ(spec[i].second, FinishReason::stop);
    expect_valid(spec[i].first);
  }
}

TEST_F(EngineConstrained, RefusesBadCombinationsByName) {
  const auto runner = open(model::DecodeBackend::standard);
  const EngineConfig c = config();
  Engine e(c, std::make_unique<ModelExecutor>(runner->model(), c.cache, model::KvCacheDtype::bf16));
  auto expect_refused = [&](GenerateRequest r, const std::string& needle) {
    try {
      e.submit(std::move(r));
      ADD_FAILURE() << "not refused: " << needle;
    } catch (const core::Error& err) {
      EXPECT_NE(std::string(err.what()).find(needle), std::string::npos) << err.what();
    }
  };
  GenerateRequest r = request(1, 0);
  r.ignore_eos = true;
  expect_refused(r, "ignore_eos");
  r = request(1, 0);
  r.forced_output = {1, 2};
  expect_refused(r, "forced_output");
  r = request(1, 0);
  auto v = std::make_shared<const structured::Vocabulary>(
      512, std::vector<std::pair<int32_t, structured::Vocabulary::Token>>{{0, {"a", -1}}}, std::vector<std::string>{},
      std::vector<int32_t>{});
  r.grammar = std::make_shared<const structured::CompiledGrammar>(
      structured::parse_ebnf("root ::= \"a\"", [](std::string_view) { return std::nullopt; }), v);
  expect_refused(r, "vocabulary of 512 tokens");
}

}  // namespace
}  // namespace k3::engine
