// kernels/dspark/dspark_ops_test.cpp: the DSpark draft's ops on every device backend against the CPU
// reference, on odd shapes (a few heads of odd widths, empty contexts, ties in the Markov argmax,
// a d2t mapping) and the K3 DSpark draft's (96 heads of 128 + 64 over a 576-wide latent, a 7-row
// block over a 2K context; the Markov head over the full 163,840-token vocabulary at rank 256).
#include <vector>

#include "core/bf16.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

Tensor inv_freq_for(int dim, float theta) {
  Tensor f = f32_tensor({dim / 2});
  for (int i = 0; i < dim / 2; ++i)
    f.data<float>()[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
  return f;
}

struct RopeCase {
  int64_t n, cols, offset, stride;
  int heads, dim;
  int64_t position;
};

void check_rope(Device* dev, Mode mode, const RopeCase& c, uint64_t seed) {
  core::Rng rng(seed);
  const Tensor x = random_act(rng, {c.n, c.cols}, Mode::fp32, 0.0, 2.0);
  const Tensor freq = inv_freq_for(c.dim, 10000.0f);
  Tensor want = copy(x);
  const Precision p = precision(mode);
  cpu_registry().rope_pairs.run({want.view(), freq.view(), c.offset, c.stride, c.heads, c.dim, c.position, p},
                                core::Device::cpu);
  Tensor dx = dev->upload(x), dfreq = dev->upload(freq);
  const kernels::RopePairsArgs args{dx.view(), dfreq.view(), c.offset, c.stride, c.heads, c.dim, c.position, p};
  expect_device_impl(dev->registry().rope_pairs, args, dev);
  dev->registry().rope_pairs.run(args, dev->kind());
  expect_close("rope_pairs", shape_str({c.n, c.cols, c.offset, c.stride, c.heads, c.dim, c.position}), mode, "x",
               dev->to_host_f32(dx.view()), want, tol_elementwise(mode));
}

struct BlockCase {
  int64_t T, P;
  int heads, nope, rope, v, latent;
};

void check_block_attention(Device* dev, Mode mode, const BlockCase& c, uint64_t seed) {
  core::Rng rng(seed);
  const int64_t qw = int64_t{c.heads} * (c.nope + c.rope), row = c.latent + c.rope;
  const Tensor q = random_act(rng, {c.T, qw}, mode);
  const Tensor ctx = random_act(rng, {std::max<int64_t>(c.P, 1), row}, mode);
  const Tensor blk = random_act(rng, {c.T, row}, mode);
  kernels::LinearWeight kv_b{random_bf16_weight(rng, int64_t{c.heads} * (c.nope + c.v), c.latent), {}};
  const Precision p = precision(mode);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.nope + c.rope));
  const TensorView ctx_rows = TensorView::contiguous(const_cast<float*>(ctx.data<const float>()), DType::f32,
                                                     {c.P, row});
  Tensor want = nan_tensor({c.T, int64_t{c.heads} * c.v});
  cpu_registry().mla_block_attention.run(
      {q.view(), ctx_rows, blk.view(), &kv_b, want.view(), c.heads, c.nope, c.rope, c.v, scale, p}, core::Device::cpu);
  Tensor dq = dev->upload(q), dctx = dev->upload(ctx), dblk = dev->upload(blk);
  const kernels::LinearWeight dkv_b = dev->upload(kv_b);
  TensorView dctx_rows = dctx.view();
  dctx_rows.shape = {c.P, row};
  Tensor out = dev->poisoned(DType::f32, {c.T, int64_t{c.heads} * c.v});
  const kernels::MlaBlockAttentionArgs args{dq.view(), dctx_rows, dblk.view(), &dkv_b, out.view(), c.heads,
                                            c.nope,    c.rope,    c.v,         scale,  p};
  expect_device_impl(dev->registry().mla_block_attention, args, dev);
  dev->registry().mla_block_attention.run(args, dev->kind());
  expect_close("mla_block_attention", shape_str({c.T, c.P, c.heads, c.nope, c.rope, c.v, c.latent}), mode, "out",
               dev->to_host_f32(out.view()), want, tol_attention(mode));
}

struct MarkovCase {
  int64_t B, K, n, V, Vd, R;
  bool ties;  // base logits and W2 of whole numbers: many equal maxima (the lowest id must win)
};

