// Warming a grammar ahead of its requests (CompiledGrammar::warm, GrammarCache's background
// thread): the chains a request reaches are already computed, the masks are the same as without
// warming, and the cache warms new grammars on its own and stops when it goes away.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include "core/rng.h"
#include "structured/grammar_cache.h"
#include "structured/structured_test_util.h"

namespace k3::structured {
namespace {

using testing::allowed;
using testing::compile;
using testing::small_vocabulary;

// A tool call's arguments: keys, an enum, a bounded string, a nested array of numbers, K3's call
// markers around them.
const char* kArgs = R"(
root    ::= <|open|> "run" <|sep|> "{" ws "\"cmd\"" ws ":" ws str ws "," ws "\"mode\"" ws ":" ws mode ws
            ( "," ws "\"n\"" ws ":" ws "[" ws ( num ( ws "," ws num ){0,3} )? ws "]" ws )? "}" <|close|>
str     ::= "\"" [a-z /._-]{0,40} "\""
mode    ::= "\"fast\"" | "\"safe\"" | "\"dry run\""
num     ::= "-"? [0-9]{1,4}
ws      ::= [ \n]{0,2}
)";

// Random walks of `paths` generations through g, returning every mask they saw.
std::vector<std::vector<uint32_t>> walk(const std::shared_ptr<const CompiledGrammar>& g, int paths) {
  std::vector<std::vector<uint32_t>> masks;
  std::vector<uint32_t> mask(static_cast<size_t>(g->vocabulary().words()));
  for (int p = 0; p < paths; ++p) {
    Matcher m(g);
    core::Rng rng(40 + static_cast<uint64_t>(p));
    for (int step = 0; step < 80 && !m.terminated(); ++step) {
      m.fill_mask(mask);
      masks.push_back(mask);
      const std::vector<int32_t> ids = allowed(mask);
      if (ids.empty()) break;
      if (!m.accept(ids[rng.next_u64() % ids.size()])) break;
    }
  }
  return masks;
}

TEST(CompiledGrammarWarm, ComputesEveryChainTheRequestsReachAndChangesNoMask) {
  auto vocab = small_vocabulary();
  auto warmed = compile(kArgs, vocab), cold = compile(kArgs, vocab);
  const std::atomic<bool> stop{false};
  const size_t chains = warmed->warm(stop);
  EXPECT_GT(chains, 10u);
  EXPECT_EQ(warmed->cached_groups(), chains);
  const auto want = walk(cold, 12), got = walk(warmed, 12);
  EXPECT_EQ(got, want) << "warming changes no mask";
  EXPECT_EQ(warmed->cached_groups(), chains) << "a request reached a chain warming did not compute";
  EXPECT_LE(cold->cached_groups(), chains);
}

TEST(CompiledGrammarWarm, StopsWhenAskedAndAtTheChainBound) {
  auto vocab = small_vocabulary();
  auto g = compile(kArgs, vocab);
  const std::atomic<bool> stop{true};
  EXPECT_EQ(g->warm(stop), 0u);
  EXPECT_EQ(g->cached_groups(), 0u);
  const std::atomic<bool> go{false};
  EXPECT_EQ(g->warm(go, 3), 3u);
  EXPECT_EQ(g->cached_groups(), 3u);
  // The byte bound: it stops once the grammar holds that much mask (after the chain in hand).
  auto h = compile(kArgs, small_vocabulary());
  h->warm(go, CompiledGrammar::kWarmMaxChains, 1);
  EXPECT_EQ(h->cached_groups(), 1u);
  EXPECT_GT(h->cached_bytes(), 0);
}

TEST(GrammarCacheWarm, WarmsEachNewGrammarInTheBackground) {
  GrammarCache cache(small_vocabulary(), 4);
  auto g = cache.get(kArgs);
  ASSERT_TRUE(cache.wait_warm(60));
  const GrammarCache::Stats s = cache.stats();
  EXPECT_EQ(s.warmed_grammars, 1);
  EXPECT_GT(s.warmed_chains, 10);
  EXPECT_EQ(static_cast<int64_t>(g->cached_groups()), s.warmed_chains) << "made before any request asked";
  cache.get(kArgs);  // a hit warms nothing again
  ASSERT_TRUE(cache.wait_warm(60));
  EXPECT_EQ(cache.stats().warmed_grammars, 1);
}

TEST(GrammarCacheWarm, GoingAwayStopsTheWarming) {
  // A grammar with thousands of reachable chains (counted repetition unrolled): the cache's
  // destructor returns after at most the chain in hand, not after the whole warming.
  const auto t0 = std::chrono::steady_clock::now();
  {
    GrammarCache cache(small_vocabulary(), 4);
    cache.get(R"(root ::= "\"" [a-z]{0,3000} "\"" ( "," [0-9]{0,3000} )?)");
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}

}  // namespace
}  // namespace k3::structured
