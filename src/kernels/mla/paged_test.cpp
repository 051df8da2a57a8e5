// kernels/mla/paged_test.cpp: MLA attention over the paged cache, batched over sequences: results do
// not depend on the page size or the (shuffled, non-contiguous) page ids, and one call over several
// sequences gives each sequence's rows exactly the bytes of a call of its own.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/mla/mla.h"
#include "kernels/mla/mla_test_util.h"

namespace k3::kernels {
namespace {

using mla_test::MlaBatch;
using mla_test::MlaDims;
using mla_test::MlaProblem;

constexpr auto kNaive = mla_naive_reference;
constexpr auto kAbsorbed = mla_absorbed_reference;
constexpr core::DType kF32 = core::DType::f32, kBf16 = core::DType::bf16, kFp8 = core::DType::f8_e4m3;
constexpr const MlaDims& kOddDims = kMlaOddNarrow;  // kernels/mla/cases.h
constexpr const MlaDims& kRope64Dims = kMlaOddRope64;
constexpr const MlaDims& kTp8Dims = kMlaK3Tp8;

bool same_bytes(const core::Tensor& a, const core::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.view().data, b.view().data, static_cast<size_t>(a.nbytes())) == 0;
}

// The same sequence in pages of 1, 7, 16 and 64 tokens (shuffled ids, spare pages poisoned) gives
// the bytes of a single page holding the whole sequence (the contiguous cache).
TEST(MlaPaged, PageSizeAndPageIdsDoNotChangeResults) {
  uint64_t seed = 900;
  for (const MlaDims& dims : {kOddDims, kRope64Dims})
    for (auto [S, T] : {std::pair<int64_t, int64_t>{17, 1}, {54, 4}, {97, 17}, {33, 33}})
      for (core::DType cache_dtype : {kF32, kFp8}) {
        ++seed;
        const float k_scale = cache_dtype == kFp8 ? 0.37f : 1.0f;
        const MlaProblem contiguous(dims, S, T, cache_dtype, kBf16, k_scale, seed, /*page_tokens=*/S);
        for (int64_t bs : {1, 7, 16, 64}) {
          const MlaProblem paged(dims, S, T, cache_dtype, kBf16, k_scale, seed, bs);
          SCOPED_TRACE(testing::Message() << "H " << dims.heads << " S " << S << " T " << T << " block " << bs
                                          << " cache " << core::dtype_name(cache_dtype));
          for (Precision precision : {Precision::bf16, Precision::fp32})
            for (auto op : {kNaive, kAbsorbed}) {
              const core::Tensor want = contiguous.run(op, precision);
              ASSERT_TRUE(mla_test::all_finite(want));
              EXPECT_TRUE(same_bytes(paged.run(op, precision), want));
            }
        }
      }
}

// Sequences with different positions and row counts (decode 1, verify 4, prefill 17, a fresh
// prefill from position 0) in ONE call, at page sizes 7, 16 and 64: each sequence's rows are the
// bytes of its own call, rows that belong to no sequence stay NaN.
TEST(MlaPaged, OneCallOverSeveralSequencesEqualsOneCallEach) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},   {40, 1},  {17, 4}, {97, 4},
                                                           {17, 17}, {60, 17}, {5, 1}};
  uint64_t seed = 1000;
  for (const MlaDims& dims : {kOddDims, kRope64Dims})
    for (core::DType cache_dtype : {kF32, kFp8}) {
      const float k_scale = cache_dtype == kFp8 ? 0.5f : 1.0f;
      std::vector<MlaProblem> probs;
      for (auto [S, T] : shapes) probs.emplace_back(dims, S, T, cache_dtype, kBf16, k_scale, ++seed);
      for (MlaProblem& p : probs) p.kv_b = probs.front().kv_b;  // one layer: one kv_b
      std::vector<const MlaProblem*> ptrs;
      for (const MlaProblem& p : probs) ptrs.push_back(&p);
      for (int64_t bs : {7, 16, 64}) {
        const MlaBatch batch(ptrs, bs, ++seed);
        for (Precision precision : {Precision::bf16, Precision::fp32})
          for (auto op : {kNaive, kAbsorbed}) {
            SCOPED_TRACE(testing::Message()
                         << "H " << dims.heads << " block " << bs << " cache " << core::dtype_name(cache_dtype) << " "
                         << (op == kNaive ? "naive" : "absorbed"));
            const core::Tensor out = batch.run(op, precision);
            for (size_t k = 0; k < probs.size(); ++k)
              EXPECT_TRUE(same_bytes(batch.rows_of(out, k), probs[k].run(op, precision)))
                  << "sequence " << k << " (S " << probs[k].S << ", T " << probs[k].T << ")";
            for (int64_t r : batch.unowned_rows())
              for (int64_t c = 0; c < out.dim(1); ++c)
                ASSERT_TRUE(std::isnan(out.data<float>()[r * out.dim(1) + c])) << "unowned row " << r;
          }
      }
    }
}

// One TP8 shard (12 heads, kv_lora 512, rope 64) decoding a batch with verify rows over an fp8
// cache in pages of 64: batched == per sequence, and close to the double oracle.
TEST(MlaPaged, Tp8ShardBatchedDecode) {
  std::vector<MlaProblem> probs;
  uint64_t seed = 1100;
  for (auto [S, T] : {std::pair<int64_t, int64_t>{130, 1}, {64, 4}, {201, 1}})
    probs.emplace_back(kTp8Dims, S, T, kFp8, kBf16, 1.0f, ++seed, /*page_tokens=*/64);
  for (MlaProblem& p : probs) p.kv_b = probs.front().kv_b;
  const std::vector<const MlaProblem*> ptrs = {&probs[0], &probs[1], &probs[2]};
  const MlaBatch batch(ptrs, 64, 1199);
  const core::Tensor out = batch.run(kAbsorbed, Precision::bf16);
  for (size_t k = 0; k < probs.size(); ++k) {
    const core::Tensor mine = batch.rows_of(out, k);
    EXPECT_TRUE(same_bytes(mine, probs[k].run(kAbsorbed, Precision::bf16))) << "sequence " << k;
  }
  // The verify sequence against the double oracle (the others cost seconds there).
  EXPECT_LE(mla_test::rel_err(batch.rows_of(out, 1), probs[1].oracle(probs[1].default_scale())), 1.6e-2);
}

// num_seqs = 0 is a no-op: nothing is read (tables undefined) and out stays poisoned.
TEST(MlaPaged, EmptyBatchWritesNothing) {
  const MlaProblem p(kOddDims, 5, 2, kF32, kBf16, 1.0f, 1200);
  for (auto op : {kNaive, kAbsorbed}) {
    const core::Tensor out = mla_test::nan_filled({p.T, static_cast<int64_t>(p.d.heads) * p.d.v});
    MlaAttentionArgs a = p.args(out, Precision::bf16, p.default_scale());
    a.seqs = SeqBatch{};
    ASSERT_TRUE(mla_attention_check(a).is_ok()) << mla_attention_check(a).reason();
    mla_test::run_op(op, a);
    for (float x : out.span<const float>()) ASSERT_TRUE(std::isnan(x));
  }
}

}  // namespace
}  // namespace k3::kernels
