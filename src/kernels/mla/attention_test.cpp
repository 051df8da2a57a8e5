// kernels/mla/attention_test.cpp: naive vs absorbed MLA attention vs a double oracle (spec §6, §15 item 5),
// one sequence per call over shuffled pages (paged_test.cpp covers batches and page layouts).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/mla/mla.h"
#include "kernels/mla/mla_test_util.h"

namespace k3::kernels {
namespace {

using mla_test::MlaDims;
using mla_test::MlaProblem;
using mla_test::rel_err;

constexpr auto kNaive = mla_naive_reference;
constexpr auto kAbsorbed = mla_absorbed_reference;
constexpr core::DType kF32 = core::DType::f32, kBf16 = core::DType::bf16, kFp8 = core::DType::f8_e4m3;

// fp32 mode: the forms differ only by summation order, so they agree to float precision.
constexpr double kFp32Tol = 1e-5;
// bf16 mode: a handful of bf16 roundings (2^-9 relative each) on the way to the output; the worst
// case seen is under 2 bf16 ulps of the largest output (docs/perf/kernel-notes.md), so allow 4 ulps.
constexpr double kBf16Tol = 1.6e-2;

// Odd head sizes (no multiple of a tile) and a small-head variant with the real 64-wide rope.
constexpr const MlaDims& kOddDims = kMlaOddNarrow;  // kernels/mla/cases.h
constexpr const MlaDims& kRope64Dims = kMlaOddRope64;
// One GPU's share of K3 at TP8 (spec §11): 12 heads, nope 128, rope 64, v 128, kv_lora 512.
constexpr const MlaDims& kTp8Dims = kMlaK3Tp8;

// Every (S, T) the tests sweep: single decode, 4 speculative-verify rows, full prefill.
std::vector<std::pair<int64_t, int64_t>> sweep() {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t S : {1, 17, 54, 97})
    for (int64_t T : {int64_t{1}, int64_t{4}, S})
      if (T <= S && (out.empty() || out.back() != std::pair{S, T})) out.push_back({S, T});
  return out;
}

bool bf16_representable(const core::Tensor& t) {
  for (float x : t.span<const float>())
    if (core::bf16_round(x) != x) return false;
  return true;
}

TEST(MlaAttention, FormsAgreeWithEachOtherAndTheOracleInFp32) {
  uint64_t seed = 100;
  for (const MlaDims& dims : {kOddDims, kRope64Dims})
    for (auto [S, T] : sweep())
      for (core::DType cache_dtype : {kF32, kFp8}) {
        const core::DType w_dtype = (seed & 1) ? kBf16 : kF32;
        const MlaProblem p(dims, S, T, cache_dtype, w_dtype, cache_dtype == kFp8 ? 0.37f : 1.0f, ++seed);
        SCOPED_TRACE(testing::Message() << "H " << dims.heads << " nope " << dims.nope << " S " << S << " T " << T
                                        << " cache " << core::dtype_name(cache_dtype));
        const core::Tensor naive = p.run(kNaive, Precision::fp32);
        const core::Tensor absorbed = p.run(kAbsorbed, Precision::fp32);
        const std::vector<double> oracle = p.oracle(p.default_scale());
        EXPECT_LE(rel_err(absorbed, naive), kFp32Tol);
        EXPECT_LE(rel_err(naive, oracle), kFp32Tol);
        EXPECT_LE(rel_err(absorbed, oracle), kFp32Tol);
      }
}

TEST(MlaAttention, FormsAgreeWithinBf16ToleranceAndRoundTheirOutputs) {
  uint64_t seed = 200;
  for (const MlaDims& dims : {kOddDims, kRope64Dims})
    for (auto [S, T] : sweep())
      for (core::DType cache_dtype : {kF32, kFp8}) {
        const MlaProblem p(dims, S, T, cache_dtype, kBf16, cache_dtype == kFp8 ? 0.37f : 1.0f, ++seed);
        SCOPED_TRACE(testing::Message() << "H " << dims.heads << " nope " << dims.nope << " S " << S << " T " << T
                                        << " cache " << core::dtype_name(cache_dtype));
        const core::Tensor naive = p.run(kNaive, Precision::bf16);
        const core::Tensor absorbed = p.run(kAbsorbed, Precision::bf16);
        const std::vector<double> oracle = p.oracle(p.default_scale());
        EXPECT_TRUE(bf16_representable(naive));
        EXPECT_TRUE(bf16_representable(absorbed));
        EXPECT_LE(rel_err(absorbed, naive), kBf16Tol);
        EXPECT_LE(rel_err(naive, oracle), kBf16Tol);
        EXPECT_LE(rel_err(absorbed, oracle), kBf16Tol);
        // The rounding points really round: bf16 mode is not the fp32 result.
        EXPECT_GT(rel_err(absorbed, p.run(kAbsorbed, Precision::fp32)), 0.0);
      }
}

// Query t sits at cache position S-T+t: editing cache row S-T+k must leave queries t < k
// bit-identical and change every query t >= k.
TEST(MlaAttention, CausalMaskHidesLaterCacheRows) {
  for (core::DType cache_dtype : {kF32, kFp8})
    for (Precision precision : {Precision::fp32, Precision::bf16})
      for (auto op : {kNaive, kAbsorbed}) {
        const int64_t S = 17, T = 4;
        MlaProblem p(kOddDims, S, T, cache_dtype, kBf16, 0.5f, 300);
        const core::Tensor before = p.run(op, precision);
        const int64_t width = static_cast<int64_t>(p.d.heads) * p.d.v;
        for (int64_t k = 1; k < T; ++k) {
          MlaProblem edited = p;  // shares storage: copy the tensors it edits
          edited.c_n = core::Tensor::copy_of(p.c_n.view());
          edited.k_pe = core::Tensor::copy_of(p.k_pe.view());
          edited.pages = core::Tensor::copy_of(p.pages.view());
          const int64_t row = S - T + k;
          for (int64_t i = 0; i < p.d.kv_lora; ++i) edited.c_n.data<float>()[row * p.d.kv_lora + i] *= -3.0f;
          for (int64_t r = 0; r < p.d.rope; ++r) edited.k_pe.data<float>()[row * p.d.rope + r] += 2.0f;
          edited.rewrite_cache();
          const core::Tensor after = edited.run(op, precision);
          for (int64_t t = 0; t < T; ++t) {
            const bool same = std::memcmp(before.data<float>() + t * width, after.data<float>() + t * width,
                                          sizeof(float) * width) == 0;
            EXPECT_EQ(same, t < k) << "edited row " << row << ", query " << t;
          }
        }
      }
}

// k_pe is a real 64-wide shared key: dropping it changes attention noticeably, and both forms
// still follow the oracle on the edited cache.
TEST(MlaAttention, RopeKeyTermMatters) {
  for (auto op : {kNaive, kAbsorbed}) {
    MlaProblem p(kRope64Dims, 54, 4, kF32, kBf16, 1.0f, 400);
    const core::Tensor with_pe = p.run(op, Precision::fp32);
    for (float& x : p.k_pe.span<float>()) x = 0.0f;
    p.rewrite_cache();
    const core::Tensor without_pe = p.run(op, Precision::fp32);
    EXPECT_GT(rel_err(without_pe, with_pe), 0.05);
    EXPECT_LE(rel_err(without_pe, p.oracle(p.default_scale())), kFp32Tol);
  }
}

// The scale is (nope + rope)^-1/2 = 192^-1/2 for K3, not nope^-1/2: the oracle with the spec's
// literal constant matches, and the nope-only scale does not.
TEST(MlaAttention, ScaleIsInverseSqrtOfNopePlusRope) {
  const MlaDims dims{2, 128, 64, 128, 512};
  const MlaProblem p(dims, 17, 1, kF32, kBf16, 1.0f, 500);
  EXPECT_NEAR(p.default_scale(), 0.0721687836, 5e-9);  // float ulp here is 7.5e-9
  const std::vector<double> oracle = p.oracle(0.0721687836);
  for (auto op : {kNaive, kAbsorbed}) {
    EXPECT_LE(rel_err(p.run(op, Precision::fp32, p.default_scale()), oracle), kFp32Tol);
    EXPECT_GT(rel_err(p.run(op, Precision::fp32, 1.0f / std::sqrt(128.0f)), oracle), 1e-2);
  }
}

// One TP8 shard of a real K3 MLA layer decoding one token over a 64-token context.
TEST(MlaAttention, RealTp8ShardDecode) {
  for (core::DType cache_dtype : {kF32, kFp8}) {
    SCOPED_TRACE(core::dtype_name(cache_dtype));
    const MlaProblem p(kTp8Dims, 64, 1, cache_dtype, kBf16, 1.0f, 600);
    const std::vector<double> oracle = p.oracle(p.default_scale());
    const core::Tensor naive = p.run(kNaive, Precision::fp32);
    const core::Tensor absorbed = p.run(kAbsorbed, Precision::fp32);
    EXPECT_LE(rel_err(absorbed, naive), kFp32Tol);
    EXPECT_LE(rel_err(naive, oracle), kFp32Tol);
    EXPECT_LE(rel_err(absorbed, oracle), kFp32Tol);
    const core::Tensor naive_bf16 = p.run(kNaive, Precision::bf16);
    const core::Tensor absorbed_bf16 = p.run(kAbsorbed, Precision::bf16);
    EXPECT_LE(rel_err(absorbed_bf16, naive_bf16), kBf16Tol);
    EXPECT_LE(rel_err(absorbed_bf16, oracle), kBf16Tol);
    // Repeatable to the bit (heads run on pool threads, each head's arithmetic is fixed).
    const core::Tensor again = p.run(kAbsorbed, Precision::bf16);
    EXPECT_EQ(std::memcmp(again.data<float>(), absorbed_bf16.data<float>(), again.nbytes()), 0);
  }
}

// Views with row strides: q and out live inside wider buffers, and the pages have padded rows
// and padded pages. Columns outside out's view must stay untouched.
TEST(MlaAttention, StridedRowViews) {
  const MlaProblem p(kOddDims, 17, 4, kFp8, kBf16, 0.5f, 700, /*page_tokens=*/5);
  const int64_t T = p.T, qw = p.q.dim(1), ow = static_cast<int64_t>(p.d.heads) * p.d.v, pad = 5;
  core::Tensor q_wide = core::Tensor::zeros(kF32, {T, qw + pad});
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(q_wide.data<float>() + t * (qw + pad) + pad, p.q.data<float>() + t * qw, sizeof(float) * qw);
  // Pages [nb, bs, width] inside rows of width + 3 bytes and pages of bs * (width + 3) + 7 bytes.
  const int64_t nb = p.pages.dim(0), bs = p.pages.dim(1), width = p.pages.dim(2);
  const int64_t row_ld = width + 3, page_ld = bs * row_ld + 7;
  core::Tensor pages_big = core::Tensor::zeros(kFp8, {nb * page_ld});
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t r = 0; r < bs; ++r)
      std::memcpy(pages_big.data<uint8_t>() + b * page_ld + r * row_ld,
                  p.pages.data<const uint8_t>() + (b * bs + r) * width, static_cast<size_t>(width));
  for (auto op : {kNaive, kAbsorbed}) {
    const core::Tensor expected = p.run(op, Precision::bf16);
    core::Tensor out_wide = mla_test::nan_filled({T, ow + pad});
    MlaAttentionArgs a = p.args(out_wide, Precision::bf16, p.default_scale());
    a.q = core::TensorView::contiguous(q_wide.data<float>() + pad, kF32, {T, qw});
    a.q.strides[0] = qw + pad;
    a.out = core::TensorView::contiguous(out_wide.data<float>(), kF32, {T, ow});
    a.out.strides[0] = ow + pad;
    a.pages = core::TensorView::contiguous(pages_big.view().data, kFp8, {nb, bs, width});
    a.pages.strides[0] = page_ld;
    a.pages.strides[1] = row_ld;
    ASSERT_TRUE(mla_attention_check(a).is_ok()) << mla_attention_check(a).reason();
    mla_test::run_op(op, a);
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(
          std::memcmp(out_wide.data<float>() + t * (ow + pad), expected.data<float>() + t * ow, sizeof(float) * ow), 0)
          << "row " << t;
      for (int64_t c = ow; c < ow + pad; ++c) EXPECT_TRUE(std::isnan(out_wide.data<float>()[t * (ow + pad) + c]));
    }
  }
}

}  // namespace
}  // namespace k3::kernels
