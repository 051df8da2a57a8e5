// kernels/gqa/gqa_ops_test.cpp: rope_gqa_attention on every device backend against the CPU reference:
// the rotated queries, the cache rows it wrote and the attention output, on odd shapes (one to a few
// new rows over short caches, heads of 10 and 64 dims, groups of 1 to 3) and the K3 EAGLE-3 draft's
// (64 heads of 128 over 8 KV heads, a chain row and a 7-row catch-up over a 4K context).
#include <vector>

#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

struct GqaCase {
  int64_t n, past;
  int num_heads, num_kv_heads, head_dim;
};

void check_gqa(Device* dev, Mode mode, const GqaCase& c, uint64_t seed) {
  core::Rng rng(seed);
  const int64_t qw = int64_t{c.num_heads} * c.head_dim, kvw = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t cap = c.past + c.n + 3;  // rows past the new ones stay unwritten (NaN)
  const Tensor q = random_act(rng, {c.n, qw}, mode), k = random_act(rng, {c.n, kvw}, mode);
  const Tensor v = random_act(rng, {c.n, kvw}, mode);
  Tensor kc = nan_tensor({cap, kvw}), vc = nan_tensor({cap, kvw});
  const Tensor past_k = random_act(rng, {std::max<int64_t>(c.past, 1), kvw}, Mode::fp32);
  const Tensor past_v = random_act(rng, {std::max<int64_t>(c.past, 1), kvw}, Mode::fp32);
  std::copy_n(past_k.data<const float>(), c.past * kvw, kc.data<float>());
  std::copy_n(past_v.data<const float>(), c.past * kvw, vc.data<float>());
  Tensor inv_freq = f32_tensor({c.head_dim / 2});
  for (int j = 0; j < c.head_dim / 2; ++j)
    inv_freq.data<float>()[j] = 1.0f / std::pow(10000.0f, 2.0f * static_cast<float>(j) / c.head_dim);
  const Precision p = precision(mode);
  const int64_t position = c.past + 1000;  // absolute positions need not start at 0
  // Reference on host copies (q and k rotate in place; the device gets the originals).
  Tensor rq = copy(q), rk = copy(k), rv = copy(v), rkc = copy(kc), rvc = copy(vc), want = nan_tensor({c.n, qw});
  cpu_registry().rope_gqa_attention.run({rq.view(), rk.view(), rv.view(), rkc.view(), rvc.view(), inv_freq.view(),
                                         want.view(), c.past, position, c.num_heads, c.num_kv_heads, c.head_dim, p},
                                        core::Device::cpu);
  Tensor dq = dev->act(q, mode), dk = dev->act(k, mode), dv = dev->act(v, mode);
  Tensor dkc = dev->upload(kc), dvc = dev->upload(vc), dfreq = dev->upload(inv_freq);
  Tensor out = dev->poisoned(act_dtype(mode), {c.n, qw});
  const kernels::RopeGqaAttentionArgs args{dq.view(),      dk.view(),  dv.view(), dkc.view(), dvc.view(),
                                           dfreq.view(),   out.view(), c.past,    position,   c.num_heads,
                                           c.num_kv_heads, c.head_dim, p};
  expect_device_impl(dev->registry().rope_gqa_attention, args, dev);
  dev->registry().rope_gqa_attention.run(args, dev->kind());
  const std::string shape = shape_str({c.n, c.past, c.num_heads, c.num_kv_heads, c.head_dim});
  expect_close("rope_gqa_attention", shape, mode, "out", dev->to_host_f32(out.view()), want, tol_attention(mode));
  expect_close("rope_gqa_attention", shape, mode, "q rotated", dev->to_host_f32(dq.view()), rq, tol_elementwise(mode));
  const Tensor got_kc = dev->to_host_f32(dkc.view());
  const int64_t written = (c.past + c.n) * kvw;
  expect_close("rope_gqa_attention", shape, mode, "k_cache",
               Tensor::copy_of(core::TensorView::contiguous(const_cast<float*>(got_kc.data<const float>()),
                                                            core::DType::f32, {written})),
               Tensor::copy_of(core::TensorView::contiguous(rkc.data<float>(), core::DType::f32, {written})),
               tol_elementwise(mode));
  for (int64_t i = written; i < cap * kvw; ++i)
    ASSERT_TRUE(std::isnan(got_kc.data<const float>()[i])) << "wrote past the new rows at " << i;
}

TEST(OpsOdd, RopeGqaAttention) {
  K3_REQUIRE_CUDA(dev);
  const GqaCase cases[] = {{1, 0, 3, 1, 10}, {5, 17, 6, 2, 10}, {3, 40, 4, 4, 64}, {7, 1, 6, 3, 34}};
  for (Mode m : kModes)
    for (const GqaCase& c : cases) check_gqa(dev, m, c, 500 + static_cast<uint64_t>(c.n * 31 + c.past));
}

TEST(OpsTp8, RopeGqaAttentionK3Draft) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes) {
    check_gqa(dev, m, {1, 4095, 64, 8, 128}, 600);  // a chain row over a 4K context
    check_gqa(dev, m, {7, 4089, 64, 8, 128}, 601);  // a verify round's catch-up rows
  }
}

}  // namespace
}  // namespace k3::ops_test
