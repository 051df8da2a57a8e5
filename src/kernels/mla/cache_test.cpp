// kernels/mla/cache_test.cpp: MLA cache write into pages through cache_rows, and read-back, for f32 and
// f8_e4m3 caches (spec §6.3).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "core/fp8.h"
#include "core/rng.h"
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_internal.h"
#include "kernels/mla/mla_test_util.h"

namespace k3::kernels {
namespace {

struct Entries {
  core::Tensor c_n, k_pe;  // f32 [T, kv_lora], [T, rope]
};

Entries random_entries(int64_t T, int64_t kv_lora, int64_t rope, double std, uint64_t seed) {
  core::Rng rng(seed);
  Entries e{core::Tensor::zeros(core::DType::f32, {T, kv_lora}), core::Tensor::zeros(core::DType::f32, {T, rope})};
  for (float& x : e.c_n.span<float>()) x = static_cast<float>(rng.normal(0.0, std));
  for (float& x : e.k_pe.span<float>()) x = static_cast<float>(rng.normal(0.0, std));
  return e;
}

// The value entry t is meant to hold at column i: c_n then k_pe.
float entry_value(const Entries& e, int64_t t, int64_t i) {
  const int64_t kv_lora = e.c_n.dim(1), rope = e.k_pe.dim(1);
  return i < kv_lora ? e.c_n.data<float>()[t * kv_lora + i] : e.k_pe.data<float>()[t * rope + i - kv_lora];
}

// Where a sequence's T entries go: positions 0 .. T-1 in pages of block_size tokens with shuffled
// ids, inside a pool with spare pages, so a write outside its rows shows up in the spare pages.
struct Layout {
  int64_t block_size = 0, num_blocks = 0;
  std::vector<int32_t> table;  // page of position j = table[j / block_size]
  std::vector<int32_t> rows;   // cache row of position j
  Layout(int64_t T, int64_t bs, uint64_t seed) : block_size(bs) {
    core::Rng rng(seed);
    const int64_t blocks = (T + bs - 1) / bs;
    num_blocks = blocks + 3;
    table = mla_test::shuffled_ids(num_blocks, rng);
    table.resize(static_cast<size_t>(blocks));
    for (int64_t j = 0; j < T; ++j)
      rows.push_back(table[j / bs] * static_cast<int32_t>(bs) + static_cast<int32_t>(j % bs));
  }
};

// Writes the entries through the layout's cache rows (one call) into a poisoned pages tensor.
void write_rows(const Entries& e, core::Tensor& pages, const std::vector<int32_t>& rows, float k_scale) {
  const core::Tensor cache_rows = mla_test::i32_tensor(rows);
  MlaCacheWriteArgs a;
  a.c_n = e.c_n.view();
  a.k_pe = e.k_pe.view();
  a.dst = pages.view();
  a.cache_rows = cache_rows.view();
  a.k_scale = k_scale;
  ASSERT_TRUE(mla_cache_write_check(a).is_ok()) << mla_cache_write_check(a).reason();
  mla_cache_write_reference(a);
}

// The position written to each cache row (-1: none).
std::vector<int64_t> position_of_row(const Layout& l, int64_t capacity) {
  std::vector<int64_t> pos(static_cast<size_t>(capacity), -1);
  for (size_t j = 0; j < l.rows.size(); ++j) pos[l.rows[j]] = static_cast<int64_t>(j);
  return pos;
}

TEST(MlaCache, F32StoresValuesAsGivenInItsRowsOnly) {
  for (auto [T, kv_lora, rope, bs] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t>{17, 37, 9, 5}, {3, 512, 64, 16}, {40, 54, 64, 7}}) {
    const Entries e = random_entries(T, kv_lora, rope, 1.0, 11 + T);
    const int64_t width = kv_lora + rope;
    const Layout l(T, bs, 90 + T);
    core::Tensor pages = mla_test::poisoned_pages(core::DType::f32, l.num_blocks, bs, width);
    write_rows(e, pages, l.rows, /*k_scale=*/0.37f);  // k_scale must not touch an f32 cache
    const std::vector<int64_t> pos = position_of_row(l, l.num_blocks * bs);
    for (int64_t r = 0; r < l.num_blocks * bs; ++r)
      for (int64_t i = 0; i < width; ++i) {
        const float got = pages.data<float>()[r * width + i];
        if (pos[r] < 0) {
          ASSERT_TRUE(std::isnan(got)) << "cache row " << r << " outside the written rows was touched";
        } else {
          ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(entry_value(e, pos[r], i)))
              << "row " << r << " col " << i;
        }
      }
    // Reading the sequence back through its block table gives the values in position order.
    const auto read = mla_detail::dequantize_sequence(pages.view(), l.table.data(), T, 0.37f, kv_lora, rope);
    ASSERT_EQ(read.positions, T);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < kv_lora; ++i) ASSERT_EQ(read.c_n_row(t)[i], entry_value(e, t, i));
      for (int64_t r = 0; r < rope; ++r) ASSERT_EQ(read.k_pe_row(t)[r], entry_value(e, t, kv_lora + r));
    }
  }
}

