// spec/acceptance.cpp: accept_point_mass, accept_synthetic, rejection_step.
#include "spec/acceptance.h"

#include <algorithm>

#include "core/error.h"

namespace k3::spec {

namespace {
std::span<const float> row_of(std::span<const float> rows, int32_t vocab, size_t j) {
  return rows.subspan(j * static_cast<size_t>(vocab), static_cast<size_t>(vocab));
}

void check_rows(std::span<const float> rows, int32_t vocab, size_t num_drafts, const char* who) {
  K3_CHECK(vocab > 0 && rows.size() == (num_drafts + 1) * static_cast<size_t>(vocab),
           std::string(who) + ": " + std::to_string(rows.size()) + " logits for " + std::to_string(num_drafts) +
               " drafts; expected (drafts + 1) * vocab = " +
               std::to_string((num_drafts + 1) * static_cast<size_t>(std::max(vocab, 0))));
}
}  // namespace

void accept_point_mass(runner::Sampler& sampler, std::span<const float> rows, int32_t vocab,
                       std::span<const int32_t> prompt, std::span<const int32_t> output,
                       std::span<const int32_t> drafts, Verified& result, std::vector<int32_t>& scratch) {
  check_rows(rows, vocab, drafts.size(), "accept_point_mass");
  result.num_accepted = 0;
  result.tokens.clear();
  scratch.assign(output.begin(), output.end());  // output ++ the drafts accepted so far (penalties)
  for (size_t j = 0; j <= drafts.size(); ++j) {
    result.tokens.push_back(sampler.sample(row_of(rows, vocab, j), prompt, scratch));
    if (j == drafts.size() || result.tokens.back().token != drafts[j]) return;
    ++result.num_accepted;
    scratch.push_back(drafts[j]);
  }
}

void accept_synthetic(runner::Sampler& sampler, std::span<const float> rows, int32_t vocab,
                      std::span<const int32_t> prompt, std::span<const int32_t> output, std::span<const int32_t> drafts,
                      int32_t acceptance_length, Verified& result, std::vector<int32_t>& scratch) {
  check_rows(rows, vocab, drafts.size(), "accept_synthetic");
  K3_CHECK(acceptance_length >= 1, "accept_synthetic: acceptance_length must be >= 1");
  const auto n = std::min<size_t>(static_cast<size_t>(acceptance_length - 1), drafts.size());
  result.num_accepted = static_cast<int32_t>(n);
  result.tokens.clear();
  scratch.assign(output.begin(), output.end());
  for (size_t j = 0; j < n; ++j) {
    runner::SampleResult forced;
    forced.token = drafts[j];
    result.tokens.push_back(forced);
    scratch.push_back(drafts[j]);
  }
  result.tokens.push_back(sampler.sample(row_of(rows, vocab, n), prompt, scratch));
}

RejectionOutcome rejection_step(std::span<const float> p, std::span<const float> q, int32_t draft, double u_accept,
                                double u_residual) {
  const size_t vocab = p.size();
  K3_CHECK(vocab > 0 && (q.empty() || q.size() == vocab), "rejection_step: p has " + std::to_string(vocab) +
                                                              " entries and q " + std::to_string(q.size()) +
                                                              " (q must be empty for a point mass, or match p)");
  K3_CHECK(draft >= 0 && static_cast<size_t>(draft) < vocab, "rejection_step: draft " + std::to_string(draft) +
                                                                 " is outside the vocabulary [0, " +
                                                                 std::to_string(vocab) + ")");
  const auto d = static_cast<size_t>(draft);
  const double qd = q.empty() ? 1.0 : q[d];
  K3_CHECK(qd > 0.0, "rejection_step: the draft distribution gives its own draft probability 0");
  const double ratio = std::min(1.0, static_cast<double>(p[d]) / qd);
  if (u_accept < ratio) return {true, draft};
  // Residual max(0, p - q), summed and walked in ascending id order.
  auto residual = [&](size_t i) {
    const double qi = q.empty() ? (i == d ? 1.0 : 0.0) : q[i];
    return std::max(0.0, static_cast<double>(p[i]) - qi);
  };
  double total = 0.0;
  for (size_t i = 0; i < vocab; ++i) total += residual(i);
  // total = 0 only when p == q (then acceptance is certain); rounding: fall back to p.
  if (!(total > 0.0)) return {false, draft};
  double r = u_residual * total;
  int32_t last = -1;
  for (size_t i = 0; i < vocab; ++i) {
    const double m = residual(i);
    if (m == 0.0) continue;
    last = static_cast<int32_t>(i);
    if ((r -= m) < 0.0) return {false, last};
  }
  return {false, last};  // rounding left r >= 0: the last token with residual mass
}

}  // namespace k3::spec
