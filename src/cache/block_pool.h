// cache/block_pool.h: MLA page ids with reference counts.
//
// A block (page) holds block_size consecutive tokens of one sequence in every MLA layer.
// Each block is in exactly one of three states:
//   free       ref 0, holds nothing worth keeping               -> on the free list
//   evictable  ref 0, registered in the prefix index (reusable)  -> on the LRU list
//   in use     ref > 0 (one per block table that holds it; a prefix hit shares a block)
// allocate() prefers a free block and otherwise evicts the least recently released
// evictable one, telling the caller which so the prefix index can forget it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cache/lru_list.h"

namespace k3::cache {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_evictable() const { return evictable_.size(); }
  // Blocks allocate() can hand out without touching a block in use.
  int32_t num_available() const { return num_free() + num_evictable(); }
  int32_t num_in_use() const { return num_blocks() - num_available(); }

  int32_t ref_count(int32_t block) const { return ref_[idx(block)]; }
  bool is_cached(int32_t block) const { return cached_[idx(block)] != 0; }

  // Takes a block (ref becomes 1). When it had to evict a cached block, *evicted is that
  // block's id (== the returned id) so the caller drops it from the prefix index; else -1.
  // Throws when nothing is available (callers check num_available() first).
  int32_t allocate(int32_t* evicted);
  // One more holder of `block` (a prefix hit): an evictable block leaves the LRU list.
  void acquire(int32_t block);
  // One holder fewer; at ref 0 a cached block becomes evictable (most recent), else free.
  void release(int32_t block);
  // The prefix index registered (true) or forgot (false) the block's contents.
  void set_cached(int32_t block, bool cached);

  // Consistency of the lists with the ref counts and cached flags; "" when consistent.
  std::string check() const;
  // Least recently released first.
  std::vector<int32_t> evictable_in_order() const { return evictable_.in_order(); }

 private:
  size_t idx(int32_t block) const;
  std::vector<int32_t> ref_;
  std::vector<uint8_t> cached_;
  std::vector<int32_t> free_;  // stack: the most recently freed block is reused first
  LruList evictable_;
};

}  // namespace k3::cache
