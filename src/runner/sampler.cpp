// runner/sampler.cpp: Sampler — parameter validation, logit processing, logprobs and the
// filtered draw. The processing order is documented in sampler.h.
#include "runner/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>

#include "core/error.h"

namespace k3::runner {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The largest value of x (the first on ties: the lowest id) and whether any value is NaN or +inf,
// in one pass of 8 independent lanes, which the compiler turns into vector max/compare (greedy
// sampling at K3's 163840 ids is this pass; a scalar first-max loop does not vectorise).
struct Scan {
  float max = -std::numeric_limits<float>::infinity();
  int32_t argmax = 0;
  bool not_finite = false;  // a NaN or +inf (-inf is a legal "masked" logit)
};
Scan scan(std::span<const float> x) {
  constexpr size_t kLanes = 8;
  const float inf = std::numeric_limits<float>::infinity();
  float lane[kLanes];
  bool bad[kLanes] = {};
  std::fill(std::begin(lane), std::end(lane), -inf);
  size_t i = 0;
  for (; i + kLanes <= x.size(); i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) {
      const float v = x[i + j];
      bad[j] |= !(v < inf);
      lane[j] = v > lane[j] ? v : lane[j];
    }
  Scan r;
  for (; i < x.size(); ++i) {
    r.not_finite |= !(x[i] < inf);
    r.max = x[i] > r.max ? x[i] : r.max;
  }
  for (size_t j = 0; j < kLanes; ++j) {
    r.not_finite |= bad[j];
    r.max = lane[j] > r.max ? lane[j] : r.max;
  }
  for (size_t k = 0; k < x.size(); ++k)
    if (x[k] == r.max) {
      r.argmax = static_cast<int32_t>(k);
      break;
    }
  return r;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// "ids[i] = id" must be a token of the vocabulary.
void check_ids(std::span<const int32_t> ids, const char* what, int32_t vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i)
    K3_CHECK(ids[i] >= 0 && ids[i] < vocab_size,
             std::string("sample: ") + what + "[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                 " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
}

}  // namespace

void validate(const SamplingParams& p, int32_t vocab_size) {
  K3_CHECK(vocab_size > 0, "vocab_size must be > 0, got " + std::to_string(vocab_size));
  // Every comparison below is false for NaN, so NaN is rejected with the parameter's name.
  K3_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f,
           "temperature must be a finite number >= 0 (0 = greedy), got " + num(p.temperature));
  K3_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1] (1 = off), got " + num(p.top_p));
  K3_CHECK(p.top_k >= -1, "top_k must be 0 or -1 (off) or >= 1, got " + std::to_string(p.top_k));
  K3_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p must be in [0, 1] (0 = off), got " + num(p.min_p));
  K3_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
           "repetition_penalty must be a finite number > 0 (1 = off), got " + num(p.repetition_penalty));
  K3_CHECK(p.presence_penalty >= -kMaxOpenAIPenalty && p.presence_penalty <= kMaxOpenAIPenalty,
           "presence_penalty must be in [-2, 2] (0 = off), got " + num(p.presence_penalty));
  K3_CHECK(p.frequency_penalty >= -kMaxOpenAIPenalty && p.frequency_penalty <= kMaxOpenAIPenalty,
           "frequency_penalty must be in [-2, 2] (0 = off), got " + num(p.frequency_penalty));
  K3_CHECK(p.logprobs >= 0 && p.logprobs <= kMaxLogprobs,
           "logprobs must be in [0, " + std::to_string(kMaxLogprobs) + "], got " + std::to_string(p.logprobs));
  K3_CHECK(p.logprobs <= vocab_size, "logprobs (" + std::to_string(p.logprobs) + ") must not exceed vocab_size (" +
                                         std::to_string(vocab_size) + ")");
  std::vector<int32_t> ids;
  ids.reserve(p.logit_bias.size());
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const auto [id, bias] = p.logit_bias[i];
    const std::string where = "logit_bias[" + std::to_string(i) + "] (token " + std::to_string(id) + ")";
    K3_CHECK(id >= 0 && id < vocab_size,
             where + ": token id is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    K3_CHECK(bias >= -kMaxLogitBias && bias <= kMaxLogitBias,
             where + ": bias must be in [-100, 100], got " + num(bias));
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  const auto dup = std::adjacent_find(ids.begin(), ids.end());
  K3_CHECK(dup == ids.end(),
           "logit_bias lists token id " + std::to_string(dup == ids.end() ? 0 : *dup) + " more than once");
}

