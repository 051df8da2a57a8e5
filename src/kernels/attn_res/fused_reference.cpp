// kernels/attn_res/fused_reference.cpp: CPU reference and argument checks of attn_res_bank and
// attn_res_merge (the fused AttnRes stream of fastpath/; contract in attn_res_fused.h).
//
// Every sum is fp32 and sequential in the order attn_res_mix_reference, add_reference and
// rmsnorm_reference use, so the bank scores, the prefix update and the final norm round exactly
// where (and as) the standard ops round; only the merged softmax differs (by fp32 rounding).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kernels/attn_res/attn_res_fused.h"

namespace k3::kernels {

namespace {

std::string describe(const core::TensorView& v) {
  if (v.data == nullptr && v.rank() == 0) return "absent";
  return std::string(core::dtype_name(v.dtype)) + " " + v.shape.str();
}
bool absent(const core::TensorView& v) { return v.data == nullptr && v.rank() == 0; }

// Rows that do not overlap: a row stride of at least the row width (any stride for one row).
bool rows_apart(const core::TensorView& v, int64_t T, int64_t W) { return T <= 1 || v.strides[0] >= W; }
// An activation [T, D] with unit inner stride (rows may be strided, never overlapping).
bool is_act_rows(const core::TensorView& v, int64_t T, int64_t D) {
  return is_activation_dtype(v) && v.rank() == 2 && v.dim(0) == T && v.dim(1) == D && (D <= 1 || v.strides[1] == 1) &&
         rows_apart(v, T, D);
}
// An f32 [T, W] matrix with unit inner stride (bank partials, stats).
bool is_f32_rows(const core::TensorView& v, int64_t T, int64_t W) {
  return v.dtype == core::DType::f32 && v.rank() == 2 && v.dim(0) == T && v.dim(1) == W &&
         (W <= 1 || v.strides[1] == 1) && rows_apart(v, T, W);
}
// A weight vector of D entries, bf16/f32, stored [D] or [1, D] (res_proj.weight is [1, D]).
bool is_weight_vector(const core::TensorView& v, int64_t D, bool allow_row) {
  const bool dtype_ok = v.dtype == core::DType::bf16 || v.dtype == core::DType::f32;
  const bool shape_ok = (v.rank() == 1 && v.dim(0) == D) ||
                        (allow_row && v.rank() == 2 && v.dim(0) == 1 && v.dim(1) == D);
  return v.data != nullptr && dtype_ok && shape_ok && v.is_contiguous();
}

// The byte range a rank-2 (or contiguous) view spans, for overlap checks.
std::pair<const char*, const char*> byte_span(const core::TensorView& v) {
  const auto* p = static_cast<const char*>(v.data);
  if (v.numel() == 0) return {p, p};
  const int64_t last = v.rank() == 2 ? (v.dim(0) - 1) * v.strides[0] + (v.dim(1) - 1) * v.strides[1] + 1 : v.numel();
  return {p, p + last * static_cast<int64_t>(core::dtype_size(v.dtype))};
}
bool overlap(const core::TensorView& a, const core::TensorView& b) {
  if (absent(a) || absent(b)) return false;
  const auto [a0, a1] = byte_span(a);
  const auto [b0, b1] = byte_span(b);
  return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1;
}
bool same_view(const core::TensorView& a, const core::TensorView& b) {
  return a.data == b.data && a.dtype == b.dtype && a.shape == b.shape && a.strides == b.strides;
}

std::string td_str(int64_t T, int64_t D) { return core::Shape{T, D}.str(); }

// c = norm * query in fp32 (spec §3.1: fp32 c), as attn_res_mix_reference folds it.
std::vector<float> score_weight(const core::TensorView& query, const core::TensorView& norm, int64_t D) {
  std::vector<float> c(static_cast<size_t>(D));
  for (int64_t h = 0; h < D; ++h) c[h] = load_f32(norm, h) * load_f32(query, h);
  return c;
}

// s = rho * sum(r * c), rho = 1 / sqrt(mean(r^2) + eps): the attn_res_mix_reference loop.
float source_score(const float* r, const float* c, int64_t D, float eps) {
  float sum_sq = 0.0f, dot = 0.0f;
  for (int64_t h = 0; h < D; ++h) {
    sum_sq += r[h] * r[h];
    dot += r[h] * c[h];
  }
  const float rho = 1.0f / std::sqrt(sum_sq / static_cast<float>(D) + eps);
  return rho * dot;
}

}  // namespace

core::Status attn_res_bank_check(const AttnResBankArgs& a) {
  const size_t n = a.bank.size(), M = a.queries.size();
  if (n < 1 || n > static_cast<size_t>(kAttnResFusedMaxBankRows))
    return core::Status::fail("bank must hold 1.." + std::to_string(kAttnResFusedMaxBankRows) + " rows, got " +
                              std::to_string(n));
  if (M < 1 || M > static_cast<size_t>(kAttnResFusedMaxMixes))
    return core::Status::fail("queries must hold 1.." + std::to_string(kAttnResFusedMaxMixes) + " mixes, got " +
                              std::to_string(M));
  if (a.norms.size() != M)
    return core::Status::fail("norms holds " + std::to_string(a.norms.size()) + " views but queries holds " +
                              std::to_string(M) + ": one norm per mix");
  const core::TensorView& first = a.bank[0];
  if (!is_activation_dtype(first) || first.rank() != 2 || (first.dim(1) > 1 && first.strides[1] != 1))
    return core::Status::fail("bank[0] must be f32 (or bf16 on CUDA) [T, D] with contiguous rows, got " +
                              describe(first));
  const int64_t T = first.dim(0), D = first.dim(1);
  if (D < 1) return core::Status::fail("bank rows must have D >= 1 columns, got " + describe(first));
  for (size_t j = 1; j < n; ++j)
    if (!is_act_rows(a.bank[j], T, D) || a.bank[j].dtype != first.dtype)
      return core::Status::fail("bank[" + std::to_string(j) + "] must be " +
                                std::string(core::dtype_name(first.dtype)) + " " + td_str(T, D) +
                                " like bank[0], got " + describe(a.bank[j]));
  for (size_t m = 0; m < M; ++m) {
    if (!is_weight_vector(a.queries[m], D, true))
      return core::Status::fail("queries[" + std::to_string(m) + "] must be bf16/f32 [" + std::to_string(D) +
                                "] or [1, " + std::to_string(D) + "], got " + describe(a.queries[m]));
    if (!is_weight_vector(a.norms[m], D, false))
      return core::Status::fail("norms[" + std::to_string(m) + "] must be bf16/f32 [" + std::to_string(D) + "], got " +
                                describe(a.norms[m]));
  }
  const auto Ms = static_cast<int64_t>(M);
  if (a.acc.dtype != core::DType::f32 || a.acc.rank() != 3 || !(a.acc.shape == core::Shape{Ms, T, D}) ||
      !a.acc.is_contiguous() || (a.acc.numel() > 0 && a.acc.data == nullptr))
    return core::Status::fail("acc must be contiguous f32 " + core::Shape{Ms, T, D}.str() +
                              " (f32 on every device), got " + describe(a.acc));
  if (a.stats.dtype != core::DType::f32 || a.stats.rank() != 3 || !(a.stats.shape == core::Shape{Ms, T, 2}) ||
      !a.stats.is_contiguous() || (a.stats.numel() > 0 && a.stats.data == nullptr))
    return core::Status::fail("stats must be contiguous f32 " + core::Shape{Ms, T, 2}.str() + ", got " +
                              describe(a.stats));
  if (a.acc.device != first.device || a.stats.device != first.device)
    return core::Status::fail("acc and stats must be on the bank's device");
  for (size_t j = 0; j < n; ++j)
    if (overlap(a.acc, a.bank[j]) || overlap(a.stats, a.bank[j]))
      return core::Status::fail("acc/stats overlap bank[" + std::to_string(j) + "]: outputs must not alias inputs");
  if (overlap(a.acc, a.stats)) return core::Status::fail("acc and stats overlap");
  if (!(a.eps >= 0.0f)) return core::Status::fail("eps must be >= 0, got " + std::to_string(a.eps));
  return core::Status::ok();
}

void attn_res_bank_reference(const AttnResBankArgs& a, backends::cpu::ThreadPool* pool) {
  const int64_t T = a.bank[0].dim(0), D = a.bank[0].dim(1);
  const size_t n = a.bank.size(), M = a.queries.size();
  std::vector<std::vector<float>> c(M);
  for (size_t m = 0; m < M; ++m) c[m] = score_weight(a.queries[m], a.norms[m], D);
  float* acc_all = a.acc.as<float>();
  float* stats_all = a.stats.as<float>();
  // One task per (mix, token): the same loops as attn_res_mix_reference over the bank rows.
  const auto run = [&](int64_t i0, int64_t i1) {
    std::vector<const float*> rows(n);
    std::vector<float> e(n);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t m = i / std::max<int64_t>(T, 1), t = i % std::max<int64_t>(T, 1);
      for (size_t j = 0; j < n; ++j) rows[j] = a.bank[j].as<const float>() + t * a.bank[j].strides[0];
      for (size_t j = 0; j < n; ++j) e[j] = source_score(rows[j], c[static_cast<size_t>(m)].data(), D, a.eps);
      const float max_score = *std::max_element(e.begin(), e.end());
      float sum = 0.0f;
      for (size_t j = 0; j < n; ++j) {
        e[j] = std::exp(e[j] - max_score);
        sum += e[j];
      }
      float* acc = acc_all + (m * T + t) * D;
      for (int64_t h = 0; h < D; ++h) {
        float v = e[0] * rows[0][h];
        for (size_t j = 1; j < n; ++j) v += e[j] * rows[j][h];
        acc[h] = v;
      }
      stats_all[(m * T + t) * 2 + 0] = max_score;
      stats_all[(m * T + t) * 2 + 1] = sum;
    }
  };
  const int64_t tasks = static_cast<int64_t>(M) * T;
  const int64_t work = std::max<int64_t>(1, static_cast<int64_t>(n) * D);
  backends::cpu::parallel_for(pool, tasks, run, std::max<int64_t>(1, (int64_t{1} << 15) / work));
}

