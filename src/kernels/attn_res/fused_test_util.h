// kernels/attn_res/fused_test_util.h: test helpers of the fused AttnRes ops: random bank
// rows and mix weights, the standard and fused forms of a sublayer tail and of the whole AttnRes
// stream (both through a registry), and the tolerance tally of the merged softmax.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/rng.h"
#include "kernels/registry.h"

namespace k3::kernels::attn_res_fused_test {

using core::DType;
using core::Tensor;
using core::TensorView;

inline constexpr float kEps = 1e-5f;

inline Tensor nan_f32(core::Shape shape) {
  Tensor t = Tensor::zeros(DType::f32, shape);
  for (float& v : t.span<float>()) v = std::numeric_limits<float>::quiet_NaN();
  return t;
}
inline Tensor copy_of(const Tensor& t) { return Tensor::copy_of(t.view()); }

// n activations [T, D] with bf16 values (as stored between ops); row j has std scale * (j + 1) / 2,
// so normalised and un-normalised sources differ a lot.
inline std::vector<Tensor> random_rows(core::Rng& rng, int n, int64_t T, int64_t D, double scale = 1.0) {
  std::vector<Tensor> rows;
  for (int j = 0; j < n; ++j) {
    Tensor r = Tensor::zeros(DType::f32, {T, D});
    for (float& v : r.span<float>()) v = core::bf16_round(static_cast<float>(rng.normal() * scale * 0.5 * (j + 1)));
    rows.push_back(r);
  }
  return rows;
}

inline void fill(Tensor& t, core::Rng& rng, double mean, double std) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float x = static_cast<float>(mean + std * rng.normal());
    if (t.dtype() == DType::bf16) t.data<uint16_t>()[i] = core::f32_to_bf16_bits(x);
    else t.data<float>()[i] = x;
  }
}

// A Mix's weights: query [1, D] (res_proj.weight) scaled so scores are O(3) (a softmax far from
// uniform, spec §14.3), norm [D] = 1 + N(0, 0.1^2).
struct MixWeights {
  Tensor query, norm;
};
inline MixWeights random_mix(core::Rng& rng, int64_t D, DType dt) {
  MixWeights w{Tensor::zeros(dt, {1, D}), Tensor::zeros(dt, {D})};
  fill(w.query, rng, 0.0, 3.0 / std::sqrt(static_cast<double>(D)));
  fill(w.norm, rng, 1.0, 0.1);
  return w;
}
inline Tensor random_norm_weight(core::Rng& rng, int64_t D) {
  Tensor w = Tensor::zeros(DType::bf16, {D});
  fill(w, rng, 1.0, 0.1);
  return w;
}

inline void run_bank(const Registry& r, const std::vector<Tensor>& bank, const std::vector<const MixWeights*>& mixes,
                     Tensor& acc, Tensor& stats, Precision p) {
  std::vector<TensorView> rows, q, n;
  for (const Tensor& b : bank) rows.push_back(b.view());
  for (const MixWeights* m : mixes) q.push_back(m->query.view()), n.push_back(m->norm.view());
  r.attn_res_bank.run({rows, q, n, acc.view(), stats.view(), kEps, p}, core::Device::cpu);
}
inline void run_bank(const Registry& r, const std::vector<Tensor>& bank, const std::vector<MixWeights>& mixes,
                     Tensor& acc, Tensor& stats, Precision p) {
  std::vector<const MixWeights*> ptrs;
  for (const MixWeights& m : mixes) ptrs.push_back(&m);
  run_bank(r, bank, ptrs, acc, stats, p);
}

// Slice [T, D] of an [M, T, D] tensor (and [T, 2] of stats).
inline TensorView slice(const Tensor& t, int64_t m) {
  const int64_t T = t.dim(1), W = t.dim(2);
  return TensorView::contiguous(t.data<float>() + m * T * W, DType::f32, {T, W});
}

// ---------------------------------------------------------------- one sublayer tail

