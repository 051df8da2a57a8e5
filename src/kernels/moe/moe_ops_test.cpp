// kernels/moe/moe_ops_test.cpp: the sigmoid router top-k and the routed experts (BF16 and MXFP4, the
// MXFP4 decoded inside the expert kernel) on every device backend against the CPU reference, at
// odd shapes and at the TP8 expert shapes (896 experts, top-16, latent 3584, intermediate 384).
// Batches cover both CUDA forms of each op: the router's ranking form (<= 1024 experts, k <= 32) and
// radix form (also run by name on the same logits: identical bits); the MXFP4 experts' scan form (<= 256 routes: batch 1, 2, 8) and sorted form (batch
// 64 in f32, odd batch 97; bf16 batches of 17..64 select "cuda_expert_grouped"), whose results must
// also be identical run to run. The small-batch expert GEMV
// ("cuda_expert_gemv": MXFP4, 1..16 tokens) is checked by name at batches 1..16, k 1, 3, 16, in
// all three activation modes, odd widths, strided rows, unrounded partial sums and bad ids, and
// what it refuses is checked to reach "cuda_expert_rowdot" (bf16 at 17..64 tokens: the grouped
// strategy, tested in moe_grouped_ops_test.cpp).
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
  for (int64_t T : {1, 17, 54, 97}) check_router(dev, T, 97, 5, 4000 + T);
  for (int64_t T : {1, 3}) check_router(dev, T, 1100, 40, 4050 + T);  // beyond the ranking form
}
TEST(OpsTp8, RouterTopk) {
  K3_REQUIRE_CUDA(dev);
  for (int64_t T : {1, 2, 8, 64}) check_router(dev, T, 896, 16, 4100 + T);
}

// The two CUDA strategies are the same function: identical ids and weight bits on the same logits
// (random, and from a few values, i.e. many exact ties), and K3's shape selects the ranking form.
TEST(OpsTp8, RouterRankAndRadixFormsAgreeBitForBit) {
  K3_REQUIRE_CUDA(dev);
  const auto named = [&](const std::string& name) -> const kernels::OpImpl<kernels::RouterTopkArgs>& {
    for (const auto& impl : dev->registry().router_topk.impls())
      if (impl.name == name && impl.device == dev->kind()) return impl;
    throw core::Error("no router_topk implementation " + name);
  };
  for (const bool tied : {false, true})
    for (int64_t T : {1, 8, 64}) {
      const int64_t E = 896, k = 16;
      core::Rng rng(4300 + T + (tied ? 1000 : 0));
      Tensor logits = random_act(rng, {T, E}, Mode::fp32, 0.0, 2.0), bias = random_uniform_f32(rng, {E}, 0.05);
      if (tied) {
        for (float& v : logits.span<float>()) v = static_cast<float>(static_cast<int>(rng.next_u64() % 3) - 1);
        for (float& v : bias.span<float>()) v = (rng.next_u64() % 4 == 0) ? 0.25f : 0.0f;
      }
      const Tensor d_logits = dev->upload(logits), d_bias = dev->upload(bias);
      std::vector<Tensor> got;
      for (const char* name : {"cuda_rank_topk", "cuda_radix_topk"}) {
        Tensor d_ids = dev->poisoned(DType::i32, {T, k}), d_w = dev->poisoned(DType::f32, {T, k});
        const kernels::RouterTopkArgs args{d_logits.view(), d_bias.view(), d_ids.view(), d_w.view(), true, 2.5f};
        if (std::string(name) == "cuda_rank_topk") {
          EXPECT_EQ(dev->registry().router_topk.select(args, dev->kind()).name, name);
        }
        ASSERT_TRUE(named(name).supports(args)) << name;
        named(name).run(args);
        got.push_back(dev->to_host(d_ids.view()));
        got.push_back(dev->to_host(d_w.view()));
      }
      const size_t bytes = static_cast<size_t>(T * k) * 4;
      EXPECT_EQ(std::memcmp(got[0].data<const int32_t>(), got[2].data<const int32_t>(), bytes), 0)
          << "ids, T " << T << (tied ? " tied" : "");
      EXPECT_EQ(std::memcmp(got[1].data<const float>(), got[3].data<const float>(), bytes), 0)
          << "weights, T " << T << (tied ? " tied" : "");
    }
}

