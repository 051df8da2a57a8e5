// kernels/moe/experts_test.cpp: routed experts against naive loops on the shapes of cases.h (odd
// shapes, one TP8 rank of K3); TP-split emulation (§15.6) and expert-parallel partial sums.
#include "kernels/moe/experts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/fp4.h"
#include "core/rng.h"
#include "kernels/moe/cases.h"
#include "kernels/norm/rmsnorm.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One expert weight plus the f32 values it decodes to (row-major [out, in]).
struct Weight {
  LinearWeight w;
  std::vector<float> values;
};

// Uniform with std gain/sqrt(in): gain 3 keeps activations O(1..10) so SiTU's clipping bites.
Weight make_weight(int64_t out, int64_t in, bool mxfp4, uint64_t seed, double gain = 3.0) {
  core::Rng rng(seed);
  const double half = gain * std::sqrt(3.0 / static_cast<double>(in));
  std::vector<float> src(static_cast<size_t>(out * in));
  for (float& v : src) v = static_cast<float>(rng.uniform(-half, half));
  Weight r;
  r.values.assign(src.size(), 0.0f);
  if (!mxfp4) {
    r.w.weight = Tensor::zeros(DType::bf16, {out, in});
    for (size_t i = 0; i < src.size(); ++i) {
      r.w.weight.data<uint16_t>()[i] = core::f32_to_bf16_bits(src[i]);
      r.values[i] = core::bf16_round(src[i]);
    }
    return r;
  }
  r.w.weight = Tensor::zeros(DType::u8, {out, in / 2});
  r.w.scale = Tensor::zeros(DType::u8, {out, in / 32});
  for (int64_t o = 0; o < out; ++o) {
    std::span<uint8_t> packed{r.w.weight.data<uint8_t>() + o * in / 2, static_cast<size_t>(in / 2)};
    std::span<uint8_t> scales{r.w.scale.data<uint8_t>() + o * in / 32, static_cast<size_t>(in / 32)};
    core::mxfp4_quantize_row({src.data() + o * in, static_cast<size_t>(in)}, packed, scales);
    core::mxfp4_dequantize_row(packed, scales, {r.values.data() + o * in, static_cast<size_t>(in)});
  }
  return r;
}

// E experts over the weight sets w1/w3/w2 (expert e takes set e % sets, cases.h MoeExpertsShape).
struct Experts {
  std::vector<Weight> w1, w3, w2;
  int64_t E = 0;
  static const Weight& at(const std::vector<Weight>& ws, int64_t e) { return ws[static_cast<size_t>(e) % ws.size()]; }
  std::vector<LinearWeight> l1() const { return pick(w1); }
  std::vector<LinearWeight> l3() const { return pick(w3); }
  std::vector<LinearWeight> l2() const { return pick(w2); }
  std::vector<LinearWeight> pick(const std::vector<Weight>& ws) const {
    std::vector<LinearWeight> r;
    for (int64_t e = 0; e < E; ++e) r.push_back(at(ws, e).w);
    return r;
  }
};

Experts make_experts(int64_t E, int64_t L, int64_t I, bool mxfp4, uint64_t seed, int64_t sets = 0) {
  Experts x;
  x.E = E;
  for (int64_t e = 0; e < (sets > 0 ? sets : E); ++e) {
    x.w1.push_back(make_weight(I, L, mxfp4, seed + 3 * e));
    x.w3.push_back(make_weight(I, L, mxfp4, seed + 3 * e + 1));
    x.w2.push_back(make_weight(L, I, mxfp4, seed + 3 * e + 2, 1.0));
  }
  return x;
}
Experts make_experts(const MoeExpertsShape& s, uint64_t seed) {
  return make_experts(s.E, s.L, s.I, s.mxfp4, seed, s.sets());
}

struct Routing {
  Tensor z, ids, weights;
};

