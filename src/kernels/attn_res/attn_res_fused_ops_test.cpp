// kernels/attn_res/attn_res_fused_ops_test.cpp: the fused AttnRes ops of fastpath/ (attn_res_bank,
// attn_res_merge) on every device backend against the CPU reference, both modes, random odd
// shapes and one TP8 rank's real shapes (hidden 7168, 9 bank rows, 24 mixes, T 1..64); the two
// CUDA forms of the merge (cluster form for T <= 32, one CTA per row beyond), each case naming the
// form that must run, the cluster form's run-to-run determinism and its agreement with the
// one-CTA form; plus the device chain bank -> merge against the standard CPU path add ->
// attn_res_mix -> rmsnorm.
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/attn_res/cases.h"
#include "kernels/testing/op_harness.h"

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
  return TensorView::contiguous(static_cast<char*>(t.view().data) + m * T * W * 4, DType::f32, {T, W}, t.view().device);
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
  // kernels/attn_res/cases.h: odd widths (the scalar path) and 136 = 17 * 8 (the vector path).
  uint64_t seed = 2000;
  for (Mode m : kModes)
    for (int64_t T : kernels::kAttnResOddRows)
      for (const kernels::AttnResShape& s : kernels::kAttnResOddShapes)
        check_bank(dev, m, T, s.D, s.bank_rows, s.mixes, ++seed);
}
TEST(OpsTp8, AttnResBank) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : kernels::kAttnResK3Rows)
      check_bank(dev, m, T, kernels::kAttnResK3.D, kernels::kAttnResK3.bank_rows, kernels::kAttnResK3.mixes, 2300 + T);
}

// ---------------------------------------------------------------- attn_res_merge

struct MergeCase {
  int64_t T, D;
  int n;         // bank rows (0: no bank part)
  bool with_a;   // a sublayer output to add
  bool restart;  // P_new = a
  bool alias;    // P_new written in place (over P_old, or over a on a restart)
  bool with_h;   // mixed_out requested
  kernels::RmsNormStyle style;
  const char* impl = nullptr;  // the CUDA strategy the registry must select (nullptr: any cuda_*)
};

// The CUDA strategies of attn_res_merge (kernels/attn_res/cuda*.cu).
constexpr const char* kCluster = "cuda_merge_cluster";  // T <= 32 rows, 2..8 CTAs per row
constexpr const char* kRowwise = "cuda_merge_rowwise";  // one CTA per row

const kernels::OpImpl<kernels::AttnResMergeArgs>& merge_impl(Device* dev, const std::string& name) {
  for (const auto& impl : dev->registry().attn_res_merge.impls())
    if (impl.name == name && impl.device == dev->kind()) return impl;
  throw std::runtime_error("attn_res_merge has no implementation named " + name);
}

// merge on `dev` (nullptr: CPU) from host P_old, a and this mix's bank part (host f32, uploaded).
struct MergeOut {
  Tensor prefix, mixed, normed;
};
// `force_impl`: run that device strategy directly (it must support the args) instead of the
// registry's choice.
MergeOut run_merge(Device* dev, Mode mode, const MergeCase& c, const Tensor& p_old, const Tensor& a,
                   const BankOut* bank, int m, const Mix& mix, const Tensor& norm_w, const char* force_impl = nullptr) {
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
  const std::string shape = shape_str({c.T, c.D, c.n});
  if (dev && force_impl) {
    const auto& impl = merge_impl(dev, force_impl);
    const core::Status checked = kernels::attn_res_merge_check(args), supported = impl.supports(args);
    EXPECT_TRUE(checked) << shape << ": " << checked.reason();
    EXPECT_TRUE(supported) << force_impl << " " << shape << ": " << supported.reason();
    if (checked && supported) impl.run(args);
  } else if (dev) {
    expect_device_impl(dev->registry().attn_res_merge, args, dev);
    if (c.impl) {
      EXPECT_EQ(dev->registry().attn_res_merge.select(args, dev->kind()).name, c.impl) << shape;
    }
    dev->registry().attn_res_merge.run(args, dev->kind());
  } else {
    cpu_registry().attn_res_merge.run(args, core::Device::cpu);
  }
  if (dev) {
    o.prefix = dev->to_host_f32(o.prefix.view());
    if (c.with_h) o.mixed = dev->to_host_f32(o.mixed.view());
    o.normed = dev->to_host_f32(o.normed.view());
  }
  return o;
}

