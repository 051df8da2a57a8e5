// kernels/kda/conv_test.cpp: the KDA short conv (spec §5.2) against a naive form, a hand example,
// state continuation over split calls, the real TP8 shard width, batches of sequences over a state
// pool (equal bits to one call per sequence; the model's strided pool), and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/kda/kda.h"
#include "kernels/kda/kda_test_util.h"

namespace k3::kernels {
namespace {

using namespace kda_test;

struct ConvCase {
  Tensor x, w, state;
  int T, C, K;
};

ConvCase random_conv(uint64_t seed, int T, int C, int K, Precision p) {
  core::Rng rng(seed);
  ConvCase cc{
      random(rng, {T, C}, 0.0, 1.0, p), random(rng, {C, K}, 0.0, 0.6), random(rng, {C, K - 1}, 0.0, 1.0, p), T, C, K};
  return cc;
}

// One sequence over all rows of x, its state [C, K-1] as a one-slot pool.
KdaConvArgs conv_args(const TensorView& x, const Tensor& w, const Tensor& state, const TensorView& out, Precision p) {
  KdaConvArgs a;
  a.x = x;
  a.weight = w.view();
  a.state = pool1(state);
  a.out = out;
  a.precision = p;
  a.seqs = single_seq(x.dim(0));
  return a;
}

TEST(KdaConv, MatchesNaiveOnOddShapes) {
  struct Shape3 {
    int T, C, K;
  };
  const Shape3 shapes[] = {{1, 1, 4},  {17, 17, 4}, {54, 97, 4}, {97, 33, 4}, {150, 5, 4},
                           {17, 9, 2}, {54, 7, 3},  {20, 13, 5}, {5, 3, 1}};
  uint64_t seed = 1;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    for (const auto& s : shapes) {
      SCOPED_TRACE("T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) + " K=" + std::to_string(s.K) +
                   (p == Precision::bf16 ? " bf16" : " fp32"));
      ConvCase cc = random_conv(seed++, s.T, s.C, s.K, p);
      std::vector<float> naive_state = to_vec(cc.state);
      const std::vector<double> ref = naive_conv(to_vec(cc.x), to_vec(cc.w), naive_state, s.T, s.C, s.K);
      Tensor out = poisoned({s.T, s.C});
      kda_conv_reference(conv_args(cc.x.view(), cc.w, cc.state, out.view(), p));
      if (p == Precision::fp32) {
        EXPECT_LT(rel_err(out.span<float>(), ref), 1e-6);
        for (size_t i = 0; i < ref.size(); ++i)
          ASSERT_NEAR(out.span<float>()[i], ref[i], 1e-5 * (1 + std::abs(ref[i])));
      } else {
        EXPECT_TRUE(bf16_close(out.span<float>(), ref));
      }
      // The state is the last K-1 inputs, exactly (inputs are copied, never recomputed).
      EXPECT_TRUE(bits_equal(cc.state.span<float>(), naive_state));
    }
  }
}

TEST(KdaConv, HandExampleAndShortSequencesShiftTheState) {
  // C = 1, K = 4, weights (w0..w3), state (a, b, c) oldest first.
  Tensor w = f32({1, 4}), state = f32({1, 3});
  const float wv[4] = {0.5f, -1.0f, 0.25f, 2.0f}, sv[3] = {1.0f, 2.0f, 3.0f};
  std::copy(wv, wv + 4, w.data<float>());
  std::copy(sv, sv + 3, state.data<float>());
  Tensor x = f32({1, 1}), out = poisoned({1, 1});
  x.data<float>()[0] = -0.75f;
  kda_conv_reference(conv_args(x.view(), w, state, out.view(), Precision::fp32));
  const float c = ((0.5f * 1.0f + -1.0f * 2.0f) + 0.25f * 3.0f) + 2.0f * -0.75f;  // = -2.25
  EXPECT_FLOAT_EQ(out.data<float>()[0], c / (1.0f + std::exp(-c)));
  // T = 1 < K-1: the state shifts left by one and appends the new input.
  EXPECT_EQ(to_vec(state), (std::vector<float>{2.0f, 3.0f, -0.75f}));
  // T = 2: shifts by two.
  Tensor x2 = f32({2, 1}), out2 = poisoned({2, 1});
  x2.data<float>()[0] = 4.0f, x2.data<float>()[1] = 5.0f;
  kda_conv_reference(conv_args(x2.view(), w, state, out2.view(), Precision::fp32));
  EXPECT_EQ(to_vec(state), (std::vector<float>{-0.75f, 4.0f, 5.0f}));
  // T = 0 changes nothing.
  Tensor x0 = f32({0, 1}), out0 = f32({0, 1});
  kda_conv_reference(conv_args(x0.view(), w, state, out0.view(), Precision::fp32));
  EXPECT_EQ(to_vec(state), (std::vector<float>{-0.75f, 4.0f, 5.0f}));
}

TEST(KdaConv, ZeroStateMeansNothingBeforeTheSequence) {
  ConvCase cc = random_conv(7, 3, 5, 4, Precision::fp32);
  for (float& s : cc.state.span<float>()) s = 0.0f;
  Tensor out = poisoned({3, 5});
  const std::vector<float> x = to_vec(cc.x), w = to_vec(cc.w);
  kda_conv_reference(conv_args(cc.x.view(), cc.w, cc.state, out.view(), Precision::fp32));
  for (int c = 0; c < 5; ++c) {
    const float c0 = w[c * 4 + 3] * x[c];  // first token: only the current input contributes
    EXPECT_FLOAT_EQ(out.data<float>()[c], c0 / (1.0f + std::exp(-c0)));
  }
}

TEST(KdaConv, SplitCallsEqualOneCall) {
  const int T = 23, C = 19, K = 4;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    ConvCase cc = random_conv(11, T, C, K, p);
    Tensor full_state = copy(cc.state), full_out = poisoned({T, C});
    kda_conv_reference(conv_args(cc.x.view(), cc.w, full_state, full_out.view(), p));
    for (int split : {1, 2, K - 1, 13}) {
      SCOPED_TRACE("split=" + std::to_string(split));
      Tensor state = copy(cc.state), out = poisoned({T, C});
      kda_conv_reference(conv_args(rows(cc.x.view(), 0, split), cc.w, state, rows(out.view(), 0, split), p));
      // The rest one token at a time for the first few (decode), then the remainder at once.
      int t = split;
      for (; t < split + 3; ++t)
        kda_conv_reference(conv_args(rows(cc.x.view(), t, 1), cc.w, state, rows(out.view(), t, 1), p));
      kda_conv_reference(conv_args(rows(cc.x.view(), t, T - t), cc.w, state, rows(out.view(), t, T - t), p));
      EXPECT_TRUE(bits_equal(out.span<float>(), full_out.span<float>()));
      EXPECT_TRUE(bits_equal(state.span<float>(), full_state.span<float>()));
    }
  }
}