// Random z (bf16 values), ids (repeats allowed, as any id list must work), weights in (0, 1).
Routing make_routing(int64_t T, int64_t L, int64_t E, int64_t k, uint64_t seed) {
  core::Rng rng(seed);
  Routing r{Tensor::zeros(DType::f32, {T, L}), Tensor::zeros(DType::i32, {T, k}), Tensor::zeros(DType::f32, {T, k})};
  for (float& v : r.z.span<float>()) v = core::bf16_round(static_cast<float>(rng.normal()));
  for (int32_t& v : r.ids.span<int32_t>()) v = static_cast<int32_t>(rng.next_u64() % E);
  for (float& v : r.weights.span<float>()) v = static_cast<float>(rng.uniform(0.05, 1.0));
  return r;
}

Tensor run(const Routing& r, const Experts& x, Precision p, bool round_output = true) {
  const std::vector<LinearWeight> w1 = x.l1(), w3 = x.l3(), w2 = x.l2();
  Tensor out = Tensor::zeros(DType::f32, r.z.shape());
  for (float& v : out.span<float>()) v = kNaN;
  MoeExpertsArgs a{r.z.view(), r.ids.view(), r.weights.view(), w1, w3, w2, out.view(), 4.0f, 25.0f, p, round_output};
  EXPECT_TRUE(moe_experts_check(a)) << moe_experts_check(a).reason();
  moe_experts_reference(a);
  return out;
}

// y = round(W x) by the textbook loop.
std::vector<float> naive_linear(const std::vector<float>& w, const float* x, int64_t out, int64_t in, Precision p) {
  std::vector<float> y(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    float acc = 0.0f;
    for (int64_t i = 0; i < in; ++i) acc = acc + x[i] * w[o * in + i];
    y[o] = round_act(acc, p);
  }
  return y;
}

// Spec §7 and §8 written out per token and route (round_output false: e_j and u unrounded). An
// expert-parallel rank (held >= 0: experts [begin, begin + held) of x): only those routes are
// summed, e_j rounded as at TP=1, u unrounded.
std::vector<float> naive_moe(const Routing& r, const Experts& x, Precision p, bool round_output = true,
                             int64_t begin = 0, int64_t held = -1) {
  const int64_t T = r.z.dim(0), L = r.z.dim(1), k = r.ids.dim(1);
  const bool ep = held >= 0, round_e = round_output || ep;
  if (ep) round_output = false;
  std::vector<float> u(static_cast<size_t>(T * L));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> acc(static_cast<size_t>(L), 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = r.ids.data<int32_t>()[t * k + j];
      if (ep && (e < begin || e >= begin + held)) continue;
      const int64_t I = Experts::at(x.w1, e).w.out_features();
      const std::vector<float> g = naive_linear(Experts::at(x.w1, e).values, r.z.data<float>() + t * L, I, L, p);
      const std::vector<float> c = naive_linear(Experts::at(x.w3, e).values, r.z.data<float>() + t * L, I, L, p);
      std::vector<float> h(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        const float gate = 4.0f * std::tanh(g[i] / 4.0f) * (1.0f / (1.0f + std::exp(-g[i])));
        h[i] = round_act(gate * (25.0f * std::tanh(c[i] / 25.0f)), p);
      }
      const std::vector<float> ej = naive_linear(Experts::at(x.w2, e).values, h.data(), L, I,
                                                 round_e ? p : Precision::fp32);
      for (int64_t l = 0; l < L; ++l) acc[l] = acc[l] + r.weights.data<float>()[t * k + j] * ej[l];
    }
    for (int64_t l = 0; l < L; ++l) u[t * L + l] = round_output ? round_act(acc[l], p) : acc[l];
  }
  return u;
}

void expect_bitwise(const Tensor& got, const std::vector<float>& want) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got.data<float>()[i]), std::bit_cast<uint32_t>(want[i])) << "i=" << i;
}

