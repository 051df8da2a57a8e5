// cache/kv_cache_manager.h: the bookkeeping of KV memory for running sequences.
//
// Hands out MLA page ids (BlockPool), KDA slot ids (IdPool) and KDA checkpoint ids
// (CheckpointPool), and keeps the prefix index. It never touches data: the engine turns
// what it decides into KvStorage calls (reset_slot, restore_checkpoint, save_checkpoint).
//
//   sequence tokens  |b0 ............|b1 ............|b2 ............|b3 ....
//   block table       page 7          page 2          page 9          page 4     (append-only)
//   prefix index      h0=xx(b0,root)  h1=xx(b1,h0)    h2=xx(b2,h1)               (full, computed blocks)
//   checkpoints                       ckpt 3 (state after 2 blocks)              (every N blocks)
//
// A new sequence's prefix hit is the deepest chain entry that has a checkpoint (its MLA
// pages and its KDA state both exist), and leaves at least one token to compute.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/block_pool.h"
#include "cache/cache_config.h"
#include "cache/checkpoint_pool.h"
#include "cache/id_pool.h"
#include "cache/prefix_index.h"

namespace k3::cache {

// What a running sequence holds. Moved along with the request's state; close() empties it.
struct SequenceCache {
  int32_t slot = -1;                // KDA state slot
  std::vector<int32_t> blocks;      // MLA page ids in token order (append-only)
  int32_t pending_checkpoint = -1;  // taken for a save at the end of the running step
  // Progress along the prefix index: the leading num_chained_blocks blocks are registered
  // (by this sequence or, for the same tokens, by another); chain_block holds the entry of
  // the last of them and chain_uid is that entry's uid (0: none yet).
  int32_t num_chained_blocks = 0;
  int32_t chain_block = -1;
  uint64_t chain_uid = 0;
  bool chain_broken = false;  // a hash collision: nothing more of it is registered
};

struct PrefixHit {
  int64_t num_tokens = 0;       // tokens whose MLA pages and KDA state are reused (block-aligned)
  int64_t mla_tokens = 0;       // tokens whose pages matched before the checkpoint clamp
  std::vector<int32_t> blocks;  // pages of those tokens, shared
  int32_t checkpoint = -1;      // KDA state after num_tokens tokens (-1 when num_tokens == 0)
  int32_t chain_block = -1;
  uint64_t chain_uid = 0;
};

struct CacheUsage {
  int32_t blocks_total = 0, blocks_in_use = 0, blocks_evictable = 0, blocks_free = 0;
  int32_t slots_total = 0, slots_in_use = 0;
  int32_t checkpoints_total = 0, checkpoints_attached = 0, checkpoints_pending = 0;
  int32_t index_entries = 0;
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const CacheConfig& config);
  const CacheConfig& config() const { return config_; }

  // The reusable prefix of `tokens` (hashes: the chain of its full blocks, block_hash.h).
  // Never covers the last token: its logits must be computed.
  PrefixHit find_prefix(std::span<const int32_t> tokens, std::span<const uint64_t> hashes) const;
  // A slot plus the hit's pages (shared: ref + 1). nullopt when no slot is free.
  std::optional<SequenceCache> open(const PrefixHit& hit);

  // Pages to add so the table covers num_tokens tokens.
  int32_t blocks_needed(const SequenceCache& seq, int64_t num_tokens) const;
  int32_t num_available_blocks() const { return blocks_.num_available(); }
  // Appends pages to cover num_tokens (evicting cached ones if needed); false, taking
  // nothing, when too few are available.
  bool reserve(SequenceCache& seq, int64_t num_tokens);
  // A checkpoint id for a save after the running step (seq.pending_checkpoint); false when
  // none can be had (none configured, or all pending).
  bool take_checkpoint(SequenceCache& seq);

  // After a step computed tokens[0, num_computed): registers the sequence's full computed
  // blocks in the prefix index and attaches its pending checkpoint (taken at a boundary) to
  // the entry of the block ending there, or releases it when that entry already has one.
  void commit(SequenceCache& seq, std::span<const int32_t> tokens, std::span<const uint64_t> hashes,
              int64_t num_computed);
  // Releases everything the sequence holds (pages in reverse order, so a sequence's last
  // pages are evicted first); leaves `seq` empty.
  void close(SequenceCache& seq);

  CacheUsage usage() const;
  // Every id accounted for: ref counts equal the number of live tables holding a block,
  // slots and pending checkpoints belong to live sequences, lists agree with flags, the index
  // and checkpoint owners agree. "" when consistent, else what is wrong.
  std::string check(std::span<const SequenceCache* const> live) const;

 private:
  void evicted_block(int32_t block);
  CacheConfig config_;
  BlockPool blocks_;
  IdPool slots_;
  CheckpointPool checkpoints_;
  PrefixIndex index_;
};

}  // namespace k3::cache