TEST(KdaConv, Bf16ModeStateHoldsBf16) {
  ConvCase cc = random_conv(5, 9, 6, 4, Precision::fp32);  // deliberately unrounded inputs
  Tensor out = poisoned({9, 6});
  kda_conv_reference(conv_args(cc.x.view(), cc.w, cc.state, out.view(), Precision::bf16));
  for (float s : cc.state.span<float>()) EXPECT_EQ(core::bf16_round(s), s);
  for (float o : out.span<float>()) EXPECT_EQ(core::bf16_round(o), o);
}

TEST(KdaConv, CheckpointWeightShapeAndStridedInput) {
  // Weight as the checkpoint stores it, [C, 1, K]; x a column slice of a fused [T, 3C] projection.
  const int T = 17, C = 13, K = 4;
  core::Rng rng(3);
  Tensor fused = random(rng, {T, 3 * C}, 0.0, 1.0), w = random(rng, {C, K}, 0.0, 0.5);
  Tensor state_a = random(rng, {C, K - 1}, 0.0, 1.0), state_b = copy(state_a);
  Tensor x = f32({T, C});
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) x.data<float>()[t * C + c] = fused.data<float>()[t * 3 * C + C + c];
  Tensor out_a = poisoned({T, C}), out_b = poisoned({T, C});
  kda_conv_reference(conv_args(x.view(), w, state_a, out_a.view(), Precision::fp32));
  KdaConvArgs a = conv_args(cols(fused.view(), C, C), w, state_b, out_b.view(), Precision::fp32);
  a.weight = TensorView::contiguous(w.data<float>(), core::DType::f32, {C, 1, K});
  kda_conv_reference(a);
  EXPECT_TRUE(bits_equal(out_a.span<float>(), out_b.span<float>()));
  EXPECT_TRUE(bits_equal(state_a.span<float>(), state_b.span<float>()));
}

