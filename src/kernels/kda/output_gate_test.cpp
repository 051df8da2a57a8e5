// kernels/kda/output_gate_test.cpp: the KDA output norm + gate (spec §5.6) against a naive form,
// per-head normalisation, f32/bf16 norm weights, aliasing, the TP8 shard, and argument checks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/kda/kda.h"
#include "kernels/kda/kda_test_util.h"

namespace k3::kernels {
namespace {

using namespace kda_test;

struct GateCase {
  Tensor o, gate, w;
  int T, H, D;
};

GateCase random_gate(uint64_t seed, int T, int H, int D, Precision p) {
  core::Rng rng(seed);
  const int64_t P = static_cast<int64_t>(H) * D;
  return {random(rng, {T, P}, 0.0, 0.3, p), random(rng, {T, P}, 0.0, 2.0, p), random(rng, {D}, 1.0, 0.1), T, H, D};
}

KdaOutputGateArgs gate_args(const GateCase& g, const TensorView& norm_w, const Tensor& out, Precision p) {
  KdaOutputGateArgs a;
  a.o = g.o.view();
  a.gate = g.gate.view();
  a.norm_w = norm_w;
  a.out = out.view();
  a.num_heads = g.H;
  a.head_dim = g.D;
  a.eps = 1e-5f;
  a.precision = p;
  return a;
}

// The norm weight as the bf16 tensor a bf16 checkpoint would hold (values rounded in place).
Tensor to_bf16(Tensor& w) {
  Tensor b = Tensor::zeros(core::DType::bf16, w.shape());
  for (int64_t i = 0; i < w.numel(); ++i) {
    b.data<uint16_t>()[i] = core::f32_to_bf16_bits(w.data<float>()[i]);
    w.data<float>()[i] = core::bf16_round(w.data<float>()[i]);
  }
  return b;
}

TEST(KdaOutputGate, MatchesNaiveOnOddShapes) {
  struct Case {
    int T, H, D;
  };
  const Case cases[] = {{1, 1, 32}, {17, 3, 32}, {54, 2, 128}, {97, 4, 32}, {150, 1, 128}};
  uint64_t seed = 300;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    for (bool bf16_weight : {false, true}) {
      for (const auto& c : cases) {
        SCOPED_TRACE("T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " D=" + std::to_string(c.D) +
                     (p == Precision::bf16 ? " bf16" : " fp32") + (bf16_weight ? " bf16 weight" : ""));
        GateCase g = random_gate(seed++, c.T, c.H, c.D, p);
        Tensor w_bf16 = bf16_weight ? to_bf16(g.w) : Tensor();
        const std::vector<double> ref = naive_output_gate(to_vec(g.o), to_vec(g.gate), to_vec(g.w), c.T, c.H, c.D,
                                                          1e-5);
        Tensor out = poisoned({c.T, static_cast<int64_t>(c.H) * c.D});
        kda_output_gate_reference(gate_args(g, bf16_weight ? w_bf16.view() : g.w.view(), out, p));
        if (p == Precision::fp32) {
          EXPECT_LT(rel_err(out.span<float>(), ref), 1e-6);
        } else {
          EXPECT_TRUE(bf16_close(out.span<float>(), ref));
        }
      }
    }
  }
}

TEST(KdaOutputGate, NormIsPerHead) {
  // Scaling one head's o leaves the other heads' bits alone and its own output (nearly) unchanged.
  GateCase g = random_gate(9, 17, 3, 32, Precision::fp32);
  Tensor out0 = poisoned({17, 96}), out1 = poisoned({17, 96});
  kda_output_gate_reference(gate_args(g, g.w.view(), out0, Precision::fp32));
  for (int t = 0; t < 17; ++t)
    for (int i = 0; i < 32; ++i) g.o.data<float>()[t * 96 + 32 + i] *= 8.0f;
  kda_output_gate_reference(gate_args(g, g.w.view(), out1, Precision::fp32));
  for (int t = 0; t < 17; ++t)
    for (int c = 0; c < 96; ++c) {
      const float a = out0.data<float>()[t * 96 + c], b = out1.data<float>()[t * 96 + c];
      if (c >= 32 && c < 64) EXPECT_NEAR(a, b, 1e-3 * std::abs(a) + 1e-6);
      else EXPECT_EQ(a, b);
    }
}

TEST(KdaOutputGate, OutMayAliasO) {
  GateCase g = random_gate(13, 54, 2, 128, Precision::bf16);
  Tensor out = poisoned({54, 256});
  kda_output_gate_reference(gate_args(g, g.w.view(), out, Precision::bf16));
  KdaOutputGateArgs a = gate_args(g, g.w.view(), out, Precision::bf16);
  a.out = g.o.view();
  kda_output_gate_reference(a);
  EXPECT_TRUE(bits_equal(g.o.span<float>(), out.span<float>()));
}

TEST(KdaOutputGate, RealTp8Shard) {
  GateCase g = random_gate(17, 20, 12, 128, Precision::bf16);
  const std::vector<double> ref = naive_output_gate(to_vec(g.o), to_vec(g.gate), to_vec(g.w), 20, 12, 128, 1e-5);
  Tensor out = poisoned({20, 12 * 128});
  kda_output_gate_reference(gate_args(g, g.w.view(), out, Precision::bf16));
  EXPECT_TRUE(bf16_close(out.span<float>(), ref));
}

TEST(KdaOutputGate, CheckNamesTheBadArgument) {
  GateCase g = random_gate(1, 5, 2, 8, Precision::fp32);
  Tensor out = f32({5, 16});
  auto reason = [&](auto mutate) {
    KdaOutputGateArgs a = gate_args(g, g.w.view(), out, Precision::fp32);
    mutate(a);
    core::Status s = kda_output_gate_check(a);
    return s ? std::string("ok") : s.reason();
  };
  EXPECT_EQ(reason([](KdaOutputGateArgs&) {}), "ok");
  Tensor bad_w = f32({16}), bad_gate = f32({5, 8}), i32_w = Tensor::zeros(core::DType::i32, {8});
  EXPECT_NE(reason([&](KdaOutputGateArgs& a) { a.norm_w = bad_w.view(); }).find("norm_w"), std::string::npos);
  EXPECT_NE(reason([&](KdaOutputGateArgs& a) { a.norm_w = i32_w.view(); }).find("norm_w must be F32 or BF16"),
            std::string::npos);
  EXPECT_NE(reason([&](KdaOutputGateArgs& a) { a.gate = bad_gate.view(); }).find("gate"), std::string::npos);
  EXPECT_NE(reason([&](KdaOutputGateArgs& a) { a.head_dim = 0; }).find("head_dim"), std::string::npos);
  EXPECT_NE(reason([&](KdaOutputGateArgs& a) { a.eps = 0.0f; }).find("eps"), std::string::npos);
  KdaOutputGateArgs bad = gate_args(g, bad_w.view(), out, Precision::fp32);
  EXPECT_THROW(kda_output_gate_reference(bad), core::Error);
}

}  // namespace
}  // namespace k3::kernels