Sampler::Sampler(const SamplingParams& params, int32_t vocab_size)
    : params_(params), vocab_size_(vocab_size), rng_(params.seed) {
  validate(params_, vocab_size_);
  top_k_ = (params_.top_k <= 0 || params_.top_k >= vocab_size_) ? vocab_size_ : params_.top_k;
}

// Steps 1-3 of sampler.h. Returns the input itself when no step is on (no copy).
std::span<const float> Sampler::process(std::span<const float> logits, std::span<const int32_t> prompt,
                                        std::span<const int32_t> output, std::span<const uint32_t> allowed) {
  const bool repetition = params_.repetition_penalty != 1.0f;
  const bool openai = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  if (params_.logit_bias.empty() && !repetition && !openai && allowed.empty()) return logits;
  // Ids first, so a bad id throws before any scratch mark is set (marks must stay all zero).
  if (repetition) check_ids(prompt, "prompt", vocab_size_);
  if (repetition || openai) check_ids(output, "output", vocab_size_);

  processed_.assign(logits.begin(), logits.end());  // capacity kept: no allocation after the first call
  std::span<float> x(processed_);
  if (!allowed.empty()) {  // step 0: tokens the request's grammar refuses
    if (allowed.size() != (static_cast<size_t>(vocab_size_) + 31) / 32)
      throw core::Error("sample: the allowed-token mask has " + std::to_string(allowed.size()) + " words, expected " +
                        std::to_string((vocab_size_ + 31) / 32));
    for (size_t w = 0; w < allowed.size(); ++w) {
      const uint32_t bits = allowed[w];
      if (bits == 0xFFFFFFFFu) continue;
      const size_t end = std::min<size_t>(32, static_cast<size_t>(vocab_size_) - w * 32);
      for (size_t b = 0; b < end; ++b)
        if (!(bits >> b & 1)) x[w * 32 + b] = -std::numeric_limits<float>::infinity();
    }
  }
  for (const auto& [id, bias] : params_.logit_bias) x[static_cast<size_t>(id)] += bias;

  if (repetition) {
    seen_.resize(static_cast<size_t>(vocab_size_));  // zero-filled the first time only
    const float penalty = params_.repetition_penalty;
    auto penalise = [&](std::span<const int32_t> ids) {
      for (int32_t id : ids) {
        if (seen_[static_cast<size_t>(id)]) continue;  // once per id, not per occurrence
        seen_[static_cast<size_t>(id)] = 1;
        float& v = x[static_cast<size_t>(id)];
        v = v > 0.0f ? v / penalty : v * penalty;
      }
    };
    penalise(prompt);
    penalise(output);
    for (int32_t id : prompt) seen_[static_cast<size_t>(id)] = 0;
    for (int32_t id : output) seen_[static_cast<size_t>(id)] = 0;
  }

  if (openai) {
    output_count_.resize(static_cast<size_t>(vocab_size_));
    for (int32_t id : output) ++output_count_[static_cast<size_t>(id)];
    for (int32_t id : output) {
      int32_t& count = output_count_[static_cast<size_t>(id)];
      if (count == 0) continue;  // already applied for this id
      x[static_cast<size_t>(id)] -= params_.frequency_penalty * static_cast<float>(count);
      x[static_cast<size_t>(id)] -= params_.presence_penalty;
      count = 0;
    }
  }
  return x;
}

