// tests/ops/attn_res_fused_ops_test.cpp: the fused AttnRes ops of fastpath/ (attn_res_bank,
// attn_res_merge) on every device backend against the CPU reference, both modes, random odd
// shapes and one TP8 rank's real shapes (hidden 7168, 9 bank rows, 24 mixes, T 1..64); plus the
// device chain bank -> merge against the standard CPU path add -> attn_res_mix -> rmsnorm.
#include <cmath>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "tests/ops/op_harness.h"

namespace k3::ops_test {
namespace {

constexpr float kEps = 1e-5f;

struct Mix {
  Tensor query, norm;  // bf16/f32 [1, D], [D]
};

// Pseudo-queries scaled so the depth softmax is far from uniform (scores O(3), spec §14.3).
Mix random_mix(core::Rng& rng, int64_t D, DType dt) {
  Mix m{Tensor::zeros(dt, {1, D}), Tensor::zeros(dt, {D})};
  const double q_std = 3.0 / std::sqrt(static_cast<double>(D));
  for (int64_t h = 0; h < D; ++h) {
    const float q = static_cast<float>(rng.normal(0.0, q_std)), n = static_cast<float>(rng.normal(1.0, 0.1));
    if (dt == DType::bf16) {
      m.query.data<uint16_t>()[h] = core::f32_to_bf16_bits(q);
      m.norm.data<uint16_t>()[h] = core::f32_to_bf16_bits(n);
    } else {
      m.query.data<float>()[h] = q;
      m.norm.data<float>()[h] = n;
    }
  }
  return m;
}
Tensor random_norm_weight(core::Rng& rng, int64_t D) {
  Tensor w = Tensor::zeros(DType::bf16, {D});
  for (uint16_t& b : w.span<uint16_t>()) b = core::f32_to_bf16_bits(static_cast<float>(rng.normal(1.0, 0.1)));
  return w;
}
// n bank rows [T, D] (row j with std 0.5 + j: normalised and raw rows differ), as activations.
std::vector<Tensor> random_bank(core::Rng& rng, Mode mode, int n, int64_t T, int64_t D) {
  std::vector<Tensor> rows;
  for (int j = 0; j < n; ++j) rows.push_back(random_act(rng, {T, D}, mode, 0.0, 0.5 + j));
  return rows;
}
// Row block m of an [M, T, W] tensor as a [T, W] view.
TensorView slice(const Tensor& t, int64_t m) {
  const int64_t T = t.dim(1), W = t.dim(2);
  return TensorView::contiguous(static_cast<char*>(t.view().data) + m * T * W * 4, DType::f32, {T, W},
                                t.view().device);
}

struct BankOut {
  Tensor acc, stats;  // f32 [M, T, D], [M, T, 2]
};
// attn_res_bank on `dev` (nullptr: the CPU reference) over host bank rows and mixes.
BankOut run_bank(Device* dev, Mode mode, const std::vector<Tensor>& bank, const std::vector<Mix>& mixes) {
  const int64_t T = bank[0].dim(0), D = bank[0].dim(1), M = static_cast<int64_t>(mixes.size());
  std::vector<Tensor> rows, q, n;
  for (const Tensor& b : bank) rows.push_back(dev ? dev->act(b, mode) : b);
  for (const Mix& m : mixes) {
    q.push_back(dev ? dev->upload(m.query) : m.query);
    n.push_back(dev ? dev->upload(m.norm) : m.norm);
  }
  std::vector<TensorView> rv, qv, nv;
  for (const Tensor& t : rows) rv.push_back(t.view());
  for (size_t m = 0; m < mixes.size(); ++m) qv.push_back(q[m].view()), nv.push_back(n[m].view());
  BankOut out{dev ? dev->poisoned(DType::f32, {M, T, D}) : nan_tensor({M, T, D}),
              dev ? dev->poisoned(DType::f32, {M, T, 2}) : nan_tensor({M, T, 2})};
  const kernels::AttnResBankArgs args{rv, qv, nv, out.acc.view(), out.stats.view(), kEps, precision(mode)};
  if (dev) {
    expect_device_impl(dev->registry().attn_res_bank, args, dev);
    dev->registry().attn_res_bank.run(args, dev->kind());
  } else {
    cpu_registry().attn_res_bank.run(args, core::Device::cpu);
  }
  return out;
}

void check_bank(Device* dev, Mode mode, int64_t T, int64_t D, int n, int M, uint64_t seed) {
  core::Rng rng(seed);
  const std::vector<Tensor> bank = random_bank(rng, mode, n, T, D);
  std::vector<Mix> mixes;
  for (int m = 0; m < M; ++m) mixes.push_back(random_mix(rng, D, m == 1 ? DType::f32 : DType::bf16));
  const BankOut want = run_bank(nullptr, mode, bank, mixes);
  const BankOut got = run_bank(dev, mode, bank, mixes);
  // Nothing is rounded in this op (acc and stats are fp32 partials): fp32 tolerances in both modes.
  const std::string shape = shape_str({T, D, n, M});
  expect_close("attn_res_bank", shape, mode, "acc", dev->to_host_f32(got.acc.view()), want.acc,
               tol_reduction(Mode::fp32));
  expect_close("attn_res_bank", shape, mode, "stats", dev->to_host_f32(got.stats.view()), want.stats,
               tol_reduction(Mode::fp32));
}

TEST(OpsOdd, AttnResBank) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 17, 54, 97}) {
      check_bank(dev, m, T, 97, 1, 1, 2000 + T);  // scalar path (odd width)
      check_bank(dev, m, T, 54, 3, 5, 2100 + T);
      check_bank(dev, m, T, 136, 9, 3, 2200 + T);  // vector path (136 = 17 * 8)
    }
}
TEST(OpsTp8, AttnResBank) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 8, 64}) check_bank(dev, m, T, 7168, 9, 24, 2300 + T);
}

