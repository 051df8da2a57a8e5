// kernels/moe/moe_ops_test_util.cpp: the routed-expert tests' shared pieces (moe_ops_test_util.h).
#include "kernels/moe/moe_ops_test_util.h"

#include <algorithm>
#include <cmath>

namespace k3::ops_test {

Experts::Experts(Device* dev, core::Rng& rng, int64_t E, int64_t distinct, int64_t L, int64_t I, bool mxfp4) {
  std::vector<kernels::LinearWeight> s1, s3, s2, d1, d3, d2;
  const auto make = [&](int64_t rows, int64_t cols) {
    if (mxfp4) return random_mxfp4_weight(rng, rows, cols);
    kernels::LinearWeight w;
    w.weight = random_bf16_weight(rng, rows, cols);
    return w;
  };
  for (int64_t s = 0; s < distinct; ++s) {
    s1.push_back(make(I, L)), s3.push_back(make(I, L)), s2.push_back(make(L, I));
    d1.push_back(dev->upload(s1.back())), d3.push_back(dev->upload(s3.back())), d2.push_back(dev->upload(s2.back()));
  }
  for (int64_t e = 0; e < E; ++e) {
    w1.push_back(s1[e % distinct]), w3.push_back(s3[e % distinct]), w2.push_back(s2[e % distinct]);
    dw1.push_back(d1[e % distinct]), dw3.push_back(d3[e % distinct]), dw2.push_back(d2[e % distinct]);
  }
}

void random_routes(core::Rng& rng, int64_t T, int64_t E, int64_t k, Tensor& ids, Tensor& weights) {
  ids = Tensor::zeros(DType::i32, {T, k});
  weights = f32_tensor({T, k});
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.0f;
    int32_t* row = ids.data<int32_t>() + t * k;
    for (int64_t j = 0; j < k; ++j) {
      int32_t e;
      do {
        e = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(E));
      } while (std::find(row, row + j, e) != row + j);
      row[j] = e;
      sum += weights.data<float>()[t * k + j] = static_cast<float>(rng.uniform(0.1, 1.0));
    }
    for (int64_t j = 0; j < k; ++j) weights.data<float>()[t * k + j] /= sum;
  }
}

std::vector<BadId> some_bad_ids(int64_t T, int64_t k, int64_t E) {
  const int32_t e = static_cast<int32_t>(E);
  return {{T - 1, std::min<int64_t>(1, k - 1), 100 + e}, {T / 2, 0, e}, {0, k - 1, -1}};
}

const kernels::OpImpl<kernels::MoeExpertsArgs>& moe_impl_named(Device* dev, const std::string& name) {
  for (const auto& impl : dev->registry().moe_experts.impls())
    if (impl.name == name && impl.device == dev->kind()) return impl;
  throw core::Error("no moe_experts implementation " + name + " registered");
}

std::string expected_moe_impl(Device* dev, const kernels::MoeExpertsArgs& args, const std::string& impl) {
  if (impl != "cuda_expert_rowdot") return impl;
  for (const char* name : {"cuda_expert_fp4_mma", "cuda_expert_fp4", "cuda_expert_rowdot"})
    if (moe_impl_named(dev, name).supports(args)) return name;
  return impl;
}

const char* mxfp4_strategy(const ExpertsMode& mode, int64_t T, int64_t k, bool aligned) {
  if (aligned && k <= kernels::kMoeExpertsMaxTopk) {
    if (T <= kernels::kMoeExpertsGemvMaxTokens) return "cuda_expert_gemv";
    if (T <= kernels::kMoeExpertsGroupedMaxTokens && mode.act == Mode::bf16) return "cuda_expert_grouped";
  }
  return "cuda_expert_rowdot";
}