// The inputs of one merge case: bank partials (the CPU's, fed to both sides), P_old, a, mix 1.
struct MergeInputs {
  BankOut part;
  Tensor p_old, a, norm_w;
  std::vector<Mix> mixes;
  const BankOut* bank() const { return part.acc.defined() ? &part : nullptr; }  // n = 0: none
};
MergeInputs merge_inputs(Mode mode, const MergeCase& c, uint64_t seed) {
  core::Rng rng(seed);
  const std::vector<Tensor> bank = random_bank(rng, mode, c.n, c.T, c.D);
  MergeInputs in;
  in.p_old = random_act(rng, {c.T, c.D}, mode, 0.0, 1.0);
  in.a = random_act(rng, {c.T, c.D}, mode, 0.0, 1.5);
  for (int m = 0; m < 2; ++m) in.mixes.push_back(random_mix(rng, c.D, DType::bf16));
  in.norm_w = random_norm_weight(rng, c.D);
  if (c.n > 0) in.part = run_bank(nullptr, mode, bank, in.mixes);
  return in;
}

// The merge kernel alone: both sides get the same bank partials (the CPU's, uploaded as f32).
void check_merge(Device* dev, Mode mode, const MergeCase& c, uint64_t seed) {
  const MergeInputs in = merge_inputs(mode, c, seed);
  const MergeOut want = run_merge(nullptr, mode, c, in.p_old, in.a, in.bank(), 1, in.mixes[1], in.norm_w);
  const MergeOut got = run_merge(dev, mode, c, in.p_old, in.a, in.bank(), 1, in.mixes[1], in.norm_w);
  const std::string shape = shape_str({c.T, c.D, c.n});
  const std::string tag = std::string(c.with_a ? (c.restart ? "restart" : "add") : "no_a") +
                          (c.alias ? "_inplace" : "");
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
    for (int64_t T : kernels::kAttnResOddRows)
      for (int64_t D : kernels::kAttnResMergeOddWidths)
        for (int n : kernels::kAttnResMergeBankRows) {
          const bool restart = i % 3 == 1, alias = i % 2 == 1, with_h = i % 5 != 4;
          const RmsNormStyle style = i % 4 == 3 ? RmsNormStyle::fused : RmsNormStyle::moonshot;
          check_merge(dev, m, {T, D, n, true, restart, alias, with_h, style}, 3000 + i);
          ++i;
        }
  for (Mode m : kModes)  // no sublayer output: layer 0's attention side, the final Mix
    for (int n : {0, 9})
      check_merge(dev, m, {17, 136, n, false, false, n == 9, true, RmsNormStyle::moonshot}, 3900 + n);
}
TEST(OpsTp8, AttnResMerge) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : kernels::kAttnResK3Rows)
      for (bool restart : {false, true})
        check_merge(dev, m,
                    {T, kernels::kAttnResK3.D, kernels::kAttnResK3.bank_rows, true, restart, !restart, true,
                     kernels::RmsNormStyle::moonshot},
                    4000 + T + restart);
}

// ---------------------------------------------------------------- attn_res_merge: the two CUDA forms