// Logits and biases from a few values: many exact ties, which both sides must break by the lower
// id (the distinct biased scores are far apart, so CUDA expf and libm agree on their order).
TEST(OpsOdd, RouterTopkTiesGoToTheLowerId) {
  K3_REQUIRE_CUDA(dev);
  struct Case {
    int64_t T, E, k;
  };
  for (const Case c : {Case{1, 97, 5}, Case{8, 97, 32}, Case{1, 896, 16}, Case{8, 896, 16}, Case{3, 1100, 40}}) {
    core::Rng rng(4200 + c.E + c.k);
    Tensor logits = f32_tensor({c.T, c.E}), bias = f32_tensor({c.E});
    for (float& v : logits.span<float>()) v = static_cast<float>(static_cast<int>(rng.next_u64() % 3) - 1);
    for (float& v : bias.span<float>()) v = (rng.next_u64() % 4 == 0) ? 0.25f : 0.0f;
    Tensor ids = Tensor::zeros(DType::i32, {c.T, c.k}), weights = nan_tensor({c.T, c.k});
    cpu_registry().router_topk.run({logits.view(), bias.view(), ids.view(), weights.view()}, core::Device::cpu);
    Tensor d_logits = dev->upload(logits), d_bias = dev->upload(bias);
    Tensor d_ids = dev->poisoned(DType::i32, {c.T, c.k}), d_w = dev->poisoned(DType::f32, {c.T, c.k});
    const kernels::RouterTopkArgs args{d_logits.view(), d_bias.view(), d_ids.view(), d_w.view()};
    expect_device_impl(dev->registry().router_topk, args, dev);
    dev->registry().router_topk.run(args, dev->kind());
    const Tensor got = dev->to_host(d_ids.view());
    for (int64_t i = 0; i < c.T * c.k; ++i)
      ASSERT_EQ(got.data<const int32_t>()[i], ids.data<const int32_t>()[i])
          << "E " << c.E << " k " << c.k << ": token " << i / c.k << " pick " << i % c.k;
    expect_close("router_topk", shape_str({c.T, c.E, c.k}), Mode::fp32, "weights_ties", dev->to_host_f32(d_w.view()),
                 weights, tol_elementwise(Mode::fp32));
  }
}

// ---------------------------------------------------------------- moe_experts

// Experts (moe_test_util.h) come from `distinct` random weight sets: 896 TP8 experts without 2 GB of
// random numbers; the kernels see 896 separate pointers all the same.
void check_experts(Device* dev, Mode mode, const Experts& ex, int64_t T, int64_t k, int64_t L, uint64_t seed,
                   const std::string& what) {
  core::Rng rng(seed);
  const int64_t E = static_cast<int64_t>(ex.w1.size());
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
  expect_close("moe_experts", shape_str({T, E, k, L, ex.w1[0].out_features()}), mode, what,
               dev->to_host_f32(out.view()), want, tol_reduction(mode));
}

TEST(OpsOdd, MoeExperts) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(5000);
  const Experts bf16_odd(dev, rng, 7, 7, 54, 17, false);  // odd widths (scalar path)
  const Experts fp4(dev, rng, 7, 7, 64, 96, true);        // MXFP4 (widths multiples of 32)
  for (Mode m : kModes)
    for (int64_t T : {1, 17, 54, 97}) {
      check_experts(dev, m, bf16_odd, T, 3, 54, 5100 + T, "w_bf16");
      check_experts(dev, m, fp4, T, 3, 64, 5200 + T, "w_mxfp4");
    }
}

