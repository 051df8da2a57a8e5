// model/local_cache.cpp: LocalCache.
#include "model/local_cache.h"

#include <numeric>

namespace k3::model {

namespace {
KvStorageConfig local_config(int32_t sequences, int64_t tokens, KvCacheDtype dtype, int32_t block_size) {
  K3_CHECK(sequences >= 1 && tokens >= 1 && block_size >= 1, "LocalCache: sizes must be >= 1");
  KvStorageConfig c;
  c.block_size = block_size;
  c.num_blocks = static_cast<int32_t>(sequences * ((tokens + block_size - 1) / block_size));
  c.num_slots = sequences;
  c.num_checkpoints = 0;
  c.kv_dtype = dtype;
  return c;
}
}  // namespace

LocalCache::LocalCache(const config::K3Config& config, int32_t max_sequences, int64_t max_tokens_per_sequence,
                       KvCacheDtype kv_dtype, int32_t block_size, std::shared_ptr<core::DeviceMemory> memory,
                       kernels::Precision precision)
    : storage_(config, local_config(max_sequences, max_tokens_per_sequence, kv_dtype, block_size), std::move(memory),
               precision),
      blocks_per_sequence_(static_cast<int32_t>((max_tokens_per_sequence + block_size - 1) / block_size)),
      tables_(static_cast<size_t>(storage_.storage_config().num_blocks)) {
  std::iota(tables_.begin(), tables_.end(), 0);
}

SequenceState LocalCache::new_sequence() {
  K3_CHECK(next_sequence_ < storage_.storage_config().num_slots,
           "LocalCache: all " + std::to_string(storage_.storage_config().num_slots) + " sequences are in use");
  SequenceState s;
  s.kda_slot = next_sequence_;
  storage_.reset_slot(s.kda_slot);
  s.block_table = std::span<const int32_t>(tables_).subspan(static_cast<size_t>(next_sequence_) * blocks_per_sequence_,
                                                            static_cast<size_t>(blocks_per_sequence_));
  ++next_sequence_;
  return s;
}

}  // namespace k3::model