core::Status attn_res_merge_check(const AttnResMergeArgs& a) {
  const core::TensorView& p = a.prefix;
  if (!is_activation_dtype(p) || p.rank() != 2 || (p.dim(1) > 1 && p.strides[1] != 1) ||
      (p.numel() > 0 && p.data == nullptr))
    return core::Status::fail("prefix must be f32 (or bf16 on CUDA) [T, D] with contiguous rows, got " + describe(p));
  const int64_t T = p.dim(0), D = p.dim(1);
  if (D < 1) return core::Status::fail("prefix must have D >= 1 columns, got " + describe(p));
  const std::string act = std::string(core::dtype_name(p.dtype)) + " " + td_str(T, D);
  const auto act_ok = [&](const core::TensorView& v) {
    return is_act_rows(v, T, D) && v.dtype == p.dtype && v.device == p.device && (v.numel() == 0 || v.data != nullptr);
  };
  const bool has_a = !absent(a.sublayer_out);
  if (has_a && !act_ok(a.sublayer_out))
    return core::Status::fail("sublayer_out must be absent or " + act + " like prefix, got " +
                              describe(a.sublayer_out));
  if (a.restart && !has_a) return core::Status::fail("restart needs sublayer_out (P_new = a), but it is absent");
  const bool has_bank = !absent(a.bank_acc);
  if (has_bank != !absent(a.bank_stats))
    return core::Status::fail("bank_acc is " + describe(a.bank_acc) + " but bank_stats is " + describe(a.bank_stats) +
                              ": both present (a bank) or both absent (an empty bank)");
  if (has_bank) {
    if (!is_f32_rows(a.bank_acc, T, D) || a.bank_acc.device != p.device || (T > 0 && a.bank_acc.data == nullptr))
      return core::Status::fail("bank_acc must be f32 " + td_str(T, D) + " (attn_res_bank's acc[m]), got " +
                                describe(a.bank_acc));
    if (!is_f32_rows(a.bank_stats, T, 2) || a.bank_stats.device != p.device || (T > 0 && a.bank_stats.data == nullptr))
      return core::Status::fail("bank_stats must be f32 " + td_str(T, 2) + " (attn_res_bank's stats[m]), got " +
                                describe(a.bank_stats));
  }
  if (!is_weight_vector(a.query, D, true))
    return core::Status::fail("query must be bf16/f32 [" + std::to_string(D) + "] or [1, " + std::to_string(D) +
                              "], got " + describe(a.query));
  if (!is_weight_vector(a.norm, D, false))
    return core::Status::fail("norm must be bf16/f32 [" + std::to_string(D) + "], got " + describe(a.norm));
  if (!is_weight_vector(a.rmsnorm_weight, D, false))
    return core::Status::fail("rmsnorm_weight must be bf16/f32 [" + std::to_string(D) + "], got " +
                              describe(a.rmsnorm_weight));
  const bool has_p_out = !absent(a.prefix_out), has_h = !absent(a.mixed_out);
  if (has_a && !has_p_out)
    return core::Status::fail("prefix_out is absent but sublayer_out is given: P_new must be stored");
  if (has_p_out && !act_ok(a.prefix_out))
    return core::Status::fail("prefix_out must be " + act + " like prefix, got " + describe(a.prefix_out));
  if (has_h && !act_ok(a.mixed_out))
    return core::Status::fail("mixed_out must be absent or " + act + " like prefix, got " + describe(a.mixed_out));
  if (!act_ok(a.normed_out))
    return core::Status::fail("normed_out must be " + act + " like prefix, got " + describe(a.normed_out));
  // Aliasing: prefix_out may be exactly prefix or sublayer_out; nothing else may overlap.
  const core::TensorView* inputs[] = {&a.prefix, &a.sublayer_out, &a.bank_acc, &a.bank_stats};
  const char* input_names[] = {"prefix", "sublayer_out", "bank_acc", "bank_stats"};
  for (int i = 0; i < 4; ++i) {
    const bool may_alias = i < 2 && same_view(a.prefix_out, *inputs[i]);
    if (has_p_out && !may_alias && overlap(a.prefix_out, *inputs[i]))
      return core::Status::fail(std::string("prefix_out overlaps ") + input_names[i] +
                                " (it may only be the very same view as prefix or sublayer_out)");
    if (overlap(a.mixed_out, *inputs[i]))
      return core::Status::fail(std::string("mixed_out overlaps ") + input_names[i]);
    if (overlap(a.normed_out, *inputs[i]))
      return core::Status::fail(std::string("normed_out overlaps ") + input_names[i]);
  }
  if (overlap(a.prefix_out, a.mixed_out) || overlap(a.prefix_out, a.normed_out) || overlap(a.mixed_out, a.normed_out))
    return core::Status::fail("prefix_out, mixed_out and normed_out must not overlap each other");
  if (!(a.mix_eps >= 0.0f)) return core::Status::fail("mix_eps must be >= 0, got " + std::to_string(a.mix_eps));
  if (!(a.rmsnorm_eps >= 0.0f))
    return core::Status::fail("rmsnorm_eps must be >= 0, got " + std::to_string(a.rmsnorm_eps));
  return core::Status::ok();
}