struct Standard {
  Tensor prefix, mixed, normed;
};
// add (or the restart copy) -> attn_res_mix over bank ++ [P] (h = P with no bank) -> rmsnorm,
// exactly as model/model.cpp layer_forward and model/layers/attn_res.cpp call them.
inline Standard run_standard(const Registry& r, const std::vector<Tensor>& bank, const Tensor& p_old, const Tensor* a,
                             bool restart, const MixWeights& w, const Tensor& norm_w, RmsNormStyle style, Precision p) {
  const int64_t T = p_old.dim(0), D = p_old.dim(1);
  Standard s;
  if (a == nullptr) {
    s.prefix = copy_of(p_old);
  } else if (restart) {
    s.prefix = copy_of(*a);
  } else {
    s.prefix = nan_f32({T, D});
    r.add.run({p_old.view(), a->view(), s.prefix.view(), p}, core::Device::cpu);
  }
  if (bank.empty()) {
    s.mixed = copy_of(s.prefix);
  } else {
    std::vector<TensorView> src;
    for (const Tensor& b : bank) src.push_back(b.view());
    src.push_back(s.prefix.view());
    s.mixed = nan_f32({T, D});
    const TensorView q = TensorView::contiguous(w.query.view().data, w.query.dtype(), {D});
    r.attn_res_mix.run({src, q, w.norm.view(), s.mixed.view(), kEps, p}, core::Device::cpu);
  }
  s.normed = nan_f32({T, D});
  r.rmsnorm.run({s.mixed.view(), norm_w.view(), s.normed.view(), kEps, style, p}, core::Device::cpu);
  return s;
}

// attn_res_merge with this mix's bank part (acc[m], stats[m], or none for an empty bank).
// `alias`: P_new is written over a copy of P_old in place (or over a copy of a on a restart).
inline Standard run_merge(const Registry& r, const Tensor* acc, const Tensor* stats, int m, const Tensor& p_old,
                          const Tensor* a, bool restart, const MixWeights& w, const Tensor& norm_w, RmsNormStyle style,
                          Precision p, bool alias, bool with_h = true) {
  const int64_t T = p_old.dim(0), D = p_old.dim(1);
  Standard f;
  Tensor prefix_in = copy_of(p_old), a_in = a ? copy_of(*a) : Tensor();
  AttnResMergeArgs args{};
  args.prefix = prefix_in.view();
  if (a) args.sublayer_out = a_in.view();
  args.restart = restart;
  if (acc) {
    args.bank_acc = slice(*acc, m);
    args.bank_stats = slice(*stats, m);
  }
  args.query = w.query.view();
  args.norm = w.norm.view();
  args.rmsnorm_weight = norm_w.view();
  if (alias) {
    f.prefix = a && restart ? a_in : prefix_in;
    args.prefix_out = f.prefix.view();
  } else if (a) {
    f.prefix = nan_f32({T, D});
    args.prefix_out = f.prefix.view();
  } else {
    f.prefix = prefix_in;  // no sublayer output: P_new = P_old, prefix_out may be absent
  }
  if (with_h) {
    f.mixed = nan_f32({T, D});
    args.mixed_out = f.mixed.view();
  }
  f.normed = nan_f32({T, D});
  args.normed_out = f.normed.view();
  args.mix_eps = kEps;
  args.rmsnorm_eps = kEps;
  args.rmsnorm_style = style;
  args.precision = p;
  r.attn_res_merge.run(args, core::Device::cpu);
  return f;
}

using Fused = Standard;
// The fused form of one tail: attn_res_bank over `mixes` (the one used is mixes[m]), then merge.
inline Fused run_fused(const Registry& r, const std::vector<Tensor>& bank, const std::vector<MixWeights>& mixes, int m,
                       const Tensor& p_old, const Tensor* a, bool restart, const MixWeights& w, const Tensor& norm_w,
                       RmsNormStyle style, Precision p, bool alias) {
  const int64_t T = p_old.dim(0), D = p_old.dim(1), M = static_cast<int64_t>(mixes.size());
  if (bank.empty()) return run_merge(r, nullptr, nullptr, 0, p_old, a, restart, w, norm_w, style, p, alias);
  Tensor acc = nan_f32({M, T, D}), stats = nan_f32({M, T, 2});
  run_bank(r, bank, mixes, acc, stats, p);
  return run_merge(r, &acc, &stats, m, p_old, a, restart, w, norm_w, style, p, alias);
}

