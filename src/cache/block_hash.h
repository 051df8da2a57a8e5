// cache/block_hash.h: the hash chain over full token blocks that keys the prefix index.
//
// hash(block i) = xxHash64(the block's block_size token ids, seed = hash(block i-1)), with a
// fixed seed for block 0, so equal hashes mean (up to a collision) equal token prefixes. The
// index never trusts a hash alone: it compares the tokens and the parent entry too.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace k3::cache {

inline constexpr uint64_t kRootBlockHash = 0x6b3373657276652dull;  // seed of block 0's hash

uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> block_tokens);

// Appends to `hashes` the hash of every full block of `tokens` not hashed yet.
// (`hashes` holds the chain of the leading blocks; tokens only ever grow.)
void extend_block_hashes(std::vector<uint64_t>& hashes, std::span<const int32_t> tokens, int32_t block_size);

}  // namespace k3::cache