TEST(KdaConv, RealTp8ShardPrefillThenDecode) {
  // q, k and v channels of one TP8 shard side by side: 3 * 12 heads * 128 = 4608 (spec §11).
  const int T = 20, C = 3 * 12 * 128, K = 4;
  ConvCase cc = random_conv(21, T + 1, C, K, Precision::bf16);
  std::vector<float> naive_state = to_vec(cc.state);
  const std::vector<double> ref = naive_conv(to_vec(cc.x), to_vec(cc.w), naive_state, T + 1, C, K);
  Tensor out = poisoned({T + 1, C});
  kda_conv_reference(conv_args(rows(cc.x.view(), 0, T), cc.w, cc.state, rows(out.view(), 0, T), Precision::bf16));
  kda_conv_reference(conv_args(rows(cc.x.view(), T, 1), cc.w, cc.state, rows(out.view(), T, 1), Precision::bf16));
  EXPECT_TRUE(bf16_close(out.span<float>(), ref));
  EXPECT_TRUE(bits_equal(cc.state.span<float>(), naive_state));
}

// Four sequences of 1, 3, 17 and 64 rows in a shuffled row order with a gap row nobody owns,
// slots shuffled over a pool of 7: one batched call gives the bits of one call per sequence;
// unused slots and the gap row stay untouched.
TEST(KdaConv, BatchedEqualsOneCallPerSequence) {
  const int C = 37, K = 4, N = 7;
  const std::vector<SeqSpec> specs = {
      {4, 17, 5, 0}, {0, 3, 0, 0}, {86, 1, 3, 0}, {21, 64, 6, 0}};  // row 3 and 85: gaps
  const int T = 87;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(p == Precision::bf16 ? "bf16" : "fp32");
    core::Rng rng(p == Precision::bf16 ? 301 : 302);
    const Tensor x = random(rng, {T, C}, 0.0, 1.0, p), w = random(rng, {C, K}, 0.0, 0.6);
    const Tensor pool0 = random(rng, {N, C, K - 1}, 0.0, 1.0, p);
    Tensor pool = copy(pool0), out = poisoned({T, C});
    const HostSeqs seqs = make_seqs(specs);
    KdaConvArgs a;
    a.x = x.view(), a.weight = w.view(), a.state = pool.view(), a.out = out.view(), a.precision = p;
    a.seqs = seqs.batch;
    kda_conv_reference(a);
    for (const SeqSpec& sp : specs) {
      SCOPED_TRACE("rows=" + std::to_string(sp.num_rows) + " slot=" + std::to_string(sp.slot));
      Tensor state = f32({C, K - 1}), o = poisoned({sp.num_rows, C});
      const std::span<float> s0 = slot_span(pool0, sp.slot);
      std::copy(s0.begin(), s0.end(), state.data<float>());
      kda_conv_reference(conv_args(rows(x.view(), sp.row_begin, sp.num_rows), w, state, o.view(), p));
      EXPECT_TRUE(bits_equal(o.span<float>(), out.span<float>().subspan(sp.row_begin * C, sp.num_rows * C)));
      EXPECT_TRUE(bits_equal(state.span<float>(), slot_span(pool, sp.slot)));
    }
    for (int64_t free_slot : {1, 2, 4})
      EXPECT_TRUE(bits_equal(slot_span(pool, free_slot), slot_span(pool0, free_slot)));
    for (int64_t gap : {3, 85})
      for (int c = 0; c < C; ++c) EXPECT_TRUE(std::isnan(out.data<float>()[gap * C + c]));
  }
}

