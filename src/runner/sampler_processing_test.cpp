// runner/sampler_processing_test.cpp: logit_bias, repetition / presence / frequency
// penalties against hand-computed examples, and logprobs (log_softmax of the processed
// logits before temperature, top-n order, the sampled token's logprob).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "runner/sampler.h"
#include "runner/sampler_test_util.h"

namespace k3::runner {
namespace {

using testing::log_softmax;

// All logprobs of the processed logits, read back through logprobs = vocab (vocab <= 20).
std::vector<double> processed_logprobs(SamplingParams p, std::span<const float> logits, std::span<const int32_t> prompt,
                                       std::span<const int32_t> output) {
  p.logprobs = static_cast<int>(logits.size());
  Sampler s(p, static_cast<int32_t>(logits.size()));
  const SampleResult r = s.sample(logits, prompt, output);
  std::vector<double> lp(logits.size(), std::nan(""));  // poison: every id must be returned
  for (const auto& [id, v] : r.top_logprobs) lp[static_cast<size_t>(id)] = v;
  return lp;
}

// Checks that the Sampler processed `logits` into `expected` (up to a constant, via logprobs).
void expect_processed(const SamplingParams& p, const std::vector<float>& logits, std::span<const int32_t> prompt,
                      std::span<const int32_t> output, const std::vector<float>& expected) {
  const auto got = processed_logprobs(p, logits, prompt, output);
  const auto want = log_softmax(expected);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-6) << "id " << i;
}

TEST(SamplerPenalties, RepetitionOverPromptAndOutputOncePerId) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f};
  const std::vector<int32_t> prompt = {0, 1, 1}, output = {2, 0, 2};
  // ids {0, 1, 2} are penalised once each: positive / 2, negative * 2; 3, 4, 5 untouched.
  expect_processed({.repetition_penalty = 2.0f}, logits, prompt, output, {1.0f, -2.0f, 0.25f, 3.0f, -2.0f, 1.0f});
  // A penalty below 1 rewards instead.
  expect_processed({.repetition_penalty = 0.5f}, logits, prompt, {}, {4.0f, -0.5f, 0.5f, 3.0f, -2.0f, 1.0f});
}

TEST(SamplerPenalties, PresenceAndFrequencyOverOutputOnly) {
  const std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<int32_t> prompt = {0, 0, 0, 4}, output = {1, 2, 2, 2, 1, 3};
  // x -= 0.25 * count + 0.5 * [count > 0]: id 1 (x2) 0, id 2 (x3) -0.25, id 3 (x1) 0.25;
  // ids 0 and 4 appear in the prompt only and keep 1.
  expect_processed({.presence_penalty = 0.5f, .frequency_penalty = 0.25f}, logits, prompt, output,
                   {1.0f, 0.0f, -0.25f, 0.25f, 1.0f});
  // Negative values encourage repetition.
  expect_processed({.presence_penalty = -1.0f}, logits, prompt, output, {1.0f, 2.0f, 2.0f, 2.0f, 1.0f});
  expect_processed({.frequency_penalty = -2.0f}, logits, prompt, output, {1.0f, 5.0f, 7.0f, 3.0f, 1.0f});
}

TEST(SamplerPenalties, BiasThenRepetitionThenPresenceFrequency) {
  const std::vector<float> logits = {3.0f, -1.0f, 0.0f, 0.5f};
  const std::vector<int32_t> output = {0, 1};
  // id 0: 3 / 1.5 - 1 = 1 (presence after repetition would otherwise give 4/3).
  // id 1: (-1 + 2) / 1.5 - 1 = -1/3 (bias before repetition: -1 * 1.5 + 2 - 1 otherwise).
  expect_processed({.repetition_penalty = 1.5f, .presence_penalty = 1.0f, .logit_bias = {{1, 2.0f}}}, logits, {},
                   output, {1.0f, -1.0f / 3.0f, 0.0f, 0.5f});
}

TEST(SamplerPenalties, ScratchStaysCleanAcrossCallsAndAfterBadIds) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 4.0f};
  Sampler s({.repetition_penalty = 2.0f, .frequency_penalty = 1.0f, .logprobs = 4}, 4);
  const std::vector<int32_t> bad = {1, 9};
  EXPECT_THROW(s.sample(logits, {}, bad), core::Error);
  const std::vector<int32_t> output = {3, 3};
  // Same answer on every call: marks and counts from earlier calls never leak.
  for (int call = 0; call < 3; ++call) {
    const SampleResult r = s.sample(logits, {}, output);
    const auto want = log_softmax(std::vector<float>{1.0f, 2.0f, 3.0f, 0.0f});  // 4 / 2 - 1 * 2
    ASSERT_EQ(r.top_logprobs.size(), 4u);
    EXPECT_EQ(r.token, 2);
    for (const auto& [id, v] : r.top_logprobs) EXPECT_NEAR(v, want[static_cast<size_t>(id)], 2e-6);
  }
  // Unused spans are not read: a bad prompt id is fine when no penalty reads the prompt.
  Sampler plain({}, 4);
  EXPECT_EQ(plain.sample(logits, bad, bad).token, 3);
}

