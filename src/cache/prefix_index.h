// cache/prefix_index.h: which block holds which token prefix (the prefix cache's map).
//
// An entry registers one full block: its chained hash (block_hash.h), its own block_size
// tokens, the uid of its parent entry (0 for the first block), a uid of its own (never
// reused, so an entry that was evicted and re-registered is a different parent), and the
// KDA checkpoint taken at its end, if any. A lookup follows the chain from block 0 and
// accepts an entry only when hash, tokens AND parent uid match: a hash collision can cost a
// miss, never a wrong hit. Entries live in arrays indexed by block id (one entry per block).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace k3::cache {

class PrefixIndex {
 public:
  PrefixIndex(int32_t num_blocks, int32_t block_size);

  int32_t block_size() const { return block_size_; }
  int32_t num_entries() const { return static_cast<int32_t>(by_hash_.size()); }

  // The block registered for (hash, tokens, parent uid), or -1.
  int32_t find(uint64_t hash, uint64_t parent_uid, std::span<const int32_t> block_tokens) const;

  enum class Insert : uint8_t {
    inserted,   // `block` is now the entry for this prefix
    duplicate,  // another block already holds this exact prefix; *canonical is that block
    collision,  // a different prefix has this hash; nothing registered
  };
  Insert insert(int32_t block, uint64_t hash, uint64_t parent_uid, std::span<const int32_t> block_tokens,
                int32_t* canonical);
  // Forgets the entry of `block` (evicted). Returns its checkpoint (-1 if none) for release.
  int32_t erase(int32_t block);

  bool is_registered(int32_t block) const { return uid_[idx(block)] != 0; }
  uint64_t uid(int32_t block) const { return uid_[idx(block)]; }  // 0 when not registered
  int32_t checkpoint(int32_t block) const { return checkpoint_[idx(block)]; }
  void set_checkpoint(int32_t block, int32_t checkpoint);

  // Map and per-block arrays agree; "" when consistent.
  std::string check() const;

 private:
  size_t idx(int32_t block) const;
  bool same_tokens(int32_t block, std::span<const int32_t> block_tokens) const;
  int32_t block_size_;
  uint64_t next_uid_ = 1;
  std::unordered_map<uint64_t, int32_t> by_hash_;  // hash -> block
  std::vector<uint64_t> hash_, uid_, parent_uid_;  // per block
  std::vector<int32_t> checkpoint_;                // per block, -1: none
  std::vector<int32_t> tokens_;                    // [num_blocks, block_size]
};

}  // namespace k3::cache
