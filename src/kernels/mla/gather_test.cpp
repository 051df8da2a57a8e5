// kernels/mla/gather_test.cpp: mla_cache_gather (whole cache entries between page layouts) and
// mla_gather_plan (the decode-context-parallel prefill's tables): split an unsplit cache over cp ranks
// as DCP does (position p on rank p % cp at local position p / cp), pack every rank's entries, gather
// them rank-major (what all_gather(first) gives), place them, and the temporary cache must hold the
// unsplit cache's bytes at every position of every sequence, in every cache dtype.
#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "kernels/mla/mla.h"
#include "kernels/mla/mla_internal.h"
#include "kernels/mla/mla_test_util.h"

namespace k3::kernels {
namespace {

// Random bytes: any dtype's entries (f32 / bf16 / fp8 codes) are copied as bytes.
core::Tensor random_pages(core::DType dtype, int64_t blocks, int64_t bs, int64_t width, uint64_t seed) {
  core::Tensor t = core::Tensor::zeros(dtype, {blocks, bs, width});
  core::Rng rng(seed);
  for (uint8_t& b : std::span(t.data<uint8_t>(), static_cast<size_t>(t.nbytes())))
    b = static_cast<uint8_t>(rng.next_u64());
  return t;
}

core::Tensor filled_pages(core::DType dtype, int64_t blocks, int64_t bs, int64_t width, uint8_t byte) {
  core::Tensor t = core::Tensor::zeros(dtype, {blocks, bs, width});
  std::memset(t.view().data, byte, static_cast<size_t>(t.nbytes()));
  return t;
}

void gather(const core::Tensor& src, const std::vector<int32_t>& rows, const core::TensorView& dst) {
  const core::Tensor r = mla_test::i32_tensor(rows);
  const MlaCacheGatherArgs a{src.view(), r.view(), dst};
  ASSERT_TRUE(mla_cache_gather_check(a).is_ok()) << mla_cache_gather_check(a).reason();
  mla_cache_gather_reference(a);
}

TEST(MlaCacheGather, CopiesWholeEntriesAndSkipsMinusOne) {
  for (auto dtype : {core::DType::f32, core::DType::bf16, core::DType::f8_e4m3}) {
    const int64_t width = 13, bs = 3;
    const core::Tensor src = random_pages(dtype, 4, bs, width, 5);
    core::Tensor dst = filled_pages(dtype, 2, 5, width, 0xab);
    const std::vector<int32_t> rows = {11, -1, 0, 7, 7, -1, 3, 1, 2, 10};
    gather(src, rows, dst.view());
    const size_t row_bytes = width * core::dtype_size(dtype);
    for (int64_t i = 0; i < 10; ++i) {
      const char* got = mla_detail::page_row_ptr(dst.view(), i);
      if (rows[i] < 0) {
        for (size_t b = 0; b < row_bytes; ++b) ASSERT_EQ(static_cast<uint8_t>(got[b]), 0xab) << "row " << i;
      } else {
        ASSERT_EQ(std::memcmp(got, mla_detail::page_row_ptr(src.view(), rows[i]), row_bytes), 0) << "row " << i;
      }
    }
  }
}

TEST(MlaCacheGather, CheckNamesTheBadArgument) {
  const core::Tensor src = random_pages(core::DType::f32, 2, 4, 8, 1);
  core::Tensor dst = filled_pages(core::DType::f32, 1, 3, 8, 0);
  const core::Tensor rows = mla_test::i32_tensor({0, 1, 2});
  const auto reason = [](const MlaCacheGatherArgs& a) { return mla_cache_gather_check(a).reason(); };
  EXPECT_TRUE(mla_cache_gather_check({src.view(), rows.view(), dst.view()}).is_ok());
  const core::Tensor i32_src = core::Tensor::zeros(core::DType::i32, {2, 4, 8});
  EXPECT_NE(reason({i32_src.view(), rows.view(), dst.view()}).find("src must be f32, bf16 or f8_e4m3 pages"),
            std::string::npos);
  const core::Tensor fp8_dst = filled_pages(core::DType::f8_e4m3, 1, 3, 8, 0);
  EXPECT_NE(reason({src.view(), rows.view(), fp8_dst.view()})
                .find("dst must be pages [num_blocks, block_size, width = 8] of src's dtype"),
            std::string::npos);
  const core::Tensor wide = filled_pages(core::DType::f32, 1, 3, 9, 0);
  EXPECT_NE(reason({src.view(), rows.view(), wide.view()}).find("width = 8"), std::string::npos);
  const core::Tensor short_rows = mla_test::i32_tensor({0, 1});
  EXPECT_NE(reason({src.view(), short_rows.view(), dst.view()})
                .find("src_rows must be a dense i32 [N = dst num_blocks * block_size = 3]"),
            std::string::npos);
  const core::Tensor bad_rows = mla_test::i32_tensor({0, 8, 1});
  EXPECT_NE(reason({src.view(), bad_rows.view(), dst.view()})
                .find("src_rows[1] = 8 is not -1 or a cache row of src in [0, num_blocks * block_size = 8)"),
            std::string::npos);
  const core::Tensor minus2 = mla_test::i32_tensor({0, -2, 1});
  EXPECT_NE(reason({src.view(), minus2.view(), dst.view()}).find("src_rows[1] = -2"), std::string::npos);
  // dst inside src's storage: its last page.
  const core::TensorView inside = core::TensorView::contiguous(src.data<float>() + 4 * 8, core::DType::f32, {1, 3, 8});
  EXPECT_NE(reason({src.view(), rows.view(), inside}).find("dst must not overlap src"), std::string::npos);
}

// The whole DCP prefill gather on the CPU: `tokens` context positions per sequence, an unsplit cache
// (each sequence's positions in pages of bs through a shuffled table), every rank's split cache
// (local position j of rank r = global position j * cp + r), then pack -> rank-major concatenation ->
// place; the temporary cache must hold every position's bytes, and its block tables must find them.
void expect_gather_reassembles(core::DType dtype, const std::vector<int64_t>& tokens, int cp, int64_t bs, int64_t width,
                               uint64_t seed) {
  SCOPED_TRACE("dtype " + std::string(core::dtype_name(dtype)) + " cp " + std::to_string(cp) + " bs " +
               std::to_string(bs) + " width " + std::to_string(width));
  const size_t S = tokens.size(), row_bytes = width * core::dtype_size(dtype);
  // Unsplit: sequence s's position p is the random entry `whole` row base[s] + p.
  std::vector<int64_t> base;
  int64_t total = 0;
  for (const int64_t n : tokens) {
    base.push_back(total);
    total += n;
  }
  const core::Tensor whole = random_pages(dtype, total, 1, width, seed);
  // Every rank's split cache in pages of bs with shuffled ids (and 2 spare pages), its local tables.
  std::vector<core::Tensor> rank_pages;
  std::vector<std::vector<std::vector<int32_t>>> rank_tables(static_cast<size_t>(cp));
  core::Rng rng(seed + 1);
  for (int r = 0; r < cp; ++r) {
    int64_t blocks = 2;
    for (const int64_t n : tokens) blocks += ((n + cp - 1) / cp + bs - 1) / bs;
    const std::vector<int32_t> ids = mla_test::shuffled_ids(blocks, rng);
    core::Tensor pages = filled_pages(dtype, blocks, bs, width, 0x5a);
    size_t next = 0;
    for (size_t s = 0; s < S; ++s) {
      std::vector<int32_t>& table = rank_tables[r].emplace_back();
      for (int64_t b = 0; b < ((tokens[s] + cp - 1) / cp + bs - 1) / bs; ++b) table.push_back(ids[next++]);
      for (int64_t p = r; p < tokens[s]; p += cp) {
        const int64_t j = p / cp;
        std::memcpy(mla_detail::page_row_ptr(pages.view(), table[j / bs] * bs + j % bs),
                    mla_detail::page_row_ptr(whole.view(), base[s] + p), row_bytes);
      }
    }
    rank_pages.push_back(pages);
  }
  // Pack on every rank, concatenate rank-major (all_gather first), place on rank 0 (every rank's
  // place tables are the same: check that too).
  std::vector<MlaGatherPlan> plans;
  for (int r = 0; r < cp; ++r) {
    std::vector<std::span<const int32_t>> tables(rank_tables[r].begin(), rank_tables[r].end());
    plans.push_back(mla_gather_plan(tokens, tables, cp, r, bs));
  }
  const int64_t slots = plans[0].slots;
  core::Tensor gathered = filled_pages(dtype, cp * slots, 1, width, 0x33);
  for (int r = 0; r < cp; ++r) {
    ASSERT_EQ(plans[r].slots, slots);
    ASSERT_EQ(plans[r].place_rows, plans[0].place_rows);
    ASSERT_EQ(plans[r].block_table, plans[0].block_table);
    const core::TensorView part = core::TensorView::contiguous(mla_detail::page_row_ptr(gathered.view(), r * slots),
                                                               dtype, {slots, 1, width});
    gather(rank_pages[r], plans[r].pack_rows, part);
  }
  const MlaGatherPlan& plan = plans[0];
  core::Tensor cache = filled_pages(dtype, plan.blocks, bs, width, 0x77);
  gather(gathered, plan.place_rows, cache.view());
  for (size_t s = 0; s < S; ++s) {
    const int32_t* table = plan.block_table.data() + s * plan.table_width;
    for (int64_t p = 0; p < tokens[s]; ++p)
      ASSERT_EQ(std::memcmp(mla_detail::page_row_ptr(cache.view(), int64_t{table[p / bs]} * bs + p % bs),
                            mla_detail::page_row_ptr(whole.view(), base[s] + p), row_bytes),
                0)
          << "sequence " << s << " position " << p;
    for (int64_t b = (tokens[s] + bs - 1) / bs; b < plan.table_width; ++b) EXPECT_EQ(table[b], -1);
  }
}

TEST(MlaCacheGather, DcpPrefillGatherReassemblesTheUnsplitCacheOddShapes) {
  // Lengths not multiples of cp or of the block size, a 1-token sequence (ranks > 0 hold none of it).
  uint64_t seed = 100;
  for (auto dtype : {core::DType::f32, core::DType::bf16, core::DType::f8_e4m3})
    for (int cp : {2, 3, 4})
      for (int64_t bs : {1, 5, 7}) expect_gather_reassembles(dtype, {1, 37, 12, 97}, cp, bs, 11, ++seed);
}

TEST(MlaCacheGather, DcpPrefillGatherReassemblesTheUnsplitCacheRealShapes) {
  // K3's 576-wide entries, block sizes 16 and 64, cp 2 / 4 / 8, chunk ends not multiples of cp.
  uint64_t seed = 200;
  for (auto dtype : {core::DType::f32, core::DType::bf16, core::DType::f8_e4m3})
    for (int cp : {2, 4, 8})
      for (int64_t bs : {16, 64}) expect_gather_reassembles(dtype, {333, 1, 1029, 64 * 8 + 5}, cp, bs, 576, ++seed);
}

TEST(MlaCacheGather, PlanLayout) {
  // Two sequences of 5 and 2 tokens, cp 2, rank 1, pages of 2: rank 1 owns positions 1, 3 of the
  // first (local 0, 1) and 1 of the second (local 0).
  const std::vector<int32_t> t0 = {4, 9}, t1 = {6};
  const std::vector<std::span<const int32_t>> tables = {t0, t1};
  const MlaGatherPlan p = mla_gather_plan(std::vector<int64_t>{5, 2}, tables, 2, 1, 2);
  EXPECT_EQ(p.slots, 3 + 1);
  EXPECT_EQ(p.pack_rows, (std::vector<int32_t>{4 * 2 + 0, 4 * 2 + 1, -1, 6 * 2 + 0}));  // slot 2: rank 0's 3rd
  EXPECT_EQ(p.blocks, 3 + 1);
  EXPECT_EQ(p.table_width, 3);
  EXPECT_EQ(p.block_table, (std::vector<int32_t>{0, 1, 2, 3, -1, -1}));
  // Position p of sequence s: gathered row (p % 2) * 4 + offset_s + p / 2.
  EXPECT_EQ(p.place_rows, (std::vector<int32_t>{0, 4, 1, 5, 2, -1, 3, 7}));
}

}  // namespace
}  // namespace k3::kernels
