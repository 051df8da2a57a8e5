// kernels/multi_linear/multi_linear_test.cpp: the fused multi_linear op against the standard op
// sequence (one registry `linear` per weight, CPU reference) bit for bit in both precisions, on
// random odd shapes (column slices of one buffer, mixed weight dtypes and round flags, NaN-poisoned
// outputs) and on the three per-GPU TP8 groups of spec §11 / §14.2; plus the argument checks.
#include "kernels/multi_linear/multi_linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/fp4.h"
#include "core/rng.h"
#include "kernels/linear/linear_test_util.h"
#include "kernels/registry.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;
using core::TensorView;

constexpr Precision kPrecisions[] = {Precision::bf16, Precision::fp32};

using namespace linear_test;

// x [T, width] N(0, 1), rounded to bf16 in bf16 mode as a stored activation is.
Tensor random_x(core::Rng& rng, int64_t T, int64_t width, Precision p) {
  Tensor x = Tensor::zeros(DType::f32, {T, width});
  for (int64_t i = 0; i < T * width; ++i) x.data<float>()[i] = round_act(static_cast<float>(rng.normal()), p);
  return x;
}

LinearWeight seeded_weight(uint64_t seed, WKind kind, int64_t out, int64_t in) {
  core::Rng rng(seed);
  return random_weight(rng, kind, out, in);
}

struct OutSpec {
  int64_t out;
  WKind kind;
  bool round;
};

// Runs the fused op and the standard per-weight sequence on NaN-poisoned buffers where every
// output is a column slice of one [T, gap + sum(out_i + gap)] buffer (the gaps stay NaN), and
// expects identical bits everywhere. x is itself a column slice (row stride > in) when x_pad > 0.
void expect_equals_standard(const std::vector<OutSpec>& specs, int64_t T, int64_t in, int64_t x_pad, Precision p,
                            uint64_t seed, const std::vector<LinearWeight>* given = nullptr) {
  core::Rng rng(seed);
  std::vector<LinearWeight> local;
  if (!given)
    for (const OutSpec& s : specs) local.push_back(random_weight(rng, s.kind, s.out, in));
  const std::vector<LinearWeight>& ws = given ? *given : local;
  const Tensor x_full = random_x(rng, T, in + x_pad, p);
  const TensorView x = columns(x_full, x_pad > 0 ? 1 : 0, in);

  constexpr int64_t kGap = 3;
  int64_t width = kGap;
  for (const OutSpec& s : specs) width += s.out + kGap;
  Tensor fused = nan_f32(T, width), standard = nan_f32(T, width);

  MultiLinearArgs args;
  args.x = x;
  args.precision = p;
  int64_t c0 = kGap;
  for (size_t i = 0; i < specs.size(); ++i) {
    const OutSpec& s = specs[i];
    args.add(&ws[i], columns(fused, c0, s.out), s.round);
    reference_registry().linear.run({x, &ws[i], columns(standard, c0, s.out), s.round, p}, core::Device::cpu);
    c0 += s.out + kGap;
  }
  ASSERT_EQ(reference_registry().multi_linear.select(args, core::Device::cpu).name, "reference");
  reference_registry().multi_linear.run(args, core::Device::cpu);

  const std::string what = "T " + std::to_string(T) + " in " + std::to_string(in) + " outputs " +
                           std::to_string(specs.size()) + (p == Precision::bf16 ? " bf16" : " fp32");
  const float* a = fused.data<float>();
  const float* b = standard.data<float>();
  int64_t written = 0, mismatches = 0;
  for (int64_t i = 0; i < T * width; ++i) {
    uint32_t ba, bb;
    std::memcpy(&ba, a + i, 4);
    std::memcpy(&bb, b + i, 4);
    if (ba != bb && mismatches++ < 5)
      ADD_FAILURE() << what << ": element " << i << " fused " << a[i] << " standard " << b[i];
    written += std::isnan(a[i]) ? 0 : 1;
  }
  EXPECT_EQ(mismatches, 0) << what;
  int64_t expected_written = 0;
  for (const OutSpec& s : specs) expected_written += T * s.out;
  EXPECT_EQ(written, expected_written) << what << ": every output written, gaps untouched";
  // bf16 mode rounds exactly the round_output outputs.
  c0 = kGap;
  for (const OutSpec& s : specs) {
    bool all_bf16 = true;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < s.out; ++o) {
        const float v = a[t * width + c0 + o];
        all_bf16 = all_bf16 && core::bf16_round(v) == v;
      }
    if (p == Precision::bf16 && s.round) {
      EXPECT_TRUE(all_bf16) << what << ": out " << s.out << " must be rounded";
    }
    if (!s.round && s.out * T >= 17) {
      EXPECT_FALSE(all_bf16) << what << ": logits must stay f32";
    }
    c0 += s.out + kGap;
  }
}

