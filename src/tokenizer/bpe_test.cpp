// tokenizer/bpe_test.cpp: the rank table, and the two byte-pair merge strategies (linear scan,
// heap) agreeing with each other and with a naive reference merge on odd-length pieces.
#include "tokenizer/bpe.h"

#include <gtest/gtest.h>

#include "core/rng.h"
#include "tokenizer/tiny_tokenizer.h"

namespace k3::tokenizer {
namespace {

struct Table {
  RankTable table;
  int32_t byte_rank[256];
  std::vector<std::string> bytes;  // by rank
};

Table tiny_table() {
  Table t;
  for (const auto& [bytes, rank] : build_tiny_vocab(1024).ranks) {
    EXPECT_TRUE(t.table.add(bytes, rank));
    if (t.bytes.size() <= static_cast<size_t>(rank)) t.bytes.resize(static_cast<size_t>(rank) + 1);
    t.bytes[static_cast<size_t>(rank)] = bytes;
    if (bytes.size() == 1) t.byte_rank[static_cast<unsigned char>(bytes[0])] = rank;
  }
  return t;
}

// The definition, written the slow way: repeatedly merge the lowest-ranked adjacent pair
// (leftmost on ties) over a vector of strings.
std::vector<int32_t> naive_merge(const RankTable& table, std::string_view piece) {
  std::vector<std::string> parts;
  for (char c : piece) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    int32_t best = kNoRank;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const int32_t r = table.find(parts[i] + parts[i + 1]);
      if (r < best) best = r, at = i;
    }
    if (best == kNoRank) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  std::vector<int32_t> ids;
  for (const std::string& p : parts) ids.push_back(table.find(p));
  return ids;
}

TEST(RankTable, AddFindAndDuplicates) {
  RankTable t;
  EXPECT_EQ(t.find("x"), kNoRank);
  for (int i = 0; i < 5000; ++i) EXPECT_TRUE(t.add("tok" + std::to_string(i), i));
  EXPECT_FALSE(t.add("tok17", 99999));
  EXPECT_EQ(t.size(), 5000u);
  EXPECT_EQ(t.find("tok4999"), 4999);
  EXPECT_EQ(t.find("tok17"), 17);
  EXPECT_EQ(t.find("tok5000"), kNoRank);
  EXPECT_EQ(t.find(""), kNoRank);
}

TEST(BytePairMerge, ScanHeapAndNaiveAgree) {
  const Table t = tiny_table();
  core::Rng rng(11);
  const std::string alphabet = "the cat reads a book at night, and he lives in a library ";
  for (size_t len : {1, 2, 3, 17, 54, 97, 300, 1000}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::string piece;
      for (size_t i = 0; i < len; ++i)
        piece += trial % 4 == 3 ? static_cast<char>(rng.next_u64() & 0xFF) : alphabet[rng.next_u64() % alphabet.size()];
      std::vector<int32_t> scan, heap, dispatch;
      byte_pair_encode_scan(t.table, t.byte_rank, piece, scan);
      byte_pair_encode_heap(t.table, t.byte_rank, piece, heap);
      byte_pair_encode(t.table, t.byte_rank, piece, dispatch);
      const std::vector<int32_t> naive = naive_merge(t.table, piece);
      ASSERT_EQ(scan, naive) << "len " << len;
      ASSERT_EQ(heap, naive) << "len " << len;
      ASSERT_EQ(dispatch, naive) << "len " << len;
      std::string joined;  // the tokens spell the piece
      for (int32_t id : naive) {
        ASSERT_NE(id, kNoRank);
        joined += t.bytes[static_cast<size_t>(id)];
      }
      ASSERT_EQ(joined, piece);
    }
  }
}

TEST(BytePairMerge, MergesFrequentWords) {
  const Table t = tiny_table();
  std::vector<int32_t> ids;
  byte_pair_encode(t.table, t.byte_rank, " the", ids);
  EXPECT_EQ(ids.size(), 1u) << "' the' is frequent in the training text and must be one token";
}

}  // namespace
}  // namespace k3::tokenizer
