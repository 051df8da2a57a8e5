// cache/prefix_index_test.cpp: the hash chain (xxHash64, deterministic, order-sensitive) and
// the index's refusal to trust a hash alone: a colliding hash, different tokens or a different
// parent entry is a miss; duplicates name the canonical block; erase returns the checkpoint.
#include "cache/prefix_index.h"

#include <gtest/gtest.h>

#include "cache/block_hash.h"
#include "core/error.h"

namespace k3::cache {
namespace {

TEST(BlockHash, ChainDependsOnEveryEarlierToken) {
  std::vector<int32_t> a(40), b(40);
  for (int i = 0; i < 40; ++i) a[static_cast<size_t>(i)] = b[static_cast<size_t>(i)] = i * 7;
  b[3] = 999;  // differs in block 0 only
  std::vector<uint64_t> ha, hb;
  extend_block_hashes(ha, a, 16);
  extend_block_hashes(hb, b, 16);
  ASSERT_EQ(ha.size(), 2u);  // 40 tokens = 2 full blocks
  EXPECT_NE(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);  // block 1 has equal tokens but a different parent
  EXPECT_EQ(ha[0], hash_block(kRootBlockHash, std::span(a).first(16)));
  // Growing the token list only appends.
  a.resize(48, 5);
  std::vector<uint64_t> ha2 = ha;
  extend_block_hashes(ha2, a, 16);
  ASSERT_EQ(ha2.size(), 3u);
  EXPECT_EQ(ha2[1], ha[1]);
  EXPECT_THROW(extend_block_hashes(ha2, std::span(a).first(16), 16), core::Error);
}

TEST(PrefixIndex, InsertFindDuplicateCollision) {
  PrefixIndex idx(8, 4);
  const std::vector<int32_t> t0{1, 2, 3, 4}, t1{5, 6, 7, 8}, other{9, 9, 9, 9};
  int32_t canon;
  ASSERT_EQ(idx.insert(3, 100, 0, t0, &canon), PrefixIndex::Insert::inserted);
  EXPECT_EQ(canon, 3);
  const uint64_t u0 = idx.uid(3);
  EXPECT_NE(u0, 0u);
  ASSERT_EQ(idx.insert(5, 200, u0, t1, &canon), PrefixIndex::Insert::inserted);
  EXPECT_EQ(idx.find(100, 0, t0), 3);
  EXPECT_EQ(idx.find(200, u0, t1), 5);
  EXPECT_EQ(idx.find(200, u0 + 77, t1), -1);  // right hash and tokens, wrong parent
  EXPECT_EQ(idx.find(100, 0, other), -1);     // right hash, wrong tokens (a collision)
  EXPECT_EQ(idx.find(300, 0, t0), -1);
  // Same prefix in another block: duplicate, canonical is the first.
  EXPECT_EQ(idx.insert(6, 100, 0, t0, &canon), PrefixIndex::Insert::duplicate);
  EXPECT_EQ(canon, 3);
  EXPECT_FALSE(idx.is_registered(6));
  // Different prefix with the same hash: refused.
  EXPECT_EQ(idx.insert(6, 100, 0, other, &canon), PrefixIndex::Insert::collision);
  EXPECT_FALSE(idx.is_registered(6));
  EXPECT_THROW(idx.insert(3, 400, 0, t1, &canon), core::Error);  // block already registered
  EXPECT_EQ(idx.check(), "");
}

TEST(PrefixIndex, EraseReturnsCheckpointAndNewUidAfterReinsert) {
  PrefixIndex idx(4, 2);
  const std::vector<int32_t> t{1, 2};
  int32_t canon;
  idx.insert(0, 11, 0, t, &canon);
  const uint64_t first_uid = idx.uid(0);
  idx.set_checkpoint(0, 7);
  EXPECT_EQ(idx.erase(0), 7);
  EXPECT_FALSE(idx.is_registered(0));
  EXPECT_EQ(idx.find(11, 0, t), -1);
  EXPECT_THROW(idx.erase(0), core::Error);
  EXPECT_THROW(idx.set_checkpoint(0, 1), core::Error);
  idx.insert(0, 11, 0, t, &canon);
  EXPECT_NE(idx.uid(0), first_uid);  // a child of the old entry can never match the new one
  EXPECT_EQ(idx.checkpoint(0), -1);
  EXPECT_EQ(idx.num_entries(), 1);
  EXPECT_EQ(idx.check(), "");
}

}  // namespace
}  // namespace k3::cache
