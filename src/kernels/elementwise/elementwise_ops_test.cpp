// kernels/elementwise/elementwise_ops_test.cpp: token-parallel ops on every device backend against the CPU
// reference: add, sigmoid_gate, situ_glu, silu_glu, rmsnorm, embedding, attn_res_mix, kda_output_gate
// (mla_cache_write: mla_ops_test.cpp). OpsOdd: random odd shapes (T in 1, 17, 54, 97); OpsTp8:
// per-GPU TP8 widths.
#include <cmath>
#include <vector>

#include "core/bf16.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

constexpr int64_t kOddT[] = {1, 17, 54, 97};
constexpr int64_t kTp8T[] = {1, 8, 64};

// ---------------------------------------------------------------- add, sigmoid_gate, situ_glu

void check_binary(Device* dev, Mode mode, int64_t T, int64_t D, uint64_t seed) {
  core::Rng rng(seed);
  const Tensor a = random_act(rng, {T, D}, mode), b = random_act(rng, {T, D}, mode, 0.0, 3.0);
  const Precision p = precision(mode);
  const std::string shape = shape_str({T, D});
  {  // add
    Tensor want = nan_tensor({T, D});
    cpu_registry().add.run({a.view(), b.view(), want.view(), p}, core::Device::cpu);
    Tensor da = dev->act(a, mode), db = dev->act(b, mode), out = dev->poisoned(act_dtype(mode), {T, D});
    const kernels::AddArgs args{da.view(), db.view(), out.view(), p};
    expect_device_impl(dev->registry().add, args, dev);
    dev->registry().add.run(args, dev->kind());
    expect_close("add", shape, mode, "out", dev->to_host_f32(out.view()), want, tol_elementwise(mode));
  }
  {  // sigmoid_gate
    Tensor want = nan_tensor({T, D});
    cpu_registry().sigmoid_gate.run({a.view(), b.view(), want.view(), p}, core::Device::cpu);
    Tensor da = dev->act(a, mode), db = dev->act(b, mode), out = dev->poisoned(act_dtype(mode), {T, D});
    const kernels::SigmoidGateArgs args{da.view(), db.view(), out.view(), p};
    expect_device_impl(dev->registry().sigmoid_gate, args, dev);
    dev->registry().sigmoid_gate.run(args, dev->kind());
    expect_close("sigmoid_gate", shape, mode, "out", dev->to_host_f32(out.view()), want, tol_elementwise(mode));
  }
  {  // situ_glu: large inputs so both tanh saturations bite
    const Tensor g = random_act(rng, {T, D}, mode, 0.0, 6.0), u = random_act(rng, {T, D}, mode, 0.0, 30.0);
    Tensor want = nan_tensor({T, D});
    cpu_registry().situ_glu.run({g.view(), u.view(), want.view(), 4.0f, 25.0f, p}, core::Device::cpu);
    Tensor dg = dev->act(g, mode), du = dev->act(u, mode), out = dev->poisoned(act_dtype(mode), {T, D});
    const kernels::SituGluArgs args{dg.view(), du.view(), out.view(), 4.0f, 25.0f, p};
    expect_device_impl(dev->registry().situ_glu, args, dev);
    dev->registry().situ_glu.run(args, dev->kind());
    expect_close("situ_glu", shape, mode, "out", dev->to_host_f32(out.view()), want, tol_elementwise(mode));
  }
  {  // silu_glu (the EAGLE-3 draft's MLP): gates from deep negative to large positive
    const Tensor g = random_act(rng, {T, D}, mode, 0.0, 6.0), u = random_act(rng, {T, D}, mode, 0.0, 3.0);
    Tensor want = nan_tensor({T, D});
    cpu_registry().silu_glu.run({g.view(), u.view(), want.view(), p}, core::Device::cpu);
    Tensor dg = dev->act(g, mode), du = dev->act(u, mode), out = dev->poisoned(act_dtype(mode), {T, D});
    const kernels::SiluGluArgs args{dg.view(), du.view(), out.view(), p};
    expect_device_impl(dev->registry().silu_glu, args, dev);
    dev->registry().silu_glu.run(args, dev->kind());
    expect_close("silu_glu", shape, mode, "out", dev->to_host_f32(out.view()), want, tol_elementwise(mode));
  }
}

TEST(OpsOdd, AddSigmoidGateSitu) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : kOddT) check_binary(dev, m, T, 97, 100 + T);
}
TEST(OpsTp8, AddSigmoidGateSitu) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : kTp8T) {
      check_binary(dev, m, T, 7168, 200 + T);  // residual / hidden
      check_binary(dev, m, T, 1536, 300 + T);  // MLA gate width, KDA P
      check_binary(dev, m, T, 384, 400 + T);   // expert intermediate
    }
}

