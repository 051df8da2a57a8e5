// kernels/embedding/embedding_test.cpp: lookup copies rows exactly; bad ids and shapes fail;
// vocab-parallel slices give their rows and zeros elsewhere, and their sum over the slices is the
// full lookup.
#include "kernels/embedding/embedding.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "core/rng.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Tensor random_table(DType dt, int64_t V, int64_t D, uint64_t seed) {
  core::Rng rng(seed);
  Tensor t = Tensor::zeros(dt, {V, D});
  for (int64_t i = 0; i < V * D; ++i) {
    const float v = static_cast<float>(rng.normal());
    if (dt == DType::bf16) t.data<uint16_t>()[i] = core::f32_to_bf16_bits(v);
    else t.data<float>()[i] = v;
  }
  return t;
}

Tensor random_ids(int64_t T, int64_t V, uint64_t seed) {
  core::Rng rng(seed);
  Tensor ids = Tensor::zeros(DType::i32, {T});
  for (int64_t t = 0; t < T; ++t) ids.data<int32_t>()[t] = static_cast<int32_t>(rng.next_u64() % V);
  return ids;
}

Tensor poisoned(int64_t T, int64_t D) {
  Tensor out = Tensor::zeros(DType::f32, {T, D});
  for (float& v : out.span<float>()) v = kNaN;
  return out;
}

float table_at(const Tensor& table, int64_t r, int64_t c) {
  const int64_t i = r * table.dim(1) + c;
  return table.dtype() == DType::bf16 ? core::bf16_bits_to_f32(table.data<uint16_t>()[i]) : table.data<float>()[i];
}

TEST(Embedding, CopiesRowsExactlyOnOddShapes) {
  for (DType dt : {DType::bf16, DType::f32}) {
    for (int64_t T : {1, 17, 54, 97}) {
      for (int64_t D : {96, 257}) {
        const int64_t V = 301;
        Tensor table = random_table(dt, V, D, 11 + T + D);
        Tensor ids = random_ids(T, V, 7 * T);
        Tensor out = poisoned(T, D);
        EmbeddingArgs a{ids.view(), table.view(), out.view()};
        ASSERT_TRUE(embedding_check(a)) << embedding_check(a).reason();
        embedding_reference(a);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < D; ++d) {
            const float want = table_at(table, ids.data<int32_t>()[t], d);
            ASSERT_EQ(std::bit_cast<uint32_t>(out.data<float>()[t * D + d]), std::bit_cast<uint32_t>(want))
                << "t=" << t << " d=" << d;
          }
      }
    }
  }
}

TEST(Embedding, K3HiddenWidthWithBoundaryIds) {
  // Real hidden width 7168; ids at both ends of the table catch off-by-one row offsets.
  const int64_t V = 40, D = 7168;
  Tensor table = random_table(DType::bf16, V, D, 3);
  Tensor ids = Tensor::zeros(DType::i32, {3});
  ids.data<int32_t>()[0] = 0;
  ids.data<int32_t>()[1] = V - 1;
  ids.data<int32_t>()[2] = 17;
  Tensor out = poisoned(3, D);
  EmbeddingArgs a{ids.view(), table.view(), out.view()};
  ASSERT_TRUE(embedding_check(a));
  embedding_reference(a);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t d = 0; d < D; ++d) ASSERT_EQ(out.data<float>()[t * D + d], table_at(table, ids.data<int32_t>()[t], d));
}

TEST(Embedding, OutOfRangeIdFailsNamingIdAndVocab) {
  const int64_t V = 50, D = 8;
  Tensor table = random_table(DType::bf16, V, D, 1);
  Tensor out = poisoned(3, D);
  for (int32_t bad : {50, 1000, -1}) {
    Tensor ids = Tensor::zeros(DType::i32, {3});
    ids.data<int32_t>()[2] = bad;
    core::Status s = embedding_check({ids.view(), table.view(), out.view()});
    ASSERT_FALSE(s);
    EXPECT_NE(s.reason().find(std::to_string(bad)), std::string::npos) << s.reason();
    EXPECT_NE(s.reason().find("50"), std::string::npos) << s.reason();
    EXPECT_NE(s.reason().find("position 2"), std::string::npos) << s.reason();
  }
}

