// cache/kv_cache_manager.cpp: KvCacheManager.
#include "cache/kv_cache_manager.h"

#include <algorithm>

#include "core/error.h"

namespace k3::cache {

namespace {
CacheConfig validated(const CacheConfig& c) {
  c.validate();
  return c;
}
}  // namespace

KvCacheManager::KvCacheManager(const CacheConfig& config)
    : config_(validated(config)),
      blocks_(config.num_blocks),
      slots_(config.num_slots),
      checkpoints_(config.enable_prefix_cache ? config.num_checkpoints : 0),
      index_(config.num_blocks, config.block_size) {}

PrefixHit KvCacheManager::find_prefix(std::span<const int32_t> tokens, std::span<const uint64_t> hashes) const {
  PrefixHit hit;
  if (!config_.enable_prefix_cache || tokens.empty()) return hit;
  const auto bs = static_cast<size_t>(config_.block_size);
  // Full blocks that end before the last token.
  const size_t max_blocks = std::min((tokens.size() - 1) / bs, hashes.size());
  uint64_t parent = 0;
  size_t deepest = 0;  // blocks covered by the deepest checkpoint
  std::vector<int32_t> matched;
  for (size_t i = 0; i < max_blocks; ++i) {
    const int32_t b = index_.find(hashes[i], parent, tokens.subspan(i * bs, bs));
    if (b < 0) break;
    matched.push_back(b);
    parent = index_.uid(b);
    if (index_.checkpoint(b) >= 0) deepest = i + 1;
  }
  hit.mla_tokens = static_cast<int64_t>(matched.size() * bs);
  if (deepest == 0) return hit;
  matched.resize(deepest);
  hit.num_tokens = static_cast<int64_t>(deepest * bs);
  hit.chain_block = matched.back();
  hit.chain_uid = index_.uid(hit.chain_block);
  hit.checkpoint = index_.checkpoint(hit.chain_block);
  hit.blocks = std::move(matched);
  return hit;
}

std::optional<SequenceCache> KvCacheManager::open(const PrefixHit& hit) {
  const int32_t slot = slots_.take();
  if (slot < 0) return std::nullopt;
  SequenceCache seq;
  seq.slot = slot;
  seq.blocks = hit.blocks;
  for (int32_t b : seq.blocks) blocks_.acquire(b);
  if (hit.checkpoint >= 0) checkpoints_.touch(hit.checkpoint);
  seq.num_chained_blocks = static_cast<int32_t>(hit.blocks.size());
  seq.chain_block = hit.chain_block;
  seq.chain_uid = hit.chain_uid;
  return seq;
}

int32_t KvCacheManager::blocks_needed(const SequenceCache& seq, int64_t num_tokens) const {
  const int64_t need = (num_tokens + config_.block_size - 1) / config_.block_size;
  return static_cast<int32_t>(std::max<int64_t>(0, need - static_cast<int64_t>(seq.blocks.size())));
}

void KvCacheManager::evicted_block(int32_t block) {
  const int32_t ckpt = index_.erase(block);
  if (ckpt >= 0) checkpoints_.release(ckpt);
}

bool KvCacheManager::reserve(SequenceCache& seq, int64_t num_tokens) {
  K3_CHECK(seq.slot >= 0, "KvCacheManager::reserve on a closed sequence");
  const int32_t need = blocks_needed(seq, num_tokens);
  if (need > blocks_.num_available()) return false;
  for (int32_t i = 0; i < need; ++i) {
    int32_t evicted = -1;
    seq.blocks.push_back(blocks_.allocate(&evicted));
    if (evicted >= 0) evicted_block(evicted);
  }
  return true;
}

bool KvCacheManager::take_checkpoint(SequenceCache& seq) {
  K3_CHECK(seq.pending_checkpoint < 0, "KvCacheManager::take_checkpoint: the sequence already has one pending");
  if (!config_.enable_prefix_cache || seq.chain_broken) return false;
  int32_t evicted_owner = -1;
  const int32_t c = checkpoints_.take(&evicted_owner);
  if (c < 0) return false;
  if (evicted_owner >= 0) index_.set_checkpoint(evicted_owner, -1);
  seq.pending_checkpoint = c;
  return true;
}

void KvCacheManager::commit(SequenceCache& seq, std::span<const int32_t> tokens, std::span<const uint64_t> hashes,
                            int64_t num_computed) {
  K3_CHECK(num_computed >= 0 && static_cast<size_t>(num_computed) <= tokens.size(),
           "KvCacheManager::commit: num_computed out of range");
  const auto bs = static_cast<size_t>(config_.block_size);
  const auto full = static_cast<int32_t>(static_cast<size_t>(num_computed) / bs);
  K3_CHECK(static_cast<size_t>(full) <= seq.blocks.size(),
           "KvCacheManager::commit: computed tokens beyond the block table");
  if (config_.enable_prefix_cache) {
    K3_CHECK(hashes.size() >= static_cast<size_t>(full),
             "KvCacheManager::commit: block hashes do not cover the computed blocks");
    // The entry the chain runs through was evicted (it was another sequence's block): what
    // this sequence would register now could never be reached, so stop.
    if (seq.num_chained_blocks > 0 && index_.uid(seq.chain_block) != seq.chain_uid) seq.chain_broken = true;
    for (int32_t i = seq.num_chained_blocks; i < full && !seq.chain_broken; ++i) {
      const auto t = tokens.subspan(static_cast<size_t>(i) * bs, bs);
      const int32_t own = seq.blocks[static_cast<size_t>(i)];
      int32_t canonical = -1;
      const auto result = index_.insert(own, hashes[static_cast<size_t>(i)], seq.chain_uid, t, &canonical);
      if (result == PrefixIndex::Insert::collision) {
        seq.chain_broken = true;
        break;
      }
      if (result == PrefixIndex::Insert::inserted) blocks_.set_cached(own, true);
      seq.num_chained_blocks = i + 1;
      seq.chain_block = canonical;
      seq.chain_uid = index_.uid(canonical);
    }
  }
  if (seq.pending_checkpoint >= 0) {
    const int32_t c = seq.pending_checkpoint;
    seq.pending_checkpoint = -1;
    if (num_computed % config_.checkpoint_interval_tokens() != 0) {
      checkpoints_.release(c);  // nothing leaks, even on a scheduler bug
      throw core::Error("KvCacheManager::commit: a checkpoint was taken but the step ended at token " +
                        std::to_string(num_computed) + ", not on a checkpoint boundary");
    }
    const bool chain_ok = !seq.chain_broken && seq.num_chained_blocks == full && seq.chain_block >= 0 &&
                          index_.uid(seq.chain_block) == seq.chain_uid;
    if (chain_ok && index_.checkpoint(seq.chain_block) < 0) {
      checkpoints_.attach(c, seq.chain_block);
      index_.set_checkpoint(seq.chain_block, c);
    } else {
      checkpoints_.release(c);
    }
  }
}

void KvCacheManager::close(SequenceCache& seq) {
  for (auto it = seq.blocks.rbegin(); it != seq.blocks.rend(); ++it) blocks_.release(*it);
  if (seq.slot >= 0) slots_.give_back(seq.slot);
  if (seq.pending_checkpoint >= 0) checkpoints_.release(seq.pending_checkpoint);
  seq = SequenceCache{};
}

CacheUsage KvCacheManager::usage() const {
  CacheUsage u;
  u.blocks_total = blocks_.num_blocks();
  u.blocks_in_use = blocks_.num_in_use();
  u.blocks_evictable = blocks_.num_evictable();
  u.blocks_free = blocks_.num_free();
  u.slots_total = slots_.capacity();
  u.slots_in_use = slots_.num_in_use();
  u.checkpoints_total = checkpoints_.capacity();
  u.checkpoints_attached = checkpoints_.num_attached();
  u.checkpoints_pending = checkpoints_.num_pending();
  u.index_entries = index_.num_entries();
  return u;
}

std::string KvCacheManager::check(std::span<const SequenceCache* const> live) const {
  if (auto e = blocks_.check(); !e.empty()) return "block pool: " + e;
  if (auto e = checkpoints_.check(); !e.empty()) return "checkpoint pool: " + e;
  if (auto e = index_.check(); !e.empty()) return "prefix index: " + e;
  const int32_t nb = blocks_.num_blocks();
  std::vector<int32_t> refs(static_cast<size_t>(nb), 0);
  std::vector<uint8_t> slot_seen(static_cast<size_t>(slots_.capacity()), 0);
  int32_t pending = 0;
  for (const SequenceCache* s : live) {
    if (s->slot < 0 || s->slot >= slots_.capacity() || !slots_.in_use(s->slot))
      return "live sequence without a valid slot";
    if (slot_seen[static_cast<size_t>(s->slot)]++) return "slot " + std::to_string(s->slot) + " held twice";
    for (int32_t b : s->blocks) {
      if (b < 0 || b >= nb) return "block id " + std::to_string(b) + " out of range in a table";
      ++refs[static_cast<size_t>(b)];
    }
    if (s->pending_checkpoint >= 0) {
      ++pending;
      if (checkpoints_.is_free(s->pending_checkpoint) || checkpoints_.is_attached(s->pending_checkpoint))
        return "pending checkpoint " + std::to_string(s->pending_checkpoint) + " is not in the pending state";
    }
  }
  if (slots_.num_in_use() != static_cast<int32_t>(live.size()))
    return std::to_string(slots_.num_in_use()) + " slots in use but " + std::to_string(live.size()) +
           " live sequences (leak)";
  if (pending != checkpoints_.num_pending())
    return std::to_string(checkpoints_.num_pending()) + " checkpoints pending but live sequences hold " +
           std::to_string(pending);
  for (int32_t b = 0; b < nb; ++b) {
    if (refs[static_cast<size_t>(b)] != blocks_.ref_count(b))
      return "block " + std::to_string(b) + " ref count " + std::to_string(blocks_.ref_count(b)) + " but held by " +
             std::to_string(refs[static_cast<size_t>(b)]) + " tables";
    if (blocks_.is_cached(b) != index_.is_registered(b))
      return "block " + std::to_string(b) + " cached flag disagrees with the index";
    const int32_t c = index_.checkpoint(b);
    if (c >= 0 && (!checkpoints_.is_attached(c) || checkpoints_.owner(c) != b))
      return "entry of block " + std::to_string(b) + " names checkpoint " + std::to_string(c) +
             " that is not attached to it";
  }
  for (int32_t c = 0; c < checkpoints_.capacity(); ++c)
    if (checkpoints_.is_attached(c) && index_.checkpoint(checkpoints_.owner(c)) != c)
      return "checkpoint " + std::to_string(c) + " attached to block " + std::to_string(checkpoints_.owner(c)) +
             " whose entry does not name it";
  return "";
}

}  // namespace k3::cache