// ---------------------------------------------------------------- rmsnorm

void check_rmsnorm(Device* dev, Mode mode, int64_t T, int64_t D, kernels::RmsNormStyle style, bool alias,
                   uint64_t seed) {
  core::Rng rng(seed);
  const Tensor x = random_act(rng, {T, D}, mode, 0.3, 2.0);
  Tensor w = Tensor::zeros(DType::bf16, {D});
  for (uint16_t& b : w.span<uint16_t>()) b = core::f32_to_bf16_bits(static_cast<float>(rng.normal(1.0, 0.1)));
  const Precision p = precision(mode);
  Tensor want = nan_tensor({T, D});
  cpu_registry().rmsnorm.run({x.view(), w.view(), want.view(), 1e-5f, style, p}, core::Device::cpu);
  Tensor dx = dev->act(x, mode), dw = dev->upload(w);
  Tensor out = alias ? dx : dev->poisoned(act_dtype(mode), {T, D});
  const kernels::RmsNormArgs args{dx.view(), dw.view(), out.view(), 1e-5f, style, p};
  expect_device_impl(dev->registry().rmsnorm, args, dev);
  dev->registry().rmsnorm.run(args, dev->kind());
  const std::string what = std::string(style == kernels::RmsNormStyle::moonshot ? "moonshot" : "fused") +
                           (alias ? "_inplace" : "");
  expect_close("rmsnorm", shape_str({T, D}), mode, what, dev->to_host_f32(out.view()), want, tol_elementwise(mode));
}

TEST(OpsOdd, RmsNorm) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : kOddT) {
      check_rmsnorm(dev, m, T, 97, kernels::RmsNormStyle::moonshot, false, 500 + T);
      check_rmsnorm(dev, m, T, 54, kernels::RmsNormStyle::fused, T == 17, 600 + T);
    }
}
TEST(OpsTp8, RmsNorm) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : kTp8T)
      for (int64_t D : {7168, 3584, 1536, 512})  // hidden, latent, q_lora, kv_lora
        check_rmsnorm(dev, m, T, D, kernels::RmsNormStyle::moonshot, false, 700 + T + D);
}

// ---------------------------------------------------------------- embedding

void check_embedding(Device* dev, Mode mode, int64_t T, int64_t V, int64_t D, uint64_t seed) {
  core::Rng rng(seed);
  const Tensor table = random_bf16_weight(rng, V, D);
  Tensor ids = Tensor::zeros(DType::i32, {T});
  for (int32_t& id : ids.span<int32_t>()) id = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(V));
  Tensor want = nan_tensor({T, D});
  cpu_registry().embedding.run({ids.view(), table.view(), want.view()}, core::Device::cpu);
  Tensor d_ids = dev->upload(ids), d_table = dev->upload(table), out = dev->poisoned(act_dtype(mode), {T, D});
  const kernels::EmbeddingArgs args{d_ids.view(), d_table.view(), out.view()};
  expect_device_impl(dev->registry().embedding, args, dev);
  dev->registry().embedding.run(args, dev->kind());
  expect_close("embedding", shape_str({T, V, D}), mode, "out", dev->to_host_f32(out.view()), want,
               Tol{0.0, 1.0 - 1e-12});  // bf16 rows copied: exact
}

TEST(OpsOdd, Embedding) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : kOddT) check_embedding(dev, m, T, 97, 54, 800 + T);
}
TEST(OpsTp8, Embedding) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : kTp8T) check_embedding(dev, m, T, 2048, 7168, 900 + T);
}
TEST(OpsOdd, EmbeddingIdOutsideTheVocabularyGivesANanRow) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(11);
  const Tensor table = random_bf16_weight(rng, 17, 8);
  Tensor ids = Tensor::zeros(DType::i32, {3});
  ids.data<int32_t>()[0] = 3, ids.data<int32_t>()[1] = 17, ids.data<int32_t>()[2] = -1;
  // Zeros, not NaN poison: the NaN rows must come from the kernel.
  Tensor d_ids = dev->upload(ids), d_table = dev->upload(table), out = dev->upload(Tensor::zeros(DType::bf16, {3, 8}));
  dev->registry().embedding.run({d_ids.view(), d_table.view(), out.view()}, dev->kind());
  const Tensor got = dev->to_host_f32(out.view());
  for (int64_t d = 0; d < 8; ++d) {
    EXPECT_TRUE(std::isfinite(got.data<float>()[d]));
    EXPECT_TRUE(std::isnan(got.data<float>()[8 + d]));
    EXPECT_TRUE(std::isnan(got.data<float>()[16 + d]));
  }
}

