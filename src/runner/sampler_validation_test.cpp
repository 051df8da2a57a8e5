// runner/sampler_validation_test.cpp: every bad parameter and bad sample() input is a
// core::Error naming it; edge values that are legal are accepted; and a smoke run at the
// real K3 vocabulary (163840) through every path (no timing assertion, times printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "runner/sampler.h"
#include "runner/sampler_test_util.h"

namespace k3::runner {
namespace {

using testing::error_of;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The message validate() throws for p at vocab 1000, checked to contain every word in `names`.
void expect_rejected(const SamplingParams& p, std::initializer_list<const char*> names, int32_t vocab = 1000) {
  const std::string msg = error_of([&] { validate(p, vocab); });
  ASSERT_FALSE(msg.empty()) << "accepted but should be rejected (expected: " << *names.begin() << ")";
  for (const char* name : names) EXPECT_NE(msg.find(name), std::string::npos) << "'" << name << "' not in: " << msg;
  EXPECT_FALSE(error_of([&] { Sampler s(p, vocab); }).empty()) << "the constructor validates too";
}

TEST(SamplerValidation, EveryBadParameterIsNamed) {
  for (float t : {-1.0f, kNan, kInf}) expect_rejected({.temperature = t}, {"temperature"});
  for (float v : {0.0f, -0.5f, 1.5f, kNan}) expect_rejected({.top_p = v}, {"top_p"});
  for (int k : {-2, -100}) expect_rejected({.top_k = k}, {"top_k", std::to_string(k).c_str()});
  for (float v : {-0.1f, 1.5f, kNan}) expect_rejected({.min_p = v}, {"min_p"});
  for (float v : {0.0f, -1.0f, kNan, kInf}) expect_rejected({.repetition_penalty = v}, {"repetition_penalty"});
  for (float v : {2.5f, -2.01f, kNan, kInf}) expect_rejected({.presence_penalty = v}, {"presence_penalty"});
  for (float v : {-3.0f, 2.01f, kNan}) expect_rejected({.frequency_penalty = v}, {"frequency_penalty"});
  for (int n : {-1, 21, 1000}) expect_rejected({.logprobs = n}, {"logprobs"});
  expect_rejected({.logprobs = 8}, {"logprobs", "vocab_size"}, 5);  // more than the vocabulary
  expect_rejected({.logit_bias = {{-1, 1.0f}}}, {"logit_bias[0]", "token -1", "vocabulary"});
  expect_rejected({.logit_bias = {{3, 1.0f}, {1000, 1.0f}}}, {"logit_bias[1]", "token 1000", "vocabulary"});
  for (float v : {100.5f, -101.0f, kNan, kInf})
    expect_rejected({.logit_bias = {{7, v}}}, {"logit_bias[0]", "token 7", "bias"});
  expect_rejected({.logit_bias = {{7, 1.0f}, {3, 2.0f}, {7, -1.0f}}}, {"logit_bias", "7", "more than once"});
  EXPECT_NE(error_of([] { validate({}, 0); }).find("vocab_size"), std::string::npos);
}

TEST(SamplerValidation, LegalEdgeValuesAreAccepted) {
  for (const SamplingParams& p : {
           SamplingParams{},
           SamplingParams{.temperature = 1e-30f, .top_p = 1.0f, .top_k = -1, .min_p = 1.0f},
           SamplingParams{.temperature = 1000.0f, .top_p = 1e-6f, .top_k = 1000000, .min_p = 0.0f},
           SamplingParams{
               .seed = ~0ull, .repetition_penalty = 1e-3f, .presence_penalty = -2.0f, .frequency_penalty = 2.0f},
           SamplingParams{.repetition_penalty = 100.0f, .presence_penalty = 2.0f, .frequency_penalty = -2.0f},
           SamplingParams{.logit_bias = {{0, -100.0f}, {999, 100.0f}}, .logprobs = 20},
       }) {
    EXPECT_EQ(error_of([&] { validate(p, 1000); }), "");
  }
}

TEST(SamplerValidation, BadSampleInputsAreNamed) {
  Sampler s({.temperature = 1.0f, .repetition_penalty = 1.1f}, 4);
  const std::vector<float> ok = {0.0f, 1.0f, 2.0f, 3.0f};
  const std::vector<int32_t> none;
  EXPECT_NE(error_of([&] {
              s.sample(std::vector<float>{0.0f, 1.0f, 2.0f}, none, none);
            }).find("vocab_size 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              s.sample(std::vector<float>{0.0f, kNan, 2.0f, 3.0f}, none, none);
            }).find("logits[1]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              s.sample(std::vector<float>{0.0f, 1.0f, 2.0f, kInf}, none, none);
            }).find("logits[3]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { s.sample(std::vector<float>(4, -kInf), none, none); }).find("-inf"), std::string::npos);
  EXPECT_NE(error_of([&] { s.sample(ok, std::vector<int32_t>{0, 4}, none); }).find("prompt[1] = 4"), std::string::npos);
  EXPECT_NE(error_of([&] { s.sample(ok, none, std::vector<int32_t>{-1}); }).find("output[0] = -1"), std::string::npos);
  // A tiny repetition_penalty can push a huge positive logit to +inf: named, not sampled.
  Sampler tiny({.repetition_penalty = 1e-3f}, 4);
  const std::vector<int32_t> first = {0};
  EXPECT_NE(error_of([&] {
              tiny.sample(std::vector<float>{3e38f, 0.0f, 0.0f, 0.0f}, first, none);
            }).find("repetition_penalty"),
            std::string::npos);
  // Everything masked but one token: that token, whatever the draw.
  const std::vector<float> one_left = {-kInf, -kInf, 0.5f, -kInf};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(one_left, none, none).token, 2);
  // A logit_bias of -100 cannot mask a token entirely; only -inf logits do.
  Sampler greedy({.logit_bias = {{3, -100.0f}}}, 4);
  EXPECT_EQ(greedy.sample(std::vector<float>{-kInf, -kInf, -kInf, 0.0f}, none, none).token, 3);
}

// The real K3 vocabulary through each path: tokens are valid and obey the filters (checked
// by brute force), and the per-call times are printed for the record (not asserted).
TEST(SamplerSpeed, K3VocabularyRunsEveryPath) {
  const int32_t vocab = 163840;
  core::Rng rng(31);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& v : logits) v = static_cast<float>(rng.normal(0.0, 3.0));
  std::vector<float> flat(logits.size());
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = logits[i] * 0.01f;  // top-p must take most of it
  std::vector<int32_t> prompt(4096), output(512);
  for (int32_t& id : prompt) id = static_cast<int32_t>(rng.next_u64() % vocab);
  for (int32_t& id : output) id = static_cast<int32_t>(rng.next_u64() % vocab);
  std::vector<int32_t> by_logit(static_cast<size_t>(vocab));
  for (int32_t i = 0; i < vocab; ++i) by_logit[static_cast<size_t>(i)] = i;
  std::partial_sort(by_logit.begin(), by_logit.begin() + 50, by_logit.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });

  struct Case {
    const char* name;
    SamplingParams params;
    const std::vector<float>* x;
  };
  const std::vector<Case> cases = {
      {"greedy", {}, &logits},
      {"greedy+penalties+logprobs",
       {.repetition_penalty = 1.1f, .presence_penalty = 0.5f, .frequency_penalty = 0.2f, .logprobs = 20},
       &logits},
      {"T=1", {.temperature = 1.0f}, &logits},
      {"top_k=50", {.temperature = 0.7f, .top_k = 50}, &logits},
      {"top_p=0.9", {.temperature = 0.7f, .top_p = 0.9f}, &logits},
      {"min_p=0.05", {.temperature = 1.0f, .min_p = 0.05f}, &logits},
      {"top_p=0.95 flat", {.temperature = 1.0f, .top_p = 0.95f}, &flat},
      {"all",
       {.temperature = 0.8f,
        .top_p = 0.95f,
        .top_k = 40,
        .min_p = 0.01f,
        .repetition_penalty = 1.05f,
        .presence_penalty = 0.1f,
        .frequency_penalty = 0.1f,
        .logit_bias = {{17, 2.0f}},
        .logprobs = 5},
       &logits},
  };
  for (const Case& c : cases) {
    Sampler s(c.params, vocab);
    // Without processing steps the naive reference gives the exact support.
    const bool plain = c.params.temperature > 0.0f && c.params.logit_bias.empty() &&
                       c.params.repetition_penalty == 1.0f && c.params.presence_penalty == 0.0f &&
                       c.params.frequency_penalty == 0.0f;
    const std::vector<double> support = plain ? testing::reference_distribution(*c.x, c.params) : std::vector<double>{};
    const int calls = 8;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      const SampleResult r = s.sample(*c.x, prompt, output);
      ASSERT_GE(r.token, 0);
      ASSERT_LT(r.token, vocab);
      EXPECT_EQ(std::isfinite(r.logprob), c.params.logprob || c.params.logprobs > 0) << c.name;
      EXPECT_EQ(r.top_logprobs.size(), static_cast<size_t>(c.params.logprobs)) << c.name;
      if (c.params.top_k == 50) {
        EXPECT_NE(std::find(by_logit.begin(), by_logit.begin() + 50, r.token), by_logit.begin() + 50) << c.name;
      }
      if (c.params.temperature == 0.0f && c.params.repetition_penalty == 1.0f) {
        EXPECT_EQ(r.token, by_logit[0]) << c.name;
      }
      if (!support.empty()) {
        EXPECT_GT(support[static_cast<size_t>(r.token)], 0.0) << c.name << ": token outside the reference support";
      }
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ sampler  ] vocab %d, %-28s %.3f ms/call\n", vocab, c.name, ms / calls);
  }
}

}  // namespace
}  // namespace k3::runner
