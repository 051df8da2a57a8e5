// kernels/moe/moe_tail_test.cpp: the fused moe_tail_combine op against the standard op
// sequence of model::moe_tail (registry situ_glu, linear, rmsnorm, linear, add; CPU reference) bit
// for bit in both precisions and both rmsnorm styles, with and without the routed norm and the shared
// experts, on random odd shapes (strided inputs, NaN-poisoned column-slice outputs) and on one TP8
// rank's shapes (spec §11 / §14.2); plus the argument checks.
#include "kernels/moe/moe_tail.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/fp4.h"
#include "core/rng.h"
#include "kernels/linear/linear_test_util.h"
#include "kernels/moe/cases.h"
#include "kernels/registry.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;
using core::TensorView;

constexpr Precision kPrecisions[] = {Precision::bf16, Precision::fp32};

using namespace linear_test;

// [T, width] N(0, std^2), rounded as a stored activation is in bf16 mode.
Tensor random_act(core::Rng& rng, int64_t T, int64_t width, double std, Precision p) {
  Tensor x = Tensor::zeros(DType::f32, {T, width});
  for (int64_t i = 0; i < T * width; ++i) x.data<float>()[i] = round_act(static_cast<float>(rng.normal(0.0, std)), p);
  return x;
}

// Norm weight [L] bf16 around 1 (as trained norms are), some negative entries.
Tensor random_norm(core::Rng& rng, int64_t L) {
  Tensor w = Tensor::zeros(DType::bf16, {L});
  for (int64_t i = 0; i < L; ++i)
    w.data<uint16_t>()[i] = core::f32_to_bf16_bits(static_cast<float>(rng.normal(1.0, 0.5)));
  return w;
}

struct Case {
  int64_t T, L, SI, hidden;
  bool use_norm = true, shared = true;
  RmsNormStyle style = RmsNormStyle::moonshot;
  WKind up_kind = WKind::bf16, down_kind = WKind::bf16;
  int64_t pad = 0;  // > 0: inputs and out are column slices of wider buffers (row stride > width)
};

std::string name_of(const Case& c, Precision p) {
  return "T " + std::to_string(c.T) + " L " + std::to_string(c.L) + " SI " + std::to_string(c.SI) + " hidden " +
         std::to_string(c.hidden) + (c.use_norm ? " norm" : " no-norm") + (c.shared ? " shared" : " no-shared") +
         (c.style == RmsNormStyle::moonshot ? " moonshot" : " fused") + (p == Precision::bf16 ? " bf16" : " fp32");
}

// model::moe_tail's ops after moe_experts (non-TP), through the reference registry, into out [T, hidden].
void run_standard(const MoeTailCombineArgs& a, const TensorView& out) {
  const Registry& r = reference_registry();
  const core::Device cpu = core::Device::cpu;
  const int64_t T = a.u.dim(0), L = a.u.dim(1), hidden = a.latent_up->out_features();
  Tensor ys;
  if (a.has_shared()) {
    const int64_t SI = a.shared_down->in_features();
    Tensor s = nan_f32(T, SI);
    r.situ_glu.run({a.shared_gate, a.shared_up, s.view(), a.situ_beta, a.situ_linear_beta, a.precision}, cpu);
    ys = nan_f32(T, hidden);
    r.linear.run({s.view(), a.shared_down, ys.view(), true, a.precision}, cpu);
  }
  Tensor un;
  TensorView x = a.u;
  if (a.use_norm) {
    un = nan_f32(T, L);
    r.rmsnorm.run({a.u, a.latent_norm, un.view(), a.eps, a.style, a.precision}, cpu);
    x = un.view();
  }
  if (!a.has_shared()) {
    r.linear.run({x, a.latent_up, out, true, a.precision}, cpu);
    return;
  }
  Tensor yr = nan_f32(T, hidden);
  r.linear.run({x, a.latent_up, yr.view(), true, a.precision}, cpu);
  r.add.run({yr.view(), ys.view(), out, a.precision}, cpu);
}

