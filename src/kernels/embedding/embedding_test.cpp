// kernels/embedding/embedding_test.cpp: lookup copies rows exactly; bad ids and shapes fail.
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
    if (dt == DType::bf16)
      t.data<uint16_t>()[i] = core::f32_to_bf16_bits(v);
    else
      t.data<float>()[i] = v;
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
  return table.dtype() == DType::bf16 ? core::bf16_bits_to_f32(table.data<uint16_t>()[i])
                                      : table.data<float>()[i];
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
            ASSERT_EQ(std::bit_cast<uint32_t>(out.data<float>()[t * D + d]),
                      std::bit_cast<uint32_t>(want))
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
    for (int64_t d = 0; d < D; ++d)
      ASSERT_EQ(out.data<float>()[t * D + d], table_at(table, ids.data<int32_t>()[t], d));
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

}  // namespace
}  // namespace k3::kernels