// Every case names the strategy that must be selected, so a silent fallback to the one-CTA form
// (or a cluster form that grabbed a shape it should refuse) fails. Cluster shapes (S CTAs per row,
// V_cta N-vectors per CTA): D = 97 scalar, 97 vectors -> S = 4 (25, 25, 25, 22 vectors: a short
// last CTA); D = 1000, 16-byte vectors, 125 -> S = 4 (32, 32, 32, 29); D = 2047 scalar -> S = 8
// (256 threads, the most per CTA; the last owns 255); D = 7168 (TP8) -> S = 8 (112 of 128 threads).
TEST(OpsOdd, AttnResMergeClusterForm) {
  K3_REQUIRE_CUDA(dev);
  using kernels::RmsNormStyle;
  int i = 0;
  for (Mode m : kModes)
    for (int64_t T : {1, 2, 7, 16, 32})
      for (int64_t D : {97, 1000})
        for (int n : {0, 1, 9}) {
          const bool restart = i % 3 == 1, alias = i % 2 == 1, with_h = i % 5 != 4;
          const RmsNormStyle style = i % 4 == 3 ? RmsNormStyle::fused : RmsNormStyle::moonshot;
          check_merge(dev, m, {T, D, n, true, restart, alias, with_h, style, kCluster}, 6000 + i);
          ++i;
        }
  for (Mode m : kModes) {
    // No sublayer output (layer 0's attention side, the final Mix), with and without a bank.
    for (int n : {0, 9})
      check_merge(dev, m, {7, 1000, n, false, false, n == 9, true, RmsNormStyle::moonshot, kCluster}, 6900 + n);
    check_merge(dev, m, {2, 2047, 9, true, false, true, true, RmsNormStyle::moonshot, kCluster}, 6910);
    // Outside the cluster form: 33 rows; 17 vectors (too narrow to split); 2049 scalar columns
    // (257 per CTA: more than one per thread).
    check_merge(dev, m, {33, 1000, 9, true, false, true, true, RmsNormStyle::moonshot, kRowwise}, 6920);
    check_merge(dev, m, {7, 136, 9, true, true, false, true, RmsNormStyle::moonshot, kRowwise}, 6921);
    check_merge(dev, m, {2, 2049, 9, true, false, true, true, RmsNormStyle::fused, kRowwise}, 6922);
  }
}
TEST(OpsTp8, AttnResMergeClusterForm) {
  K3_REQUIRE_CUDA(dev);
  using kernels::RmsNormStyle;
  for (Mode m : kModes) {
    for (int64_t T : {1, 2, 7, 16, 32})
      for (bool restart : {false, true})
        check_merge(dev, m, {T, 7168, 9, true, restart, !restart, true, RmsNormStyle::moonshot, kCluster},
                    7000 + 2 * T + restart);
    check_merge(dev, m, {1, 7168, 0, true, false, true, false, RmsNormStyle::moonshot, kCluster}, 7100);   // empty bank
    check_merge(dev, m, {1, 7168, 1, false, false, false, true, RmsNormStyle::moonshot, kCluster}, 7101);  // no a
    check_merge(dev, m, {33, 7168, 9, true, false, true, true, RmsNormStyle::moonshot, kRowwise}, 7102);
  }
}

bool same_bits(const Tensor& x, const Tensor& y) {
  return x.numel() == y.numel() && std::memcmp(x.view().data, y.view().data, static_cast<size_t>(x.numel()) * 4) == 0;
}

// Same inputs through both forms, the cluster form twice: the cluster form repeats itself bit for
// bit (every sum in a fixed order, the ranks' partials added in rank order); P_new equals the
// one-CTA form's bit for bit, h and x up to the order of the row sums (fp32 noise; in bf16 a
// rounding flip here and there).
void check_cluster_vs_rowwise(Device* dev, Mode mode, int64_t T, int64_t D, uint64_t seed) {
  const MergeCase c{T, D, 9, true, false, false, true, kernels::RmsNormStyle::moonshot};
  const MergeInputs in = merge_inputs(mode, c, seed);
  const auto run = [&](const char* impl) {
    return run_merge(dev, mode, c, in.p_old, in.a, in.bank(), 1, in.mixes[1], in.norm_w, impl);
  };
  const MergeOut first = run(kCluster), second = run(kCluster), rowwise = run(kRowwise);
  const std::string shape = shape_str({T, D, c.n});
  EXPECT_TRUE(same_bits(first.prefix, second.prefix)) << "P_new differs between two cluster runs " << shape;
  EXPECT_TRUE(same_bits(first.mixed, second.mixed)) << "h differs between two cluster runs " << shape;
  EXPECT_TRUE(same_bits(first.normed, second.normed)) << "x differs between two cluster runs " << shape;
  const Tol close = mode == Mode::fp32 ? Tol{2e-5, 1 - 1e-9} : tol_reduction(mode);
  expect_close("attn_res_merge_cluster_vs_rowwise", shape, mode, "prefix", first.prefix, rowwise.prefix,
               Tol{0.0, 1.0 - 1e-12});
  expect_close("attn_res_merge_cluster_vs_rowwise", shape, mode, "h", first.mixed, rowwise.mixed, close);
  expect_close("attn_res_merge_cluster_vs_rowwise", shape, mode, "x", first.normed, rowwise.normed, close);
}

TEST(OpsTp8, AttnResMergeClusterIsDeterministicAndMatchesTheRowwiseForm) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes) {
    for (int64_t T : {1, 16}) check_cluster_vs_rowwise(dev, m, T, 7168, 7200 + T);
    check_cluster_vs_rowwise(dev, m, 7, 97, 7300);  // scalar path, short last CTA
  }
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
