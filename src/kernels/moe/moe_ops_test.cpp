// kernels/moe/moe_ops_test.cpp: the sigmoid router top-k and the routed experts (BF16 and MXFP4, the
// MXFP4 decoded inside the expert kernel) on every device backend against the CPU reference, at the
// shapes of cases.h: odd shapes and one TP8 rank's (896 experts, top-16, latent 3584, intermediate
// 384) at the K3 token counts. The router's two CUDA forms, ranking (<= 1024 experts, k <= 32) and
// radix, also run by name on the same logits: identical bits. The experts run through the registry
// (whichever strategy it picks, also past the strategies' piece of 2048 tokens) with results identical
// run to run. The small-batch expert GEMV ("cuda_expert_gemv": MXFP4, 1..16 tokens) is checked at every
// batch it takes in all three activation modes: odd widths, strided rows, unrounded partial sums and
// bad ids; what it refuses (tokens, routes, misaligned rows, bf16 experts) is checked to reach the
// strategy the bounds name (the grouped one is tested in moe_grouped_ops_test.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/moe/moe_ops_test_util.h"

namespace k3::ops_test {
namespace {

// ---------------------------------------------------------------- router_topk

void check_router(Device* dev, int64_t T, int64_t E, int64_t k, uint64_t seed) {
  core::Rng rng(seed);
  const Tensor logits = random_act(rng, {T, E}, Mode::fp32, 0.0, 2.0);
  const Tensor bias = random_uniform_f32(rng, {E}, 0.05);
  Tensor ids = Tensor::zeros(DType::i32, {T, k}), weights = nan_tensor({T, k});
  cpu_registry().router_topk.run({logits.view(), bias.view(), ids.view(), weights.view(), true, 2.5f},
                                 core::Device::cpu);
  Tensor d_logits = dev->upload(logits), d_bias = dev->upload(bias);
  Tensor d_ids = dev->poisoned(DType::i32, {T, k}), d_w = dev->poisoned(DType::f32, {T, k});
  const kernels::RouterTopkArgs args{d_logits.view(), d_bias.view(), d_ids.view(), d_w.view(), true, 2.5f};
  expect_device_impl(dev->registry().router_topk, args, dev);
  dev->registry().router_topk.run(args, dev->kind());
  const Tensor got_ids = dev->to_host(d_ids.view());
  const Tensor got_w = dev->to_host_f32(d_w.view());
  // Ids are compared per token; a near tie may flip between libm and CUDA expf (allow 1 in 100).
  // Weights are compared on the tokens whose ids agree.
  std::vector<float> gw, ww;
  int64_t tokens_equal = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (!std::equal(got_ids.data<const int32_t>() + t * k, got_ids.data<const int32_t>() + (t + 1) * k,
                    ids.data<const int32_t>() + t * k))
      continue;
    ++tokens_equal;
    gw.insert(gw.end(), got_w.data<const float>() + t * k, got_w.data<const float>() + (t + 1) * k);
    ww.insert(ww.end(), weights.data<const float>() + t * k, weights.data<const float>() + (t + 1) * k);
  }
  EXPECT_GE(tokens_equal, T - T / 100) << "router ids differ on " << T - tokens_equal << " of " << T << " tokens";
  Tensor g = f32_tensor({static_cast<int64_t>(gw.size())}), w = f32_tensor({static_cast<int64_t>(ww.size())});
  std::copy(gw.begin(), gw.end(), g.data<float>());
  std::copy(ww.begin(), ww.end(), w.data<float>());
  expect_close("router_topk", shape_str({T, E, k}), Mode::fp32, "weights", g, w, tol_elementwise(Mode::fp32));
}

TEST(OpsOdd, RouterTopk) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 4000;
  for (const kernels::MoeRouterShape& s : kernels::kMoeRouterOddShapes)  // kernels/moe/cases.h
    for (int64_t T : kernels::kMoeRouterOddTokens) check_router(dev, T, s.E, s.k, ++seed);
}
TEST(OpsTp8, RouterTopk) {
  K3_REQUIRE_CUDA(dev);
  const kernels::MoeRouterShape& k3 = kernels::kMoeRouterK3;
  for (int64_t T : kernels::kMoeK3Tokens) check_router(dev, T, k3.E, k3.k, 4100 + T);
}