TEST(Embedding, BadShapesAndDtypesFail) {
  Tensor table = random_table(DType::bf16, 10, 8, 1);
  Tensor ids = random_ids(4, 10, 2);
  Tensor out_wrong_d = poisoned(4, 9);
  Tensor out_wrong_t = poisoned(3, 8);
  Tensor ids_i64 = Tensor::zeros(DType::i64, {4});
  Tensor out_ok = poisoned(4, 8);
  Tensor table_u8 = Tensor::zeros(DType::u8, {10, 8});
  EXPECT_FALSE(embedding_check({ids.view(), table.view(), out_wrong_d.view()}));
  EXPECT_FALSE(embedding_check({ids.view(), table.view(), out_wrong_t.view()}));
  core::Status s = embedding_check({ids_i64.view(), table.view(), out_ok.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("ids"), std::string::npos);
  s = embedding_check({ids.view(), table_u8.view(), out_ok.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("table"), std::string::npos);
}

// Vocab-parallel (spec §11): each of n slices returns its own rows and zero rows for ids held by
// another slice, so the sum over the slices (what the all-reduce computes) is the full lookup.
TEST(Embedding, VocabSlicesGiveTheirRowsAndZerosElsewhere) {
  for (int n : {2, 4, 8}) {
    for (int64_t T : {1, 17, 97}) {
      const int64_t V = 8 * 13, D = 33, slice = V / n;
      Tensor table = random_table(DType::bf16, V, D, 100 + n + T);
      Tensor ids = random_ids(T, V, 5 * T + n);
      ids.data<int32_t>()[0] = static_cast<int32_t>(V - 1);             // the last row of the last slice
      if (T > 1) ids.data<int32_t>()[1] = static_cast<int32_t>(slice);  // the first row of slice 1
      Tensor sum = Tensor::zeros(DType::f32, {T, D});
      for (int r = 0; r < n; ++r) {
        // The slice is a row view of the full table (as the checkpoint loader makes it).
        core::TensorView part = table.view();
        part.data = table.data<uint16_t>() + r * slice * D;
        part.shape = core::Shape{slice, D};
        Tensor out = poisoned(T, D);
        EmbeddingArgs a{ids.view(), part, out.view(), r * slice, V};
        ASSERT_TRUE(embedding_check(a)) << embedding_check(a).reason();
        embedding_reference(a);
        for (int64_t t = 0; t < T; ++t) {
          const int32_t id = ids.data<int32_t>()[t];
          const bool mine = id >= r * slice && id < (r + 1) * slice;
          for (int64_t d = 0; d < D; ++d) {
            const float got = out.data<float>()[t * D + d];
            ASSERT_EQ(got, mine ? table_at(table, id, d) : 0.0f) << "slice " << r << " t=" << t << " d=" << d;
            sum.data<float>()[t * D + d] += got;
          }
        }
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d)
          ASSERT_EQ(sum.data<float>()[t * D + d], table_at(table, ids.data<int32_t>()[t], d)) << "n=" << n;
    }
  }
}

TEST(Embedding, VocabSliceChecksTheFullVocabularyAndTheSliceRange) {
  const int64_t V = 40, D = 8;
  Tensor table = random_table(DType::bf16, V / 4, D, 9);  // one of 4 slices
  Tensor out = poisoned(2, D);
  Tensor ids = Tensor::zeros(DType::i32, {2});
  ids.data<int32_t>()[0] = 35;  // outside the slice but inside the vocabulary: fine
  ids.data<int32_t>()[1] = 3;
  EXPECT_TRUE(embedding_check({ids.view(), table.view(), out.view(), 10, V}));
  ids.data<int32_t>()[1] = 40;  // outside the vocabulary
  core::Status s = embedding_check({ids.view(), table.view(), out.view(), 10, V});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("token id 40"), std::string::npos) << s.reason();
  EXPECT_NE(s.reason().find("size 40"), std::string::npos) << s.reason();
  ids.data<int32_t>()[1] = 0;
  for (auto [begin, vocab] : {std::pair<int64_t, int64_t>{31, 40}, {-1, 40}, {5, 0}}) {
    s = embedding_check({ids.view(), table.view(), out.view(), begin, vocab});
    ASSERT_FALSE(s) << begin << " " << vocab;
    EXPECT_NE(s.reason().find("vocab_begin " + std::to_string(begin)), std::string::npos) << s.reason();
  }
}

}  // namespace
}  // namespace k3::kernels
