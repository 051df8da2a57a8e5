// runner/sampler_test.cpp: greedy, the exact supports of top-k / top-p / min-p and their
// order, drawn frequencies against a naive reference, and seeded reproducibility.
#include "runner/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "runner/sampler_test_util.h"

namespace k3::runner {
namespace {

using testing::expect_chi_square_fits;
using testing::histogram;
using testing::reference_distribution;
using testing::support;

constexpr int kDraws = 20000;

// Logits whose softmax is exactly proportional to probs.
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> x;
  for (double p : probs) x.push_back(static_cast<float>(std::log(p)));
  return x;
}

std::vector<float> random_logits(size_t vocab, uint64_t seed, double scale) {
  core::Rng rng(seed);
  std::vector<float> x(vocab);
  for (float& v : x) v = static_cast<float>(rng.normal(0.0, scale));
  return x;
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s({}, 4);
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.sample(logits, {}, {}).token, 1);
  // Filters are legal under greedy and never change the argmax.
  Sampler filtered({.top_p = 0.1f, .top_k = 1, .min_p = 1.0f}, 4);
  EXPECT_EQ(filtered.sample(logits, {}, {}).token, 1);
  const std::vector<float> one = {-3.0f};
  EXPECT_EQ(Sampler({}, 1).sample(one, {}, {}).token, 0);
}

// Greedy over a vocabulary that is not a multiple of the scan's 8 lanes: the maximum in every lane
// and in the tail, ties across lanes to the lowest id, every value -inf but one, and the errors
// naming the first NaN or +inf input, or the id a bias overflowed.
TEST(Sampler, GreedyScanFindsTheFirstMaximumAnywhere) {
  const size_t V = 8 * 37 + 5;
  for (size_t at = 0; at < V; at += 7) {
    std::vector<float> x = random_logits(V, at, 1.0);
    x[at] = 50.0f;
    EXPECT_EQ(Sampler({}, static_cast<int32_t>(V)).sample(x, {}, {}).token, static_cast<int32_t>(at)) << at;
    if (at + 13 < V) x[at + 13] = 50.0f;  // a tie in another lane: the lower id still wins
    EXPECT_EQ(Sampler({}, static_cast<int32_t>(V)).sample(x, {}, {}).token, static_cast<int32_t>(at)) << at;
  }
  std::vector<float> masked(V, -std::numeric_limits<float>::infinity());
  masked[V - 1] = -1e30f;  // in the tail
  EXPECT_EQ(Sampler({}, static_cast<int32_t>(V)).sample(masked, {}, {}).token, static_cast<int32_t>(V - 1));
  auto error = [&](std::vector<float> x, const SamplingParams& p = {}, std::vector<int32_t> prompt = {}) {
    try {
      Sampler(p, static_cast<int32_t>(V)).sample(x, prompt, {});
    } catch (const core::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::vector<float> bad = random_logits(V, 1, 1.0);
  bad[100] = std::numeric_limits<float>::quiet_NaN();
  bad[200] = std::numeric_limits<float>::infinity();
  EXPECT_NE(error(bad).find("logits[100] is nan"), std::string::npos) << error(bad);
  bad[100] = 0;
  EXPECT_NE(error(bad).find("logits[200] is inf"), std::string::npos) << error(bad);
  std::vector<float> huge = random_logits(V, 2, 1.0);
  huge[250] = std::numeric_limits<float>::max();
  SamplingParams penalised;
  penalised.repetition_penalty = 0.5f;  // a positive logit is divided by it: FLT_MAX / 0.5 = +inf
  const std::string overflow = error(huge, penalised, {250});
  EXPECT_NE(overflow.find("logit 250 overflowed to +inf"), std::string::npos) << overflow;
}

// The grammar mask is step 0: refused ids are -inf before everything, logprobs see it, a draw never
// picks a refused id, and a mask of the wrong width or refusing every finite logit is an error.
TEST(Sampler, AllowedMaskRefusesTokensBeforeEverything) {
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f, -1.0f, 5.0f, 0.5f, 0.25f, 0.1f, 0.0f, 0.0f, 0.0f,
                                     0.0f, 0.0f, 0.0f, 0.0f, 0.0f,  0.0f, 0.0f, 0.0f,  0.0f, 0.0f, 0.0f, 0.0f,
                                     0.0f, 0.0f, 0.0f, 0.0f, 0.0f,  0.0f, 0.0f, 0.0f,  9.0f, 1.0f};  // 34 ids: 2 words
  const std::vector<uint32_t> allowed = {(1u << 1) | (1u << 2) | (1u << 4), 1u << 1};                // ids 1, 2, 4, 33
  Sampler greedy({.logprobs = 2}, 34);
  const SampleResult r = greedy.sample(logits, {}, {}, allowed);
  EXPECT_EQ(r.token, 1);  // 5 (id 5) and 9 (id 32) are refused
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0].first, 1);
  EXPECT_EQ(r.top_logprobs[1].first, 2);
  const double z = std::log(std::exp(2.0) + std::exp(1.0) + std::exp(-1.0) + std::exp(1.0));
  EXPECT_NEAR(r.logprob, 2.0 - z, 1e-5);
  Sampler sampled({.temperature = 1.0f, .seed = 3}, 34);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = sampled.sample(logits, {}, {}, allowed).token;
    EXPECT_TRUE(t == 1 || t == 2 || t == 4 || t == 33) << t;
  }
  EXPECT_THROW(greedy.sample(logits, {}, {}, std::vector<uint32_t>{1u}), core::Error);
  EXPECT_THROW(greedy.sample(logits, {}, {}, std::vector<uint32_t>{0u, 0u}), core::Error);
}