// Logits and biases from a few values: many exact ties.
void fill_tied(core::Rng& rng, Tensor& logits, Tensor& bias) {
  for (float& v : logits.span<float>()) v = static_cast<float>(static_cast<int>(rng.next_u64() % 3) - 1);
  for (float& v : bias.span<float>()) v = (rng.next_u64() % 4 == 0) ? 0.25f : 0.0f;
}

// The two CUDA strategies are the same function: identical ids and weight bits on the same logits
// (random, and from a few values, i.e. many exact ties) wherever the ranking form takes the shape
// (every odd shape within its bounds, and K3's, which it is selected for).
TEST(OpsTp8, RouterRankAndRadixFormsAgreeBitForBit) {
  K3_REQUIRE_CUDA(dev);
  const auto named = [&](const std::string& name) -> const kernels::OpImpl<kernels::RouterTopkArgs>& {
    for (const auto& impl : dev->registry().router_topk.impls())
      if (impl.name == name && impl.device == dev->kind()) return impl;
    throw core::Error("no router_topk implementation " + name);
  };
  const auto compare = [&](const kernels::MoeRouterShape& s, int64_t T, bool tied, bool k3) {
    const int64_t E = s.E, k = s.k;
    core::Rng rng(4300 + T + E + (tied ? 1000 : 0));
    Tensor logits = random_act(rng, {T, E}, Mode::fp32, 0.0, 2.0), bias = random_uniform_f32(rng, {E}, 0.05);
    if (tied) fill_tied(rng, logits, bias);
    const Tensor d_logits = dev->upload(logits), d_bias = dev->upload(bias);
    std::vector<Tensor> got;
    for (const char* name : {"cuda_rank_topk", "cuda_radix_topk"}) {
      Tensor d_ids = dev->poisoned(DType::i32, {T, k}), d_w = dev->poisoned(DType::f32, {T, k});
      const kernels::RouterTopkArgs args{d_logits.view(), d_bias.view(), d_ids.view(), d_w.view(), true, 2.5f};
      if (!k3 && !named("cuda_rank_topk").supports(args)) return;  // beyond the ranking form
      if (k3 && std::string(name) == "cuda_rank_topk") {
        EXPECT_EQ(dev->registry().router_topk.select(args, dev->kind()).name, name);
      }
      ASSERT_TRUE(named(name).supports(args)) << name;
      named(name).run(args);
      got.push_back(dev->to_host(d_ids.view()));
      got.push_back(dev->to_host(d_w.view()));
    }
    const size_t bytes = static_cast<size_t>(T * k) * 4;
    const std::string where = std::string(s.name) + " T " + std::to_string(T) + (tied ? " tied" : "");
    EXPECT_EQ(std::memcmp(got[0].data<const int32_t>(), got[2].data<const int32_t>(), bytes), 0) << "ids, " << where;
    EXPECT_EQ(std::memcmp(got[1].data<const float>(), got[3].data<const float>(), bytes), 0) << "weights, " << where;
  };
  for (const bool tied : {false, true}) {
    for (int64_t T : kernels::kMoeK3Tokens) compare(kernels::kMoeRouterK3, T, tied, true);
    for (const kernels::MoeRouterShape& s : kernels::kMoeRouterOddShapes)
      for (int64_t T : kernels::kMoeRouterOddTokens) compare(s, T, tied, false);
  }
}

// Logits and biases from a few values: many exact ties, which both sides must break by the lower
// id (the distinct biased scores are far apart, so CUDA expf and libm agree on their order).
void check_router_ties(Device* dev, int64_t T, int64_t E, int64_t k, uint64_t seed) {
  core::Rng rng(seed);
  Tensor logits = f32_tensor({T, E}), bias = f32_tensor({E});
  fill_tied(rng, logits, bias);
  Tensor ids = Tensor::zeros(DType::i32, {T, k}), weights = nan_tensor({T, k});
  cpu_registry().router_topk.run({logits.view(), bias.view(), ids.view(), weights.view()}, core::Device::cpu);
  Tensor d_logits = dev->upload(logits), d_bias = dev->upload(bias);
  Tensor d_ids = dev->poisoned(DType::i32, {T, k}), d_w = dev->poisoned(DType::f32, {T, k});
  const kernels::RouterTopkArgs args{d_logits.view(), d_bias.view(), d_ids.view(), d_w.view()};
  expect_device_impl(dev->registry().router_topk, args, dev);
  dev->registry().router_topk.run(args, dev->kind());
  const Tensor got = dev->to_host(d_ids.view());
  for (int64_t i = 0; i < T * k; ++i)
    ASSERT_EQ(got.data<const int32_t>()[i], ids.data<const int32_t>()[i])
        << "T " << T << " E " << E << " k " << k << ": token " << i / k << " pick " << i % k;
  expect_close("router_topk", shape_str({T, E, k}), Mode::fp32, "weights_ties", dev->to_host_f32(d_w.view()), weights,
               tol_elementwise(Mode::fp32));
}