TEST(MlaCache, Fp8StoresScaledCodesAndReadsBackTimesKScale) {
  const int64_t T = 17, kv_lora = 54, rope = 64, width = kv_lora + rope, bs = 4;
  const float k_scale = 0.37f;
  const Entries e = random_entries(T, kv_lora, rope, 3.0, 21);
  const Layout l(T, bs, 22);
  core::Tensor pages = mla_test::poisoned_pages(core::DType::f8_e4m3, l.num_blocks, bs, width);
  write_rows(e, pages, l.rows, k_scale);
  const uint8_t* codes = pages.data<uint8_t>();
  const std::vector<int64_t> pos = position_of_row(l, l.num_blocks * bs);
  for (int64_t r = 0; r < l.num_blocks * bs; ++r)  // rows of no position untouched
    if (pos[r] < 0) {
      for (int64_t i = 0; i < width; ++i) ASSERT_EQ(codes[r * width + i], 0x7f) << "cache row " << r;
    }
  const auto read = mla_detail::dequantize_sequence(pages.view(), l.table.data(), T, k_scale, kv_lora, rope);
  int64_t differs_from_unscaled = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < width; ++i) {
      const float x = entry_value(e, t, i);
      const uint8_t code = codes[l.rows[t] * width + i];
      ASSERT_EQ(code, core::f32_to_fp8_e4m3(x / k_scale)) << "t " << t << " col " << i;
      differs_from_unscaled += code != core::f32_to_fp8_e4m3(x);
      const float back = i < kv_lora ? read.c_n_row(t)[i] : read.k_pe_row(t)[i - kv_lora];
      ASSERT_EQ(back, core::fp8_e4m3_to_f32(code) * k_scale);
      // E4M3 keeps 3 mantissa bits: round-to-nearest error <= 2^-4 relative (normal range),
      // <= half the 2^-9 subnormal step (times k_scale) below it.
      EXPECT_LE(std::fabs(back - x), std::max(0x1p-4f * std::fabs(x), 0x1p-10f * k_scale) * 1.0001f) << "x " << x;
    }
  EXPECT_GT(differs_from_unscaled, T * width / 2) << "k_scale seems ignored";
}

// Rows go wherever cache_rows says, in any order, and -1 rows (padding) are skipped.
TEST(MlaCache, RowsInAnyOrderAndPaddingRowsSkipped) {
  const int64_t T = 9, kv_lora = 13, rope = 5, width = kv_lora + rope, bs = 7;
  const Entries e = random_entries(T, kv_lora, rope, 1.0, 31);
  const std::vector<int32_t> rows = {20, -1, 3, 0, 13, -1, 27, 6, 14};  // 4 pages of 7 = 28 rows
  core::Tensor pages = mla_test::poisoned_pages(core::DType::f32, 4, bs, width);
  write_rows(e, pages, rows, 1.0f);
  for (int64_t r = 0; r < 4 * bs; ++r) {
    const auto it = std::find(rows.begin(), rows.end(), static_cast<int32_t>(r));
    for (int64_t i = 0; i < width; ++i) {
      const float got = pages.data<float>()[r * width + i];
      if (it == rows.end()) ASSERT_TRUE(std::isnan(got)) << "cache row " << r;
      else ASSERT_EQ(got, entry_value(e, it - rows.begin(), i)) << "cache row " << r << " col " << i;
    }
  }
}

TEST(MlaCache, Fp8SaturatesAtMaxTimesKScale) {
  const float k_scale = 2.5f, inf = std::numeric_limits<float>::infinity();
  const float limit = core::kFp8E4m3Max * k_scale;  // 1120
  // Inputs and the values they must read back as.
  const std::vector<std::pair<float, float>> cases = {{limit, limit},
                                                      {-limit, -limit},
                                                      {limit * 1.01f, limit},
                                                      {-limit * 1.5f, -limit},
                                                      {1e6f, limit},
                                                      {-1e30f, -limit},
                                                      {inf, limit},
                                                      {-inf, -limit},
                                                      {416.0f * k_scale, 416.0f * k_scale},
                                                      {0.0f, 0.0f},
                                                      {k_scale, k_scale},
                                                      {0x1p-9f * k_scale,
                                                       0x1p-9f * k_scale}};  // the smallest subnormal survives
  const int64_t kv_lora = 7, rope = static_cast<int64_t>(cases.size()) - kv_lora;
  Entries e{core::Tensor::zeros(core::DType::f32, {1, kv_lora}), core::Tensor::zeros(core::DType::f32, {1, rope})};
  for (int64_t i = 0; i < kv_lora + rope; ++i)
    (i < kv_lora ? e.c_n.data<float>()[i] : e.k_pe.data<float>()[i - kv_lora]) = cases[i].first;
  core::Tensor pages = mla_test::poisoned_pages(core::DType::f8_e4m3, 1, 1, kv_lora + rope);
  write_rows(e, pages, {0}, k_scale);
  const int32_t table[] = {0};
  const auto read = mla_detail::dequantize_sequence(pages.view(), table, 1, k_scale, kv_lora, rope);
  for (int64_t i = 0; i < kv_lora + rope; ++i) {
    const float back = i < kv_lora ? read.c_n_row(0)[i] : read.k_pe_row(0)[i - kv_lora];
    EXPECT_EQ(back, cases[i].second) << "input " << cases[i].first;
  }
}

TEST(MlaCache, EmptyWriteIsANoOp) {
  MlaCacheWriteArgs a;
  core::Tensor dst = mla_test::poisoned_pages(core::DType::f8_e4m3, 2, 16, 576);
  a.c_n = core::TensorView::contiguous(nullptr, core::DType::f32, {0, 512});
  a.k_pe = core::TensorView::contiguous(nullptr, core::DType::f32, {0, 64});
  a.cache_rows = core::TensorView::contiguous(nullptr, core::DType::i32, {0});
  a.dst = dst.view();
  EXPECT_TRUE(mla_cache_write_check(a).is_ok()) << mla_cache_write_check(a).reason();
  mla_cache_write_reference(a);
  for (uint8_t code : dst.span<const uint8_t>()) ASSERT_EQ(code, 0x7f);
}

}  // namespace
}  // namespace k3::kernels