TEST(Sampler, GreedyAppliesLogitBiasAndPenalties) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.9f};
  const std::vector<int32_t> none, out1 = {1};
  EXPECT_EQ(Sampler({}, 3).sample(logits, none, none).token, 1);
  EXPECT_EQ(Sampler({.logit_bias = {{2, 0.2f}}}, 3).sample(logits, none, none).token, 2);
  EXPECT_EQ(Sampler({.logit_bias = {{0, 100.0f}}}, 3).sample(logits, none, none).token, 0);
  EXPECT_EQ(Sampler({.repetition_penalty = 1.5f}, 3).sample(logits, out1, none).token, 2);  // via prompt
  EXPECT_EQ(Sampler({.repetition_penalty = 1.5f}, 3).sample(logits, none, out1).token, 2);  // via output
  EXPECT_EQ(Sampler({.presence_penalty = 0.5f}, 3).sample(logits, none, out1).token, 2);
  EXPECT_EQ(Sampler({.presence_penalty = 0.5f}, 3).sample(logits, out1, none).token, 1);  // prompt-only: no effect
  EXPECT_EQ(Sampler({.frequency_penalty = 0.2f}, 3).sample(logits, none, out1).token, 2);
}

TEST(Sampler, TopKKeepsExactlyKTiesToLowerIds) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, 0.0f, 2.5f, -1.0f};
  Sampler s({.temperature = 1.0f, .top_k = 3, .seed = 1}, 7);
  const auto count = histogram(s, logits, kDraws);
  EXPECT_EQ(support(count), (std::vector<int32_t>{1, 3, 5}));
  expect_chi_square_fits(count, reference_distribution(logits, s.params()), "top_k=3");

  // Four tokens tie at the top: k = 2 keeps the two lowest ids.
  const std::vector<float> ties = {2.0f, 1.0f, 2.0f, 2.0f, 0.0f, 2.0f};
  Sampler t({.temperature = 1.0f, .top_k = 2, .seed = 2}, 6);
  EXPECT_EQ(support(histogram(t, ties, 2000)), (std::vector<int32_t>{0, 2}));
  // k >= vocab and k = -1 keep everything.
  Sampler all({.temperature = 1.0f, .top_k = 100, .seed = 3}, 6), off({.temperature = 1.0f, .top_k = -1, .seed = 3}, 6);
  EXPECT_EQ(support(histogram(all, ties, 4000)).size(), 6u);
  EXPECT_EQ(support(histogram(off, ties, 4000)).size(), 6u);
}