TEST(MultiLinear, EqualsStandardSequenceOnOddShapes) {
  const std::vector<OutSpec> mixed = {
      {1, WKind::bf16, true}, {5, WKind::f32, true}, {54, WKind::bf16, false}, {97, WKind::f32, true}};
  uint64_t seed = 100;
  for (Precision p : kPrecisions)
    for (int64_t in : {17, 97, 1000})
      for (int64_t T : {1, 3, 17, 64}) expect_equals_standard(mixed, T, in, /*x_pad=*/T % 2 ? 5 : 0, p, ++seed);
}

TEST(MultiLinear, SingleOutputAndFullCapacity) {
  uint64_t seed = 300;
  for (Precision p : kPrecisions) {
    expect_equals_standard({{97, WKind::bf16, true}}, 17, 97, 0, p, ++seed);
    std::vector<OutSpec> eight;
    for (int i = 0; i < kMultiLinearMaxOutputs; ++i)
      eight.push_back({1 + 13 * i, i % 3 == 0 ? WKind::f32 : WKind::bf16, i != 5});
    expect_equals_standard(eight, 3, 54, 2, p, ++seed);
  }
}

TEST(MultiLinear, Mxfp4WeightsOnTheCpu) {
  uint64_t seed = 400;
  for (Precision p : kPrecisions)
    expect_equals_standard({{17, WKind::mxfp4, true}, {54, WKind::bf16, true}, {5, WKind::mxfp4, false}}, 3, 96, 1, p,
                           ++seed);
}

// One TP8 rank's groups (spec §11 / §14.2): in = 7168, bf16 weights, T = 2 (two decode rows).
TEST(MultiLinear, EqualsStandardSequenceOnTp8Groups) {
  constexpr int64_t kHidden = 7168;
  const std::vector<std::vector<OutSpec>> groups = {
      // KDA [q, k, v, g, f_a, b]
      {{1536, WKind::bf16, true},
       {1536, WKind::bf16, true},
       {1536, WKind::bf16, true},
       {1536, WKind::bf16, true},
       {128, WKind::bf16, true},
       {12, WKind::bf16, true}},
      // MLA [q_a, kv_a, g_proj]
      {{1536, WKind::bf16, true}, {576, WKind::bf16, true}, {1536, WKind::bf16, true}},
      // MoE front [router (f32 logits), latent_down, shared_gate, shared_up]
      {{896, WKind::bf16, false}, {3584, WKind::bf16, true}, {768, WKind::bf16, true}, {768, WKind::bf16, true}},
  };
  uint64_t seed = 500;
  for (const auto& g : groups) {
    core::Rng rng(++seed);
    std::vector<LinearWeight> ws;
    for (const OutSpec& s : g) ws.push_back(random_weight(rng, s.kind, s.out, kHidden));
    for (Precision p : kPrecisions) expect_equals_standard(g, 2, kHidden, 0, p, ++seed, &ws);
  }
}

// ---------------------------------------------------------------- argument checks

