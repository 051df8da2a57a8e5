// cache/block_pool_test.cpp: BlockPool ref counts, free vs evictable lists, LRU eviction
// order, and check() catching inconsistencies; LruList and IdPool basics.
#include "cache/block_pool.h"

#include <gtest/gtest.h>

#include "cache/checkpoint_pool.h"
#include "cache/id_pool.h"
#include "core/error.h"

namespace k3::cache {
namespace {

TEST(LruList, OrderTouchRemove) {
  LruList l(5);
  for (int i : {3, 1, 4}) l.push_back(i);
  EXPECT_EQ(l.in_order(), (std::vector<int32_t>{3, 1, 4}));
  l.touch(3);
  EXPECT_EQ(l.in_order(), (std::vector<int32_t>{1, 4, 3}));
  l.remove(4);
  EXPECT_EQ(l.pop_front(), 1);
  EXPECT_EQ(l.pop_front(), 3);
  EXPECT_TRUE(l.empty());
  EXPECT_THROW(l.remove(0), core::Error);
  EXPECT_THROW(l.push_back(5), core::Error);
}

TEST(BlockPool, AllocatesFreeBlocksFirstThenEvictsLeastRecentlyReleased) {
  BlockPool pool(4);
  int32_t ev = 0;
  std::vector<int32_t> got;
  for (int i = 0; i < 4; ++i) {
    got.push_back(pool.allocate(&ev));
    EXPECT_EQ(ev, -1);
  }
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(pool.num_available(), 0);
  EXPECT_THROW(pool.allocate(&ev), core::Error);
  pool.set_cached(1, true);
  pool.set_cached(2, true);
  pool.release(2);  // evictable first (least recent)
  pool.release(1);
  pool.release(0);  // not cached -> free
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.num_evictable(), 2);
  EXPECT_EQ(pool.evictable_in_order(), (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(pool.allocate(&ev), 0);  // the free one before any eviction
  EXPECT_EQ(ev, -1);
  EXPECT_EQ(pool.allocate(&ev), 2);
  EXPECT_EQ(ev, 2);
  EXPECT_FALSE(pool.is_cached(2));
  EXPECT_EQ(pool.check(), "");
}

TEST(BlockPool, AcquireSharesAndRevivesEvictable) {
  BlockPool pool(3);
  int32_t ev;
  const int32_t b = pool.allocate(&ev);
  pool.set_cached(b, true);
  pool.acquire(b);
  EXPECT_EQ(pool.ref_count(b), 2);
  pool.release(b);
  pool.release(b);
  EXPECT_EQ(pool.num_evictable(), 1);
  pool.acquire(b);  // a prefix hit on a cached block
  EXPECT_EQ(pool.num_evictable(), 0);
  EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_EQ(pool.check(), "");
  pool.release(b);
  EXPECT_THROW(pool.release(b), core::Error);
  EXPECT_THROW(pool.acquire(2), core::Error);  // free, not cached: nothing to share
  EXPECT_THROW(pool.set_cached(2, true), core::Error);
  EXPECT_THROW(BlockPool(0), core::Error);
  EXPECT_THROW(pool.ref_count(3), core::Error);
}

TEST(IdPool, TakesLowestFirstAndRejectsDoubleGiveBack) {
  IdPool p(3);
  EXPECT_EQ(p.take(), 0);
  EXPECT_EQ(p.take(), 1);
  EXPECT_EQ(p.take(), 2);
  EXPECT_EQ(p.take(), -1);
  p.give_back(1);
  EXPECT_EQ(p.num_free(), 1);
  EXPECT_THROW(p.give_back(1), core::Error);
  EXPECT_EQ(p.take(), 1);
}

TEST(CheckpointPool, PendingAttachedEvictionOrder) {
  CheckpointPool p(2);
  int32_t owner;
  const int32_t a = p.take(&owner), b = p.take(&owner);
  EXPECT_EQ(owner, -1);
  EXPECT_EQ(p.take(&owner), -1);  // both pending: never evicted
  p.attach(a, 10);
  p.attach(b, 11);
  p.touch(a);  // b is now least recently used
  EXPECT_EQ(p.num_attached(), 2);
  EXPECT_EQ(p.take(&owner), b);
  EXPECT_EQ(owner, 11);
  EXPECT_EQ(p.num_pending(), 1);
  EXPECT_THROW(p.attach(a, 3), core::Error);  // already attached
  p.release(a);
  p.release(b);
  EXPECT_EQ(p.num_free(), 2);
  EXPECT_THROW(p.release(a), core::Error);
  EXPECT_EQ(p.check(), "");
}

}  // namespace
}  // namespace k3::cache