// The model's conv storage [num_slots, 3, P, K-1] passed as three strided pools (index i of dim 1),
// with x and out column slices of fused [T, 3P] projections: the same bits as contiguous per-slot
// states, and each of q/k/v updates only its own part of the storage.
TEST(KdaConv, StridedPoolOfTheModelStorage) {
  const int P = 19, K = 4, N = 3, T = 9;
  core::Rng rng(303);
  const Tensor fused = random(rng, {T, 3 * P}, 0.0, 1.0, Precision::bf16), w = random(rng, {P, K}, 0.0, 0.5);
  const Tensor storage0 = random(rng, {N, 3, P, K - 1}, 0.0, 1.0, Precision::bf16);
  Tensor storage = copy(storage0), out = poisoned({T, 3 * P});
  const HostSeqs seqs = make_seqs({{0, 4, 2, 0}, {4, 5, 0, 0}});  // slot 1 unused
  for (int i = 0; i < 3; ++i) {
    KdaConvArgs a;
    a.x = cols(fused.view(), i * P, P), a.weight = w.view(), a.out = cols(out.view(), i * P, P);
    a.state = TensorView::contiguous(storage.data<float>() + i * P * (K - 1), core::DType::f32, {N, P, K - 1});
    a.state.strides = {3 * P * (K - 1), K - 1, 1, 0};
    a.precision = Precision::bf16;
    a.seqs = seqs.batch;
    kda_conv_reference(a);
  }
  for (int i = 0; i < 3; ++i)
    for (const SeqSpec& sp : {SeqSpec{0, 4, 2, 0}, SeqSpec{4, 5, 0, 0}}) {
      Tensor state = f32({P, K - 1}), o = poisoned({sp.num_rows, P});
      const float* s0 = storage0.data<float>() + (sp.slot * 3 + i) * P * (K - 1);
      std::copy(s0, s0 + P * (K - 1), state.data<float>());
      kda_conv_reference(conv_args(rows(cols(fused.view(), i * P, P), sp.row_begin, sp.num_rows), w, state, o.view(),
                                   Precision::bf16));
      for (int t = 0; t < sp.num_rows; ++t)
        for (int c = 0; c < P; ++c)
          ASSERT_EQ(o.data<float>()[t * P + c], out.data<float>()[(sp.row_begin + t) * 3 * P + i * P + c]);
      const float* got = storage.data<float>() + (sp.slot * 3 + i) * P * (K - 1);
      EXPECT_TRUE(bits_equal(state.span<float>(), std::span<const float>(got, P * (K - 1))));
    }
  EXPECT_TRUE(bits_equal(slot_span(storage, 1), slot_span(storage0, 1)));
}