TEST(OpsOdd, RouterTopkTiesGoToTheLowerId) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 4200;
  for (const kernels::MoeRouterShape& s : kernels::kMoeRouterOddShapes)
    for (int64_t T : kernels::kMoeRouterOddTokens) check_router_ties(dev, T, s.E, s.k, ++seed);
  for (int64_t T : kernels::kMoeK3Tokens)
    check_router_ties(dev, T, kernels::kMoeRouterK3.E, kernels::kMoeRouterK3.k, ++seed);
}

// ---------------------------------------------------------------- moe_experts

// Experts (moe_ops_test_util.h) of a cases.h shape, through the registry (whichever device strategy it
// picks) against the CPU reference.
void check_experts(Device* dev, Mode mode, const Experts& ex, int64_t T, int64_t k, uint64_t seed,
                   const std::string& what) {
  core::Rng rng(seed);
  const int64_t E = ex.E(), L = ex.L();
  const Tensor z = random_act(rng, {T, L}, mode, 0.0, 2.0);
  Tensor ids, weights;
  random_routes(rng, T, E, k, ids, weights);
  const Precision p = precision(mode);
  Tensor want = nan_tensor({T, L});
  cpu_registry().moe_experts.run(
      {z.view(), ids.view(), weights.view(), ex.w1, ex.w3, ex.w2, want.view(), 4.0f, 25.0f, p}, core::Device::cpu);
  Tensor dz = dev->act(z, mode), d_ids = dev->upload(ids), d_w = dev->upload(weights);
  Tensor out = dev->poisoned(act_dtype(mode), {T, L});
  const kernels::MoeExpertsArgs args{dz.view(), d_ids.view(), d_w.view(), ex.dw1, ex.dw3,
                                     ex.dw2,    out.view(),   4.0f,       25.0f,  p};
  expect_device_impl(dev->registry().moe_experts, args, dev);
  dev->registry().moe_experts.run(args, dev->kind());
  expect_close("moe_experts", shape_str({T, E, k, L, ex.I()}), mode, what, dev->to_host_f32(out.view()), want,
               tol_reduction(mode));
}

// cases.h kMoeExpertsOddShapes (bf16 experts at odd widths: the rowdot strategy's generic kernels;
// MXFP4 ones) at the odd token counts and past the 2048-token piece, both modes.
TEST(OpsOdd, MoeExperts) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(5000);
  uint64_t seed = 5100;
  for (const kernels::MoeExpertsShape& s : kernels::kMoeExpertsOddShapes) {
    const Experts ex(dev, rng, s);
    for (int64_t k : s.topk)
      for (Mode m : kModes) {
        for (int64_t T : kernels::kMoeExpertsOddTokens)
          check_experts(dev, m, ex, T, k, ++seed, s.mxfp4 ? "w_mxfp4" : "w_bf16");
        check_experts(dev, m, ex, kernels::kMoeExpertsTwoPieceTokens, k, ++seed, s.mxfp4 ? "w_mxfp4" : "w_bf16");
      }
  }
}

// Route ids outside [0, E) (cases.h kMoeExpertsBadIdShape, some_bad_ids) through the registry: their
// tokens' rows are NaN, the others as the reference computes them, in every mode and at every odd token
// count (the GEMV, the grouped kernels, the MXFP4 kernels' route form and sorted form).
TEST(OpsOdd, MoeExpertsBadIdGivesANanRow) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(5300);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsBadIdShape;
  const Experts ex(dev, rng, s);
  uint64_t seed = 5400;
  for (const ExpertsMode& gm : kExpertsModes)
    for (int64_t k : s.topk)
      for (int64_t T : kernels::kMoeExpertsOddTokens)
        check_experts_case(dev, gm, ex, {T, k}, ++seed, mxfp4_strategy(gm, T, k), some_bad_ids(T, k, s.E));
}

