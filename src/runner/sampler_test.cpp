// runner/sampler_test.cpp: greedy, seeded reproducibility, filters and parameter errors.
#include "runner/sampler.h"

#include <gtest/gtest.h>

#include <cmath>

#include <map>
#include <vector>

#include "core/error.h"

namespace k3::runner {
namespace {

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s({});
  std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.sample(logits), 1);
}

TEST(Sampler, SameSeedSameStreamDifferentSeedDiffers) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 7) * 0.3f;
  auto draw = [&](uint64_t seed) {
    Sampler s({.temperature = 1.0f, .seed = seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampler, TopKAndTopPRestrictTheSupport) {
  std::vector<float> logits = {3.0f, 2.9f, 0.0f, -1.0f, -2.0f};
  Sampler k2({.temperature = 5.0f, .top_k = 2, .seed = 1});
  Sampler p({.temperature = 1.0f, .top_p = 0.5f, .seed = 2});
  for (int i = 0; i < 500; ++i) {
    EXPECT_LT(k2.sample(logits), 2);
    EXPECT_EQ(p.sample(logits), 0);  // token 0 alone holds > 50% of the mass
  }
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  std::vector<float> logits = {0.0f, 0.0f, -10.0f};
  Sampler s({.temperature = 1.0f, .min_p = 0.01f, .seed = 3});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[s.sample(logits)];
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_GT(seen[0], 800);
  EXPECT_GT(seen[1], 800);
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  std::vector<float> logits = {std::log(0.7f), std::log(0.2f), std::log(0.1f)};
  Sampler s({.temperature = 1.0f, .seed = 11});
  std::vector<int> count(3);
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[static_cast<size_t>(s.sample(logits))];
  EXPECT_NEAR(count[0] / double(n), 0.7, 0.02);
  EXPECT_NEAR(count[1] / double(n), 0.2, 0.02);
  EXPECT_NEAR(count[2] / double(n), 0.1, 0.02);
}

TEST(Sampler, BadParametersNameThemselves) {
  auto msg = [](SamplingParams p) {
    try {
      validate(p);
    } catch (const core::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg({.temperature = -1.0f}).find("temperature"), std::string::npos);
  EXPECT_NE(msg({.top_p = 0.0f}).find("top_p"), std::string::npos);
  EXPECT_NE(msg({.top_k = -2}).find("top_k"), std::string::npos);
  EXPECT_NE(msg({.min_p = 1.5f}).find("min_p"), std::string::npos);
  Sampler s({});
  std::vector<float> nan = {0.0f, std::nanf("")};
  EXPECT_THROW(s.sample(nan), core::Error);
}

}  // namespace
}  // namespace k3::runner
