// model/local_cache.h: a single-owner cache for the CLI, tests and benchmarks: storage for a
// fixed number of sequences of bounded length, every sequence given its own slot and all the
// blocks it may need up front (no sharing, no prefix cache: that is cache/ + engine/).
#pragma once
#include <cstdint>
#include <vector>

#include "model/kv_storage.h"

namespace k3::model {

class LocalCache {
 public:
  LocalCache(const config::K3Config& config, int32_t max_sequences, int64_t max_tokens_per_sequence,
             KvCacheDtype kv_dtype = KvCacheDtype::bf16, int32_t block_size = 16,
             std::shared_ptr<core::DeviceMemory> memory = core::make_host_memory(),
             kernels::Precision precision = kernels::Precision::bf16);
  KvStorage& storage() { return storage_; }
  // A fresh sequence: a zeroed KDA slot and blocks for max_tokens_per_sequence tokens (its block
  // table is a view of this cache's, valid while the cache lives, moves included).
  // Throws core::Error when max_sequences are already handed out.
  SequenceState new_sequence();

 private:
  KvStorage storage_;
  int32_t blocks_per_sequence_;
  std::vector<int32_t> tables_;  // sequence i's pages: [i * blocks_per_sequence_, +blocks_per_sequence_)
  int32_t next_sequence_ = 0;
};

}  // namespace k3::model