void attn_res_merge_reference(const AttnResMergeArgs& a, backends::cpu::ThreadPool* pool) {
  const int64_t T = a.prefix.dim(0), D = a.prefix.dim(1);
  const std::vector<float> c = score_weight(a.query, a.norm, D);
  std::vector<float> w(static_cast<size_t>(D));
  for (int64_t i = 0; i < D; ++i) w[i] = load_f32(a.rmsnorm_weight, i);
  const bool has_a = !absent(a.sublayer_out), has_bank = !absent(a.bank_acc), has_p_out = !absent(a.prefix_out);
  const bool has_h = !absent(a.mixed_out), moonshot = a.rmsnorm_style == RmsNormStyle::moonshot;
  const auto run = [&](int64_t t0, int64_t t1) {
    std::vector<float> p_new(static_cast<size_t>(D)), hv(static_cast<size_t>(D));
    for (int64_t t = t0; t < t1; ++t) {
      // P_new: the standard add (round(P + a)), the restart copy, or P itself. Each element of
      // prefix / sublayer_out is read before prefix_out (which may be either) is written.
      const float* p_old = a.prefix.as<const float>() + t * a.prefix.strides[0];
      const float* sub = has_a ? a.sublayer_out.as<const float>() + t * a.sublayer_out.strides[0] : nullptr;
      for (int64_t h = 0; h < D; ++h)
        p_new[h] = !has_a ? p_old[h] : a.restart ? sub[h] : round_act(p_old[h] + sub[h], a.precision);
      if (has_p_out) {
        float* out = a.prefix_out.as<float>() + t * a.prefix_out.strides[0];
        std::copy(p_new.begin(), p_new.end(), out);
      }
      // h: the merged softmax over (bank partials, prefix), or the prefix itself without a bank.
      if (!has_bank) {
        hv = p_new;
      } else {
        const float s_p = source_score(p_new.data(), c.data(), D, a.mix_eps);
        const float* st = a.bank_stats.as<const float>() + t * a.bank_stats.strides[0];
        const float max_b = st[0], sum_b = st[1];
        const float m = std::max(max_b, s_p);
        const float scale_b = std::exp(max_b - m), scale_p = std::exp(s_p - m);
        const float denom = scale_b * sum_b + scale_p;
        const float* acc = a.bank_acc.as<const float>() + t * a.bank_acc.strides[0];
        for (int64_t h = 0; h < D; ++h) hv[h] = round_act((scale_b * acc[h] + scale_p * p_new[h]) / denom, a.precision);
      }
      if (has_h) {
        float* out = a.mixed_out.as<float>() + t * a.mixed_out.strides[0];
        std::copy(hv.begin(), hv.end(), out);
      }
      // x = RMSNorm(h): the rmsnorm_reference loop.
      float sum_sq = 0.0f;
      for (int64_t h = 0; h < D; ++h) sum_sq += hv[h] * hv[h];
      const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(D) + a.rmsnorm_eps);
      float* x = a.normed_out.as<float>() + t * a.normed_out.strides[0];
      for (int64_t h = 0; h < D; ++h) {
        float x_hat = hv[h] * inv_rms;
        if (moonshot) x_hat = round_act(x_hat, a.precision);
        x[h] = round_act(w[h] * x_hat, a.precision);
      }
    }
  };
  backends::cpu::parallel_for(pool, T, run, std::max<int64_t>(1, 4096 / D));
}

}  // namespace k3::kernels