TEST(KdaConv, CheckNamesTheBadSequenceTable) {
  const int T = 10, C = 8, K = 4, N = 4;
  core::Rng rng(304);
  const Tensor x = random(rng, {T, C}, 0.0, 1.0), w = random(rng, {C, K}, 0.0, 0.5);
  Tensor pool = random(rng, {N, C, K - 1}, 0.0, 1.0), out = f32({T, C});
  auto reason = [&](const std::vector<SeqSpec>& specs, auto mutate) {
    const HostSeqs seqs = make_seqs(specs);
    KdaConvArgs a;
    a.x = x.view(), a.weight = w.view(), a.state = pool.view(), a.out = out.view(), a.seqs = seqs.batch;
    mutate(a);
    core::Status s = kda_conv_check(a);
    return s ? std::string("ok") : s.reason();
  };
  const auto none = [](KdaConvArgs&) {};
  const auto has = [](const std::string& r, const std::string& what) {
    return ::testing::AssertionResult(r.find(what) != std::string::npos) << r;
  };
  EXPECT_EQ(reason({{0, 3, 1}, {3, 7, 0}}, none), "ok");
  EXPECT_EQ(reason({}, none), "ok");                                // nothing to do
  EXPECT_TRUE(has(reason({{0, 3, 4}}, none), "seqs.slot[0] = 4"));  // slot past the pool
  EXPECT_TRUE(has(reason({{0, 3, -1}}, none), "seqs.slot[0] = -1"));
  EXPECT_TRUE(has(reason({{0, 3, 2}, {3, 2, 2}}, none), "share a slot"));           // two sequences, one slot
  EXPECT_TRUE(has(reason({{0, 3, 0}, {8, 3, 1}}, none), "seqs.row_begin[1] = 8"));  // rows 8..10 past T
  EXPECT_TRUE(has(reason({{-1, 3, 0}}, none), "seqs.row_begin[0] = -1"));
  EXPECT_TRUE(has(reason({{0, 4, 0}, {3, 2, 1}}, none), "overlap"));  // rows 0..3 and 3..4
  EXPECT_TRUE(has(reason({{0, 3, 0}}, [](KdaConvArgs& a) { a.seqs.max_rows = 2; }), "seqs.num_rows[0] = 3"));
  EXPECT_TRUE(has(reason({{0, 0, 0}}, [](KdaConvArgs& a) { a.seqs.max_rows = 3; }), "seqs.num_rows[0] = 0"));
  Tensor f32_slots = f32({1}), long_rows = Tensor::zeros(core::DType::i32, {2});
  EXPECT_TRUE(has(reason({{0, 3, 0}}, [&](KdaConvArgs& a) { a.seqs.slot = f32_slots.view(); }), "seqs.slot must be"));
  EXPECT_TRUE(
      has(reason({{0, 3, 0}}, [&](KdaConvArgs& a) { a.seqs.num_rows = long_rows.view(); }), "seqs.num_rows must be"));
  EXPECT_TRUE(has(reason({{0, 3, 0}}, [&](KdaConvArgs& a) { a.seqs.row_begin = TensorView{}; }), "seqs.row_begin"));
  EXPECT_TRUE(has(reason({{0, 3, 0}}, [&](KdaConvArgs& a) { a.seqs.max_rows = 0; }), "seqs.max_rows"));
  // A pool whose slot stride is shorter than a slot: slots would overlap.
  EXPECT_TRUE(has(reason({{0, 3, 0}}, [&](KdaConvArgs& a) { a.state.strides[0] = C; }), "state slot stride"));
  // Position is not read by the conv: a missing position table is fine.
  EXPECT_EQ(reason({{0, 3, 0}}, [](KdaConvArgs& a) { a.seqs.position = TensorView{}; }), "ok");
  // The reference refuses what the check refuses.
  const HostSeqs bad = make_seqs({{0, 3, 9}});
  KdaConvArgs a;
  a.x = x.view(), a.weight = w.view(), a.state = pool.view(), a.out = out.view(), a.seqs = bad.batch;
  EXPECT_THROW(kda_conv_reference(a), core::Error);
}

TEST(KdaConv, CheckNamesTheBadArgument) {
  ConvCase cc = random_conv(1, 5, 8, 4, Precision::fp32);
  Tensor out = f32({5, 8});
  auto reason = [&](auto mutate) {
    KdaConvArgs a = conv_args(cc.x.view(), cc.w, cc.state, out.view(), Precision::fp32);
    mutate(a);
    core::Status s = kda_conv_check(a);
    return s ? std::string("ok") : s.reason();
  };
  EXPECT_EQ(reason([](KdaConvArgs&) {}), "ok");
  Tensor bad_state = f32({8, 4}), bad_out = f32({5, 7}), bad_w = f32({7, 4});
  Tensor bf16_x = Tensor::zeros(core::DType::bf16, {5, 8});
  EXPECT_NE(reason([&](KdaConvArgs& a) { a.state = bad_state.view(); }).find("state"), std::string::npos);
  EXPECT_NE(reason([&](KdaConvArgs& a) { a.out = bad_out.view(); }).find("out"), std::string::npos);
  EXPECT_NE(reason([&](KdaConvArgs& a) { a.weight = bad_w.view(); }).find("x"), std::string::npos);
  EXPECT_NE(reason([&](KdaConvArgs& a) { a.x = bf16_x.view(); }).find("x must be F32"), std::string::npos);
  EXPECT_NE(reason([&](KdaConvArgs& a) { a.weight = TensorView{}; }).find("weight"), std::string::npos);
  EXPECT_THROW(kda_conv_reference(conv_args(cc.x.view(), cc.w, bad_state, out.view(), Precision::fp32)), core::Error);
}

}  // namespace
}  // namespace k3::kernels
