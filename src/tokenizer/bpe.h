// tokenizer/bpe.h: the rank table of a tiktoken-style byte-level BPE (token bytes -> rank) and
// the rank-ordered byte-pair merge that turns one pre-token into token ids.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace k3::tokenizer {

inline constexpr int32_t kNoRank = INT32_MAX;

// Open-addressing hash table (linear probing, load <= 1/2) from token bytes to rank. Keys of up
// to 8 bytes, most tokens, are stored in the slot itself, so a lookup costs one cache miss;
// longer keys are stored as their 64-bit hash and checked against the bytes kept aside.
class RankTable {
 public:
  // Adds `bytes` (not empty) with `rank`; false (and no change) when `bytes` is present.
  bool add(std::string_view bytes, int32_t rank);
  int32_t find(std::string_view bytes) const;  // kNoRank when absent
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key = 0;     // the bytes, zero-padded (length <= 8), or their hash
    uint32_t length = 0;  // 0: empty slot
    int32_t rank = 0;
  };
  void grow();
  void place(const Slot& slot, uint32_t long_offset);
  std::string long_bytes_;             // keys longer than 8 bytes
  std::vector<Slot> slots_;            // power-of-two size
  std::vector<uint32_t> long_offset_;  // [slot] offset in long_bytes_ (long keys only)
  size_t size_ = 0;
};

// Encodes one pre-token `piece` (not empty) with the ranks of `table`, appending ids to `out`:
// start from single bytes and repeatedly merge the adjacent pair whose concatenation has the
// lowest rank (leftmost on ties) until no adjacent pair is a token. `byte_rank[b]` is the rank
// of the single byte b (all 256 must exist). Long pieces use a heap, short ones a linear scan;
// both pick the same pair at every step.
void byte_pair_encode(const RankTable& table, const int32_t (&byte_rank)[256], std::string_view piece,
                      std::vector<int32_t>& out);

// The two strategies, exposed so a test can check they agree on any input.
void byte_pair_encode_scan(const RankTable& table, const int32_t (&byte_rank)[256], std::string_view piece,
                           std::vector<int32_t>& out);
void byte_pair_encode_heap(const RankTable& table, const int32_t (&byte_rank)[256], std::string_view piece,
                           std::vector<int32_t>& out);

}  // namespace k3::tokenizer
