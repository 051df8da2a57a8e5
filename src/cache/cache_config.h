// cache/cache_config.h: how many pages, slots and checkpoints, and how a byte budget buys them.
#pragma once
#include <cstdint>
#include <string>

namespace k3::cache {

struct CacheConfig {
  int32_t block_size = 16;      // tokens per MLA page (and per prefix-index block)
  int32_t num_blocks = 0;       // MLA pages
  int32_t num_slots = 0;        // KDA state slots = sequences that can run at once
  int32_t num_checkpoints = 0;  // KDA state checkpoints for prefix hits
  // A checkpoint is due every N blocks: at token counts that are multiples of
  // N * block_size. Prefill chunks are cut to end there (the state is copied after a step).
  int32_t checkpoint_interval_blocks = 4;
  bool enable_prefix_cache = true;

  int64_t checkpoint_interval_tokens() const { return static_cast<int64_t>(checkpoint_interval_blocks) * block_size; }
  // Throws core::Error naming the field when a value is out of range.
  void validate() const;
};

// The memory the caches may use, in bytes, and the price of each kind of id
// (model::KvStorage::bytes_per_block / bytes_per_kda_state, passed in as numbers so cache/
// links no model code).
struct CacheBudget {
  int64_t bytes = 0;
  int64_t bytes_per_block = 0;      // one page id, all MLA layers
  int64_t bytes_per_kda_state = 0;  // one slot or one checkpoint, all KDA layers
  // Share of the bytes left after the slots that goes to checkpoints (0 with the prefix
  // cache off); the rest buys pages.
  double checkpoint_fraction = 0.2;
};

// Fills num_blocks and num_checkpoints of `base` (block_size, num_slots and the prefix-cache
// settings come from it) from the budget. Throws when the budget cannot hold the slots and
// at least `min_blocks` pages, with the numbers in the message.
CacheConfig size_cache(const CacheBudget& budget, CacheConfig base, int32_t min_blocks);
// Bytes a config costs at these prices.
int64_t cache_bytes(const CacheConfig& c, int64_t bytes_per_block, int64_t bytes_per_kda_state);

std::string describe(const CacheConfig& c);

}  // namespace k3::cache