// cases.h kMoeExpertsOddShapes (bf16 and MXFP4 experts, one expert, k = 1 and k = E) at every odd
// token count, both precisions.
TEST(MoeExperts, MatchesNaiveOnOddShapes) {
  uint64_t seed = 10;
  for (const MoeExpertsShape& s : kMoeExpertsOddShapes) {
    const Experts x = make_experts(s, seed += 100);
    for (int64_t k : s.topk)
      for (int64_t T : kMoeExpertsOddTokens) {
        SCOPED_TRACE(std::string(s.name) + " k " + std::to_string(k) + " T " + std::to_string(T));
        const Routing r = make_routing(T, s.L, s.E, k, ++seed);
        for (Precision p : {Precision::bf16, Precision::fp32}) expect_bitwise(run(r, x, p), naive_moe(r, x, p));
      }
  }
}

// One TP8 rank (cases.h kMoeExpertsK3Tp8: all 896 experts, w1/w3 [384, 3584], w2 [3584, 384], MXFP4,
// top-16) at the first decode batches of kMoeK3Tokens (the naive loops take ~0.1 s a token).
TEST(MoeExperts, K3Tp8ExpertShardShape) {
  const MoeExpertsShape& s = kMoeExpertsK3Tp8;
  const Experts x = make_experts(s, 30);
  for (int64_t T : kMoeK3Tokens) {
    if (T > 2) break;
    SCOPED_TRACE("T " + std::to_string(T));
    const Routing r = make_routing(T, s.L, s.E, s.topk[0], 31 + T);
    const std::vector<float> want = naive_moe(r, x, Precision::bf16);
    expect_bitwise(run(r, x, Precision::bf16), want);
    int64_t nonzero = 0;
    for (float v : want) nonzero += v != 0.0f;
    EXPECT_GT(nonzero, static_cast<int64_t>(want.size()) / 2);
  }
}

// Two routes to the same expert with weights a and b equal one route with a + b (exact in fp32 when
// a, b, a + b are small powers of two), on every odd shape.
TEST(MoeExperts, RouteWeightsScaleTheSum) {
  uint64_t seed = 40;
  for (const MoeExpertsShape& s : kMoeExpertsOddShapes) {
    const Experts x = make_experts(s, seed += 100);
    for (int64_t T : kMoeExpertsOddTokens) {
      Routing two = make_routing(T, s.L, s.E, 2, ++seed), one = make_routing(T, s.L, s.E, 1, seed);
      std::copy(two.z.data<float>(), two.z.data<float>() + T * s.L, one.z.data<float>());
      const int32_t e = static_cast<int32_t>(s.E - 1);
      for (int64_t t = 0; t < T; ++t) {
        two.ids.data<int32_t>()[2 * t] = two.ids.data<int32_t>()[2 * t + 1] = one.ids.data<int32_t>()[t] = e;
        two.weights.data<float>()[2 * t] = 0.25f;
        two.weights.data<float>()[2 * t + 1] = 0.25f;
        one.weights.data<float>()[t] = 0.5f;
      }
      Tensor a = run(two, x, Precision::fp32), b = run(one, x, Precision::fp32);
      for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << s.name << " T " << T;
    }
  }
}

// Rows [r0, r1) and columns [c0, c1) of a rank-2 tensor, any dtype.
Tensor slice2d(const Tensor& t, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const size_t es = core::dtype_size(t.dtype());
  Tensor s = Tensor::zeros(t.dtype(), {r1 - r0, c1 - c0});
  for (int64_t r = r0; r < r1; ++r)
    std::memcpy(s.data<char>() + (r - r0) * (c1 - c0) * es, t.data<char>() + (r * t.dim(1) + c0) * es, (c1 - c0) * es);
  return s;
}

