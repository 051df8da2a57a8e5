// tests/ops/moe_ops_test.cpp: the sigmoid router top-k and the routed experts (BF16 and MXFP4, the
// MXFP4 decoded inside the expert kernel) on every device backend against the CPU reference, at
// odd shapes and at the TP8 expert shapes (896 experts, top-16, latent 3584, intermediate 384).
#include <algorithm>
#include <cmath>
#include <vector>

#include "tests/ops/op_harness.h"

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
}
TEST(OpsTp8, RouterTopk) {
  K3_REQUIRE_CUDA(dev);
  for (int64_t T : {1, 8, 64}) check_router(dev, T, 896, 16, 4100 + T);
}

// ---------------------------------------------------------------- moe_experts

// E experts backed by `distinct` random weight sets (expert e uses set e % distinct: 896 TP8
// experts without 2 GB of random numbers; the kernels see 896 separate pointers all the same).
struct Experts {
  std::vector<kernels::LinearWeight> w1, w3, w2;        // CPU
  std::vector<kernels::LinearWeight> dw1, dw3, dw2;     // device
  Experts(Device* dev, core::Rng& rng, int64_t E, int distinct, int64_t L, int64_t I, bool mxfp4) {
    std::vector<kernels::LinearWeight> s1, s3, s2, d1, d3, d2;
    const auto make = [&](int64_t rows, int64_t cols) {
      if (mxfp4) return random_mxfp4_weight(rng, rows, cols);
      kernels::LinearWeight w;
      w.weight = random_bf16_weight(rng, rows, cols);
      return w;
    };
    for (int s = 0; s < distinct; ++s) {
      s1.push_back(make(I, L)), s3.push_back(make(I, L)), s2.push_back(make(L, I));
      d1.push_back(dev->upload(s1.back())), d3.push_back(dev->upload(s3.back())), d2.push_back(dev->upload(s2.back()));
    }
    for (int64_t e = 0; e < E; ++e) {
      w1.push_back(s1[e % distinct]), w3.push_back(s3[e % distinct]), w2.push_back(s2[e % distinct]);
      dw1.push_back(d1[e % distinct]), dw3.push_back(d3[e % distinct]), dw2.push_back(d2[e % distinct]);
    }
  }
};

// ids: k distinct experts per token, uniformly at random; weights: positive, summing to 1.
void random_routes(core::Rng& rng, int64_t T, int64_t E, int64_t k, Tensor& ids, Tensor& weights) {
  ids = Tensor::zeros(DType::i32, {T, k});
  weights = f32_tensor({T, k});
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int32_t e;
      do {
        e = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(E));
      } while (std::find(ids.data<int32_t>() + t * k, ids.data<int32_t>() + t * k + j, e) !=
               ids.data<int32_t>() + t * k + j);
      ids.data<int32_t>()[t * k + j] = e;
      sum += weights.data<float>()[t * k + j] = static_cast<float>(rng.uniform(0.1, 1.0));
    }
    for (int64_t j = 0; j < k; ++j) weights.data<float>()[t * k + j] /= sum;
  }
}

void check_experts(Device* dev, Mode mode, const Experts& ex, int64_t T, int64_t k, int64_t L, uint64_t seed,
                   const std::string& what) {
  core::Rng rng(seed);
  const int64_t E = static_cast<int64_t>(ex.w1.size());
  const Tensor z = random_act(rng, {T, L}, mode, 0.0, 2.0);
  Tensor ids, weights;
  random_routes(rng, T, E, k, ids, weights);
  const Precision p = precision(mode);
  Tensor want = nan_tensor({T, L});
  cpu_registry().moe_experts.run({z.view(), ids.view(), weights.view(), ex.w1, ex.w3, ex.w2, want.view(), 4.0f,
                                  25.0f, p},
                                 core::Device::cpu);
  Tensor dz = dev->act(z, mode), d_ids = dev->upload(ids), d_w = dev->upload(weights);
  Tensor out = dev->poisoned(act_dtype(mode), {T, L});
  const kernels::MoeExpertsArgs args{dz.view(), d_ids.view(), d_w.view(), ex.dw1, ex.dw3, ex.dw2,
                                     out.view(), 4.0f, 25.0f, p};
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

TEST(OpsOdd, MoeExpertsBadIdGivesANanRow) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(5300);
  const Experts ex(dev, rng, 5, 5, 32, 32, true);
  const Tensor z = random_act(rng, {3, 32}, Mode::bf16);
  Tensor ids = Tensor::zeros(DType::i32, {3, 2}), weights = f32_tensor({3, 2});
  const int32_t id_values[6] = {0, 1, -1, 2, 3, 4};  // token 1 has the router's NaN marker -1
  std::copy_n(id_values, 6, ids.data<int32_t>());
  std::fill_n(weights.data<float>(), 6, 0.5f);
  Tensor dz = dev->act(z, Mode::bf16), d_ids = dev->upload(ids), d_w = dev->upload(weights);
  Tensor out = dev->upload(Tensor::zeros(DType::bf16, {3, 32}));
  dev->registry().moe_experts.run({dz.view(), d_ids.view(), d_w.view(), ex.dw1, ex.dw3, ex.dw2, out.view()},
                                  dev->kind());
  const Tensor got = dev->to_host_f32(out.view());
  for (int64_t l = 0; l < 32; ++l) {
    EXPECT_TRUE(std::isfinite(got.data<float>()[l]));
    EXPECT_TRUE(std::isnan(got.data<float>()[32 + l]));
    EXPECT_TRUE(std::isfinite(got.data<float>()[64 + l]));
  }
}

TEST(OpsTp8, MoeExpertsMxfp4Top16Of896) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(6000);
  const Experts ex(dev, rng, 896, 32, 3584, 384, true);
  for (Mode m : kModes)
    for (int64_t T : {1, 8}) check_experts(dev, m, ex, T, 16, 3584, 6100 + T, "w_mxfp4");
}

}  // namespace
}  // namespace k3::ops_test
