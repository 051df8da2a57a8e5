// cache/block_pool.cpp: BlockPool.
#include "cache/block_pool.h"

#include "core/error.h"

namespace k3::cache {

BlockPool::BlockPool(int32_t num_blocks)
    : ref_(static_cast<size_t>(num_blocks > 0 ? num_blocks : 0), 0),
      cached_(ref_.size(), 0),
      evictable_(num_blocks > 0 ? num_blocks : 0) {
  K3_CHECK(num_blocks > 0, "BlockPool: num_blocks must be > 0, got " + std::to_string(num_blocks));
  free_.reserve(ref_.size());
  // Stack order: block 0 is handed out first.
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

size_t BlockPool::idx(int32_t block) const {
  K3_CHECK(block >= 0 && static_cast<size_t>(block) < ref_.size(),
           "BlockPool: block id " + std::to_string(block) + " out of range [0, " + std::to_string(ref_.size()) + ")");
  return static_cast<size_t>(block);
}

int32_t BlockPool::allocate(int32_t* evicted) {
  *evicted = -1;
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    K3_CHECK(!evictable_.empty(), "BlockPool: no block available (" + std::to_string(num_blocks()) + " in use)");
    b = evictable_.pop_front();
    cached_[idx(b)] = 0;
    *evicted = b;
  }
  ref_[idx(b)] = 1;
  return b;
}

void BlockPool::acquire(int32_t block) {
  int32_t& r = ref_[idx(block)];
  if (r == 0) {
    K3_CHECK(cached_[idx(block)], "BlockPool: acquire of free block " + std::to_string(block) + " (not cached)");
    evictable_.remove(block);
  }
  ++r;
}

void BlockPool::release(int32_t block) {
  int32_t& r = ref_[idx(block)];
  K3_CHECK(r > 0, "BlockPool: release of block " + std::to_string(block) + " with ref count 0");
  if (--r == 0) {
    if (cached_[idx(block)]) evictable_.push_back(block);
    else free_.push_back(block);
  }
}

void BlockPool::set_cached(int32_t block, bool cached) {
  uint8_t& c = cached_[idx(block)];
  if (c == static_cast<uint8_t>(cached)) return;
  // Only blocks in use change registration: a free block holds nothing to register, and an
  // evictable block is forgotten only by allocate()'s eviction.
  K3_CHECK(ref_[idx(block)] > 0, "BlockPool: set_cached on block " + std::to_string(block) + " that is not in use");
  c = static_cast<uint8_t>(cached);
}

std::string BlockPool::check() const {
  std::vector<uint8_t> seen(ref_.size(), 0);
  for (int32_t b : free_) {
    if (ref_[idx(b)] != 0 || cached_[idx(b)]) return "free block " + std::to_string(b) + " has a ref or is cached";
    if (seen[idx(b)]++) return "block " + std::to_string(b) + " is on the free list twice";
  }
  for (int32_t b : evictable_.in_order()) {
    if (ref_[idx(b)] != 0 || !cached_[idx(b)])
      return "evictable block " + std::to_string(b) + " has a ref or is not cached";
    if (seen[idx(b)]++) return "block " + std::to_string(b) + " is both free and evictable";
  }
  for (size_t b = 0; b < ref_.size(); ++b) {
    if (ref_[b] < 0) return "block " + std::to_string(b) + " has a negative ref count";
    if (ref_[b] == 0 && !seen[b]) return "block " + std::to_string(b) + " has ref 0 but is on no list (leaked)";
  }
  return "";
}

}  // namespace k3::cache