struct CheckFixture {
  LinearWeight w17 = seeded_weight(1, WKind::bf16, 5, 17);
  LinearWeight w19 = seeded_weight(2, WKind::f32, 4, 19);
  Tensor x = Tensor::zeros(DType::f32, {3, 17});
  Tensor buf = nan_f32(3, 20);  // room for four [3, 5] column slices
  MultiLinearArgs args() {
    MultiLinearArgs a;
    a.x = x.view();
    for (int i = 0; i < 4; ++i) a.add(&w17, columns(buf, 5 * i, 5));
    return a;
  }
};

std::string check_reason(const MultiLinearArgs& a) {
  const core::Status s = multi_linear_check(a);
  return s ? std::string("ok") : s.reason();
}

TEST(MultiLinear, CheckAcceptsColumnSlicesOfOneBuffer) {
  CheckFixture f;
  EXPECT_EQ(check_reason(f.args()), "ok");
}

TEST(MultiLinear, CheckNamesTheBadOutput) {
  CheckFixture f;
  {
    MultiLinearArgs a;
    a.x = f.x.view();
    EXPECT_NE(check_reason(a).find("num_outputs must be 1..8, got 0"), std::string::npos) << check_reason(a);
  }
  {
    MultiLinearArgs a = f.args();
    a.outputs[2].w = nullptr;
    EXPECT_EQ(check_reason(a), "outputs[2].w is null");
  }
  {
    MultiLinearArgs a = f.args();
    a.outputs[1].w = &f.w19;
    a.outputs[1].out = columns(f.buf, 5, 4);
    EXPECT_NE(check_reason(a).find("outputs[1].w has in = 19 but outputs[0].w has in = 17"), std::string::npos)
        << check_reason(a);
  }
  {
    MultiLinearArgs a = f.args();
    a.outputs[3].out = columns(f.buf, 15, 4);  // w has 5 outputs
    const std::string r = check_reason(a);
    EXPECT_EQ(r.rfind("outputs[3]: out must be", 0), 0u) << r;
  }
  {
    MultiLinearArgs a = f.args();
    a.outputs[3].out = columns(f.buf, 8, 5);  // columns 8..12 meet outputs[1] (5..9) and [2] (10..14)
    EXPECT_EQ(check_reason(a), "outputs[3].out overlaps outputs[1].out");
  }
  {
    MultiLinearArgs a = f.args();
    Tensor xo = nan_f32(3, 22);
    a.x = columns(xo, 0, 17);
    a.outputs[0].out = columns(xo, 16, 5);  // shares column 16 with x
    EXPECT_EQ(check_reason(a), "outputs[0].out overlaps x");
    a.outputs[0].out = columns(xo, 17, 5);  // beside x in the same rows: fine
    EXPECT_EQ(check_reason(a), "ok");
  }
  {
    MultiLinearArgs a = f.args();
    a.num_outputs = kMultiLinearMaxOutputs + 1;
    EXPECT_NE(check_reason(a).find("num_outputs must be 1..8, got 9"), std::string::npos);
  }
  {
    MultiLinearArgs a = f.args();
    for (int i = 4; i < kMultiLinearMaxOutputs; ++i) a.add(&f.w17, columns(f.buf, 0, 5));
    EXPECT_THROW(a.add(&f.w17, columns(f.buf, 0, 5)), core::Error);
  }
  {
    // The registry wrapper throws with the op name and the reason.
    MultiLinearArgs a = f.args();
    a.outputs[2].w = nullptr;
    try {
      reference_registry().multi_linear.run(a, core::Device::cpu);
      FAIL() << "a null weight was accepted";
    } catch (const core::Error& e) {
      EXPECT_EQ(std::string(e.what()), "multi_linear: outputs[2].w is null");
    }
  }
}