// TP shard s of tp of every weight set: w1/w3 rows (column parallel), w2 columns (row parallel).
// MXFP4 shards cut the packed codes (2 per byte) and the scales (1 per 32) at the same columns.
Experts shard(const Experts& x, int s, int tp) {
  Experts r;
  r.E = x.E;
  for (size_t e = 0; e < x.w1.size(); ++e) {
    const int64_t I = x.w1[e].w.out_features(), L = x.w2[e].w.out_features();
    const int64_t i0 = I * s / tp, i1 = I * (s + 1) / tp;
    for (const auto* src : {&x.w1[e], &x.w3[e]}) {
      Weight w;
      w.w.weight = slice2d(src->w.weight, i0, i1, 0, src->w.weight.dim(1));
      if (src->w.is_mxfp4()) w.w.scale = slice2d(src->w.scale, i0, i1, 0, src->w.scale.dim(1));
      w.values.assign(src->values.begin() + i0 * L, src->values.begin() + i1 * L);
      (src == &x.w1[e] ? r.w1 : r.w3).push_back(w);
    }
    Weight w2;
    const bool mx = x.w2[e].w.is_mxfp4();
    w2.w.weight = mx ? slice2d(x.w2[e].w.weight, 0, L, i0 / 2, i1 / 2) : slice2d(x.w2[e].w.weight, 0, L, i0, i1);
    if (mx) w2.w.scale = slice2d(x.w2[e].w.scale, 0, L, i0 / 32, i1 / 32);
    r.w2.push_back(w2);
  }
  return r;
}

Tensor rmsnorm_fp32(const Tensor& u, const Tensor& w) {
  Tensor out = Tensor::zeros(DType::f32, u.shape());
  rmsnorm_reference({u.view(), w.view(), out.view(), 1e-5f, RmsNormStyle::moonshot, Precision::fp32});
  return out;
}

double max_rel_diff(const Tensor& a, const Tensor& b) {
  double diff = 0.0, scale = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::fabs(double(a.data<float>()[i]) - b.data<float>()[i]));
    scale = std::max(scale, std::fabs(double(b.data<float>()[i])));
  }
  return diff / scale;
}

// Spec §15 item 6: each rank holds a slice of every expert's intermediate; the partial latent sums
// (fp32 mode) all-reduced, then the routed RMSNorm, equal the unsharded result (cases.h
// kMoeExpertsTpSplitShapes, both formats).
TEST(MoeExperts, LatentTpSplitEqualsUnsharded) {
  uint64_t seed = 50;
  for (const MoeExpertsShape& s : kMoeExpertsTpSplitShapes) {
    const int64_t L = s.L;
    const Experts x = make_experts(s, seed += 100);
    Tensor norm_w = Tensor::zeros(DType::f32, {L});
    core::Rng rng(++seed);
    for (float& v : norm_w.span<float>()) v = static_cast<float>(1.0 + 0.1 * rng.normal());
    for (int64_t k : s.topk)
      for (int64_t T : kMoeExpertsOddTokens) {
        const Routing r = make_routing(T, L, s.E, k, ++seed);
        const Tensor full = run(r, x, Precision::fp32);
        const Tensor full_normed = rmsnorm_fp32(full, norm_w);
        for (int tp : kMoeExpertsTpSplits) {
          Tensor reduced = Tensor::zeros(DType::f32, {T, L});
          for (int rank = 0; rank < tp; ++rank) {
            const Tensor partial = run(r, shard(x, rank, tp), Precision::fp32);
            for (int64_t i = 0; i < T * L; ++i) reduced.data<float>()[i] += partial.data<float>()[i];
          }
          EXPECT_LE(max_rel_diff(reduced, full), 1e-5) << s.name << " T " << T << " tp " << tp;
          EXPECT_LE(max_rel_diff(rmsnorm_fp32(reduced, norm_w), full_normed), 1e-5) << s.name << " T " << T;
        }
      }
  }
}