inline void expect_bits_equal(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const float* g = got.data<float>();
  const float* w = want.data<float>();
  int64_t diff = 0;
  for (int64_t i = 0; i < want.numel(); ++i) diff += std::memcmp(&g[i], &w[i], sizeof(float)) != 0;
  EXPECT_EQ(diff, 0) << what << ": " << diff << " of " << want.numel() << " values differ (expected bit for bit)";
}

// ---------------------------------------------------------------- the whole AttnRes stream

// The sublayer tails of `layers` layers (block size 12: bank writes at l = 0, 12, 24, ...) and the
// final Mix, in order: mix 2l is layer l's attention side, 2l + 1 its FFN side, 2L the final.
struct StreamResult {
  std::vector<Tensor> prefix, mixed, normed;  // per mix: P_new, h, x (h undefined where skipped)
  int bank_calls = 0;
};
inline StreamResult run_stream(const Registry& r, int layers, int64_t T, int64_t D, Precision p, bool fused) {
  constexpr int kBlock = 12;
  core::Rng rng(static_cast<uint64_t>(layers * 31 + T * 7 + D));
  const int mixes = 2 * layers + 1;
  std::vector<MixWeights> w;
  std::vector<Tensor> norm_w, sub;  // sub[i]: the sublayer output added before mix i (none for i = 0)
  for (int i = 0; i < mixes; ++i) {
    w.push_back(random_mix(rng, D, DType::bf16));
    norm_w.push_back(random_norm_weight(rng, D));
    sub.push_back(random_rows(rng, 1, T, D, 2.0)[0]);
  }
  const Tensor embed = random_rows(rng, 1, T, D, 2.0)[0];
  const auto is_write = [&](int i) { return i % 2 == 1 && (i / 2) % kBlock == 0; };  // FFN side of a write layer
  // Bank rows seen by mix i: the writes at attention sides of layers l' % 12 == 0 before it.
  const auto bank_size = [&](int i) {
    int n = 0;
    for (int l = 0; l < layers; l += kBlock) n += 2 * l < i;
    return n;
  };
  StreamResult out;
  std::vector<Tensor> bank;
  Tensor prefix = copy_of(embed);
  Tensor acc, stats;  // fused: the bank part of every mix of the current bank
  std::vector<int> slot(static_cast<size_t>(mixes), -1);
  int acc_bank = -1;
  for (int i = 0; i < mixes; ++i) {
    const Tensor* a = i == 0 ? nullptr : &sub[static_cast<size_t>(i)];
    const bool restart = is_write(i);
    if (restart) bank.push_back(copy_of(prefix));  // snapshot the block sum before the restart
    const int n = bank_size(i);
    EXPECT_EQ(n, static_cast<int>(bank.size())) << "mix " << i;
    Standard s;
    if (!fused) {
      s = run_standard(r, bank, prefix, a, restart, w[static_cast<size_t>(i)], norm_w[static_cast<size_t>(i)],
                       RmsNormStyle::moonshot, p);
    } else {
      if (n > 0 && acc_bank != n) {  // a new bank: one attn_res_bank for every mix that sees it
        std::vector<const MixWeights*> group;
        for (int k = i; k < mixes && bank_size(k) == n; ++k) {
          slot[static_cast<size_t>(k)] = static_cast<int>(group.size());
          group.push_back(&w[static_cast<size_t>(k)]);
        }
        const auto M = static_cast<int64_t>(group.size());
        acc = nan_f32({M, T, D});
        stats = nan_f32({M, T, 2});
        run_bank(r, bank, group, acc, stats, p);
        acc_bank = n;
        ++out.bank_calls;
      }
      s = run_merge(r, n > 0 ? &acc : nullptr, n > 0 ? &stats : nullptr, slot[static_cast<size_t>(i)], prefix, a,
                    restart, w[static_cast<size_t>(i)], norm_w[static_cast<size_t>(i)], RmsNormStyle::moonshot, p,
                    /*alias=*/i % 2 == 0, /*with_h=*/i % 3 != 2);
    }
    prefix = s.prefix;
    out.prefix.push_back(s.prefix);
    out.mixed.push_back(s.mixed);
    out.normed.push_back(s.normed);
  }
  return out;
}

