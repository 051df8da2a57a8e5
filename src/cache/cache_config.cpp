// cache/cache_config.cpp: CacheConfig validation and sizing from a byte budget.
#include "cache/cache_config.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace k3::cache {

void CacheConfig::validate() const {
  K3_CHECK(block_size > 0, "cache: block_size must be > 0, got " + std::to_string(block_size));
  K3_CHECK(num_blocks > 0, "cache: num_blocks must be > 0, got " + std::to_string(num_blocks));
  K3_CHECK(num_slots > 0, "cache: num_slots must be > 0, got " + std::to_string(num_slots));
  K3_CHECK(num_checkpoints >= 0, "cache: num_checkpoints must be >= 0, got " + std::to_string(num_checkpoints));
  K3_CHECK(checkpoint_interval_blocks > 0,
           "cache: checkpoint_interval_blocks must be > 0, got " + std::to_string(checkpoint_interval_blocks));
}

int64_t cache_bytes(const CacheConfig& c, int64_t bpb, int64_t bpk) {
  return c.num_blocks * bpb + (static_cast<int64_t>(c.num_slots) + c.num_checkpoints) * bpk;
}

CacheConfig size_cache(const CacheBudget& b, CacheConfig c, int32_t min_blocks) {
  K3_CHECK(b.bytes > 0, "cache budget: bytes must be > 0, got " + std::to_string(b.bytes));
  K3_CHECK(b.bytes_per_block > 0,
           "cache budget: bytes_per_block must be > 0, got " + std::to_string(b.bytes_per_block));
  K3_CHECK(b.bytes_per_kda_state >= 0, "cache budget: bytes_per_kda_state must be >= 0");
  K3_CHECK(std::isfinite(b.checkpoint_fraction) && b.checkpoint_fraction >= 0.0 && b.checkpoint_fraction < 1.0,
           "cache budget: checkpoint_fraction must be in [0, 1), got " + std::to_string(b.checkpoint_fraction));
  K3_CHECK(c.num_slots > 0, "cache budget: num_slots must be > 0, got " + std::to_string(c.num_slots));
  const int64_t slot_bytes = c.num_slots * b.bytes_per_kda_state;
  const int64_t rest = b.bytes - slot_bytes;
  const int64_t need = slot_bytes + static_cast<int64_t>(min_blocks) * b.bytes_per_block;
  K3_CHECK(rest >= static_cast<int64_t>(min_blocks) * b.bytes_per_block,
           "cache budget: " + std::to_string(b.bytes) + " bytes cannot hold " + std::to_string(c.num_slots) +
               " KDA slots (" + std::to_string(b.bytes_per_kda_state) + " B each) and " + std::to_string(min_blocks) +
               " pages (" + std::to_string(b.bytes_per_block) + " B each): need at least " + std::to_string(need));
  const double fraction = c.enable_prefix_cache && b.bytes_per_kda_state > 0 ? b.checkpoint_fraction : 0.0;
  int64_t ckpt_bytes = static_cast<int64_t>(static_cast<double>(rest) * fraction);
  // Pages first up to min_blocks: the checkpoints take only what the minimum leaves.
  ckpt_bytes = std::min(ckpt_bytes, rest - static_cast<int64_t>(min_blocks) * b.bytes_per_block);
  const int64_t checkpoints = b.bytes_per_kda_state > 0 ? ckpt_bytes / b.bytes_per_kda_state : 0;
  const int64_t blocks = (rest - checkpoints * b.bytes_per_kda_state) / b.bytes_per_block;
  K3_CHECK(blocks <= std::numeric_limits<int32_t>::max() && checkpoints <= std::numeric_limits<int32_t>::max(),
           "cache budget: too many pages or checkpoints for int32 ids; raise block_size");
  c.num_blocks = static_cast<int32_t>(blocks);
  c.num_checkpoints = static_cast<int32_t>(checkpoints);
  c.validate();
  return c;
}

std::string describe(const CacheConfig& c) {
  return "block_size=" + std::to_string(c.block_size) + " num_blocks=" + std::to_string(c.num_blocks) +
         " num_slots=" + std::to_string(c.num_slots) + " num_checkpoints=" + std::to_string(c.num_checkpoints) +
         " checkpoint_interval_blocks=" + std::to_string(c.checkpoint_interval_blocks) +
         " prefix_cache=" + (c.enable_prefix_cache ? "on" : "off");
}

}  // namespace k3::cache