void expect_equals_standard(const Case& c, Precision p, uint64_t seed) {
  const std::string what = name_of(c, p);
  core::Rng rng(seed);
  const LinearWeight up = random_weight(rng, c.up_kind, c.hidden, c.L);
  const LinearWeight down = random_weight(rng, c.down_kind, c.hidden, c.SI);
  const Tensor norm = random_norm(rng, c.L);
  const int64_t pad = c.pad;
  const Tensor u_full = random_act(rng, c.T, c.L + pad, 1.0, p);
  // Gate/up pre-activations wide enough to reach both SiTU saturations (|a| >> beta, |c| >> linear_beta).
  const Tensor gate_full = random_act(rng, c.T, c.SI + pad, 6.0, p);
  const Tensor upin_full = random_act(rng, c.T, c.SI + pad, 30.0, p);

  MoeTailCombineArgs a;
  a.u = columns(u_full, pad > 0 ? 1 : 0, c.L);
  a.latent_norm = c.use_norm ? norm.view() : TensorView{};
  a.latent_up = &up;
  if (c.shared) {
    a.shared_gate = columns(gate_full, pad, c.SI);
    a.shared_up = columns(upin_full, 0, c.SI);
    a.shared_down = &down;
  }
  a.use_norm = c.use_norm;
  a.style = c.style;
  a.precision = p;
  a.eps = 1e-5f;
  a.situ_beta = 4.0f;
  a.situ_linear_beta = 25.0f;

  // out is a column slice [T, hidden] at column 2 of a NaN [T, hidden + 5] buffer: the gaps stay NaN.
  const int64_t width = c.hidden + 5;
  Tensor fused = nan_f32(c.T, width);
  a.out = columns(fused, 2, c.hidden);
  ASSERT_TRUE(moe_tail_combine_check(a)) << what << ": " << moe_tail_combine_check(a).reason();
  ASSERT_EQ(reference_registry().moe_tail_combine.select(a, core::Device::cpu).name, "reference");
  reference_registry().moe_tail_combine.run(a, core::Device::cpu);

  Tensor standard = nan_f32(c.T, c.hidden);
  run_standard(a, standard.view());

  int64_t mismatches = 0, unrounded = 0;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t col = 0; col < width; ++col) {
      const float f = fused.data<float>()[t * width + col];
      if (col < 2 || col >= 2 + c.hidden) {
        if (!std::isnan(f) && mismatches++ < 5) ADD_FAILURE() << what << ": gap column " << col << " written";
        continue;
      }
      const float s = standard.data<float>()[t * c.hidden + col - 2];
      uint32_t bf, bs;
      std::memcpy(&bf, &f, 4);
      std::memcpy(&bs, &s, 4);
      if ((bf != bs || std::isnan(f)) && mismatches++ < 5)
        ADD_FAILURE() << what << ": row " << t << " column " << col - 2 << " fused " << f << " standard " << s;
      unrounded += core::bf16_round(f) == f ? 0 : 1;
    }
  EXPECT_EQ(mismatches, 0) << what;
  if (p == Precision::bf16) {
    EXPECT_EQ(unrounded, 0) << what << ": f is stored rounded";
  } else if (c.T * c.hidden >= 17) {
    EXPECT_GT(unrounded, 0) << what << ": fp32 mode rounds nothing";
  }
}

TEST(MoeTailCombine, EqualsStandardSequenceOnOddShapes) {
  uint64_t seed = 10;
  for (Precision p : kPrecisions)
    for (int64_t T : kMoeTailOddRows)  // kernels/moe/cases.h
      for (const MoeTailShape& s : kMoeTailOddShapes)
        for (RmsNormStyle style : {RmsNormStyle::moonshot, RmsNormStyle::fused}) {
          Case c{T, s.L, s.SI, s.hidden};
          c.style = style;
          c.pad = T % 2 ? 3 : 0;
          c.up_kind = s.L == 97 ? WKind::f32 : WKind::bf16;
          expect_equals_standard(c, p, ++seed);
        }
}

TEST(MoeTailCombine, WithoutNormOrSharedExperts) {
  uint64_t seed = 200;
  for (Precision p : kPrecisions)
    for (bool use_norm : {true, false})
      for (bool shared : {true, false}) {
        Case c{97, 54, 17, 97};
        c.use_norm = use_norm;
        c.shared = shared;
        c.pad = 1;
        c.down_kind = WKind::f32;
        expect_equals_standard(c, p, ++seed);
      }
}

TEST(MoeTailCombine, Mxfp4WeightsOnTheCpu) {
  uint64_t seed = 300;
  for (Precision p : kPrecisions) {
    Case c{17, 64, 96, 54};
    c.up_kind = WKind::mxfp4;
    c.down_kind = WKind::mxfp4;
    expect_equals_standard(c, p, ++seed);
  }
}

// One TP8 rank (spec §11 / §14.2 k3-layer-tp8): L = 3584, hidden = 7168, SI = 2 x 3072 / 8 = 768, bf16
// weights; T = 3 decode rows (one bf16, one fp32 pass; the fused norm style in fp32).
TEST(MoeTailCombine, EqualsStandardSequenceOnTp8Shapes) {
  Case c{3, kMoeTailK3Tp8.L, kMoeTailK3Tp8.SI, kMoeTailK3Tp8.hidden};
  expect_equals_standard(c, Precision::bf16, 400);
  c.style = RmsNormStyle::fused;
  c.pad = 8;
  expect_equals_standard(c, Precision::fp32, 401);
}

