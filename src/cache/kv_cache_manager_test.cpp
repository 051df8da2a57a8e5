// cache/kv_cache_manager_test.cpp: prefix hits through KvCacheManager (clamped to the deepest
// checkpoint, never the last token), sharing by ref count, eviction dropping index entries
// and their checkpoints, duplicates, check() catching leaks, and sizing from a byte budget.
#include "cache/kv_cache_manager.h"

#include <gtest/gtest.h>

#include "cache/block_hash.h"
#include "core/error.h"
#include "core/rng.h"

namespace k3::cache {
namespace {

CacheConfig small_config() {
  CacheConfig c;
  c.block_size = 4;
  c.num_blocks = 16;
  c.num_slots = 3;
  c.num_checkpoints = 4;
  c.checkpoint_interval_blocks = 2;  // boundaries at 8, 16, 24 ... tokens
  return c;
}

std::vector<int32_t> tokens_from(uint64_t seed, int n) {
  core::Rng r(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(r.next_u64() % 1000);
  return t;
}

// Runs `tokens` through the manager the way the scheduler does: chunks that end on each
// checkpoint boundary, a checkpoint taken for each. Leaves the sequence open.
SequenceCache run_sequence(KvCacheManager& m, const std::vector<int32_t>& tokens, int64_t* hit_tokens = nullptr) {
  std::vector<uint64_t> hashes;
  extend_block_hashes(hashes, tokens, m.config().block_size);
  const PrefixHit hit = m.find_prefix(tokens, hashes);
  if (hit_tokens) *hit_tokens = hit.num_tokens;
  auto seq = m.open(hit);
  EXPECT_TRUE(seq.has_value());
  const int64_t step = m.config().checkpoint_interval_tokens();
  for (int64_t done = hit.num_tokens; done < static_cast<int64_t>(tokens.size());) {
    const int64_t end = std::min<int64_t>((done / step + 1) * step, static_cast<int64_t>(tokens.size()));
    EXPECT_TRUE(m.reserve(*seq, end));
    if (end % step == 0 && m.config().enable_prefix_cache) {
      EXPECT_TRUE(m.take_checkpoint(*seq));
    }
    m.commit(*seq, tokens, hashes, end);
    done = end;
  }
  return std::move(*seq);
}

TEST(KvCacheManager, HitIsClampedToDeepestCheckpointAndLeavesOneToken) {
  KvCacheManager m(small_config());
  const auto a = tokens_from(1, 19);  // blocks 0..3 full; checkpoints after 8 and 16 tokens
  SequenceCache sa = run_sequence(m, a);
  EXPECT_EQ(m.usage().index_entries, 4);
  EXPECT_EQ(m.usage().checkpoints_attached, 2);

  std::vector<uint64_t> h;
  // Same 19 tokens: 4 blocks match, the deepest checkpoint is at 16 tokens.
  extend_block_hashes(h, a, 4);
  PrefixHit hit = m.find_prefix(a, h);
  EXPECT_EQ(hit.mla_tokens, 16);
  EXPECT_EQ(hit.num_tokens, 16);
  EXPECT_EQ(hit.blocks, std::vector<int32_t>(sa.blocks.begin(), sa.blocks.begin() + 4));
  // Exactly 16 tokens: the last token must be computed, so only 12 may match -> clamp to 8.
  std::vector<int32_t> a16(a.begin(), a.begin() + 16);
  h.clear();
  extend_block_hashes(h, a16, 4);
  hit = m.find_prefix(a16, h);
  EXPECT_EQ(hit.mla_tokens, 12);
  EXPECT_EQ(hit.num_tokens, 8);
  // Diverging inside block 2: blocks 0, 1 match, checkpoint at 8.
  std::vector<int32_t> b = a;
  b[9] += 1;
  h.clear();
  extend_block_hashes(h, b, 4);
  hit = m.find_prefix(b, h);
  EXPECT_EQ(hit.num_tokens, 8);
  EXPECT_EQ(hit.mla_tokens, 8);
  // Diverging in block 0: nothing.
  b[0] += 1;
  h.clear();
  extend_block_hashes(h, b, 4);
  EXPECT_EQ(m.find_prefix(b, h).num_tokens, 0);
  const SequenceCache* live[] = {&sa};
  EXPECT_EQ(m.check(live), "");
  m.close(sa);
  EXPECT_EQ(m.check({}), "");
}

TEST(KvCacheManager, SharedBlocksAreRefCountedAndSurviveTheOwner) {
  KvCacheManager m(small_config());
  const auto a = tokens_from(2, 21);
  SequenceCache sa = run_sequence(m, a);
  m.close(sa);  // everything cached, evictable
  EXPECT_EQ(m.usage().blocks_in_use, 0);
  EXPECT_EQ(m.usage().blocks_evictable, 5);

  std::vector<int32_t> b(a.begin(), a.begin() + 17);
  b.push_back(5);
  int64_t hit = 0;
  SequenceCache sb = run_sequence(m, b, &hit);
  EXPECT_EQ(hit, 16);
  auto c = tokens_from(2, 21);  // == a
  int64_t hit_c = 0;
  SequenceCache sc = run_sequence(m, c, &hit_c);
  EXPECT_EQ(hit_c, 16);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(sb.blocks[static_cast<size_t>(i)], sc.blocks[static_cast<size_t>(i)]);
  const SequenceCache* live[] = {&sb, &sc};
  EXPECT_EQ(m.check(live), "");
  m.close(sb);
  m.close(sc);
  EXPECT_EQ(m.check({}), "");
  EXPECT_EQ(m.usage().slots_in_use, 0);
}

TEST(KvCacheManager, EvictionForgetsEntriesAndReleasesTheirCheckpoints) {
  KvCacheManager m(small_config());                        // 16 blocks of 4
  SequenceCache s1 = run_sequence(m, tokens_from(3, 32));  // 8 blocks, 4 checkpoints
  m.close(s1);
  EXPECT_EQ(m.usage().checkpoints_attached, 4);
  // 48 fresh tokens need 12 blocks: 8 free + 4 evicted (s1's last blocks first).
  SequenceCache s2 = run_sequence(m, tokens_from(4, 48));
  const SequenceCache* live[] = {&s2};
  EXPECT_EQ(m.check(live), "");
  EXPECT_EQ(m.usage().blocks_free + m.usage().blocks_evictable, 4);
  // s1's blocks were released last-first, so its last 4 pages went to s2 and its first 4
  // survive; but s2's 6 boundary saves took the 4-checkpoint pool, LRU-evicting all of s1's.
  // Pages without a KDA checkpoint are no hit.
  std::vector<uint64_t> h;
  const auto t1 = tokens_from(3, 32);
  extend_block_hashes(h, t1, 4);
  const PrefixHit hit = m.find_prefix(t1, h);
  EXPECT_EQ(hit.mla_tokens, 16);
  EXPECT_EQ(hit.num_tokens, 0);
  EXPECT_TRUE(hit.blocks.empty());
  EXPECT_FALSE(m.reserve(s2, 48 + 4 * 5));  // 5 more blocks: only 4 available, nothing taken
  EXPECT_EQ(s2.blocks.size(), 12u);
  EXPECT_EQ(m.check(live), "");
  m.close(s2);
  EXPECT_EQ(m.check({}), "");
}

TEST(KvCacheManager, DuplicatePrefixKeepsOnePageAndChainsThroughIt) {
  KvCacheManager m(small_config());
  const auto t = tokens_from(5, 17);
  // Two sequences compute the same tokens concurrently (neither can hit the other).
  std::vector<uint64_t> h;
  extend_block_hashes(h, t, 4);
  auto s1 = m.open(m.find_prefix(t, h));
  auto s2 = m.open(m.find_prefix(t, h));
  ASSERT_TRUE(s1 && s2);
  ASSERT_TRUE(m.reserve(*s1, 8) && m.reserve(*s2, 8));
  ASSERT_TRUE(m.take_checkpoint(*s1) && m.take_checkpoint(*s2));
  m.commit(*s1, t, h, 8);
  m.commit(*s2, t, h, 8);  // duplicate: its pages stay private, its checkpoint is released
  EXPECT_EQ(m.usage().index_entries, 2);
  EXPECT_EQ(m.usage().checkpoints_attached, 1);
  EXPECT_EQ(s2->chain_block, s1->blocks[1]);
  ASSERT_TRUE(m.reserve(*s2, 17) && m.take_checkpoint(*s2));
  m.commit(*s2, t, h, 16);  // s2 registers blocks 2, 3 under s1's entries
  EXPECT_EQ(m.usage().index_entries, 4);
  EXPECT_EQ(m.usage().checkpoints_attached, 2);
  const SequenceCache* live[] = {&*s1, &*s2};
  EXPECT_EQ(m.check(live), "");
  const PrefixHit hit = m.find_prefix(t, h);
  EXPECT_EQ(hit.num_tokens, 16);
  EXPECT_EQ(hit.blocks[1], s1->blocks[1]);
  EXPECT_EQ(hit.blocks[2], s2->blocks[2]);
  // A checkpoint taken off a boundary is a scheduler bug and is reported.
  ASSERT_TRUE(m.take_checkpoint(*s1));
  EXPECT_THROW(m.commit(*s1, t, h, 9), core::Error);
  m.close(*s1);
  m.close(*s2);
  EXPECT_EQ(m.check({}), "");
}

TEST(KvCacheManager, CheckFindsLeaksAndSlotsRunOut) {
  KvCacheManager m(small_config());
  auto t = tokens_from(6, 10);
  SequenceCache a = run_sequence(m, t), b = run_sequence(m, t), c = run_sequence(m, t);
  EXPECT_FALSE(m.open(PrefixHit{}).has_value());  // 3 slots
  const SequenceCache* two[] = {&a, &b};
  EXPECT_NE(m.check(two), "");  // c's slot and pages are not accounted for
  const SequenceCache* three[] = {&a, &b, &c};
  EXPECT_EQ(m.check(three), "");
  m.close(a);
  m.close(b);
  m.close(c);
  EXPECT_EQ(m.check({}), "");
}

TEST(KvCacheManager, PrefixCacheOffNeverHitsOrCheckpoints) {
  CacheConfig c = small_config();
  c.enable_prefix_cache = false;
  KvCacheManager m(c);
  const auto t = tokens_from(7, 30);
  SequenceCache s = run_sequence(m, t);
  m.close(s);
  int64_t hit = -1;
  SequenceCache s2 = run_sequence(m, t, &hit);
  EXPECT_EQ(hit, 0);
  EXPECT_EQ(m.usage().index_entries, 0);
  m.close(s2);
}

TEST(CacheConfig, SizeFromBudget) {
  CacheConfig base;
  base.block_size = 16;
  base.num_slots = 4;
  CacheBudget b{.bytes = 1'000'000, .bytes_per_block = 1000, .bytes_per_kda_state = 10'000, .checkpoint_fraction = 0.5};
  const CacheConfig c = size_cache(b, base, 10);
  // 40'000 for slots, 960'000 left: half (480'000) -> 48 checkpoints, the rest -> 480 pages.
  EXPECT_EQ(c.num_checkpoints, 48);
  EXPECT_EQ(c.num_blocks, 480);
  EXPECT_LE(cache_bytes(c, 1000, 10'000), b.bytes);
  base.enable_prefix_cache = false;
  const CacheConfig off = size_cache(b, base, 10);
  EXPECT_EQ(off.num_checkpoints, 0);
  EXPECT_EQ(off.num_blocks, 960);
  b.bytes = 40'000 + 9'999;  // slots + 9 pages: not the 10 asked for
  EXPECT_THROW(size_cache(b, base, 10), core::Error);
  b.bytes = 1'000'000;
  b.checkpoint_fraction = 1.0;
  EXPECT_THROW(size_cache(b, base, 10), core::Error);
  CacheConfig bad = small_config();
  bad.checkpoint_interval_blocks = 0;
  EXPECT_THROW(KvCacheManager{bad}, core::Error);
}

}  // namespace
}  // namespace k3::cache