TEST(Sampler, TopPKeepsTheShortestPrefixReachingP) {
  // Most likely first: 1 (0.4), 3 (0.3), 4 (0.15), 0 (0.1), 2 (0.05).
  const auto logits = logits_of({0.1, 0.4, 0.05, 0.3, 0.15});
  auto support_for = [&](float top_p) {
    Sampler s({.temperature = 1.0f, .top_p = top_p, .seed = 4}, 5);
    const auto count = histogram(s, logits, kDraws);
    expect_chi_square_fits(count, reference_distribution(logits, s.params()), "top_p");
    return support(count);
  };
  EXPECT_EQ(support_for(0.3f), (std::vector<int32_t>{1}));
  EXPECT_EQ(support_for(0.65f), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(support_for(0.75f), (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(support_for(0.9f), (std::vector<int32_t>{0, 1, 3, 4}));
  EXPECT_EQ(support_for(1.0f), (std::vector<int32_t>{0, 1, 2, 3, 4}));
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheMax) {
  const auto logits = logits_of({0.1, 0.4, 0.05, 0.3, 0.15});
  auto support_for = [&](float min_p, float temperature) {
    Sampler s({.temperature = temperature, .min_p = min_p, .seed = 5}, 5);
    const auto count = histogram(s, logits, kDraws);
    expect_chi_square_fits(count, reference_distribution(logits, s.params()), "min_p");
    return support(count);
  };
  EXPECT_EQ(support_for(0.5f, 1.0f), (std::vector<int32_t>{1, 3}));     // threshold 0.2
  EXPECT_EQ(support_for(0.3f, 1.0f), (std::vector<int32_t>{1, 3, 4}));  // threshold 0.12
  EXPECT_EQ(support_for(1.0f, 1.0f), (std::vector<int32_t>{1}));
  // Relative to the tempered distribution: at T = 2 the ratios to the max are sqrt(p / 0.4):
  // 0.5, 1, 0.354, 0.866, 0.612.
  EXPECT_EQ(support_for(0.55f, 2.0f), (std::vector<int32_t>{1, 3, 4}));
}

TEST(Sampler, FiltersApplyTopKThenTopPThenMinP) {
  const auto logits = logits_of({0.3, 0.25, 0.2, 0.15, 0.1});
  auto support_for = [&](SamplingParams p) {
    p.temperature = 1.0f;
    p.seed = 6;
    Sampler s(p, 5);
    const auto count = histogram(s, logits, kDraws);
    expect_chi_square_fits(count, reference_distribution(logits, p), "combined");
    return support(count);
  };
  // top_p alone over the full mass: 0.3, 0.55, 0.75 >= 0.6.
  EXPECT_EQ(support_for({.top_p = 0.6f}), (std::vector<int32_t>{0, 1, 2}));
  // After top_k = 3 the mass is 0.75 and the target 0.45: 0.3, 0.55 >= 0.45.
  EXPECT_EQ(support_for({.top_p = 0.6f, .top_k = 3}), (std::vector<int32_t>{0, 1}));
  // Then min_p = 0.9 keeps p >= 0.27 only.
  EXPECT_EQ(support_for({.top_p = 0.6f, .top_k = 3, .min_p = 0.9f}), (std::vector<int32_t>{0}));
  EXPECT_EQ(support_for({.top_k = 4, .min_p = 0.6f}), (std::vector<int32_t>{0, 1, 2}));
}

TEST(Sampler, TemperatureReshapesTheDistribution) {
  const std::vector<double> probs = {0.5, 0.3, 0.2};
  const auto logits = logits_of(probs);
  for (float temperature : {0.5f, 1.0f, 2.0f, 7.0f}) {
    Sampler s({.temperature = temperature, .seed = 7}, 3);
    std::vector<double> expected(3);
    double total = 0;
    for (size_t i = 0; i < 3; ++i) total += expected[i] = std::pow(probs[i], 1.0 / temperature);  // p^(1/T)
    for (double& e : expected) e /= total;
    expect_chi_square_fits(histogram(s, logits, kDraws), expected, "T=" + std::to_string(temperature));
  }
  // A tiny temperature behaves like greedy and does not overflow.
  Sampler cold({.temperature = 1e-30f, .seed = 8}, 3);
  EXPECT_EQ(support(histogram(cold, logits, 200)), (std::vector<int32_t>{0}));
}

TEST(Sampler, FrequenciesMatchTheReferenceOnRandomVocabularies) {
  // Odd vocabularies; the filters leave a handful of likely tokens, each checked within 5 sigma.
  const std::vector<SamplingParams> cases = {
      {.temperature = 1.0f, .top_k = 5},
      {.temperature = 0.8f, .top_p = 0.7f},
      {.temperature = 1.3f, .top_p = 0.9f, .top_k = 12, .min_p = 0.1f},
      {.temperature = 0.6f, .min_p = 0.2f},
  };
  for (size_t vocab : {17u, 54u, 97u}) {
    for (size_t c = 0; c < cases.size(); ++c) {
      SamplingParams p = cases[c];
      p.seed = 100 + vocab + c;
      const auto logits = random_logits(vocab, p.seed, 2.0);
      Sampler s(p, static_cast<int32_t>(vocab));
      const auto count = histogram(s, logits, kDraws);
      const auto expected = reference_distribution(logits, p);
      for (size_t i = 0; i < vocab; ++i) {
        const double sigma = std::sqrt(expected[i] * (1 - expected[i]) / kDraws);
        EXPECT_NEAR(count[i] / double(kDraws), expected[i], 5 * sigma + 1e-12)
            << "vocab " << vocab << " case " << c << " id " << i;
      }
    }
  }
}

// Every draw lies in the reference support, and almost all of a large support is drawn
// (about 10 draws per kept token).
void expect_support_within_reference(std::span<const float> logits, const SamplingParams& p, size_t min_kept) {
  const auto expected = reference_distribution(logits, p);
  size_t kept = 0;
  for (double e : expected) kept += e > 0;
  ASSERT_GE(kept, min_kept);
  Sampler s(p, static_cast<int32_t>(logits.size()));
  const auto count = histogram(s, logits, static_cast<int>(10 * kept));
  size_t seen = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (count[i] > 0) ++seen;
    if (expected[i] == 0) {
      EXPECT_EQ(count[i], 0) << "id " << i << " is outside the support";
    }
  }
  EXPECT_GT(seen, kept * 95 / 100);
}

TEST(Sampler, TopPCutsDeepIntoAFlatVocabulary) {
  // Near-flat logits: top_p = 0.5 keeps about half of 600 tokens, so the weighted selection
  // halves several times before it sorts the last block.
  expect_support_within_reference(random_logits(600, 9, 0.05), {.temperature = 1.0f, .top_p = 0.5f, .seed = 10}, 250);
  // 5 heads and a tail of 595 tied tokens holding 2/3 of the mass: the cut falls inside the
  // ties (after ~250 of them; ~195 under top_k = 400), which keep their lowest ids.
  std::vector<float> heads_and_tail(600, -4.0f);
  for (size_t i : {7u, 300u, 434u, 500u, 599u}) heads_and_tail[i] = 0.0f;
  expect_support_within_reference(heads_and_tail, {.temperature = 1.0f, .top_p = 0.6f, .seed = 11}, 200);
  expect_support_within_reference(heads_and_tail, {.temperature = 1.0f, .top_p = 0.7f, .top_k = 400, .seed = 12}, 150);
}

TEST(Sampler, SameSeedSameTokensWhateverOtherRequestsDo) {
  const auto logits = random_logits(97, 11, 1.0);
  const SamplingParams p{.temperature = 0.9f, .top_p = 0.95f, .seed = 7};
  auto alone = [&](const SamplingParams& params) {
    Sampler s(params, 97);
    std::vector<int32_t> out;
    for (int i = 0; i < 300; ++i) out.push_back(s.sample(logits, {}, out).token);
    return out;
  };
  const std::vector<int32_t> reference = alone(p);
  EXPECT_EQ(alone(p), reference);
  EXPECT_NE(alone({.temperature = 0.9f, .top_p = 0.95f, .seed = 8}), reference);

  // Interleaved with other requests (same seed, other seeds, greedy, other logits): unchanged.
  Sampler mine(p, 97), twin(p, 97), other({.temperature = 1.5f, .top_k = 3, .seed = 8}, 97), greedy({}, 97);
  const auto other_logits = random_logits(97, 12, 3.0);
  std::vector<int32_t> out;
  for (int i = 0; i < 300; ++i) {
    for (int j = 0; j < i % 3; ++j) other.sample(other_logits, {}, {});
    if (i % 2) twin.sample(other_logits, {}, {});
    greedy.sample(logits, {}, {});
    out.push_back(mine.sample(logits, {}, out).token);
  }
  EXPECT_EQ(out, reference);
}

}  // namespace
}  // namespace k3::runner