// ---- argument checks

struct CheckFixture {
  LinearWeight up, down;
  Tensor norm, u, gate, upin, out;
  MoeTailCombineArgs a;
  CheckFixture() {
    core::Rng rng(7);
    up = random_weight(rng, WKind::bf16, 20, 16);
    down = random_weight(rng, WKind::bf16, 20, 8);
    norm = random_norm(rng, 16);
    u = random_act(rng, 3, 16, 1.0, Precision::bf16);
    gate = random_act(rng, 3, 8, 1.0, Precision::bf16);
    upin = random_act(rng, 3, 8, 1.0, Precision::bf16);
    out = nan_f32(3, 20);
    a.u = u.view();
    a.latent_norm = norm.view();
    a.latent_up = &up;
    a.shared_gate = gate.view();
    a.shared_up = upin.view();
    a.shared_down = &down;
    a.out = out.view();
  }
};

void expect_fails_naming(const MoeTailCombineArgs& a, const std::string& needle) {
  const core::Status s = moe_tail_combine_check(a);
  ASSERT_FALSE(s) << "expected a failure naming " << needle;
  EXPECT_NE(s.reason().find(needle), std::string::npos) << s.reason();
  // The registry wraps it in a core::Error naming the op.
  try {
    reference_registry().moe_tail_combine.run(a, core::Device::cpu);
    ADD_FAILURE() << "run() accepted bad args (" << needle << ")";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe_tail_combine"), std::string::npos) << e.what();
  }
}

TEST(MoeTailCombine, CheckNamesTheBadArgument) {
  {
    CheckFixture f;
    EXPECT_TRUE(moe_tail_combine_check(f.a)) << moe_tail_combine_check(f.a).reason();
  }
  {
    CheckFixture f;
    f.a.latent_up = nullptr;
    expect_fails_naming(f.a, "latent_up is null");
  }
  {
    CheckFixture f;
    f.a.latent_up = &f.down;  // in 8 != L 16
    expect_fails_naming(f.a, "latent_up must be [hidden, L]");
  }
  {
    CheckFixture f;
    f.a.u.shape = {3, 15};
    f.a.u.strides = {16, 1};
    expect_fails_naming(f.a, "latent_up must be [hidden, L]");
  }
  {
    CheckFixture f;
    Tensor bad = Tensor::zeros(DType::bf16, {15});
    f.a.latent_norm = bad.view();
    expect_fails_naming(f.a, "latent_norm must be bf16 or f32 [16]");
    f.a.use_norm = false;  // not read without the norm
    EXPECT_TRUE(moe_tail_combine_check(f.a)) << moe_tail_combine_check(f.a).reason();
  }
  {
    CheckFixture f;
    core::Rng rng(1);
    LinearWeight narrow = random_weight(rng, WKind::bf16, 19, 8);
    f.a.shared_down = &narrow;
    expect_fails_naming(f.a, "shared_down must have out = hidden = 20");
  }
  {
    CheckFixture f;
    Tensor g = nan_f32(2, 8);
    f.a.shared_gate = g.view();
    expect_fails_naming(f.a, "shared_gate must be f32 (or bf16 on CUDA) [3, 8]");
    f.a.shared_down = nullptr;  // no shared experts: gate/up are ignored
    EXPECT_TRUE(moe_tail_combine_check(f.a)) << moe_tail_combine_check(f.a).reason();
  }
  {
    CheckFixture f;
    Tensor g = nan_f32(3, 7);
    f.a.shared_up = g.view();
    expect_fails_naming(f.a, "shared_up must be f32 (or bf16 on CUDA) [3, 8]");
  }
  {
    CheckFixture f;
    Tensor o = nan_f32(3, 21);
    f.a.out = o.view();
    expect_fails_naming(f.a, "out must be f32 (or bf16 on CUDA) [3, 20]");
  }
  {
    CheckFixture f;
    Tensor o = Tensor::zeros(DType::bf16, {3, 20});  // bf16 only on CUDA
    f.a.out = o.view();
    expect_fails_naming(f.a, "out must be f32");
  }
  {
    CheckFixture f;
    Tensor big = nan_f32(3, 40);
    f.a.u = columns(big, 0, 16);
    f.a.out = columns(big, 16, 20);
    expect_fails_naming(f.a, "out overlaps u");
  }
  {
    CheckFixture f;
    f.a.situ_beta = 0.0f;
    expect_fails_naming(f.a, "situ_beta and situ_linear_beta must be > 0");
  }
  {
    CheckFixture f;
    f.a.eps = -1.0f;
    expect_fails_naming(f.a, "eps must be >= 0");
  }
}

}  // namespace
}  // namespace k3::kernels