// Token 1 carries the router's NaN marker -1: its row is NaN, the others finite. T = 3 takes the
// scan form, T = 150 (300 routes) the sorted form.
TEST(OpsOdd, MoeExpertsBadIdGivesANanRow) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(5300);
  const Experts ex(dev, rng, 5, 5, 32, 32, true);
  for (int64_t T : {3, 150}) {
    const Tensor z = random_act(rng, {T, 32}, Mode::bf16);
    Tensor ids = Tensor::zeros(DType::i32, {T, 2}), weights = f32_tensor({T, 2});
    for (int64_t q = 0; q < 2 * T; ++q) ids.data<int32_t>()[q] = static_cast<int32_t>(q % 5);
    ids.data<int32_t>()[2] = -1;
    std::fill_n(weights.data<float>(), 2 * T, 0.5f);
    Tensor dz = dev->act(z, Mode::bf16), d_ids = dev->upload(ids), d_w = dev->upload(weights);
    Tensor out = dev->upload(Tensor::zeros(DType::bf16, {T, 32}));
    dev->registry().moe_experts.run({dz.view(), d_ids.view(), d_w.view(), ex.dw1, ex.dw3, ex.dw2, out.view()},
                                    dev->kind());
    const Tensor got = dev->to_host_f32(out.view());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t l = 0; l < 32; ++l) {
        const float v = got.data<float>()[t * 32 + l];
        EXPECT_EQ(std::isnan(v), t == 1) << "T " << T << " token " << t << " column " << l;
      }
  }
}

TEST(OpsTp8, MoeExpertsMxfp4Top16Of896) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(6000);
  const Experts ex(dev, rng, 896, 32, 3584, 384, true);
  for (Mode m : kModes)
    for (int64_t T : {1, 2, 8}) check_experts(dev, m, ex, T, 16, 3584, 6100 + T, "w_mxfp4");
  check_experts(dev, Mode::bf16, ex, 64, 16, 3584, 6164, "w_mxfp4");  // the sorted form (1024 routes)
}

// The same call twice gives the same bits (the sorted form's route lists are built with atomics;
// no result may depend on their order).
TEST(OpsTp8, MoeExpertsRunToRunIdentical) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(6200);
  const Experts ex(dev, rng, 896, 8, 3584, 384, true);
  for (int64_t T : {8, 64}) {
    const Tensor z = random_act(rng, {T, 3584}, Mode::bf16, 0.0, 2.0);
    Tensor ids, weights;
    random_routes(rng, T, 896, 16, ids, weights);
    Tensor dz = dev->act(z, Mode::bf16), d_ids = dev->upload(ids), d_w = dev->upload(weights);
    std::vector<Tensor> got;
    for (int run = 0; run < 3; ++run) {
      Tensor out = dev->poisoned(DType::bf16, {T, 3584});
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
constexpr const char* kGrouped = "cuda_expert_grouped";  // bf16, MXFP4, 1..64 tokens (moe_grouped_ops_test.cpp)

// Odd widths the MXFP4 layout allows (multiples of 32 that leave lanes, steps and warp slices
// idle: L = 96 is 3 chunks, 2080 is 65, I = 32 is one chunk, 160 is five), every batch 1..16 the
// GEMV takes, k = 1, 3, 16, in all three modes.
TEST(OpsOdd, MoeExpertsGemvOddShapes) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(7000);
  const Experts narrow(dev, rng, 20, 20, 96, 160, true);
  const Experts wide(dev, rng, 20, 10, 2080, 32, true);
  const Experts tiny(dev, rng, 5, 5, 32, 96, true);
  uint64_t seed = 7100;
  for (const ExpertsMode& gm : kExpertsModes)
    for (int64_t T : {1, 2, 5, 8, 16}) {
      for (int64_t k : {1, 3, 16}) {
        check_experts_case(dev, gm, narrow, {T, k}, ++seed, kGemv);
        check_experts_case(dev, gm, wide, {T, k}, ++seed, kGemv);
      }
      check_experts_case(dev, gm, tiny, {T, 3}, ++seed, kGemv);
    }
}

// Strided z rows (16-byte multiples: taken) and strided out rows, rounded and unrounded outputs.
TEST(OpsOdd, MoeExpertsGemvStridedRows) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(7200);
  const Experts ex(dev, rng, 12, 12, 224, 96, true);
  uint64_t seed = 7300;
  for (const ExpertsMode& gm : kExpertsModes) {
    const int64_t aligned_pad = gm.act == Mode::bf16 ? 8 : 4;  // 16 bytes
    for (bool round_output : {true, false})
      for (int64_t T : {1, 5, 16}) {
        check_experts_case(dev, gm, ex, {T, 3, round_output, aligned_pad, 3}, ++seed, kGemv);
        check_experts_case(dev, gm, ex, {T, 16 - 4, round_output, 0, 5}, ++seed, kGemv);
      }
  }
}

