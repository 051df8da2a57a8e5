// cache/block_hash.cpp: xxHash64 block chain (Debian libxxhash).
#include "cache/block_hash.h"

#define XXH_INLINE_ALL  // header-only: no libxxhash to link (the GPU machine has no -dev package)
#include <xxhash.h>

#include "core/error.h"

namespace k3::cache {

uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> block_tokens) {
  return XXH64(block_tokens.data(), block_tokens.size_bytes(), parent_hash);
}

void extend_block_hashes(std::vector<uint64_t>& hashes, std::span<const int32_t> tokens, int32_t block_size) {
  K3_CHECK(block_size > 0, "extend_block_hashes: block_size must be > 0");
  const size_t full = tokens.size() / static_cast<size_t>(block_size);
  K3_CHECK(hashes.size() <= full, "extend_block_hashes: more hashes than full blocks (tokens shrank?)");
  for (size_t i = hashes.size(); i < full; ++i) {
    const uint64_t parent = i == 0 ? kRootBlockHash : hashes[i - 1];
    hashes.push_back(
        hash_block(parent, tokens.subspan(i * static_cast<size_t>(block_size), static_cast<size_t>(block_size))));
  }
}

}  // namespace k3::cache