SampleResult Sampler::sample(std::span<const float> logits, std::span<const int32_t> prompt,
                             std::span<const int32_t> output, std::span<const uint32_t> allowed) {
  K3_CHECK(logits.size() == static_cast<size_t>(vocab_size_), "sample: logits has " + std::to_string(logits.size()) +
                                                                  " values, expected vocab_size " +
                                                                  std::to_string(vocab_size_));
  const Scan input = scan(logits);
  if (input.not_finite)
    for (size_t i = 0; i < logits.size(); ++i)
      if (!(logits[i] < kInf))  // NaN or +inf; -inf is a legal "masked" logit
        throw core::Error("sample: logits[" + std::to_string(i) + "] is " + num(logits[i]) +
                          "; logits must be finite or -inf");

  const std::span<const float> x = process(logits, prompt, output, allowed);
  // First maximum: ties -> lowest id. Unprocessed logits were scanned already.
  const Scan processed = x.data() == logits.data() ? input : scan(x);
  const int32_t argmax = processed.argmax;
  const float max_logit = processed.max;
  K3_CHECK(max_logit > -kInf, allowed.empty()
                                  ? "sample: every logit is -inf after logit_bias and penalties; no token can be chosen"
                                  : "sample: every token the grammar allows has logit -inf; no token can be chosen");
  K3_CHECK(max_logit < kInf, "sample: logit " + std::to_string(argmax) +
                                 " overflowed to +inf after logit_bias and penalties (repetition_penalty " +
                                 num(params_.repetition_penalty) + ")");

  // Step 5 (T > 0): unnormalised probabilities exp((x - max) / T) in [0, 1], exactly 1 for
  // the most likely token, so min-p's threshold min_p * max(p) is just min_p. The exponent is
  // clamped before narrowing to float (exp(-150) is 0 in float anyway) so a tiny T cannot
  // overflow the cast.
  const bool greedy = params_.temperature == 0.0f;
  if (!greedy) {
    const double inv_t = 1.0 / static_cast<double>(params_.temperature);
    prob_.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      prob_[i] = std::exp(static_cast<float>(std::max(static_cast<double>(x[i] - max_logit) * inv_t, -150.0)));
  }
  // Step 4: log_softmax of the processed logits (temperature 1, no filter), only when asked
  // for; at T = 1 the terms are exactly prob_.
  const bool want_logprobs = params_.logprob || params_.logprobs > 0;
  double log_z = 0.0;
  if (want_logprobs) {
    double z = 0.0;
    if (params_.temperature == 1.0f) {
      for (float p : prob_) z += p;
    } else {
      for (float v : x) z += std::exp(v - max_logit);
    }
    log_z = std::log(z);
  }
  auto logprob = [&](int32_t id) {
    return static_cast<float>(static_cast<double>(x[static_cast<size_t>(id)]) - max_logit - log_z);
  };

  SampleResult result;
  result.token = greedy ? argmax : draw(x);
  result.logprob = want_logprobs ? logprob(result.token) : std::numeric_limits<float>::quiet_NaN();
  if (params_.logprobs > 0) {
    // One pass keeping the n best in a small sorted array; ids arrive ascending, so a tie
    // never displaces an earlier (lower) id.
    const size_t n = static_cast<size_t>(params_.logprobs);
    std::array<int32_t, kMaxLogprobs> best{};
    size_t count = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (count == n && !(x[i] > x[static_cast<size_t>(best[n - 1])])) continue;
      size_t pos = std::min(count, n - 1);
      while (pos > 0 && x[i] > x[static_cast<size_t>(best[pos - 1])]) {
        best[pos] = best[pos - 1];
        --pos;
      }
      best[pos] = static_cast<int32_t>(i);
      count = std::min(count + 1, n);
    }
    result.top_logprobs.reserve(n);
    for (size_t j = 0; j < n; ++j) result.top_logprobs.emplace_back(best[j], logprob(best[j]));
  }
  return result;
}