// The router epilogue (the MoE front): ids and weights equal router_topk's on the op's own logits,
// bit for bit, with the logits output anywhere in the list; both precisions; bf16 and f32 bias.
TEST(MultiLinear, RouterEpilogueEqualsTheRouterOnItsLogits) {
  for (const Precision p : kPrecisions)
    for (const int router_at : {0, 2}) {
      core::Rng rng(700 + router_at);
      const int64_t T = 3, in = 40, E = 37, k = 6;
      const LinearWeight wr = random_weight(rng, WKind::bf16, E, in), w1 = random_weight(rng, WKind::bf16, 9, in);
      const Tensor x = random_x(rng, T, in, p);
      Tensor logits = nan_f32(T, E), y1 = nan_f32(T, 9), y2 = nan_f32(T, 9);
      Tensor bias = Tensor::zeros(DType::f32, {E});
      for (int64_t e = 0; e < E; ++e) bias.data<float>()[e] = static_cast<float>(rng.normal() * 0.05);
      Tensor ids = Tensor::zeros(DType::i32, {T, k}), weights = nan_f32(T, k);
      MultiLinearArgs a;
      a.x = x.view();
      a.precision = p;
      for (int i = 0; i < 3; ++i) {
        if (i == router_at) a.add(&wr, logits.view(), /*round_output=*/false);
        else a.add(&w1, (i == 1 ? y1 : y2).view());
      }
      a.router = {router_at, bias.view(), ids.view(), weights.view(), true, 2.5f};
      ASSERT_EQ(check_reason(a), "ok");
      reference_registry().multi_linear.run(a, core::Device::cpu);

      Tensor want_ids = Tensor::zeros(DType::i32, {T, k}), want_w = nan_f32(T, k);
      reference_registry().router_topk.run({logits.view(), bias.view(), want_ids.view(), want_w.view(), true, 2.5f},
                                           core::Device::cpu);
      EXPECT_EQ(std::memcmp(ids.data<int32_t>(), want_ids.data<int32_t>(), T * k * 4), 0) << "router at " << router_at;
      EXPECT_EQ(std::memcmp(weights.data<float>(), want_w.data<float>(), T * k * 4), 0) << "router at " << router_at;
    }
}

TEST(MultiLinear, CheckNamesABadRouterEpilogue) {
  CheckFixture f;
  Tensor logits = nan_f32(3, 5), bias = Tensor::zeros(DType::f32, {5});
  Tensor ids = Tensor::zeros(DType::i32, {3, 2}), weights = nan_f32(3, 2);
  const auto with_router = [&]() {
    MultiLinearArgs a = f.args();
    a.outputs[1] = {&f.w17, logits.view(), false};
    a.router = {1, bias.view(), ids.view(), weights.view(), true, 1.0f};
    return a;
  };
  EXPECT_EQ(check_reason(with_router()), "ok");
  {
    MultiLinearArgs a = with_router();
    a.router.output = 4;
    EXPECT_EQ(check_reason(a), "router: output 4 out of range (4 outputs)");
  }
  {
    MultiLinearArgs a = with_router();
    a.outputs[1].round_output = true;
    EXPECT_EQ(check_reason(a), "router: outputs[1] must keep its f32 logits (round_output = false)");
  }
  {
    MultiLinearArgs a = with_router();
    Tensor wide_ids = Tensor::zeros(DType::i32, {3, 6});  // top-6 of 5 experts
    a.router.ids = wide_ids.view();
    EXPECT_EQ(check_reason(a).rfind("router: top-k 6", 0), 0u) << check_reason(a);
  }
  {
    MultiLinearArgs a = with_router();
    a.router.weights = columns(f.buf, 0, 2);  // inside outputs[0].out
    EXPECT_EQ(check_reason(a).rfind("router: weights overlaps outputs[0].out", 0), 0u) << check_reason(a);
  }
}

TEST(MultiLinear, EmptyBatchWritesNothing) {
  LinearWeight w = seeded_weight(3, WKind::bf16, 5, 17);
  Tensor x = Tensor::zeros(DType::f32, {0, 17}), out = Tensor::zeros(DType::f32, {0, 5});
  MultiLinearArgs a;
  a.x = x.view();
  a.add(&w, out.view());
  EXPECT_EQ(check_reason(a), "ok");
  reference_registry().multi_linear.run(a, core::Device::cpu);
}

}  // namespace
}  // namespace k3::kernels