// round_output off (a TP rank's partial sum): gate/up and SiTU rounded as ever, e_j and u not;
// the ranks' partial sums add up to the unsharded unrounded sum, which rounds to the usual result
// up to the e_j rounding TP cannot keep.
TEST(MoeExperts, UnroundedPartialSumsForTensorParallelism) {
  uint64_t seed = 70;
  for (const MoeExpertsShape& s : kMoeExpertsTpSplitShapes) {
    const int64_t L = s.L;
    const Experts x = make_experts(s, seed += 100);
    for (int64_t k : s.topk)
      for (int64_t T : kMoeExpertsOddTokens) {
        SCOPED_TRACE(std::string(s.name) + " T " + std::to_string(T));
        const Routing r = make_routing(T, L, s.E, k, ++seed);
        const Tensor full = run(r, x, Precision::bf16, /*round_output=*/false);
        expect_bitwise(full, naive_moe(r, x, Precision::bf16, /*round_output=*/false));
        int64_t off_grid = 0;  // values that are not bf16: the output really is unrounded
        for (float v : full.span<float>()) off_grid += v != core::bf16_round(v);
        EXPECT_GT(off_grid, full.numel() / 2);
        for (int tp : kMoeExpertsTpSplits) {
          Tensor reduced = Tensor::zeros(DType::f32, {T, L});
          for (int rank = 0; rank < tp; ++rank) {
            const Tensor partial = run(r, shard(x, rank, tp), Precision::bf16, false);
            for (int64_t i = 0; i < T * L; ++i) reduced.data<float>()[i] += partial.data<float>()[i];
          }
          EXPECT_LE(max_rel_diff(reduced, full), 1e-5) << "tp=" << tp;
        }
      }
  }
  // The output must be f32 when unrounded, whatever z is.
  const int64_t L = 64;
  const Experts x = make_experts(2, L, 32, false, 90);
  const Routing r = make_routing(3, L, 2, 1, 91);
  const std::vector<LinearWeight> w1 = x.l1(), w3 = x.l3(), w2 = x.l2();
  Tensor out_bf16 = Tensor::zeros(DType::bf16, {3, L});
  const core::Status st = moe_experts_check(
      {r.z.view(), r.ids.view(), r.weights.view(), w1, w3, w2, out_bf16.view(), 4.0f, 25.0f, Precision::bf16, false});
  ASSERT_FALSE(st);
  EXPECT_NE(st.reason().find("round_output"), std::string::npos) << st.reason();
}

TEST(MoeExperts, BadArgumentsFail) {
  const Experts x = make_experts(3, 64, 32, false, 70);
  std::vector<LinearWeight> w1 = x.l1(), w3 = x.l3(), w2 = x.l2();
  Routing r = make_routing(4, 64, 3, 2, 71);
  Tensor out = Tensor::zeros(DType::f32, {4, 64});
  MoeExpertsArgs a{r.z.view(), r.ids.view(), r.weights.view(), w1, w3, w2, out.view()};
  EXPECT_TRUE(moe_experts_check(a)) << moe_experts_check(a).reason();
  r.ids.data<int32_t>()[5] = 3;
  core::Status s = moe_experts_check(a);
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("ids[2][1] = 3"), std::string::npos) << s.reason();
  EXPECT_NE(s.reason().find("3 experts"), std::string::npos) << s.reason();
  r.ids.data<int32_t>()[5] = 0;
  std::vector<LinearWeight> w2_bad = w2;
  w2_bad[1] = make_weight(64, 31, false, 1).w;
  s = moe_experts_check({r.z.view(), r.ids.view(), r.weights.view(), w1, w3, w2_bad, out.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("w2[1]"), std::string::npos) << s.reason();
  std::vector<LinearWeight> w3_bad = w3;
  w3_bad[2] = make_weight(33, 64, false, 1).w;
  s = moe_experts_check({r.z.view(), r.ids.view(), r.weights.view(), w1, w3_bad, w2, out.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("w3[2]"), std::string::npos) << s.reason();
  std::vector<LinearWeight> w2_short(w2.begin(), w2.end() - 1);
  EXPECT_FALSE(moe_experts_check({r.z.view(), r.ids.view(), r.weights.view(), w1, w3, w2_short, out.view()}));
  Tensor weights_bad = Tensor::zeros(DType::f32, {4, 3});
  s = moe_experts_check({r.z.view(), r.ids.view(), weights_bad.view(), w1, w3, w2, out.view()});
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason().find("weights"), std::string::npos) << s.reason();
}