// One TP8 rank (cases.h kMoeExpertsK3Tp8) at the K3 token counts (the GEMV, the grouped kernels, the
// MXFP4 tensor-core kernels' sorted form at 128); f32 activations up to 8 tokens (the CPU reference's time).
TEST(OpsTp8, MoeExpertsMxfp4Top16Of896) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(6000);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsK3Tp8;
  const Experts ex(dev, rng, s);
  for (Mode m : kModes)
    for (int64_t T : kernels::kMoeK3Tokens) {
      if (m != Mode::bf16 && T > 8) break;
      check_experts(dev, m, ex, T, s.topk[0], 6100 + T, "w_mxfp4");
    }
}

// The same call twice gives the same bits (the sorted forms' route lists are built with atomics;
// no result may depend on their order), at every K3 token count.
TEST(OpsTp8, MoeExpertsRunToRunIdentical) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(6200);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsK3Tp8;
  const Experts ex(dev, rng, s);
  for (int64_t T : kernels::kMoeK3Tokens) {
    const Tensor z = random_act(rng, {T, s.L}, Mode::bf16, 0.0, 2.0);
    Tensor ids, weights;
    random_routes(rng, T, s.E, s.topk[0], ids, weights);
    Tensor dz = dev->act(z, Mode::bf16), d_ids = dev->upload(ids), d_w = dev->upload(weights);
    std::vector<Tensor> got;
    for (int run = 0; run < 3; ++run) {
      Tensor out = dev->poisoned(DType::bf16, {T, s.L});
      dev->registry().moe_experts.run({dz.view(), d_ids.view(), d_w.view(), ex.dw1, ex.dw3, ex.dw2, out.view()},
                                      dev->kind());
      got.push_back(dev->to_host(out.view()));
    }
    for (int run = 1; run < 3; ++run)
      EXPECT_TRUE(std::equal(got[0].span<const uint16_t>().begin(), got[0].span<const uint16_t>().end(),
                             got[run].span<const uint16_t>().begin()))
          << "T " << T << ": run " << run << " differs from run 0";
  }
}

// ---------------------------------------------------------------- moe_experts: the small-batch GEMV

constexpr const char* kGemv = "cuda_expert_gemv";
constexpr const char* kRowdot = "cuda_expert_rowdot";

// cases.h kMoeExpertsMxfp4OddShapes at every batch the GEMV takes, in all three modes.
TEST(OpsOdd, MoeExpertsGemvOddShapes) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(7000);
  uint64_t seed = 7100;
  for (const kernels::MoeExpertsShape& s : kernels::kMoeExpertsMxfp4OddShapes) {
    const Experts ex(dev, rng, s);
    for (const ExpertsMode& gm : kExpertsModes)
      for (int64_t T : kernels::kMoeExpertsGemvTokens)
        for (int64_t k : s.topk) check_experts_case(dev, gm, ex, {T, k}, ++seed, kGemv);
  }
}

// Strided z rows (16-byte multiples: taken) and strided out rows, rounded and unrounded outputs.
TEST(OpsOdd, MoeExpertsGemvStridedRows) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(7200);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsStridedShape;
  const Experts ex(dev, rng, s);
  uint64_t seed = 7300;
  for (const ExpertsMode& gm : kExpertsModes) {
    const int64_t aligned_pad = gm.act == Mode::bf16 ? 8 : 4;  // 16 bytes
    for (bool round_output : {true, false})
      for (int64_t T : kernels::kMoeExpertsGemvTokens)
        for (int64_t k : s.topk) {
          check_experts_case(dev, gm, ex, {T, k, round_output, aligned_pad, 3}, ++seed, kGemv);
          check_experts_case(dev, gm, ex, {T, k, round_output, 0, 5}, ++seed, kGemv);
        }
  }
}