// ---------------------------------------------------------------- the merged softmax's tolerance

// fp32: max |got - want| <= 1e-6 * max |want| per tensor (the merged softmax differs from the
// standard Mix by a few fp32 ulps). bf16: elements that differ are counted; each may be at most
// 1 bf16 ulp off for h and 2 for x (x inherits h's flips through x_hat and inv_rms) -- except
// where h is a near-cancellation (|h| << the row's scale), where the fp32 bound 2e-6 * max |want|
// applies instead (a few fp32 ulps of the O(1) terms are many bf16 ulps of a 1e-6 result) -- and
// at most 1% of the elements may differ.
struct MergeTally {
  double worst_fp32 = 0;
  int64_t bf16_total = 0, bf16_diff = 0;
  double worst_bf16_ulps = 0;
  int64_t bad = 0;

  static double bf16_ulp(float v) {
    int e = 0;
    std::frexp(v == 0.0f ? 1e-30f : v, &e);  // v = f * 2^e, f in [0.5, 1): 8 significant bits
    return std::ldexp(1.0, e - 8);
  }
  void add(const Tensor& got, const Tensor& want, Precision p, const char* what) {
    if (!got.defined() || !want.defined()) return;
    ASSERT_EQ(got.numel(), want.numel());
    const float* g = got.data<float>();
    const float* w = want.data<float>();
    double max_ref = 0, max_err = 0;
    for (int64_t i = 0; i < want.numel(); ++i) max_ref = std::max(max_ref, static_cast<double>(std::abs(w[i])));
    for (int64_t i = 0; i < want.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(g[i])) << what << "[" << i << "] not written (NaN poison left)";
      const double d = std::abs(static_cast<double>(g[i]) - w[i]);
      max_err = std::max(max_err, d);
      if (p == Precision::bf16) {
        ++bf16_total;
        if (d == 0) continue;
        ++bf16_diff;
        const double ulps = d / std::min(bf16_ulp(w[i]), bf16_ulp(g[i]));
        worst_bf16_ulps = std::max(worst_bf16_ulps, ulps);
        const double allowed = std::string(what) == "h" ? 1.0 : 2.0;
        if (ulps > allowed && d > 2e-6 * max_ref) {
          ++bad;
          ADD_FAILURE() << what << "[" << i << "] = " << g[i] << ", standard " << w[i] << ": " << ulps << " bf16 ulps";
        }
      }
    }
    if (p == Precision::fp32) {
      const double rel = max_ref > 0 ? max_err / max_ref : max_err;
      worst_fp32 = std::max(worst_fp32, rel);
      EXPECT_LE(rel, 1e-6) << what << ": max |got - want| / max |want| = " << rel;
    }
  }
  void expect_within_contract() const {
    if (bf16_total > 0) {
      EXPECT_LE(static_cast<double>(bf16_diff), 0.01 * static_cast<double>(bf16_total))
          << bf16_diff << " of " << bf16_total << " bf16 values differ from the standard path";
    }
  }
  std::string summary() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "fp32 worst max-err/max-ref %.3g; bf16 %lld of %lld values differ (worst %.3g ulp)",
                  worst_fp32, static_cast<long long>(bf16_diff), static_cast<long long>(bf16_total), worst_bf16_ulps);
    return buf;
  }
};

}  // namespace k3::kernels::attn_res_fused_test