// ---------------------------------------------------------------- expert parallelism

// Experts [begin, begin + n) of x: what an expert-parallel rank holds (whole experts).
Experts held_experts(const Experts& x, int64_t begin, int64_t n) {
  Experts r;
  r.E = n;
  for (int64_t e = begin; e < begin + n; ++e) {
    r.w1.push_back(Experts::at(x.w1, e));
    r.w3.push_back(Experts::at(x.w3, e));
    r.w2.push_back(Experts::at(x.w2, e));
  }
  return r;
}

// Rank `rank` of `ep`: its partial sum (round_output off, whole experts) over experts
// [rank * E / ep, (rank + 1) * E / ep) of the E in x, into a NaN-poisoned f32 out.
Tensor run_ep(const Routing& r, const Experts& x, Precision p, int rank, int ep) {
  const int64_t E = x.E, n = E / ep, begin = rank * n;
  const Experts held = held_experts(x, begin, n);
  const std::vector<LinearWeight> w1 = held.l1(), w3 = held.l3(), w2 = held.l2();
  Tensor out = Tensor::zeros(DType::f32, r.z.shape());
  for (float& v : out.span<float>()) v = kNaN;
  MoeExpertsArgs a{r.z.view(), r.ids.view(), r.weights.view(), w1, w3, w2, out.view(), 4.0f, 25.0f, p, false};
  a.expert_begin = begin, a.num_experts = E, a.whole_experts = true;
  EXPECT_TRUE(moe_experts_check(a)) << moe_experts_check(a).reason();
  moe_experts_reference(a);
  return out;
}

// Each rank's partial is bitwise the naive sum over its own routes (e_j rounded as at TP=1, the sum
// unrounded); the ranks' partials add up to the TP=1 sum up to fp32 summation order (tight), and in
// bf16 the rounded total equals TP=1's rounded output wherever the two f32 sums round alike (and is
// within one bf16 ulp everywhere): e_j rounding is exactly TP=1's. On cases.h kMoeExpertsEpOddShapes,
// each split of kMoeExpertsEpSplits that divides E.
TEST(MoeExperts, ExpertParallelPartialsSumToTp1) {
  uint64_t seed = 110;
  for (const MoeExpertsShape& s : kMoeExpertsEpOddShapes) {
    const int64_t L = s.L, E = s.E;
    const Experts x = make_experts(s, seed += 100);
    for (int64_t k : s.topk)
      for (int64_t T : kMoeExpertsOddTokens) {
        const Routing r = make_routing(T, L, E, k, ++seed);
        for (Precision p : {Precision::fp32, Precision::bf16}) {
          const std::string at = std::string(s.name) + " k " + std::to_string(k) + " T " + std::to_string(T) +
                                 (p == Precision::bf16 ? " bf16" : " fp32");
          SCOPED_TRACE(at);
          const Tensor tp1 = run(r, x, p);  // round(sum_j p_j e_j)
          // TP=1's unrounded sum with e_j rounded: the whole range held by one "rank".
          const Tensor tp1_sum = run_ep(r, x, p, 0, 1);
          expect_bitwise(tp1_sum, naive_moe(r, x, p, false, 0, E));
          for (int64_t i = 0; i < tp1.numel(); ++i)
            ASSERT_EQ(round_act(tp1_sum.data<float>()[i], p), tp1.data<float>()[i]) << "i=" << i;
          for (int ep : kMoeExpertsEpSplits) {
            if (E % ep != 0) continue;
            Tensor reduced = Tensor::zeros(DType::f32, {T, L});
            for (int rank = 0; rank < ep; ++rank) {
              const Tensor partial = run_ep(r, x, p, rank, ep);
              expect_bitwise(partial, naive_moe(r, x, p, false, rank * (E / ep), E / ep));
              for (int64_t i = 0; i < T * L; ++i) reduced.data<float>()[i] += partial.data<float>()[i];
            }
            EXPECT_LE(max_rel_diff(reduced, tp1_sum), 1e-6) << "ep " << ep;
            for (int64_t i = 0; i < T * L; ++i) {
              const float got = round_act(reduced.data<float>()[i], p), want = tp1.data<float>()[i];
              ASSERT_LE(std::fabs(got - want), std::ldexp(std::fabs(want), -7) + 1e-30f) << "ep " << ep << " i=" << i;
            }
          }
        }
      }
  }
}