// A TP rank's unrounded f32 partial sums into the latent block of a packed [T, L | hidden] buffer.
TEST(OpsOdd, MoeExpertsGemvUnroundedPartial) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(7400);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsPartialShape;
  const Experts ex(dev, rng, s);
  uint64_t seed = 7500;
  for (const ExpertsMode& gm : kExpertsModes)
    for (int64_t T : kernels::kMoeExpertsGemvTokens)
      for (int64_t k : s.topk) check_experts_case(dev, gm, ex, {T, k, false, 0, 96}, ++seed, kGemv);
}

// A route id outside [0, E) (the router's NaN marker -1, E, beyond) makes its token's row NaN; the
// other tokens' rows are unaffected.
TEST(OpsOdd, MoeExpertsGemvBadIdGivesANanRow) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(7600);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsBadIdShape;
  const Experts ex(dev, rng, s);
  uint64_t seed = 7700;
  for (const ExpertsMode& gm : kExpertsModes)
    for (bool round_output : {true, false})
      for (int64_t T : kernels::kMoeExpertsGemvTokens)
        for (int64_t k : s.topk)
          check_experts_case(dev, gm, ex, {T, k, round_output, 0, 2}, ++seed, kGemv, some_bad_ids(T, k, s.E));
}

// What the GEMV refuses reaches the strategy the bounds name (mxfp4_strategy; cases.h
// kMoeExpertsRouteBoundShape at kMoeExpertsBoundTokens) and stays right: more than 16 tokens (in bf16
// activations the grouped strategy takes 17..64), more than 64 routes per token, z rows not 16-byte
// multiples apart (one row is aligned all the same), bf16 experts (cases.h kMoeExpertsOddShapes).
TEST(OpsOdd, MoeExpertsGemvRefusalsTakeRowdot) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(7800);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsRouteBoundShape;
  const Experts ex(dev, rng, s);
  uint64_t seed = 7900;
  for (const ExpertsMode& gm : kExpertsModes) {
    const int64_t odd_pad = gm.act == Mode::bf16 ? 4 : 2;  // rows 8 bytes off a 16-byte multiple
    for (int64_t T : kernels::kMoeExpertsBoundTokens)
      for (int64_t k : s.topk) {
        check_experts_case(dev, gm, ex, {T, k}, ++seed, mxfp4_strategy(gm, T, k));
        check_experts_case(dev, gm, ex, {T, k, true, odd_pad, 0}, ++seed, mxfp4_strategy(gm, T, k, T == 1));
      }
  }
  for (const kernels::MoeExpertsShape& b : kernels::kMoeExpertsOddShapes) {
    if (b.mxfp4) continue;
    const Experts bf16_experts(dev, rng, b);
    for (int64_t T : kernels::kMoeExpertsBoundTokens)
      check_experts_case(dev, kExpertsModes[0], bf16_experts, {T, b.topk[0]}, ++seed, kRowdot);
  }
}

// One TP8 rank (cases.h kMoeExpertsK3Tp8) at the K3 token counts the GEMV takes (f32 activations up to
// 8 tokens, f32 in bf16 precision at 1: the CPU reference's time), the [T, L | hidden] partial sums, and
// the first count past its bound (the grouped kernels).
TEST(OpsTp8, MoeExpertsGemvMxfp4Top16) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(8000);
  const kernels::MoeExpertsShape& s = kernels::kMoeExpertsK3Tp8;
  const Experts ex(dev, rng, s);
  const int64_t k = s.topk[0];
  uint64_t seed = 8100;
  for (int64_t T : kernels::kMoeK3Tokens) {
    if (T > kernels::kMoeExpertsGemvMaxTokens) {
      check_experts_case(dev, kExpertsModes[0], ex, {T, k}, ++seed, mxfp4_strategy(kExpertsModes[0], T, k));
      break;
    }
    check_experts_case(dev, kExpertsModes[0], ex, {T, k}, ++seed, kGemv);
    if (T <= 8) check_experts_case(dev, kExpertsModes[1], ex, {T, k}, ++seed, kGemv);
    if (T == 1) check_experts_case(dev, kExpertsModes[2], ex, {T, k}, ++seed, kGemv);
    if (T == 8) {  // [T, L | hidden] partial sums
      check_experts_case(dev, kExpertsModes[0], ex, {T, k, false, 0, kernels::kMoeTailK3Tp8.hidden}, ++seed, kGemv);
    }
  }
}

}  // namespace
}  // namespace k3::ops_test