TEST(SamplerLogitBias, AddsAndForcesAndBans) {
  const std::vector<float> logits = {0.0f, 5.0f, -3.0f, 2.0f, 1.0f};
  expect_processed({.logit_bias = {{2, 1.5f}, {4, -0.5f}}}, logits, {}, {}, {0.0f, 5.0f, -1.5f, 2.0f, 0.5f});
  // +100 forces the least likely token at any temperature; -100 bans the most likely one.
  Sampler force({.temperature = 1.5f, .seed = 1, .logit_bias = {{2, 100.0f}}, .logprob = true}, 5);
  Sampler ban({.temperature = 1.0f, .seed = 2, .logit_bias = {{1, -100.0f}}}, 5);
  for (int i = 0; i < 2000; ++i) {
    const SampleResult f = force.sample(logits, {}, {});
    EXPECT_EQ(f.token, 2);
    EXPECT_NEAR(f.logprob, 0.0f, 1e-6f);
    EXPECT_NE(ban.sample(logits, {}, {}).token, 1);
  }
  EXPECT_EQ(Sampler({.logit_bias = {{1, -100.0f}}}, 5).sample(logits, {}, {}).token, 3);
}

TEST(SamplerLogprobs, AreLogSoftmaxOfProcessedLogitsBeforeTemperature) {
  core::Rng rng(21);
  std::vector<float> logits(97);
  for (float& v : logits) v = static_cast<float>(rng.normal(0.0, 2.0));
  const std::vector<int32_t> prompt = {5, 6, 7}, output = {7, 8, 8};
  const SamplingParams base{.repetition_penalty = 1.3f,
                            .presence_penalty = 0.4f,
                            .frequency_penalty = 0.1f,
                            .logit_bias = {{40, 3.0f}},
                            .logprobs = 20};
  // Oracle: the processed logits by hand, then log_softmax in double.
  std::vector<float> processed = logits;
  processed[40] += 3.0f;
  for (int id : {5, 6, 7, 8})
    processed[static_cast<size_t>(id)] = processed[static_cast<size_t>(id)] > 0
                                             ? processed[static_cast<size_t>(id)] / 1.3f
                                             : processed[static_cast<size_t>(id)] * 1.3f;
  processed[7] -= 0.1f * 1 + 0.4f;
  processed[8] -= 0.1f * 2 + 0.4f;
  const auto want = log_softmax(processed);
  std::vector<int32_t> ranked(97);
  for (size_t i = 0; i < ranked.size(); ++i) ranked[i] = static_cast<int32_t>(i);
  std::stable_sort(ranked.begin(), ranked.end(), [&](int32_t a, int32_t b) { return want[a] > want[b]; });

  std::vector<SampleResult> results;
  for (SamplingParams p : {base, SamplingParams{.temperature = 0.3f, .top_k = 2, .seed = 3},
                           SamplingParams{.temperature = 2.5f, .top_p = 0.5f, .min_p = 0.1f, .seed = 4}}) {
    p.repetition_penalty = base.repetition_penalty;
    p.presence_penalty = base.presence_penalty;
    p.frequency_penalty = base.frequency_penalty;
    p.logit_bias = base.logit_bias;
    p.logprobs = base.logprobs;
    Sampler s(p, 97);
    for (int i = 0; i < 50; ++i) results.push_back(s.sample(logits, prompt, output));
  }
  for (const SampleResult& r : results) {
    EXPECT_NEAR(r.logprob, want[static_cast<size_t>(r.token)], 1e-5);
    ASSERT_EQ(r.top_logprobs.size(), 20u);
    for (size_t j = 0; j < 20; ++j) {
      EXPECT_EQ(r.top_logprobs[j].first, ranked[j]) << "rank " << j;
      EXPECT_NEAR(r.top_logprobs[j].second, want[static_cast<size_t>(ranked[j])], 1e-5);
    }
  }
  // Temperature and filters change the draws, never the logprobs.
  EXPECT_EQ(results.front().top_logprobs, results.back().top_logprobs);
}

TEST(SamplerLogprobs, TopNOrderTiesAndMaskedTokens) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {1.0f, 2.0f, ninf, 2.0f, 1.0f, 2.0f};
  Sampler s({.logprobs = 6}, 6);
  const SampleResult r = s.sample(logits, {}, {});
  EXPECT_EQ(r.token, 1);
  ASSERT_EQ(r.top_logprobs.size(), 6u);
  const std::vector<int32_t> ids = {1, 3, 5, 0, 4, 2};  // ties: lower id first; -inf last
  double total = 0;
  for (size_t j = 0; j < 6; ++j) {
    EXPECT_EQ(r.top_logprobs[j].first, ids[j]);
    total += std::exp(static_cast<double>(r.top_logprobs[j].second));
  }
  EXPECT_EQ(r.top_logprobs[5].second, ninf);
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_NEAR(r.logprob, std::log(std::exp(2.0) / (3 * std::exp(2.0) + 2 * std::exp(1.0))), 1e-6);
  // logprobs = 0 with logprob: no list, the sampled token's logprob all the same; -inf is never drawn.
  Sampler none({.temperature = 50.0f, .seed = 5, .logprob = true}, 6);
  for (int i = 0; i < 2000; ++i) {
    const SampleResult d = none.sample(logits, {}, {});
    EXPECT_TRUE(d.top_logprobs.empty());
    EXPECT_NE(d.token, 2);
    EXPECT_NEAR(d.logprob, log_softmax(logits)[static_cast<size_t>(d.token)], 1e-6);
  }
  // Not asked for: no log-softmax over the vocabulary, and the logprob says so (NaN).
  Sampler quiet({.temperature = 1.0f, .seed = 6}, 6);
  EXPECT_TRUE(std::isnan(quiet.sample(logits, {}, {}).logprob));
}

}  // namespace
}  // namespace k3::runner