// A token none of whose routes the rank holds gets exactly +0 (the poison is overwritten); a token
// with some held routes gets just those.
TEST(MoeExperts, ExpertParallelRoutesOfOtherRanksGiveZero) {
  const int64_t L = 64, I = 32, E = 8, T = 3;
  const Experts x = make_experts(E, L, I, true, 130);
  Routing r = make_routing(T, L, E, 2, 131);
  const int32_t ids[T][2] = {{4, 7}, {5, 5}, {1, 6}};  // rank 0 of 2 holds 0..3: only token 2's first route
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < 2; ++j) r.ids.data<int32_t>()[t * 2 + j] = ids[t][j];
  const Tensor rank0 = run_ep(r, x, Precision::bf16, 0, 2);
  for (int64_t i = 0; i < 2 * L; ++i) ASSERT_EQ(std::bit_cast<uint32_t>(rank0.data<float>()[i]), 0u) << "i=" << i;
  expect_bitwise(rank0, naive_moe(r, x, Precision::bf16, false, 0, 4));
  int64_t nonzero = 0;
  for (int64_t l = 0; l < L; ++l) nonzero += rank0.data<float>()[2 * L + l] != 0.0f;
  EXPECT_GT(nonzero, L / 2);
}

// Bad ids (outside [0, num_experts), not merely another rank's) and bad ranges fail the check.
TEST(MoeExperts, ExpertParallelBadIdsAndRangesFail) {
  const int64_t L = 64, E = 8;
  const Experts x = make_experts(E, L, 32, false, 140);
  const Experts held = held_experts(x, 4, 2);  // experts 4, 5 of 8
  const std::vector<LinearWeight> w1 = held.l1(), w3 = held.l3(), w2 = held.l2();
  Routing r = make_routing(2, L, E, 3, 141);
  Tensor out = Tensor::zeros(DType::f32, {2, L});
  MoeExpertsArgs a{r.z.view(), r.ids.view(), r.weights.view(), w1,   w3, w2, out.view(),
                   4.0f,       25.0f,        Precision::bf16,  false};
  a.expert_begin = 4, a.num_experts = E, a.whole_experts = true;
  ASSERT_TRUE(moe_experts_check(a)) << moe_experts_check(a).reason();  // ids of every rank are fine
  for (int32_t bad : {-1, 8, 100}) {
    r.ids.data<int32_t>()[4] = bad;
    const core::Status s = moe_experts_check(a);
    ASSERT_FALSE(s) << bad;
    EXPECT_NE(s.reason().find("ids[1][1] = " + std::to_string(bad)), std::string::npos) << s.reason();
    EXPECT_NE(s.reason().find("8 experts"), std::string::npos) << s.reason();
  }
  r.ids.data<int32_t>()[4] = 0;
  struct Range {
    int64_t begin, total;
  };
  for (const Range bad : {Range{7, 8}, Range{-1, 8}, Range{1, 0}, Range{0, -4}, Range{4, 5}}) {
    a.expert_begin = bad.begin, a.num_experts = bad.total;
    const core::Status s = moe_experts_check(a);
    ASSERT_FALSE(s) << bad.begin << " " << bad.total;
    EXPECT_NE(s.reason().find("held experts"), std::string::npos) << s.reason();
  }
  a.expert_begin = 6, a.num_experts = E;  // the last two: fine
  EXPECT_TRUE(moe_experts_check(a)) << moe_experts_check(a).reason();
}
}  // namespace
}  // namespace k3::kernels
