// cache/lru_list.h: an intrusive least-recently-used list over dense ids [0, n).
//
// O(1) push (most recent end), remove, and pop (least recent end), with no allocation after
// construction: the block pool keeps its evictable blocks here, the prefix index its
// checkpoints. Ids are int32_t; -1 marks "not linked".
#pragma once
#include <cstdint>
#include <vector>

#include "core/error.h"

namespace k3::cache {

class LruList {
 public:
  explicit LruList(int32_t capacity)
      : prev_(static_cast<size_t>(capacity), kUnlinked), next_(static_cast<size_t>(capacity), kUnlinked) {}

  int32_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool contains(int32_t id) const { return prev_[idx(id)] != kUnlinked; }

  // Links `id` as the most recently used.
  void push_back(int32_t id) {
    K3_CHECK(!contains(id), "LruList: id " + std::to_string(id) + " is already linked");
    prev_[idx(id)] = tail_;
    next_[idx(id)] = kEnd;
    if (tail_ == kEnd) head_ = id;
    else next_[idx(tail_)] = id;
    tail_ = id;
    ++size_;
  }
  void remove(int32_t id) {
    K3_CHECK(contains(id), "LruList: id " + std::to_string(id) + " is not linked");
    const int32_t p = prev_[idx(id)], n = next_[idx(id)];
    if (p == kEnd) head_ = n;
    else next_[idx(p)] = n;
    if (n == kEnd) tail_ = p;
    else prev_[idx(n)] = p;
    prev_[idx(id)] = next_[idx(id)] = kUnlinked;
    --size_;
  }
  // Marks `id` as just used (it must be linked).
  void touch(int32_t id) {
    remove(id);
    push_back(id);
  }
  // The least recently used id (the list must not be empty).
  int32_t front() const {
    K3_CHECK(head_ != kEnd, "LruList: front() of an empty list");
    return head_;
  }
  int32_t pop_front() {
    const int32_t id = front();
    remove(id);
    return id;
  }
  // Least recent first, for invariant checks and tests.
  std::vector<int32_t> in_order() const {
    std::vector<int32_t> out;
    for (int32_t i = head_; i != kEnd; i = next_[idx(i)]) out.push_back(i);
    return out;
  }

 private:
  static constexpr int32_t kUnlinked = -2, kEnd = -1;
  size_t idx(int32_t id) const {
    K3_CHECK(id >= 0 && static_cast<size_t>(id) < prev_.size(),
             "LruList: id " + std::to_string(id) + " out of range [0, " + std::to_string(prev_.size()) + ")");
    return static_cast<size_t>(id);
  }
  std::vector<int32_t> prev_, next_;
  int32_t head_ = kEnd, tail_ = kEnd, size_ = 0;
};

}  // namespace k3::cache