void check_experts_case(Device* dev, const ExpertsMode& mode, const Experts& ex, const ExpertsCase& c, uint64_t seed,
                        const std::string& impl, const std::vector<BadId>& bad, RunAs how) {
  core::Rng rng(seed);
  const int64_t E = ex.E(), L = ex.L(), I = ex.I(), T = c.T, k = c.k;
  const Tensor z_full = random_act(rng, {T, L + c.z_pad}, mode.act, 0.0, 2.0);
  Tensor ids, weights;
  random_routes(rng, T, E, k, ids, weights);
  kernels::MoeExpertsArgs cpu{column_block(z_full, 0, L),
                              ids.view(),
                              weights.view(),
                              ex.w1,
                              ex.w3,
                              ex.w2,
                              TensorView{},
                              4.0f,
                              25.0f,
                              mode.precision};
  cpu.round_output = c.round_output;
  Tensor want = nan_tensor({T, L});
  cpu.out = want.view();
  cpu_registry().moe_experts.run(cpu, core::Device::cpu);  // with the valid ids

  Tensor bad_ids = copy(ids);
  std::vector<bool> bad_token(static_cast<size_t>(T), false);
  for (const BadId& b : bad) {
    bad_ids.data<int32_t>()[b.t * k + b.j] = b.id;
    bad_token[static_cast<size_t>(b.t)] = true;
  }
  const DType out_dtype = c.round_output ? act_dtype(mode.act) : DType::f32;
  Tensor dz = dev->upload(z_full, act_dtype(mode.act)), d_ids = dev->upload(bad_ids), d_w = dev->upload(weights);
  Tensor out = dev->poisoned(out_dtype, {T, L + c.out_pad});
  kernels::MoeExpertsArgs args{column_block(dz, 0, L),  d_ids.view(), d_w.view(), ex.dw1,        ex.dw3, ex.dw2,
                               column_block(out, 0, L), 4.0f,         25.0f,      mode.precision};
  args.round_output = c.round_output;
  const std::string shape = shape_str({T, E, k, L, I});
  const std::string where = shape + " " + mode.name + (c.round_output ? "" : " partial") + " z_pad " +
                            std::to_string(c.z_pad);
  if (how == RunAs::selected) {
    ASSERT_EQ(dev->registry().moe_experts.select(args, dev->kind()).name, expected_moe_impl(dev, args, impl)) << where;
    dev->registry().moe_experts.run(args, dev->kind());
  } else {
    const auto& named = moe_impl_named(dev, impl);
    const core::Status s = named.supports(args);
    ASSERT_TRUE(s) << where << ": " << s.reason();
    named.run(args);
  }
  const Tensor got_full = dev->to_host_f32(out.view());
  Tensor got = copy_rows(column_block(got_full, 0, L));
  int64_t pad_written = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t l = L; l < L + c.out_pad; ++l)
      pad_written += !std::isnan(got_full.data<float>()[t * (L + c.out_pad) + l]);
  EXPECT_EQ(pad_written, 0) << shape << ": out columns beside the op's view were written";
  for (int64_t t = 0; t < T; ++t) {
    if (!bad_token[static_cast<size_t>(t)]) continue;
    int64_t nan_count = 0;
    for (int64_t l = 0; l < L; ++l) {
      nan_count += std::isnan(got.data<float>()[t * L + l]);
      got.data<float>()[t * L + l] = want.data<float>()[t * L + l] = 0.0f;  // out of the comparison
    }
    EXPECT_EQ(nan_count, L) << shape << ": token " << t << " has a bad id, its row must be NaN";
  }
  const std::string what = std::string(mode.name) + (c.round_output ? "" : "_partial") + (c.z_pad ? "_zld" : "") +
                           (c.out_pad ? "_outld" : "") + (bad.empty() ? "" : "_badid") + "_k" + std::to_string(k);
  expect_close(c.round_output ? "moe_experts" : "moe_experts_partial", shape, mode.tol, what, got, want,
               tol_reduction(mode.tol));
}

}  // namespace k3::ops_test