// Steps 6-9 for temperature > 0: one uniform draw over the tokens the filters keep.
int32_t Sampler::draw(std::span<const float> x) {
  const size_t vocab = x.size();
  const double min_p = params_.min_p;
  const bool filter_k = static_cast<size_t>(top_k_) < vocab;
  const bool filter_p = params_.top_p < 1.0f;

  if (!filter_k && !filter_p) {  // only min-p: walk the ids in order, no candidate list
    double total = 0.0;
    for (float p : prob_)
      if (p >= min_p) total += p;
    double r = rng_.uniform() * total;  // step 9: the single draw of this call
    int32_t last = 0;
    for (size_t i = 0; i < vocab; ++i) {
      const double p = prob_[i];
      if (p == 0.0 || p < min_p) continue;
      last = static_cast<int32_t>(i);
      if ((r -= p) < 0.0) return last;
    }
    return last;  // rounding left r >= 0: the last token with nonzero mass
  }

  // Candidates order_[0, n). "Most likely first" is the total order (logit desc, id asc).
  auto more_likely = [&](int32_t a, int32_t b) {
    const float xa = x[static_cast<size_t>(a)], xb = x[static_cast<size_t>(b)];
    return xa > xb || (xa == xb && a < b);
  };
  auto at = [&](size_t i) { return order_.begin() + static_cast<std::ptrdiff_t>(i); };
  auto mass_of = [&](size_t lo, size_t hi) {
    double m = 0.0;
    for (size_t i = lo; i < hi; ++i) m += prob_[static_cast<size_t>(order_[i])];
    return m;
  };
  size_t n = vocab;
  double mass = 0.0;  // what top-p's fraction refers to: the mass left after top-k
  if (filter_k) {
    // Step 6: exactly k, by one pass with a heap of the k best so far whose front is the least
    // likely of them (ids arrive ascending, so a tie never displaces a lower id).
    n = static_cast<size_t>(top_k_);
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0);
    std::make_heap(order_.begin(), order_.end(), more_likely);
    for (size_t i = n; i < vocab; ++i) {
      if (!more_likely(static_cast<int32_t>(i), order_.front())) continue;
      std::pop_heap(order_.begin(), order_.end(), more_likely);
      order_.back() = static_cast<int32_t>(i);
      std::push_heap(order_.begin(), order_.end(), more_likely);
    }
    mass = mass_of(0, n);
  } else {
    for (float p : prob_) mass += p;
  }
  // Keep only candidates that can survive (order_[0, n) stays a superset of the final set):
  //  - min-p losers (step 8): a tail of the most-likely-first order, removed at the end anyway;
  //  - with top-p, tokens with p < eps = (1 - top_p) * mass / (2n): together they weigh at most
  //    half of the mass top-p cuts off, so they lie wholly inside the cut-off tail, and the
  //    prefix sums before them (hence the cut) are unchanged.
  const double target = static_cast<double>(params_.top_p) * mass;
  double floor = min_p;
  if (filter_p) {
    const double cut_off_mass = (1.0 - static_cast<double>(params_.top_p)) * mass;
    floor = std::max(floor, cut_off_mass / (2.0 * static_cast<double>(n)));
  }
  size_t kept = 0;
  if (filter_k) {
    for (size_t i = 0; i < n; ++i)
      if (prob_[static_cast<size_t>(order_[i])] >= floor) order_[kept++] = order_[i];
  } else {
    order_.resize(vocab);
    for (size_t i = 0; i < vocab; ++i)
      if (prob_[i] >= floor) order_[kept++] = static_cast<int32_t>(i);
  }
  n = kept;        // >= 1: the most likely token has p = 1 >= floor
  if (filter_p) {  // step 7: weighted selection of the shortest prefix reaching target
    size_t lo = 0, hi = n;
    double cum = 0.0;  // mass of order_[0, lo), all of it kept
    constexpr size_t kSortBelow = 32;
    while (hi - lo > kSortBelow) {
      const size_t mid = lo + (hi - lo) / 2;
      std::nth_element(at(lo), at(mid), at(hi), more_likely);
      const double upper = mass_of(lo, mid);
      if (cum + upper >= target) {
        hi = mid;  // the cut is inside [lo, mid)
      } else {
        cum += upper;  // [lo, mid) kept whole; the cut is further
        lo = mid;
      }
    }
    std::sort(at(lo), at(hi), more_likely);
    size_t keep = hi;  // rounding may leave cum just short: keep the whole block
    for (size_t i = lo; i < hi; ++i) {
      cum += prob_[static_cast<size_t>(order_[i])];
      if (cum >= target) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  // Step 9 walks the survivors in ascending id order, as the min-p-only path above does: the
  // token a uniform picks then depends on the kept set alone, not on the order nth_element or the
  // heap left them in (the standard library's), so the device sampler (kernels/sampling) picks the
  // same token for the same draw. The kept set is a prefix of the most-likely-first order: every
  // id at or before its least likely member `last_kept`.
  int32_t last_kept = order_[0];
  for (size_t i = 1; i < n; ++i)
    if (more_likely(last_kept, order_[i])) last_kept = order_[i];
  const bool few = n * 16 < vocab;  // few survivors: sort them by id; else scan the vocabulary
  if (few) std::sort(at(0), at(n));
  double total = 0.0;
  auto for_each_kept = [&](auto&& fn) {  // fn(id) over the survivors, ascending; false stops
    if (few) {
      for (size_t i = 0; i < n; ++i)
        if (!fn(order_[i])) return;
    } else {
      for (size_t i = 0; i < vocab; ++i)
        if (!more_likely(last_kept, static_cast<int32_t>(i)) && !fn(static_cast<int32_t>(i))) return;
    }
  };
  for_each_kept([&](int32_t id) {
    total += prob_[static_cast<size_t>(id)];
    return true;
  });
  double r = rng_.uniform() * total;  // step 9: the single draw of this call
  int32_t last = last_kept, pick = -1;
  for_each_kept([&](int32_t id) {
    const double p = prob_[static_cast<size_t>(id)];
    if (p == 0.0) return true;
    last = id;
    if ((r -= p) >= 0.0) return true;
    pick = id;
    return false;
  });
  return pick >= 0 ? pick : last;  // rounding left r >= 0: the last survivor with nonzero mass
}

bool Sampler::device_eligible() const {
  return params_.logit_bias.empty() && params_.repetition_penalty == 1.0f && params_.presence_penalty == 0.0f &&
         params_.frequency_penalty == 0.0f;
}

double Sampler::draw_uniform() { return params_.temperature == 0.0f ? 0.0 : rng_.uniform(); }

}  // namespace k3::runner
