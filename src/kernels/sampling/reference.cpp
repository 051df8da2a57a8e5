// kernels/sampling/reference.cpp: CPU reference of the `sample` op: runner::Sampler's steps 4-9
// (runner/sampler.cpp) for rows without logit_bias or penalties, the same expressions in the same
// order, so for the same uniform it picks the same token (up to the summation order of the top-k
// mass, which only moves a top-p cut when the target lies within ~1e-16 of a prefix mass).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/sampling/sampling.h"

namespace k3::kernels {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

int32_t f32_bits(float v) { return std::bit_cast<int32_t>(v); }
float bits_f32(int32_t v) { return std::bit_cast<float>(v); }

std::string row_field(int64_t r, const char* field) { return "params row " + std::to_string(r) + " " + field; }

// The host-side value check of one row (sampler.h's ranges; bias and penalties are not here).
core::Status check_row(const SampleRowParams& p, int64_t r, int64_t rows, int64_t V, int64_t N) {
  if (p.logits_row < 0 || p.logits_row >= rows)
    return core::Status::fail(row_field(r, "logits_row") + " = " + std::to_string(p.logits_row) +
                              " is outside the logits' rows [0, " + std::to_string(rows) + ")");
  if (!(std::isfinite(p.temperature) && p.temperature >= 0.0f))
    return core::Status::fail(row_field(r, "temperature") + " must be finite and >= 0, got " +
                              std::to_string(p.temperature));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    return core::Status::fail(row_field(r, "top_p") + " must be in (0, 1], got " + std::to_string(p.top_p));
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
    return core::Status::fail(row_field(r, "min_p") + " must be in [0, 1], got " + std::to_string(p.min_p));
  if (p.num_top < 0 || p.num_top > N || p.num_top > V)
    return core::Status::fail(row_field(r, "num_top") + " = " + std::to_string(p.num_top) +
                              " must be in [0, min(N = " + std::to_string(N) + ", V = " + std::to_string(V) + ")]");
  if (!(p.uniform >= 0.0 && p.uniform < 1.0))
    return core::Status::fail(row_field(r, "uniform") + " must be in [0, 1), got " + std::to_string(p.uniform));
  return core::Status::ok();
}

// The Sampler's "most likely first" total order: logit desc, id asc.
struct MoreLikely {
  const float* x;
  bool operator()(int32_t a, int32_t b) const { return x[a] > x[b] || (x[a] == x[b] && a < b); }
};

// Steps 6-9 for T > 0 over prob[] (exp((x - max) / T)): one draw with u. The kept set is a
// prefix of the MoreLikely order ending at `last`; the walk goes over ids ascending.
int32_t draw_row(const float* x, int64_t V, const SampleRowParams& p, const std::vector<float>& prob,
                 std::vector<int32_t>& order) {
  const double min_p = p.min_p;
  const int64_t top_k = (p.top_k <= 0 || p.top_k >= V) ? V : p.top_k;
  const bool filter_k = top_k < V, filter_p = p.top_p < 1.0f;
  if (!filter_k && !filter_p) {  // only min-p: Sampler::draw's id-order walk
    double total = 0.0;
    for (int64_t i = 0; i < V; ++i)
      if (prob[i] >= min_p) total += prob[i];
    double r = p.uniform * total;
    int32_t last = 0;
    for (int64_t i = 0; i < V; ++i) {
      const double q = prob[i];
      if (q == 0.0 || q < min_p) continue;
      last = static_cast<int32_t>(i);
      if ((r -= q) < 0.0) return last;
    }
    return last;
  }
  const MoreLikely more_likely{x};
  order.resize(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  int64_t n = V;
  double mass = 0.0;  // top-p's reference mass: what top-k left, summed in id order
  if (filter_k) {
    std::nth_element(order.begin(), order.begin() + (top_k - 1), order.end(), more_likely);
    n = top_k;
    std::sort(order.begin(), order.begin() + n);
  }
  for (int64_t j = 0; j < n; ++j) mass += prob[order[j]];
  const int64_t n_k = n;  // what top-k left (the eps bound below counts these)
  // Min-p losers form a tail of the order: drop them first (they never change a prefix sum).
  int64_t kept = 0;
  for (int64_t j = 0; j < n; ++j)
    if (prob[order[j]] >= min_p) order[kept++] = order[j];
  n = kept;  // >= 1: the most likely token has p = 1
  int32_t last;
  if (filter_p) {
    // Only tokens with p >= (1 - top_p) * mass / (2 n_k) can be in the prefix (sampler.cpp's
    // argument: together the others weigh at most half the mass top-p cuts off), which keeps the
    // sort short on peaked rows.
    const double target = static_cast<double>(p.top_p) * mass;
    const double eps = (1.0 - static_cast<double>(p.top_p)) * mass / (2.0 * static_cast<double>(n_k));
    int64_t m = 0;
    for (int64_t j = 0; j < n; ++j)
      if (prob[order[j]] >= eps) order[m++] = order[j];
    std::sort(order.begin(), order.begin() + m, more_likely);
    int64_t keep = m;
    double cum = 0.0;
    for (int64_t j = 0; j < m; ++j) {
      cum += prob[order[j]];
      if (cum >= target) {
        keep = j + 1;
        break;
      }
    }
    last = order[keep - 1];
  } else {
    last = order[0];
    for (int64_t j = 1; j < n; ++j)
      if (more_likely(last, order[j])) last = order[j];
  }
  double total = 0.0;
  for (int64_t i = 0; i < V; ++i)
    if (!more_likely(last, static_cast<int32_t>(i))) total += prob[i];
  double r = p.uniform * total;
  int32_t pick = last;
  for (int64_t i = 0; i < V; ++i) {
    const double q = prob[i];
    if (q == 0.0 || more_likely(last, static_cast<int32_t>(i))) continue;
    pick = static_cast<int32_t>(i);
    if ((r -= q) < 0.0) return pick;
  }
  return pick;  // rounding left r >= 0: the last kept token with nonzero mass
}

}  // namespace

core::Status sample_check(const SampleArgs& a) {
  if (a.logits.dtype != core::DType::f32 || a.logits.rank() != 2 || a.logits.strides[1] != 1)
    return core::Status::fail("logits must be an f32 [rows, V] tensor with contiguous rows, got " +
                              std::string(core::dtype_name(a.logits.dtype)) + " " + a.logits.shape.str());
  const int64_t rows = a.logits.dim(0), V = a.logits.dim(1);
  if (V < 1 || V > kMaxSampleVocab)
    return core::Status::fail("logits width V = " + std::to_string(V) + " must be in [1, " +
                              std::to_string(kMaxSampleVocab) + "]");
  if (a.params.dtype != core::DType::i32 || a.params.rank() != 2 || a.params.dim(1) != kSampleParamCols ||
      !a.params.is_contiguous())
    return core::Status::fail("params must be a contiguous i32 [R, " + std::to_string(kSampleParamCols) +
                              "] tensor, got " + std::string(core::dtype_name(a.params.dtype)) + " " +
                              a.params.shape.str());
  const int64_t R = a.params.dim(0);
  if (a.out.dtype != core::DType::f32 || a.out.rank() != 2 || a.out.dim(0) != R || !a.out.is_contiguous() ||
      a.out.dim(1) < 2 || a.out.dim(1) % 2 != 0 || a.out.dim(1) > 2 + 2 * kMaxTopLogprobs)
    return core::Status::fail("out must be a contiguous f32 [R, 2 + 2N] tensor with R = " + std::to_string(R) +
                              " and N in [0, " + std::to_string(kMaxTopLogprobs) + "], got " +
                              std::string(core::dtype_name(a.out.dtype)) + " " + a.out.shape.str());
  if (a.params.device != a.logits.device || a.out.device != a.logits.device)
    return core::Status::fail(
        "logits, params and out must live on one device, got " + std::string(core::device_name(a.logits.device)) +
        ", " + std::string(core::device_name(a.params.device)) + ", " + std::string(core::device_name(a.out.device)));
  if (a.params.device == core::Device::cpu) {
    const int64_t N = (a.out.dim(1) - 2) / 2;
    for (int64_t r = 0; r < R; ++r) {
      core::Status s = check_row(unpack_sample_params(a.params.as<const int32_t>() + r * kSampleParamCols), r, rows, V,
                                 N);
      if (!s) return s;
    }
  }
  return core::Status::ok();
}

void sample_reference(const SampleArgs& a) {
  const int64_t V = a.logits.dim(1), R = a.params.dim(0), N = (a.out.dim(1) - 2) / 2;
  std::vector<float> prob;
  std::vector<int32_t> order;
  for (int64_t r = 0; r < R; ++r) {
    const SampleRowParams p = unpack_sample_params(a.params.as<const int32_t>() + r * kSampleParamCols);
    const float* x = a.logits.as<const float>() + p.logits_row * a.logits.strides[0];
    float* out = a.out.as<float>() + r * a.out.dim(1);
    out[kOutToken] = -1.0f;
    out[kOutLogprob] = kNaN;
    for (int64_t j = 0; j < N; ++j) out[kOutTopIds + j] = -1.0f, out[out_top_logprobs_col(N) + j] = kNaN;

    bool bad = false;  // NaN or +inf: the host Sampler throws; here the row says -1
    int32_t argmax = 0;
    float max_logit = x[0];
    for (int64_t i = 0; i < V; ++i) {
      bad = bad || !(x[i] < kInf);
      if (x[i] > max_logit) max_logit = x[i], argmax = static_cast<int32_t>(i);
    }
    if (bad || !(max_logit > -kInf)) continue;

    const bool greedy = p.temperature == 0.0f;
    if (!greedy) {
      const double inv_t = 1.0 / static_cast<double>(p.temperature);
      prob.resize(static_cast<size_t>(V));
      for (int64_t i = 0; i < V; ++i)
        prob[i] = std::exp(static_cast<float>(std::max(static_cast<double>(x[i] - max_logit) * inv_t, -150.0)));
    }
    const bool want_logprobs = p.want_logprob || p.num_top > 0;
    double log_z = 0.0;
    if (want_logprobs) {
      double z = 0.0;
      if (p.temperature == 1.0f) {
        for (int64_t i = 0; i < V; ++i) z += prob[i];
      } else {
        for (int64_t i = 0; i < V; ++i) z += std::exp(x[i] - max_logit);
      }
      log_z = std::log(z);
    }
    auto logprob = [&](int32_t id) { return static_cast<float>(static_cast<double>(x[id]) - max_logit - log_z); };
    const int32_t token = greedy ? argmax : draw_row(x, V, p, prob, order);
    out[kOutToken] = static_cast<float>(token);
    if (want_logprobs) out[kOutLogprob] = logprob(token);
    if (p.num_top > 0) {  // the Sampler's one-pass sorted array of the n best
      const size_t n = static_cast<size_t>(p.num_top);
      std::array<int32_t, kMaxTopLogprobs> best{};
      size_t count = 0;
      for (int64_t i = 0; i < V; ++i) {
        if (count == n && !(x[i] > x[best[n - 1]])) continue;
        size_t pos = std::min(count, n - 1);
        while (pos > 0 && x[i] > x[best[pos - 1]]) {
          best[pos] = best[pos - 1];
          --pos;
        }
        best[pos] = static_cast<int32_t>(i);
        count = std::min(count + 1, n);
      }
      for (size_t j = 0; j < n; ++j) {
        out[kOutTopIds + j] = static_cast<float>(best[j]);
        out[out_top_logprobs_col(N) + static_cast<int64_t>(j)] = logprob(best[j]);
      }
    }
  }
}

core::Tensor pack_sample_params(std::span<const SampleRowParams> rows) {
  core::Tensor t = core::Tensor::zeros(core::DType::i32, {static_cast<int64_t>(rows.size()), kSampleParamCols});
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleRowParams& p = rows[r];
    const double scaled = p.uniform * 0x1.0p53;  // exact for a multiple of 2^-53
    K3_CHECK(p.uniform >= 0.0 && p.uniform < 1.0 && scaled == std::floor(scaled),
             row_field(static_cast<int64_t>(r), "uniform") + " must be a multiple of 2^-53 in [0, 1) " +
                 "(core::Rng::uniform()), got " + std::to_string(p.uniform));
    const uint64_t n = static_cast<uint64_t>(scaled);
    int32_t* o = t.data<int32_t>() + r * kSampleParamCols;
    o[kParamLogitsRow] = p.logits_row;
    o[kParamTemperature] = f32_bits(p.temperature);
    o[kParamTopP] = f32_bits(p.top_p);
    o[kParamMinP] = f32_bits(p.min_p);
    o[kParamTopK] = p.top_k;
    o[kParamNumTop] = p.num_top;
    o[kParamWantLogprob] = p.want_logprob ? 1 : 0;
    o[kParamUniformLo] = static_cast<int32_t>(static_cast<uint32_t>(n & 0xffffffffu));
    o[kParamUniformHi] = static_cast<int32_t>(static_cast<uint32_t>(n >> 32));
  }
  return t;
}