// ---------------------------------------------------------------- attn_res_mix

void check_mix(Device* dev, Mode mode, int64_t T, int64_t D, int n, bool alias, uint64_t seed) {
  core::Rng rng(seed);
  std::vector<Tensor> src;
  for (int j = 0; j < n; ++j) src.push_back(random_act(rng, {T, D}, mode, 0.0, 0.5 + j));
  Tensor query = Tensor::zeros(DType::bf16, {1, D}), norm = Tensor::zeros(DType::bf16, {D});
  // Pseudo-query large enough that the depth softmax is far from uniform (spec §14.3).
  for (uint16_t& b : query.span<uint16_t>()) b = core::f32_to_bf16_bits(static_cast<float>(rng.normal(0, 0.5)));
  for (uint16_t& b : norm.span<uint16_t>()) b = core::f32_to_bf16_bits(static_cast<float>(rng.normal(1, 0.1)));
  std::vector<TensorView> cpu_views;
  for (const Tensor& s : src) cpu_views.push_back(s.view());
  Tensor want = nan_tensor({T, D});
  cpu_registry().attn_res_mix.run({cpu_views, query.view(), norm.view(), want.view(), 1e-5f, precision(mode)},
                                  core::Device::cpu);
  std::vector<Tensor> dsrc;
  std::vector<TensorView> dviews;
  for (const Tensor& s : src) dsrc.push_back(dev->act(s, mode));
  for (const Tensor& s : dsrc) dviews.push_back(s.view());
  Tensor dq = dev->upload(query), dn = dev->upload(norm);
  Tensor out = alias ? dsrc.back() : dev->poisoned(act_dtype(mode), {T, D});
  const kernels::AttnResMixArgs args{dviews, dq.view(), dn.view(), out.view(), 1e-5f, precision(mode)};
  expect_device_impl(dev->registry().attn_res_mix, args, dev);
  dev->registry().attn_res_mix.run(args, dev->kind());
  expect_close("attn_res_mix", shape_str({T, D, n}), mode, alias ? "out_inplace" : "out", dev->to_host_f32(out.view()),
               want, tol_reduction(mode));
}

TEST(OpsOdd, AttnResMix) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : kOddT)
      for (int n : {1, 2, 9}) check_mix(dev, m, T, 97, n, n == 2, 1000 + T * 10 + n);
}
TEST(OpsTp8, AttnResMix) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : kTp8T) {
      for (int n : {1, 2, 9}) check_mix(dev, m, T, 7168, n, false, 1100 + T * 10 + n);
      check_mix(dev, m, T, 7168, 9, true, 1150 + T);  // out = the prefix, in place
    }
}

// ---------------------------------------------------------------- kda_output_gate

void check_output_gate(Device* dev, Mode mode, int64_t T, int H, int D, uint64_t seed) {
  core::Rng rng(seed);
  const Tensor o = random_act(rng, {T, int64_t{H} * D}, mode), g = random_act(rng, {T, int64_t{H} * D}, mode, 0, 3);
  const Tensor w = random_uniform_f32(rng, {D}, 0.3);
  Tensor want = nan_tensor({T, int64_t{H} * D});
  cpu_registry().kda_output_gate.run({o.view(), g.view(), w.view(), want.view(), H, D, 1e-5f, precision(mode)},
                                     core::Device::cpu);
  Tensor d_o = dev->act(o, mode), d_g = dev->act(g, mode), d_w = dev->upload(w);
  Tensor out = dev->poisoned(act_dtype(mode), {T, int64_t{H} * D});
  const kernels::KdaOutputGateArgs args{d_o.view(), d_g.view(), d_w.view(), out.view(), H, D, 1e-5f, precision(mode)};
  expect_device_impl(dev->registry().kda_output_gate, args, dev);
  dev->registry().kda_output_gate.run(args, dev->kind());
  expect_close("kda_output_gate", shape_str({T, H, D}), mode, "out", dev->to_host_f32(out.view()), want,
               tol_elementwise(mode));
}

TEST(OpsOdd, KdaOutputGate) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : kOddT) check_output_gate(dev, m, T, 3, 17, 1200 + T);
}
TEST(OpsTp8, KdaOutputGate) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : kTp8T) check_output_gate(dev, m, T, 12, 128, 1300 + T);
}

}  // namespace
}  // namespace k3::ops_test