void check_markov(Device* dev, const MarkovCase& c, uint64_t seed) {
  core::Rng rng(seed);
  Tensor base = random_act(rng, {c.B * c.K, c.Vd}, Mode::fp32, 0.0, 3.0);
  Tensor w1 = random_act(rng, {c.V, c.R}, Mode::bf16);
  kernels::LinearWeight w2{random_bf16_weight(rng, c.Vd, c.R), {}};
  if (c.ties) {
    for (float& v : base.span<float>()) v = std::round(v);
    for (float& v : w1.span<float>()) v = 0.0f;  // no Markov term: z is the integer base row
  }
  Tensor w1_bf16 = Tensor::zeros(DType::bf16, {c.V, c.R});
  for (int64_t i = 0; i < w1.numel(); ++i)
    w1_bf16.data<uint16_t>()[i] = core::f32_to_bf16_bits(w1.data<const float>()[i]);
  Tensor x0 = Tensor::zeros(DType::i32, {c.B});
  for (int64_t b = 0; b < c.B; ++b) x0.data<int32_t>()[b] = static_cast<int32_t>((b * 7919 + 3) % c.V);
  Tensor d2t;
  if (c.Vd < c.V) {  // draft id d -> target id d + d2t[d]: spread over the target vocabulary
    d2t = Tensor::zeros(DType::i64, {c.Vd});
    for (int64_t d = 0; d < c.Vd; ++d) d2t.data<int64_t>()[d] = (d * (c.V / c.Vd)) - d;
  }
  const TensorView d2t_view = d2t.defined() ? d2t.view() : TensorView{};
  Tensor want_tokens = Tensor::zeros(DType::i32, {c.B, c.n});
  Tensor want_logits = nan_tensor({c.B * c.n, c.Vd});
  cpu_registry().markov_draft.run({base.view(), x0.view(), w1_bf16.view(), &w2, d2t_view, want_tokens.view(),
                                   want_logits.view(), static_cast<int>(c.K)},
                                  core::Device::cpu);
  Tensor dbase = dev->upload(base), dx0 = dev->upload(x0), dw1 = dev->upload(w1_bf16);
  const kernels::LinearWeight dw2 = dev->upload(w2);
  Tensor dd2t = d2t.defined() ? dev->upload(d2t) : Tensor{};
  Tensor tokens = dev->poisoned(DType::i32, {c.B, c.n}), logits = dev->poisoned(DType::f32, {c.B * c.n, c.Vd});
  const kernels::MarkovDraftArgs args{
      dbase.view(),  dx0.view(),    dw1.view(),           &dw2, dd2t.defined() ? dd2t.view() : TensorView{},
      tokens.view(), logits.view(), static_cast<int>(c.K)};
  expect_device_impl(dev->registry().markov_draft, args, dev);
  dev->registry().markov_draft.run(args, dev->kind());
  const Tensor got_tokens = dev->to_host(tokens.view());
  for (int64_t i = 0; i < c.B * c.n; ++i)
    ASSERT_EQ(got_tokens.data<const int32_t>()[i], want_tokens.data<const int32_t>()[i])
        << "token " << i << " of " << shape_str({c.B, c.K, c.n, c.V, c.Vd, c.R});
  // The Markov dots run in index order without FMA on both sides: the logits are bit-equal.
  const Tensor got_logits = dev->to_host_f32(logits.view());
  for (int64_t i = 0; i < got_logits.numel(); ++i)
    ASSERT_EQ(got_logits.data<const float>()[i], want_logits.data<const float>()[i]) << "logit " << i;
}

TEST(OpsOdd, RopePairs) {
  K3_REQUIRE_CUDA(dev);
  const RopeCase cases[] = {{3, 40, 5, 12, 3, 6, 17}, {1, 64, 0, 0, 1, 64, 4000}, {5, 33, 7, 13, 2, 10, 0}};
  for (Mode m : kModes)
    for (const RopeCase& c : cases) check_rope(dev, m, c, 700 + static_cast<uint64_t>(c.n * 13 + c.cols));
}

TEST(OpsTp8, RopePairsK3Draft) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes) {
    check_rope(dev, m, {7, 96 * 192, 128, 192, 96, 64, 8190}, 710);  // a block's q_pe, all 96 heads
    check_rope(dev, m, {300, 576, 512, 0, 1, 64, 1000}, 711);        // context latents' k_pe
  }
}

TEST(OpsOdd, MlaBlockAttention) {
  K3_REQUIRE_CUDA(dev);
  const BlockCase cases[] = {
      {3, 0, 2, 10, 6, 12, 40}, {5, 17, 3, 16, 8, 9, 33}, {1, 1, 1, 8, 0, 8, 16}, {7, 130, 4, 32, 64, 24, 512}};
  for (Mode m : kModes)
    for (const BlockCase& c : cases) check_block_attention(dev, m, c, 720 + static_cast<uint64_t>(c.T * 31 + c.P));
}

TEST(OpsTp8, MlaBlockAttentionK3Draft) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes) {
    check_block_attention(dev, m, {7, 2041, 96, 128, 64, 128, 512}, 730);  // the K3 draft's block over 2K
    check_block_attention(dev, m, {7, 4089, 12, 128, 64, 128, 512}, 731);  // the proxy draft's 12 heads over 4K
  }
}

TEST(OpsOdd, MarkovDraft) {
  K3_REQUIRE_CUDA(dev);
  check_markov(dev, {1, 1, 1, 5, 5, 3, false}, 740);
  check_markov(dev, {3, 7, 7, 300, 300, 17, false}, 741);
  check_markov(dev, {2, 5, 3, 1000, 257, 33, false}, 742);  // d2t: a reduced draft vocabulary
  check_markov(dev, {4, 4, 4, 600, 600, 8, true}, 743);     // ties: the lowest id wins
}

TEST(OpsTp8, MarkovDraftK3Draft) {
  K3_REQUIRE_CUDA(dev);
  check_markov(dev, {1, 7, 7, 163840, 163840, 256, false}, 750);
  check_markov(dev, {8, 7, 7, 20480, 20480, 256, false}, 751);  // the proxy draft at batch 8
}

}  // namespace
}  // namespace k3::ops_test
