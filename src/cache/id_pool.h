// cache/id_pool.h: a pool of dense ids [0, n) (KDA state slots): take, give back, count.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace k3::cache {

class IdPool {
 public:
  explicit IdPool(int32_t capacity) : in_use_(static_cast<size_t>(capacity > 0 ? capacity : 0), 0) {
    K3_CHECK(capacity >= 0, "IdPool: capacity must be >= 0");
    for (int32_t i = capacity - 1; i >= 0; --i) free_.push_back(i);
  }
  int32_t capacity() const { return static_cast<int32_t>(in_use_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_in_use() const { return capacity() - num_free(); }
  bool in_use(int32_t id) const { return in_use_[idx(id)] != 0; }

  // The lowest free id first (on a fresh pool); -1 when none is free.
  int32_t take() {
    if (free_.empty()) return -1;
    const int32_t id = free_.back();
    free_.pop_back();
    in_use_[idx(id)] = 1;
    return id;
  }
  void give_back(int32_t id) {
    K3_CHECK(in_use_[idx(id)], "IdPool: id " + std::to_string(id) + " given back but not in use");
    in_use_[idx(id)] = 0;
    free_.push_back(id);
  }

 private:
  size_t idx(int32_t id) const {
    K3_CHECK(id >= 0 && id < capacity(),
             "IdPool: id " + std::to_string(id) + " out of range [0, " + std::to_string(capacity()) + ")");
    return static_cast<size_t>(id);
  }
  std::vector<uint8_t> in_use_;
  std::vector<int32_t> free_;
};

}  // namespace k3::cache