// A TP rank's unrounded f32 partial sums into the latent block of a packed [T, L | hidden] buffer.
TEST(OpsOdd, MoeExpertsGemvUnroundedPartial) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(7400);
  const Experts ex(dev, rng, 18, 18, 160, 64, true);
  uint64_t seed = 7500;
  for (const ExpertsMode& gm : kExpertsModes)
    for (int64_t T : {1, 2, 8, 16})
      for (int64_t k : {1, 16}) check_experts_case(dev, gm, ex, {T, k, false, 0, 96}, ++seed, kGemv);
}

// A route id outside [0, E) (the router's NaN marker -1, or E) makes its token's row NaN; the
// other tokens' rows are unaffected.
TEST(OpsOdd, MoeExpertsGemvBadIdGivesANanRow) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(7600);
  const Experts ex(dev, rng, 9, 9, 96, 64, true);
  uint64_t seed = 7700;
  for (const ExpertsMode& gm : kExpertsModes)
    for (bool round_output : {true, false}) {
      check_experts_case(dev, gm, ex, {3, 2, round_output}, ++seed, kGemv, {{1, 0, -1}});
      check_experts_case(dev, gm, ex, {1, 3, round_output}, ++seed, kGemv, {{0, 2, 9}});
      check_experts_case(dev, gm, ex, {16, 4, round_output, 0, 2}, ++seed, kGemv,
                         {{0, 3, -1}, {7, 0, 9}, {15, 1, 100}});
    }
}

// What the GEMV refuses reaches the rowdot strategy (and stays right): more than 16 tokens (in bf16
// activations the grouped strategy takes 17..64), z rows not 16-byte multiples apart, more than 64
// routes per token, bf16 experts.
TEST(OpsOdd, MoeExpertsGemvRefusalsTakeRowdot) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(7800);
  const Experts ex(dev, rng, 70, 10, 96, 64, true);
  uint64_t seed = 7900;
  for (const ExpertsMode& gm : kExpertsModes) {
    const char* beyond_gemv = gm.act == Mode::bf16 ? kGrouped : kRowdot;
    check_experts_case(dev, gm, ex, {17, 3}, ++seed, beyond_gemv);
    check_experts_case(dev, gm, ex, {40, 16}, ++seed, beyond_gemv);
    const int64_t odd_pad = gm.act == Mode::bf16 ? 4 : 2;  // rows 8 bytes off a 16-byte multiple
    check_experts_case(dev, gm, ex, {5, 3, true, odd_pad, 0}, ++seed, kRowdot);
    check_experts_case(dev, gm, ex, {1, 65}, ++seed, kRowdot);
    check_experts_case(dev, gm, ex, {16, 64}, ++seed, kGemv);  // the largest k taken
  }
  const Experts bf16_experts(dev, rng, 6, 6, 64, 32, false);
  check_experts_case(dev, kExpertsModes[0], bf16_experts, {2, 3}, ++seed, kRowdot);
}

// The k3-layer-tp8 rank's expert shapes (L 3584, I 384 = 3072 / 8, top-16; 64 experts instead of
// 896 to keep memory small, 16 weight sets): the GEMV at batch 1..16, the grouped kernels at 17.
TEST(OpsTp8, MoeExpertsGemvMxfp4Top16) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(8000);
  const Experts ex(dev, rng, 64, 16, 3584, 384, true);
  uint64_t seed = 8100;
  for (int64_t T : {1, 8, 16}) check_experts_case(dev, kExpertsModes[0], ex, {T, 16}, ++seed, kGemv);
  for (int64_t T : {1, 8}) check_experts_case(dev, kExpertsModes[1], ex, {T, 16}, ++seed, kGemv);
  check_experts_case(dev, kExpertsModes[2], ex, {1, 16}, ++seed, kGemv);
  check_experts_case(dev, kExpertsModes[0], ex, {8, 16, false, 0, 7168}, ++seed,
                     kGemv);  // [T, L | hidden] partial sums
  check_experts_case(dev, kExpertsModes[0], ex, {17, 16}, ++seed, kGrouped);
}

}  // namespace
}  // namespace k3::ops_test