// ---------------------------------------------------------------- attn_res_merge

struct MergeCase {
  int64_t T, D;
  int n;              // bank rows (0: no bank part)
  bool with_a;        // a sublayer output to add
  bool restart;       // P_new = a
  bool alias;         // P_new written in place (over P_old, or over a on a restart)
  bool with_h;        // mixed_out requested
  kernels::RmsNormStyle style;
};

// merge on `dev` (nullptr: CPU) from host P_old, a and this mix's bank part (host f32, uploaded).
struct MergeOut {
  Tensor prefix, mixed, normed;
};
MergeOut run_merge(Device* dev, Mode mode, const MergeCase& c, const Tensor& p_old, const Tensor& a,
                   const BankOut* bank, int m, const Mix& mix, const Tensor& norm_w) {
  const auto act = [&](const Tensor& t) { return dev ? dev->act(t, mode) : copy(t); };
  const auto up = [&](const Tensor& t) { return dev ? dev->upload(t) : t; };
  const auto out = [&]() { return dev ? dev->poisoned(act_dtype(mode), {c.T, c.D}) : nan_tensor({c.T, c.D}); };
  Tensor dp = act(p_old), da = c.with_a ? act(a) : Tensor(), dq = up(mix.query), dn = up(mix.norm), dw = up(norm_w);
  Tensor acc, stats;
  kernels::AttnResMergeArgs args{};
  args.prefix = dp.view();
  if (c.with_a) args.sublayer_out = da.view();
  args.restart = c.restart;
  if (bank) {
    acc = up(bank->acc);
    stats = up(bank->stats);
    args.bank_acc = slice(acc, m);
    args.bank_stats = slice(stats, m);
  }
  args.query = dq.view();
  args.norm = dn.view();
  args.rmsnorm_weight = dw.view();
  MergeOut o;
  o.prefix = c.alias ? (c.with_a && c.restart ? da : dp) : c.with_a ? out() : dp;
  if (c.with_a || c.alias) args.prefix_out = o.prefix.view();
  if (c.with_h) {
    o.mixed = out();
    args.mixed_out = o.mixed.view();
  }
  o.normed = out();
  args.normed_out = o.normed.view();
  args.mix_eps = kEps;
  args.rmsnorm_eps = kEps;
  args.rmsnorm_style = c.style;
  args.precision = precision(mode);
  if (dev) {
    expect_device_impl(dev->registry().attn_res_merge, args, dev);
    dev->registry().attn_res_merge.run(args, dev->kind());
    o.prefix = dev->to_host_f32(o.prefix.view());
    if (c.with_h) o.mixed = dev->to_host_f32(o.mixed.view());
    o.normed = dev->to_host_f32(o.normed.view());
  } else {
    cpu_registry().attn_res_merge.run(args, core::Device::cpu);
  }
  return o;
}

// The merge kernel alone: both sides get the same bank partials (the CPU's, uploaded as f32).
void check_merge(Device* dev, Mode mode, const MergeCase& c, uint64_t seed) {
  core::Rng rng(seed);
  const std::vector<Tensor> bank = random_bank(rng, mode, c.n, c.T, c.D);
  const Tensor p_old = random_act(rng, {c.T, c.D}, mode, 0.0, 1.0), a = random_act(rng, {c.T, c.D}, mode, 0.0, 1.5);
  std::vector<Mix> mixes;
  for (int m = 0; m < 2; ++m) mixes.push_back(random_mix(rng, c.D, DType::bf16));
  const Tensor norm_w = random_norm_weight(rng, c.D);
  BankOut part;
  if (c.n > 0) part = run_bank(nullptr, mode, bank, mixes);
  const BankOut* bp = c.n > 0 ? &part : nullptr;
  const MergeOut want = run_merge(nullptr, mode, c, p_old, a, bp, 1, mixes[1], norm_w);
  const MergeOut got = run_merge(dev, mode, c, p_old, a, bp, 1, mixes[1], norm_w);
  const std::string shape = shape_str({c.T, c.D, c.n});
  const std::string tag = std::string(c.with_a ? (c.restart ? "restart" : "add") : "no_a") + (c.alias ? "_inplace" : "");
  // P_new is one IEEE add (or a copy) of the same values: exact on every backend.
  expect_close("attn_res_merge", shape, mode, "prefix_" + tag, got.prefix, want.prefix, Tol{0.0, 1.0 - 1e-12});
  if (c.with_h) expect_close("attn_res_merge", shape, mode, "h_" + tag, got.mixed, want.mixed, tol_reduction(mode));
  expect_close("attn_res_merge", shape, mode, "x_" + tag, got.normed, want.normed, tol_reduction(mode));
}

