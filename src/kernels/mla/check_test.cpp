// kernels/mla/check_test.cpp: MLA argument checks reject bad input (shapes, dtypes, sequence tables,
// cache rows) and name the bad argument.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "kernels/mla/mla.h"
#include "kernels/mla/mla_test_util.h"

namespace k3::kernels {
namespace {

using mla_test::i32_tensor;
using mla_test::MlaProblem;

// The base problem: 2 queries at positions 4, 5 over a 6-token cache in one page of 16 (4 pages,
// table [1, 3] = {page, -1, -1}).
const MlaProblem& base_problem() {
  static const MlaProblem p({2, 5, 3, 4, 9}, 6, 2, core::DType::f8_e4m3, core::DType::bf16, 1.0f, 1);
  return p;
}

// Applies `edit` to valid args and expects the check to fail with a reason containing `word`,
// and both reference forms to throw core::Error rather than run.
void expect_attention_rejects(const std::function<void(MlaAttentionArgs&)>& edit, const std::string& word) {
  const MlaProblem& p = base_problem();
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
  static const core::Tensor pages_bf16 = core::Tensor::zeros(core::DType::bf16, {4, 16, 12});
  static const core::Tensor pages_wide = core::Tensor::zeros(core::DType::f32, {4, 16, 13});
  static const core::Tensor pages_rank2 = core::Tensor::zeros(core::DType::f32, {64, 12});
  static const core::Tensor out_short = core::Tensor::zeros(core::DType::f32, {1, 8});
  static const core::Tensor out_wide = core::Tensor::zeros(core::DType::f32, {2, 9});
  static LinearWeight kv_b_rows, kv_b_cols, kv_b_fp8;
  kv_b_rows.weight = core::Tensor::zeros(core::DType::bf16, {17, 9});
  kv_b_cols.weight = core::Tensor::zeros(core::DType::bf16, {18, 10});
  kv_b_fp8.weight = core::Tensor::zeros(core::DType::f8_e4m3, {18, 9});

  expect_attention_rejects([](auto& a) { a.q = q_bf16.view(); }, "q must be f32");
  expect_attention_rejects([](auto& a) { a.q = q_narrow.view(); }, "q must be");
  expect_attention_rejects([](auto& a) { a.pages = pages_bf16.view(); }, "pages must be f32 or f8_e4m3");
  expect_attention_rejects([](auto& a) { a.pages = pages_wide.view(); }, "pages must be [num_blocks");
  expect_attention_rejects([](auto& a) { a.pages = pages_rank2.view(); }, "pages must be [num_blocks");
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

// Shapes and dtypes of the sequence tables, and the limits on their host integers.
TEST(MlaCheck, AttentionRejectsBadTableShapes) {
  static const core::Tensor f32_one = core::Tensor::zeros(core::DType::f32, {1});
  static const core::Tensor i32_two = i32_tensor({0, 0});
  static const core::Tensor table_rank1 = i32_tensor({0, -1, -1});
  expect_attention_rejects([](auto& a) { a.seqs.num_seqs = -1; }, "seqs.num_seqs");
  expect_attention_rejects([](auto& a) { a.seqs.row_begin = f32_one.view(); }, "seqs.row_begin must be a dense i32");
  expect_attention_rejects([](auto& a) { a.seqs.num_rows = i32_two.view(); }, "seqs.num_rows must be a dense i32");
  expect_attention_rejects([](auto& a) { a.seqs.position = core::TensorView{}; }, "seqs.position must be");
  expect_attention_rejects([](auto& a) { a.seqs.block_table = table_rank1.view(); }, "seqs.block_table must be i32");
  expect_attention_rejects([](auto& a) { a.seqs.max_rows = 0; }, "seqs.max_rows");
  expect_attention_rejects([](auto& a) { a.seqs.max_tokens = 0; }, "seqs.max_tokens");
  // The table has 3 blocks of 16 tokens: 48 positions at most.
  expect_attention_rejects([](auto& a) { a.seqs.max_tokens = 49; }, "seqs.max_tokens = 49");
}

// Values of CPU tables: rows, positions and page ids in range, sequences' rows disjoint.
TEST(MlaCheck, AttentionRejectsBadTableValues) {
  static const core::Tensor rows_3 = i32_tensor({3}), rows_0 = i32_tensor({0});
  static const core::Tensor begin_1 = i32_tensor({1}), begin_neg = i32_tensor({-1});
  static const core::Tensor position_5 = i32_tensor({5});
  static const core::Tensor table_big = i32_tensor({4, -1, -1}, {1, 3}), table_neg = i32_tensor({-1, -1, -1}, {1, 3});
  expect_attention_rejects([](auto& a) { a.seqs.num_rows = rows_3.view(); }, "seqs.num_rows[0] = 3");
  expect_attention_rejects([](auto& a) { a.seqs.num_rows = rows_0.view(); }, "seqs.num_rows[0] = 0");
  expect_attention_rejects([](auto& a) { a.seqs.row_begin = begin_1.view(); }, "seqs.row_begin[0] = 1");
  expect_attention_rejects([](auto& a) { a.seqs.row_begin = begin_neg.view(); }, "seqs.row_begin[0] = -1");
  expect_attention_rejects([](auto& a) { a.seqs.position = position_5.view(); }, "seqs.position[0] = 5");
  expect_attention_rejects([](auto& a) { a.seqs.block_table = table_big.view(); }, "seqs.block_table[0][0] = 4");
  expect_attention_rejects([](auto& a) { a.seqs.block_table = table_neg.view(); }, "seqs.block_table[0][0] = -1");
  // Two sequences claiming q row 1.
  static const core::Tensor begins = i32_tensor({0, 1}), counts = i32_tensor({2, 1}), positions = i32_tensor({4, 5});
  static const core::Tensor tables = i32_tensor({0, -1, -1, 1, -1, -1}, {2, 3});
  expect_attention_rejects(
      [](auto& a) {
        a.seqs.row_begin = begins.view();
        a.seqs.num_rows = counts.view();
        a.seqs.position = positions.view();
        a.seqs.block_table = tables.view();
        a.seqs.num_seqs = 2;
      },
      "two sequences share q row 1");
}

void expect_cache_write_rejects(const std::function<void(MlaCacheWriteArgs&)>& edit, const std::string& word) {
  static const core::Tensor c_n = core::Tensor::zeros(core::DType::f32, {3, 8});
  static const core::Tensor k_pe = core::Tensor::zeros(core::DType::f32, {3, 4});
  static const core::Tensor dst = core::Tensor::zeros(core::DType::f8_e4m3, {2, 4, 12});  // 8 cache rows
  static const core::Tensor rows = i32_tensor({5, 0, -1});
  MlaCacheWriteArgs a;
  a.c_n = c_n.view();
  a.k_pe = k_pe.view();
  a.dst = dst.view();
  a.cache_rows = rows.view();
  a.k_scale = 0.5f;
  ASSERT_TRUE(mla_cache_write_check(a).is_ok()) << mla_cache_write_check(a).reason();
  edit(a);
  const core::Status st = mla_cache_write_check(a);
  ASSERT_FALSE(st.is_ok()) << "expected a failure naming " << word;
  EXPECT_NE(st.reason().find(word), std::string::npos) << st.reason();
  EXPECT_THROW(mla_cache_write_reference(a), core::Error);
}

TEST(MlaCheck, CacheWriteRejectsBadArguments) {
  static const core::Tensor bf16_pages = core::Tensor::zeros(core::DType::bf16, {2, 4, 12});
  static const core::Tensor f32_narrow = core::Tensor::zeros(core::DType::f32, {2, 4, 11});
  static const core::Tensor f32_rank2 = core::Tensor::zeros(core::DType::f32, {3, 12});
  static const core::Tensor f32_two_rows = core::Tensor::zeros(core::DType::f32, {2, 4});
  static const core::Tensor c_n_bf16 = core::Tensor::zeros(core::DType::bf16, {3, 8});
  static const core::Tensor rows_f32 = core::Tensor::zeros(core::DType::f32, {3});
  static const core::Tensor rows_short = i32_tensor({1, 2});
  static const core::Tensor rows_past = i32_tensor({8, 0, 1}), rows_neg = i32_tensor({1, -2, 3});
  static const core::Tensor rows_twice = i32_tensor({5, 2, 5});
  expect_cache_write_rejects([](auto& a) { a.dst = bf16_pages.view(); }, "dst must be f32 or f8_e4m3");
  expect_cache_write_rejects([](auto& a) { a.dst = f32_narrow.view(); }, "dst must be pages");
  expect_cache_write_rejects([](auto& a) { a.dst = f32_rank2.view(); }, "dst must be pages");
  expect_cache_write_rejects([](auto& a) { a.k_pe = f32_two_rows.view(); }, "k_pe must be");
  expect_cache_write_rejects([](auto& a) { a.c_n = c_n_bf16.view(); }, "c_n must be f32");
  expect_cache_write_rejects([](auto& a) { a.k_scale = 0.0f; }, "k_scale must be");
  expect_cache_write_rejects([](auto& a) { a.k_scale = std::numeric_limits<float>::infinity(); }, "k_scale");
  expect_cache_write_rejects([](auto& a) { a.cache_rows = rows_f32.view(); }, "cache_rows must be a dense i32");
  expect_cache_write_rejects([](auto& a) { a.cache_rows = rows_short.view(); }, "cache_rows must be a dense i32");
  expect_cache_write_rejects([](auto& a) { a.cache_rows = core::TensorView{}; }, "cache_rows must be");
  expect_cache_write_rejects([](auto& a) { a.cache_rows = rows_past.view(); }, "cache_rows[0] = 8");
  expect_cache_write_rejects([](auto& a) { a.cache_rows = rows_neg.view(); }, "cache_rows[1] = -2");
  expect_cache_write_rejects([](auto& a) { a.cache_rows = rows_twice.view(); }, "names cache row 5 twice");
}

}  // namespace
}  // namespace k3::kernels
