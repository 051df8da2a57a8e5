// kernels/testing/tp_ops_test.cpp: the op variants tensor parallelism uses (spec §11) on every device
// backend against the CPU reference: to_activation (round a reduced fp32 sum once, reading a
// column block of a packed [T, L + hidden] buffer), the vocab-parallel embedding (rows of the
// rank's slice, zeros for other ids), and moe_experts with round_output off (a rank's unrounded
// f32 partial sum, written into a column block of the packed buffer).
#include <cmath>
#include <vector>

#include "core/bf16.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

// Columns [c0, c1) of a contiguous rank-2 tensor (any device) as a row-strided view.
TensorView columns(const Tensor& t, int64_t c0, int64_t c1) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + c0 * static_cast<int64_t>(core::dtype_size(t.dtype()));
  v.shape = Shape{t.dim(0), c1 - c0};
  return v;
}

void check_to_activation(Device* dev, Mode mode, int64_t T, int64_t L, int64_t H, uint64_t seed) {
  core::Rng rng(seed);
  const Tensor packed = random_uniform_f32(rng, {T, L + H}, 3.0);  // fp32 sums, not bf16 values
  const Precision p = precision(mode);
  const Tensor d_packed = dev->upload(packed);
  for (auto [c0, c1] : {std::pair<int64_t, int64_t>{0, L}, {L, L + H}}) {
    Tensor want = nan_tensor({T, c1 - c0});
    cpu_registry().to_activation.run({columns(packed, c0, c1), want.view(), p}, core::Device::cpu);
    Tensor out = dev->poisoned(act_dtype(mode), {T, c1 - c0});
    const kernels::ToActivationArgs args{columns(d_packed, c0, c1), out.view(), p};
    expect_device_impl(dev->registry().to_activation, args, dev);
    dev->registry().to_activation.run(args, dev->kind());
    expect_close("to_activation", shape_str({T, c0, c1}), mode, "out", dev->to_host_f32(out.view()), want,
                 Tol{0.0, 1.0 - 1e-12});  // one rounding: exact
  }
}

TEST(OpsOdd, ToActivation) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 17, 54, 97}) check_to_activation(dev, m, T, 37, 96, 300 + T);
}
TEST(OpsTp8, ToActivationLatentPlusHidden) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 8, 64}) check_to_activation(dev, m, T, 3584, 7168, 400 + T);
}

TEST(OpsOdd, EmbeddingVocabSlice) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(500);
  const int64_t V = 8 * 61, D = 54, T = 97;
  for (int n : {2, 8}) {
    const int64_t slice = V / n;
    for (int r : {0, n - 1}) {
      const Tensor table = random_bf16_weight(rng, slice, D);  // the rank's rows
      Tensor ids = Tensor::zeros(DType::i32, {T});
      for (int32_t& id : ids.span<int32_t>()) id = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(V));
      ids.data<int32_t>()[0] = static_cast<int32_t>(r * slice);  // the slice's edges
      ids.data<int32_t>()[1] = static_cast<int32_t>((r + 1) * slice - 1);
      for (Mode m : kModes) {
        Tensor want = nan_tensor({T, D});
        cpu_registry().embedding.run({ids.view(), table.view(), want.view(), r * slice, V}, core::Device::cpu);
        Tensor d_ids = dev->upload(ids), d_table = dev->upload(table), out = dev->poisoned(act_dtype(m), {T, D});
        const kernels::EmbeddingArgs args{d_ids.view(), d_table.view(), out.view(), r * slice, V};
        expect_device_impl(dev->registry().embedding, args, dev);
        dev->registry().embedding.run(args, dev->kind());
        expect_close("embedding_slice", shape_str({T, V, D, n, r}), m, "out", dev->to_host_f32(out.view()), want,
                     Tol{0.0, 1.0 - 1e-12});
      }
    }
  }
}

TEST(OpsOdd, MoeExpertsUnroundedPartialIntoPackedColumns) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(600);
  const int64_t E = 6, k = 3, L = 64, I = 32, H = 96;  // I: a TP rank's slice, one MXFP4 group
  for (bool mxfp4 : {false, true}) {
    std::vector<kernels::LinearWeight> w1, w3, w2, d1, d3, d2;
    for (int64_t e = 0; e < E; ++e) {
      for (auto* pair : {&w1, &w3}) {
        kernels::LinearWeight w;
        if (mxfp4) w = random_mxfp4_weight(rng, I, L);
        else w.weight = random_bf16_weight(rng, I, L);
        pair->push_back(w);
      }
      kernels::LinearWeight w;
      if (mxfp4) w = random_mxfp4_weight(rng, L, I);
      else w.weight = random_bf16_weight(rng, L, I);
      w2.push_back(w);
      d1.push_back(dev->upload(w1.back())), d3.push_back(dev->upload(w3.back())), d2.push_back(dev->upload(w2.back()));
    }
    for (Mode m : kModes)
      for (int64_t T : {1, 17, 54}) {
        const Tensor z = random_act(rng, {T, L}, m, 0.0, 2.0);
        Tensor ids = Tensor::zeros(DType::i32, {T, k}), weights = f32_tensor({T, k});
        for (int32_t& id : ids.span<int32_t>()) id = static_cast<int32_t>(rng.next_u64() % E);
        for (float& w : weights.span<float>()) w = static_cast<float>(rng.uniform(0.1, 0.6));
        Tensor want = nan_tensor({T, L});
        kernels::MoeExpertsArgs cpu{z.view(), ids.view(),  weights.view(), w1,    w3,
                                    w2,       want.view(), 4.0f,           25.0f, precision(m)};
        cpu.round_output = false;
        cpu_registry().moe_experts.run(cpu, core::Device::cpu);
        Tensor dz = dev->act(z, m), d_ids = dev->upload(ids), d_w = dev->upload(weights);
        Tensor packed = dev->poisoned(DType::f32, {T, L + H});  // [T, L | hidden] f32 partial sums
        kernels::MoeExpertsArgs args{dz.view(), d_ids.view(),          d_w.view(), d1,    d3,
                                     d2,        columns(packed, 0, L), 4.0f,       25.0f, precision(m)};
        args.round_output = false;
        expect_device_impl(dev->registry().moe_experts, args, dev);
        dev->registry().moe_experts.run(args, dev->kind());
        const Tensor got = dev->to_host_f32(packed.view());
        const Tensor latent = copy_rows(columns(got, 0, L));
        expect_close("moe_experts_partial", shape_str({T, E, k, L, I}), m, mxfp4 ? "w_mxfp4" : "w_bf16", latent, want,
                     tol_reduction(m));
        int64_t poisoned = 0;  // the hidden block is not the op's to write
        for (int64_t t = 0; t < T; ++t)
          for (int64_t c = L; c < L + H; ++c) poisoned += std::isnan(got.data<float>()[t * (L + H) + c]);
        EXPECT_EQ(poisoned, T * H);
      }
  }
}

}  // namespace
}  // namespace k3::ops_test
