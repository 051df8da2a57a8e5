// cache/checkpoint_pool.cpp: CheckpointPool.
#include "cache/checkpoint_pool.h"

#include "core/error.h"

namespace k3::cache {

CheckpointPool::CheckpointPool(int32_t capacity)
    : owner_(static_cast<size_t>(capacity > 0 ? capacity : 0), -1),
      free_flag_(owner_.size(), 1),
      attached_(capacity > 0 ? capacity : 0) {
  K3_CHECK(capacity >= 0, "CheckpointPool: capacity must be >= 0, got " + std::to_string(capacity));
  for (int32_t i = capacity - 1; i >= 0; --i) free_.push_back(i);
}

size_t CheckpointPool::idx(int32_t c) const {
  K3_CHECK(c >= 0 && c < capacity(), "CheckpointPool: checkpoint id " + std::to_string(c) + " out of range [0, " +
                                         std::to_string(capacity()) + ")");
  return static_cast<size_t>(c);
}

bool CheckpointPool::is_free(int32_t c) const { return free_flag_[idx(c)] != 0; }

int32_t CheckpointPool::take(int32_t* evicted_owner) {
  *evicted_owner = -1;
  int32_t c;
  if (!free_.empty()) {
    c = free_.back();
    free_.pop_back();
    free_flag_[idx(c)] = 0;
  } else if (!attached_.empty()) {
    c = attached_.pop_front();
    *evicted_owner = owner_[idx(c)];
    owner_[idx(c)] = -1;
  } else {
    return -1;
  }
  return c;
}

void CheckpointPool::attach(int32_t c, int32_t owner_block) {
  K3_CHECK(!free_flag_[idx(c)] && !attached_.contains(c),
           "CheckpointPool: attach of checkpoint " + std::to_string(c) + " that is not pending");
  K3_CHECK(owner_block >= 0, "CheckpointPool: attach needs an owner block");
  owner_[idx(c)] = owner_block;
  attached_.push_back(c);
}

void CheckpointPool::release(int32_t c) {
  K3_CHECK(!free_flag_[idx(c)], "CheckpointPool: release of free checkpoint " + std::to_string(c));
  if (attached_.contains(c)) attached_.remove(c);
  owner_[idx(c)] = -1;
  free_flag_[idx(c)] = 1;
  free_.push_back(c);
}

std::string CheckpointPool::check() const {
  int32_t n_free = 0;
  for (size_t c = 0; c < owner_.size(); ++c) {
    const auto id = static_cast<int32_t>(c);
    const bool att = attached_.contains(id);
    if (free_flag_[c] && att) return "checkpoint " + std::to_string(c) + " is free and attached";
    if (att != (owner_[c] >= 0)) return "checkpoint " + std::to_string(c) + " owner does not match attached state";
    n_free += free_flag_[c];
  }
  if (n_free != num_free()) return "checkpoint free list and flags disagree";
  return "";
}

}  // namespace k3::cache
