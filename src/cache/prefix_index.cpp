// cache/prefix_index.cpp: PrefixIndex.
#include "cache/prefix_index.h"

#include <algorithm>

#include "core/error.h"

namespace k3::cache {

PrefixIndex::PrefixIndex(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size),
      hash_(static_cast<size_t>(std::max(num_blocks, 0)), 0),
      uid_(hash_.size(), 0),
      parent_uid_(hash_.size(), 0),
      checkpoint_(hash_.size(), -1),
      tokens_(hash_.size() * static_cast<size_t>(std::max(block_size, 0)), -1) {
  K3_CHECK(num_blocks > 0, "PrefixIndex: num_blocks must be > 0");
  K3_CHECK(block_size > 0, "PrefixIndex: block_size must be > 0");
  by_hash_.reserve(hash_.size());
}

size_t PrefixIndex::idx(int32_t block) const {
  K3_CHECK(block >= 0 && static_cast<size_t>(block) < uid_.size(),
           "PrefixIndex: block id " + std::to_string(block) + " out of range");
  return static_cast<size_t>(block);
}

bool PrefixIndex::same_tokens(int32_t block, std::span<const int32_t> t) const {
  const auto* own = tokens_.data() + idx(block) * static_cast<size_t>(block_size_);
  return std::equal(t.begin(), t.end(), own);
}

int32_t PrefixIndex::find(uint64_t hash, uint64_t parent_uid, std::span<const int32_t> t) const {
  K3_CHECK(t.size() == static_cast<size_t>(block_size_), "PrefixIndex::find: block must have block_size tokens");
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const int32_t b = it->second;
  if (parent_uid_[idx(b)] != parent_uid || !same_tokens(b, t)) return -1;
  return b;
}

PrefixIndex::Insert PrefixIndex::insert(int32_t block, uint64_t hash, uint64_t parent_uid, std::span<const int32_t> t,
                                        int32_t* canonical) {
  K3_CHECK(t.size() == static_cast<size_t>(block_size_), "PrefixIndex::insert: block must have block_size tokens");
  K3_CHECK(!is_registered(block), "PrefixIndex::insert: block " + std::to_string(block) + " is already registered");
  *canonical = -1;
  const auto [it, fresh] = by_hash_.try_emplace(hash, block);
  if (!fresh) {
    const int32_t other = it->second;
    if (parent_uid_[idx(other)] == parent_uid && same_tokens(other, t)) {
      *canonical = other;
      return Insert::duplicate;
    }
    return Insert::collision;
  }
  const size_t b = idx(block);
  hash_[b] = hash;
  uid_[b] = next_uid_++;
  parent_uid_[b] = parent_uid;
  checkpoint_[b] = -1;
  std::copy(t.begin(), t.end(), tokens_.begin() + static_cast<std::ptrdiff_t>(b * static_cast<size_t>(block_size_)));
  *canonical = block;
  return Insert::inserted;
}

int32_t PrefixIndex::erase(int32_t block) {
  const size_t b = idx(block);
  K3_CHECK(uid_[b] != 0, "PrefixIndex::erase: block " + std::to_string(block) + " is not registered");
  by_hash_.erase(hash_[b]);
  const int32_t ckpt = checkpoint_[b];
  hash_[b] = uid_[b] = parent_uid_[b] = 0;
  checkpoint_[b] = -1;
  return ckpt;
}

void PrefixIndex::set_checkpoint(int32_t block, int32_t checkpoint) {
  K3_CHECK(is_registered(block), "PrefixIndex::set_checkpoint: block " + std::to_string(block) + " is not registered");
  checkpoint_[idx(block)] = checkpoint;
}

std::string PrefixIndex::check() const {
  size_t registered = 0;
  for (size_t b = 0; b < uid_.size(); ++b) {
    if (uid_[b] == 0) {
      if (checkpoint_[b] != -1) return "unregistered block " + std::to_string(b) + " has a checkpoint";
      continue;
    }
    ++registered;
    const auto it = by_hash_.find(hash_[b]);
    if (it == by_hash_.end() || it->second != static_cast<int32_t>(b))
      return "registered block " + std::to_string(b) + " is not what its hash maps to";
  }
  if (registered != by_hash_.size()) return "hash map has entries for unregistered blocks";
  return "";
}

}  // namespace k3::cache
