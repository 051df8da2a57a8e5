// cache/checkpoint_pool.h: KDA state checkpoint ids.
//
// A checkpoint is a copy of a sequence's KDA state (every KDA layer) taken right after the
// step that ended on a block-aligned token boundary. Each id is in one of three states:
//   free      nothing in it
//   pending   taken for a save at the end of the running step (owned by that sequence)
//   attached  holds the state after a prefix-index entry's block; on the LRU list
// take() evicts the least recently used attached checkpoint when none is free and says
// which block entry owned it, so the index detaches it. Pending ids are never evicted.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cache/lru_list.h"

namespace k3::cache {

class CheckpointPool {
 public:
  explicit CheckpointPool(int32_t capacity);

  int32_t capacity() const { return static_cast<int32_t>(owner_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_attached() const { return attached_.size(); }
  int32_t num_pending() const { return capacity() - num_free() - num_attached(); }

  // A pending id, or -1 when every id is pending. When an attached one was evicted,
  // *evicted_owner is the block whose entry held it (else -1).
  int32_t take(int32_t* evicted_owner);
  // pending -> attached to the entry of `owner_block` (most recently used).
  void attach(int32_t checkpoint, int32_t owner_block);
  // pending or attached -> free.
  void release(int32_t checkpoint);
  // An attached checkpoint was just restored (a prefix hit).
  void touch(int32_t checkpoint) { attached_.touch(checkpoint); }

  bool is_attached(int32_t checkpoint) const { return attached_.contains(checkpoint); }
  bool is_free(int32_t checkpoint) const;
  int32_t owner(int32_t checkpoint) const { return owner_[idx(checkpoint)]; }
  std::string check() const;

 private:
  size_t idx(int32_t checkpoint) const;
  std::vector<int32_t> owner_;  // block whose entry holds it (attached), else -1
  std::vector<uint8_t> free_flag_;
  std::vector<int32_t> free_;
  LruList attached_;
};

}  // namespace k3::cache
