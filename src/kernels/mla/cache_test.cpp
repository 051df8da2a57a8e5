// kernels/mla/cache_test.cpp: MLA cache write and read-back for f32 and f8_e4m3 caches (spec §6.3).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/fp8.h"
#include "core/rng.h"
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_internal.h"

namespace k3::kernels {
namespace {

struct Entries {
  core::Tensor c_n, k_pe;  // f32 [T, kv_lora], [T, rope]
};

Entries random_entries(int64_t T, int64_t kv_lora, int64_t rope, double std, uint64_t seed) {
  core::Rng rng(seed);
  Entries e{core::Tensor::zeros(core::DType::f32, {T, kv_lora}),
            core::Tensor::zeros(core::DType::f32, {T, rope})};
  for (float& x : e.c_n.span<float>()) x = static_cast<float>(rng.normal(0.0, std));
  for (float& x : e.k_pe.span<float>()) x = static_cast<float>(rng.normal(0.0, std));
  return e;
}

// The value entry t is meant to hold at column i: c_n then k_pe.
float entry_value(const Entries& e, int64_t t, int64_t i) {
  const int64_t kv_lora = e.c_n.dim(1), rope = e.k_pe.dim(1);
  return i < kv_lora ? e.c_n.data<float>()[t * kv_lora + i] : e.k_pe.data<float>()[t * rope + i - kv_lora];
}

// Writes T entries into rows [first, first + T) of a NaN-poisoned cache of `capacity` rows, so
// the test also sees that the write stays inside its rows.
void write_rows(const Entries& e, core::Tensor& cache, int64_t first, float k_scale) {
  const int64_t T = e.c_n.dim(0), width = cache.dim(1);
  const size_t esize = core::dtype_size(cache.dtype());
  MlaCacheWriteArgs a;
  a.c_n = e.c_n.view();
  a.k_pe = e.k_pe.view();
  a.dst = core::TensorView::contiguous(static_cast<char*>(cache.view().data) + first * width * esize,
                                       cache.dtype(), {T, width});
  a.k_scale = k_scale;
  ASSERT_TRUE(mla_cache_write_check(a).is_ok()) << mla_cache_write_check(a).reason();
  mla_cache_write_reference(a);
}

core::Tensor poisoned_cache(core::DType dtype, int64_t capacity, int64_t width) {
  core::Tensor c = core::Tensor::zeros(dtype, {capacity, width});
  if (dtype == core::DType::f32)
    for (float& x : c.span<float>()) x = std::numeric_limits<float>::quiet_NaN();
  else
    std::memset(c.view().data, 0x7f, static_cast<size_t>(c.nbytes()));  // E4M3 NaN code
  return c;
}

TEST(MlaCache, F32StoresValuesAsGivenInItsRowsOnly) {
  for (auto [T, kv_lora, rope] : {std::tuple<int64_t, int64_t, int64_t>{17, 37, 9}, {3, 512, 64}}) {
    const Entries e = random_entries(T, kv_lora, rope, 1.0, 11 + T);
    const int64_t width = kv_lora + rope, first = 5, capacity = T + 8;
    core::Tensor cache = poisoned_cache(core::DType::f32, capacity, width);
    write_rows(e, cache, first, /*k_scale=*/0.37f);  // k_scale must not touch an f32 cache
    for (int64_t r = 0; r < capacity; ++r)
      for (int64_t i = 0; i < width; ++i) {
        const float got = cache.data<float>()[r * width + i];
        if (r < first || r >= first + T) {
          ASSERT_TRUE(std::isnan(got)) << "row " << r << " outside the written rows was touched";
        } else {
          ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(entry_value(e, r - first, i)))
              << "row " << r << " col " << i;
        }
      }
    // Reading back the written rows gives the same values, split into c_n and k_pe.
    const core::TensorView rows = core::TensorView::contiguous(cache.data<float>() + first * width,
                                                               core::DType::f32, {T, width});
    const auto read = mla_detail::dequantize_cache(rows, 0.37f, kv_lora, rope);
    ASSERT_EQ(read.positions, T);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < kv_lora; ++i) ASSERT_EQ(read.c_n_row(t)[i], entry_value(e, t, i));
      for (int64_t r = 0; r < rope; ++r) ASSERT_EQ(read.k_pe_row(t)[r], entry_value(e, t, kv_lora + r));
    }
  }
}

