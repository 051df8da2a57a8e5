// kernels/mla/check_test.cpp: MLA argument checks reject bad input and name the bad argument.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "kernels/mla/mla.h"
#include "kernels/mla/mla_test_util.h"

namespace k3::kernels {
namespace {

using mla_test::MlaProblem;

// Applies `edit` to valid args and expects the check to fail with a reason containing `word`,
// and both reference forms to throw core::Error rather than run.
void expect_attention_rejects(const std::function<void(MlaAttentionArgs&)>& edit, const std::string& word) {
  const MlaProblem p({2, 5, 3, 4, 9}, 6, 2, core::DType::f8_e4m3, core::DType::bf16, 1.0f, 1);
  const core::Tensor out = mla_test::nan_filled({p.T, 2 * 4});
  MlaAttentionArgs a = p.args(out, Precision::bf16, p.default_scale());
  ASSERT_TRUE(mla_attention_check(a).is_ok()) << mla_attention_check(a).reason();
  edit(a);
  const core::Status st = mla_attention_check(a);
  ASSERT_FALSE(st.is_ok()) << "expected a failure naming " << word;
  EXPECT_NE(st.reason().find(word), std::string::npos) << st.reason();
  EXPECT_THROW(mla_naive_reference(a), core::Error);
  EXPECT_THROW(mla_absorbed_reference(a), core::Error);
}

TEST(MlaCheck, AttentionRejectsBadArguments) {
  static const core::Tensor q_bf16 = core::Tensor::zeros(core::DType::bf16, {2, 16});
  static const core::Tensor q_narrow = core::Tensor::zeros(core::DType::f32, {2, 15});
  static const core::Tensor cache_bf16 = core::Tensor::zeros(core::DType::bf16, {6, 12});
  static const core::Tensor cache_wide = core::Tensor::zeros(core::DType::f32, {6, 13});
  static const core::Tensor cache_short = core::Tensor::zeros(core::DType::f32, {1, 12});
  static const core::Tensor out_short = core::Tensor::zeros(core::DType::f32, {1, 8});
  static const core::Tensor out_wide = core::Tensor::zeros(core::DType::f32, {2, 9});
  static LinearWeight kv_b_rows, kv_b_cols, kv_b_fp8;
  kv_b_rows.weight = core::Tensor::zeros(core::DType::bf16, {17, 9});
  kv_b_cols.weight = core::Tensor::zeros(core::DType::bf16, {18, 10});
  kv_b_fp8.weight = core::Tensor::zeros(core::DType::f8_e4m3, {18, 9});

  expect_attention_rejects([](auto& a) { a.q = q_bf16.view(); }, "q must be f32");
  expect_attention_rejects([](auto& a) { a.q = q_narrow.view(); }, "q must be");
  expect_attention_rejects([](auto& a) { a.cache = cache_bf16.view(); }, "cache must be f32 or f8_e4m3");
  expect_attention_rejects([](auto& a) { a.cache = cache_wide.view(); }, "cache must be [S, kv_lora + qk_rope]");
  expect_attention_rejects([](auto& a) { a.cache = cache_short.view(); }, "S >= T");
  expect_attention_rejects([](auto& a) { a.kv_b = nullptr; }, "kv_b is missing");
  expect_attention_rejects([](auto& a) { a.kv_b = &kv_b_rows; }, "kv_b must be contiguous");
  expect_attention_rejects([](auto& a) { a.kv_b = &kv_b_cols; }, "kv_b must be contiguous");
  expect_attention_rejects([](auto& a) { a.kv_b = &kv_b_fp8; }, "kv_b must be a dense bf16 or f32");
  expect_attention_rejects([](auto& a) { a.out = out_short.view(); }, "out must be");
  expect_attention_rejects([](auto& a) { a.out = out_wide.view(); }, "out must be");
  expect_attention_rejects([](auto& a) { a.scale = 0.0f; }, "scale must be");
  expect_attention_rejects([](auto& a) { a.scale = -0.1f; }, "scale must be");
  expect_attention_rejects([](auto& a) { a.k_scale = 0.0f; }, "k_scale must be");
  expect_attention_rejects([](auto& a) { a.num_heads = 0; }, "num_heads");
  expect_attention_rejects([](auto& a) { a.qk_rope = 4; }, "q must be");  // q width no longer matches
}

void expect_cache_write_rejects(const std::function<void(MlaCacheWriteArgs&)>& edit, const std::string& word) {
  static const core::Tensor c_n = core::Tensor::zeros(core::DType::f32, {3, 8});
  static const core::Tensor k_pe = core::Tensor::zeros(core::DType::f32, {3, 4});
  static const core::Tensor dst = core::Tensor::zeros(core::DType::f8_e4m3, {3, 12});
  MlaCacheWriteArgs a;
  a.c_n = c_n.view();
  a.k_pe = k_pe.view();
  a.dst = dst.view();
  a.k_scale = 0.5f;
  ASSERT_TRUE(mla_cache_write_check(a).is_ok()) << mla_cache_write_check(a).reason();
  edit(a);
  const core::Status st = mla_cache_write_check(a);
  ASSERT_FALSE(st.is_ok()) << "expected a failure naming " << word;
  EXPECT_NE(st.reason().find(word), std::string::npos) << st.reason();
  EXPECT_THROW(mla_cache_write_reference(a), core::Error);
}

TEST(MlaCheck, CacheWriteRejectsBadArguments) {
  static const core::Tensor bf16_rows = core::Tensor::zeros(core::DType::bf16, {3, 12});
  static const core::Tensor f32_narrow = core::Tensor::zeros(core::DType::f32, {3, 11});
  static const core::Tensor f32_two_rows = core::Tensor::zeros(core::DType::f32, {2, 4});
  static const core::Tensor c_n_bf16 = core::Tensor::zeros(core::DType::bf16, {3, 8});
  expect_cache_write_rejects([](auto& a) { a.dst = bf16_rows.view(); }, "dst must be f32 or f8_e4m3");
  expect_cache_write_rejects([](auto& a) { a.dst = f32_narrow.view(); }, "dst must be [T, kv_lora + rope]");
  expect_cache_write_rejects([](auto& a) { a.k_pe = f32_two_rows.view(); }, "k_pe must be");
  expect_cache_write_rejects([](auto& a) { a.c_n = c_n_bf16.view(); }, "c_n must be f32");
  expect_cache_write_rejects([](auto& a) { a.k_scale = 0.0f; }, "k_scale must be");
  expect_cache_write_rejects([](auto& a) { a.k_scale = std::numeric_limits<float>::infinity(); }, "k_scale");
}

}  // namespace
}  // namespace k3::kernels