SampleRowParams unpack_sample_params(const int32_t* o) {
  SampleRowParams p;
  p.logits_row = o[kParamLogitsRow];
  p.temperature = bits_f32(o[kParamTemperature]);
  p.top_p = bits_f32(o[kParamTopP]);
  p.min_p = bits_f32(o[kParamMinP]);
  p.top_k = o[kParamTopK];
  p.num_top = o[kParamNumTop];
  p.want_logprob = o[kParamWantLogprob] != 0;
  const uint64_t n = static_cast<uint64_t>(static_cast<uint32_t>(o[kParamUniformLo])) |
                     (static_cast<uint64_t>(static_cast<uint32_t>(o[kParamUniformHi])) << 32);
  p.uniform = static_cast<double>(n) * 0x1.0p-53;
  return p;
}

core::Status token_mask_check(const TokenMaskArgs& a) {
  if (a.logits.dtype != core::DType::f32 || a.logits.rank() != 2 || a.logits.strides[1] != 1)
    return core::Status::fail("logits must be an f32 [rows, V] tensor with contiguous rows, got " +
                              std::string(core::dtype_name(a.logits.dtype)) + " " + a.logits.shape.str());
  const int64_t V = a.logits.dim(1), words = (V + 31) / 32;
  if (a.masks.dtype != core::DType::i32 || a.masks.rank() != 2 || a.masks.dim(1) != words || !a.masks.is_contiguous())
    return core::Status::fail("masks must be a contiguous i32 [R, " + std::to_string(words) + "] tensor, got " +
                              std::string(core::dtype_name(a.masks.dtype)) + " " + a.masks.shape.str());
  if (a.rows.dtype != core::DType::i32 || a.rows.rank() != 1 || a.rows.dim(0) != a.masks.dim(0) ||
      !a.rows.is_contiguous())
    return core::Status::fail("rows must be a contiguous i32 [R] tensor with R = " + std::to_string(a.masks.dim(0)) +
                              ", got " + std::string(core::dtype_name(a.rows.dtype)) + " " + a.rows.shape.str());
  if (a.masks.device != a.logits.device || a.rows.device != a.logits.device)
    return core::Status::fail("logits, masks and rows must live on one device");
  if (a.rows.device == core::Device::cpu) {
    std::vector<bool> seen(static_cast<size_t>(a.logits.dim(0)), false);
    for (int64_t r = 0; r < a.rows.dim(0); ++r) {
      const int32_t row = a.rows.as<const int32_t>()[r];
      if (row < 0 || row >= a.logits.dim(0) || seen[static_cast<size_t>(row)])
        return core::Status::fail("rows[" + std::to_string(r) + "] = " + std::to_string(row) +
                                  " is outside the logits or repeats an earlier row");
      seen[static_cast<size_t>(row)] = true;
    }
  }
  return core::Status::ok();
}

void token_mask_reference(const TokenMaskArgs& a) {
  const int64_t V = a.logits.dim(1), words = a.masks.dim(1);
  for (int64_t r = 0; r < a.rows.dim(0); ++r) {
    float* x = a.logits.as<float>() + a.rows.as<const int32_t>()[r] * a.logits.strides[0];
    const auto* m = reinterpret_cast<const uint32_t*>(a.masks.as<const int32_t>() + r * words);
    for (int64_t t = 0; t < V; ++t)
      if (!(m[t >> 5] >> (t & 31) & 1)) x[t] = -std::numeric_limits<float>::infinity();
  }
}

}  // namespace k3::kernels