TEST(MlaCache, Fp8StoresScaledCodesAndReadsBackTimesKScale) {
  const int64_t T = 17, kv_lora = 54, rope = 64, width = kv_lora + rope;
  const float k_scale = 0.37f;
  const Entries e = random_entries(T, kv_lora, rope, 3.0, 21);
  core::Tensor cache = poisoned_cache(core::DType::f8_e4m3, T + 2, width);
  write_rows(e, cache, 1, k_scale);
  const uint8_t* codes = cache.data<uint8_t>();
  for (int64_t i = 0; i < width; ++i) {  // rows 0 and T+1 untouched
    ASSERT_EQ(codes[i], 0x7f);
    ASSERT_EQ(codes[(T + 1) * width + i], 0x7f);
  }
  const core::TensorView rows = core::TensorView::contiguous(cache.data<uint8_t>() + width,
                                                             core::DType::f8_e4m3, {T, width});
  const auto read = mla_detail::dequantize_cache(rows, k_scale, kv_lora, rope);
  int64_t differs_from_unscaled = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < width; ++i) {
      const float x = entry_value(e, t, i);
      const uint8_t code = codes[(t + 1) * width + i];
      ASSERT_EQ(code, core::f32_to_fp8_e4m3(x / k_scale)) << "t " << t << " col " << i;
      differs_from_unscaled += code != core::f32_to_fp8_e4m3(x);
      const float back = i < kv_lora ? read.c_n_row(t)[i] : read.k_pe_row(t)[i - kv_lora];
      ASSERT_EQ(back, core::fp8_e4m3_to_f32(code) * k_scale);
      // E4M3 keeps 3 mantissa bits: round-to-nearest error <= 2^-4 relative (normal range),
      // <= half the 2^-9 subnormal step (times k_scale) below it.
      EXPECT_LE(std::fabs(back - x), std::max(0x1p-4f * std::fabs(x), 0x1p-10f * k_scale) * 1.0001f)
          << "x " << x;
    }
  EXPECT_GT(differs_from_unscaled, T * width / 2) << "k_scale seems ignored";
}

TEST(MlaCache, Fp8SaturatesAtMaxTimesKScale) {
  const float k_scale = 2.5f, inf = std::numeric_limits<float>::infinity();
  const float limit = core::kFp8E4m3Max * k_scale;  // 1120
  // Inputs and the values they must read back as.
  const std::vector<std::pair<float, float>> cases = {
      {limit, limit},          {-limit, -limit},       {limit * 1.01f, limit}, {-limit * 1.5f, -limit},
      {1e6f, limit},           {-1e30f, -limit},       {inf, limit},           {-inf, -limit},
      {416.0f * k_scale, 416.0f * k_scale},            {0.0f, 0.0f},           {k_scale, k_scale},
      {0x1p-9f * k_scale, 0x1p-9f * k_scale}};  // the smallest subnormal survives
  const int64_t kv_lora = 7, rope = static_cast<int64_t>(cases.size()) - kv_lora;
  Entries e{core::Tensor::zeros(core::DType::f32, {1, kv_lora}), core::Tensor::zeros(core::DType::f32, {1, rope})};
  for (int64_t i = 0; i < kv_lora + rope; ++i)
    (i < kv_lora ? e.c_n.data<float>()[i] : e.k_pe.data<float>()[i - kv_lora]) = cases[i].first;
  core::Tensor cache = poisoned_cache(core::DType::f8_e4m3, 1, kv_lora + rope);
  write_rows(e, cache, 0, k_scale);
  const auto read = mla_detail::dequantize_cache(cache.view(), k_scale, kv_lora, rope);
  for (int64_t i = 0; i < kv_lora + rope; ++i) {
    const float back = i < kv_lora ? read.c_n_row(0)[i] : read.k_pe_row(0)[i - kv_lora];
    EXPECT_EQ(back, cases[i].second) << "input " << cases[i].first;
  }
}

TEST(MlaCache, EmptyWriteIsANoOp) {
  MlaCacheWriteArgs a;
  core::Tensor dst = core::Tensor::zeros(core::DType::f8_e4m3, {0, 576});
  a.c_n = core::TensorView::contiguous(nullptr, core::DType::f32, {0, 512});
  a.k_pe = core::TensorView::contiguous(nullptr, core::DType::f32, {0, 64});
  a.dst = dst.view();
  EXPECT_TRUE(mla_cache_write_check(a).is_ok()) << mla_cache_write_check(a).reason();
  mla_cache_write_reference(a);
}

}  // namespace
}  // namespace k3::kernels