TEST(OpsOdd, AttnResMerge) {
  K3_REQUIRE_CUDA(dev);
  using kernels::RmsNormStyle;
  int i = 0;
  for (Mode m : kModes)
    for (int64_t T : {1, 17, 54, 97})
      for (int64_t D : {97, 54, 136})
        for (int n : {0, 1, 3, 9}) {
          const bool restart = i % 3 == 1, alias = i % 2 == 1, with_h = i % 5 != 4;
          const RmsNormStyle style = i % 4 == 3 ? RmsNormStyle::fused : RmsNormStyle::moonshot;
          check_merge(dev, m, {T, D, n, true, restart, alias, with_h, style}, 3000 + i);
          ++i;
        }
  for (Mode m : kModes)  // no sublayer output: layer 0's attention side, the final Mix
    for (int n : {0, 9}) check_merge(dev, m, {17, 136, n, false, false, n == 9, true, RmsNormStyle::moonshot}, 3900 + n);
}
TEST(OpsTp8, AttnResMerge) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 8, 64})
      for (bool restart : {false, true})
        check_merge(dev, m, {T, 7168, 9, true, restart, !restart, true, kernels::RmsNormStyle::moonshot},
                    4000 + T + restart);
}

// ---------------------------------------------------------------- the device chain vs the standard path

// attn_res_bank (24 mixes) then attn_res_merge for mix 13, all on the device, against the CPU's
// standard ops: add -> attn_res_mix over bank ++ [P_new] -> rmsnorm.
void check_chain(Device* dev, Mode mode, int64_t T, uint64_t seed) {
  constexpr int64_t D = 7168;
  constexpr int n = 9, M = 24, m = 13;
  core::Rng rng(seed);
  const std::vector<Tensor> bank = random_bank(rng, mode, n, T, D);
  const Tensor p_old = random_act(rng, {T, D}, mode, 0.0, 1.0), a = random_act(rng, {T, D}, mode, 0.0, 1.5);
  std::vector<Mix> mixes;
  for (int k = 0; k < M; ++k) mixes.push_back(random_mix(rng, D, DType::bf16));
  const Tensor norm_w = random_norm_weight(rng, D);
  const Precision p = precision(mode);
  // Standard CPU path.
  Tensor p_new = nan_tensor({T, D}), h = nan_tensor({T, D}), x = nan_tensor({T, D});
  cpu_registry().add.run({p_old.view(), a.view(), p_new.view(), p}, core::Device::cpu);
  std::vector<TensorView> src;
  for (const Tensor& b : bank) src.push_back(b.view());
  src.push_back(p_new.view());
  const TensorView q = TensorView::contiguous(mixes[m].query.view().data, DType::bf16, {D});
  cpu_registry().attn_res_mix.run({src, q, mixes[m].norm.view(), h.view(), kEps, p}, core::Device::cpu);
  cpu_registry().rmsnorm.run({h.view(), norm_w.view(), x.view(), kEps, kernels::RmsNormStyle::moonshot, p},
                             core::Device::cpu);
  // Device: bank once for all 24 mixes, then this mix's merge.
  const BankOut dbank = run_bank(dev, mode, bank, mixes);
  const Tensor d_acc_host = dev->to_host_f32(dbank.acc.view()), d_stats_host = dev->to_host_f32(dbank.stats.view());
  const BankOut host_part{d_acc_host, d_stats_host};  // re-uploaded by run_merge
  const MergeCase c{T, D, n, true, false, true, true, kernels::RmsNormStyle::moonshot};
  const MergeOut got = run_merge(dev, mode, c, p_old, a, &host_part, m, mixes[m], norm_w);
  const std::string shape = shape_str({T, D, n, M});
  expect_close("attn_res_fused_chain", shape, mode, "prefix", got.prefix, p_new, Tol{0.0, 1.0 - 1e-12});
  expect_close("attn_res_fused_chain", shape, mode, "h", got.mixed, h, tol_reduction(mode));
  expect_close("attn_res_fused_chain", shape, mode, "x", got.normed, x, tol_reduction(mode));
}

TEST(OpsTp8, AttnResFusedChainEqualsTheStandardPath) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 64}) check_chain(dev, m, T, 5000 + T);
}

}  // namespace
}  // namespace k3::ops_test
