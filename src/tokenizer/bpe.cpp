// tokenizer/bpe.cpp: rank table (xxHash3 keys, linear probing) and the byte-pair merge.
#include "tokenizer/bpe.h"

#include <cstring>
#include <queue>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace k3::tokenizer {

namespace {

// The slot key of `b`: the bytes themselves for up to 8 bytes, otherwise their hash.
uint64_t key_of(std::string_view b) {
  if (b.size() > 8) return XXH3_64bits(b.data(), b.size());
  uint64_t k = 0;
  std::memcpy(&k, b.data(), b.size());
  return k;
}

// Home slot hash of a key (splitmix64 finalizer; the length disambiguates zero padding).
uint64_t mix(uint64_t key, size_t length) {
  uint64_t z = key + 0x9e3779b97f4a7c15ull * (length + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

void RankTable::place(const Slot& slot, uint32_t long_offset) {
  const size_t mask = slots_.size() - 1;
  size_t s = mix(slot.key, slot.length) & mask;
  while (slots_[s].length != 0) s = (s + 1) & mask;
  slots_[s] = slot;
  long_offset_[s] = long_offset;
}

void RankTable::grow() {
  std::vector<Slot> old = std::move(slots_);
  std::vector<uint32_t> old_offset = std::move(long_offset_);
  const size_t capacity = old.empty() ? 1024 : old.size() * 2;
  slots_.assign(capacity, Slot{});
  long_offset_.assign(capacity, 0);
  for (size_t s = 0; s < old.size(); ++s)
    if (old[s].length != 0) place(old[s], old_offset[s]);
}

bool RankTable::add(std::string_view bytes, int32_t rank) {
  if (bytes.empty() || find(bytes) != kNoRank) return false;
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const auto offset = static_cast<uint32_t>(long_bytes_.size());
  if (bytes.size() > 8) long_bytes_.append(bytes);
  place({key_of(bytes), static_cast<uint32_t>(bytes.size()), rank}, offset);
  ++size_;
  return true;
}

int32_t RankTable::find(std::string_view bytes) const {
  if (slots_.empty() || bytes.empty()) return kNoRank;
  const uint64_t key = key_of(bytes);
  const size_t mask = slots_.size() - 1;
  for (size_t s = mix(key, bytes.size()) & mask;; s = (s + 1) & mask) {
    const Slot& slot = slots_[s];
    if (slot.length == 0) return kNoRank;
    if (slot.key != key || slot.length != bytes.size()) continue;
    if (bytes.size() <= 8 || std::memcmp(long_bytes_.data() + long_offset_[s], bytes.data(), bytes.size()) == 0)
      return slot.rank;
  }
}

// Scan strategy (good for short pieces): parts hold the start offset of each current token and
// the rank of merging it with its right neighbour; each step finds the minimum by a scan.
void byte_pair_encode_scan(const RankTable& table, const int32_t (&byte_rank)[256], std::string_view piece,
                           std::vector<int32_t>& out) {
  struct Part {
    size_t start;
    int32_t pair_rank;  // rank of this part + the next one, kNoRank if none
  };
  const size_t n = piece.size();
  // Short pieces (the common case) live on the stack; parts[count - 1] is a sentinel at n.
  Part local[64];
  std::vector<Part> heap_parts;
  Part* parts = local;
  if (n + 1 > std::size(local)) {
    heap_parts.resize(n + 1);
    parts = heap_parts.data();
  }
  size_t count = n + 1;
  for (size_t i = 0; i <= n; ++i) parts[i] = {i, i + 2 <= n ? table.find(piece.substr(i, 2)) : kNoRank};
  auto pair_rank = [&](size_t i) {  // rank of parts[i] joined with parts[i + 1]
    if (i + 2 >= count) return kNoRank;
    return table.find(piece.substr(parts[i].start, parts[i + 2].start - parts[i].start));
  };
  while (count > 2) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < count; ++i)
      if (parts[i].pair_rank < parts[best].pair_rank) best = i;
    if (parts[best].pair_rank == kNoRank) break;
    std::memmove(parts + best + 1, parts + best + 2, (count - best - 2) * sizeof(Part));
    --count;
    parts[best].pair_rank = pair_rank(best);
    if (best > 0) parts[best - 1].pair_rank = pair_rank(best - 1);
  }
  for (size_t i = 0; i + 1 < count; ++i) {
    const size_t len = parts[i + 1].start - parts[i].start;
    out.push_back(len == 1 ? byte_rank[static_cast<unsigned char>(piece[parts[i].start])]
                           : table.find(piece.substr(parts[i].start, len)));
  }
}

// Heap strategy (for long pieces): a doubly linked list of parts and a min-heap of candidate
// merges keyed (rank, start); entries made stale by an earlier merge are skipped on pop.
void byte_pair_encode_heap(const RankTable& table, const int32_t (&byte_rank)[256], std::string_view piece,
                           std::vector<int32_t>& out) {
  const size_t n = piece.size();
  constexpr uint32_t kNone = UINT32_MAX;
  std::vector<uint32_t> next(n), prev(n), version(n, 0);
  std::vector<int32_t> token(n);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? static_cast<uint32_t>(i + 1) : kNone;
    prev[i] = i > 0 ? static_cast<uint32_t>(i - 1) : kNone;
    token[i] = byte_rank[static_cast<unsigned char>(piece[i])];
  }
  auto end_of = [&](uint32_t i) { return next[i] == kNone ? n : static_cast<size_t>(next[i]); };
  struct Candidate {
    int32_t rank;
    uint32_t start, version;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : start > o.start; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push_pair = [&](uint32_t i) {  // candidate: part i merged with its right neighbour
    if (next[i] == kNone) return;
    const int32_t r = table.find(piece.substr(i, end_of(next[i]) - i));
    if (r != kNoRank) heap.push({r, i, version[i]});
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (c.version != version[c.start]) continue;  // the pair changed since it was pushed
    const uint32_t right = next[c.start];
    token[c.start] = c.rank;
    next[c.start] = next[right];
    if (next[right] != kNone) prev[next[right]] = c.start;
    ++version[c.start];
    ++version[right];
    push_pair(c.start);
    if (prev[c.start] != kNone) {
      ++version[prev[c.start]];
      push_pair(prev[c.start]);
    }
  }
  for (uint32_t i = 0; i != kNone; i = next[i]) out.push_back(token[i]);
}

void byte_pair_encode(const RankTable& table, const int32_t (&byte_rank)[256], std::string_view piece,
                      std::vector<int32_t>& out) {
  if (piece.size() == 1) {
    out.push_back(byte_rank[static_cast<unsigned char>(piece[0])]);
  } else if (piece.size() < 48) {
    byte_pair_encode_scan(table, byte_rank, piece, out);
  } else {
    byte_pair_encode_heap(table, byte_rank, piece, out);
  }
}

}  // namespace k3::tokenizer
