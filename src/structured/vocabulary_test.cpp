// The vocabulary's sorted order and its skip over a shared prefix, against brute force.
#include <gtest/gtest.h>

#include "structured/structured_test_util.h"

namespace k3::structured {
namespace {

TEST(Vocabulary, NextSharingLessIsTheFirstLaterTokenWithAShorterCommonPrefix) {
  for (uint64_t seed : {1, 2, 3}) {
    auto vocab = testing::small_vocabulary(seed, 300 + static_cast<int>(seed) * 97);
    const auto& order = vocab->order();
    const auto common = [&](size_t a, size_t b) {
      const auto x = vocab->symbols(order[a]), y = vocab->symbols(order[b]);
      size_t k = 0;
      while (k < x.size() && k < y.size() && x[k] == y[k]) ++k;
      return k;
    };
    for (size_t i = 0; i < order.size(); ++i)
      for (size_t depth = 0; depth <= vocab->symbols(order[i]).size() + 1; ++depth) {
        size_t want = i + 1;
        while (want < order.size() && common(i, want) >= depth) ++want;
        ASSERT_EQ(vocab->next_sharing_less(i, depth), want) << "seed " << seed << " at " << i << " depth " << depth;
      }
  }
}

}  // namespace
}  // namespace k3::structured
