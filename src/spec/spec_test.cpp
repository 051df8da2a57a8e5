// spec/spec_test.cpp: the drafters and acceptance rules alone:
//   - NgramDrafter: the indexed proposal equals the scan reference on random contexts (small
//     alphabets, so matches of every length occur), longest match wins, most recent wins,
//     incremental growth and a changed context under the same id;
//   - SyntheticDrafter proposes min(max, AL - 1) tokens and says synthetic;
//   - accept_point_mass: greedy rule (prefix of argmax matches + correction / bonus), and for
//     temperature > 0 the same tokens and Rng draws as plain sampling;
//   - rejection_step: the output distribution over a stratified grid of uniforms equals p exactly
//     (to the grid's resolution) for point-mass and general q, on a tiny vocabulary;
//   - DraftLengthController and SpecCounters; SpeculativeConfig parsing and validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "spec/acceptance.h"
#include "spec/draft_length.h"
#include "spec/ngram_drafter.h"
#include "spec/spec_config.h"
#include "spec/synthetic_drafter.h"

namespace k3::spec {
namespace {

std::vector<int32_t> random_tokens(core::Rng& rng, int n, int alphabet) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(alphabet));
  return t;
}

std::vector<int32_t> propose(NgramDrafter& d, RequestId id, std::span<const int32_t> tokens, int32_t k) {
  DraftQuery q{id, tokens, 1, k};
  Draft out;
  d.propose(std::span(&q, 1), std::span(&out, 1));
  return out.tokens;
}

TEST(NgramDrafter, ReferenceHandExamples) {
  // Suffix [2 3] occurs at ends 3 and 7; the most recent (7) wins: propose t[7..].
  const std::vector<int32_t> t = {1, 2, 3, 9, 5, 2, 3, 8, 4, 2, 3};
  EXPECT_EQ(NgramDrafter::lookup(t, 1, 4, 3), (std::vector<int32_t>{8, 4, 2}));
  // A longer match beats a more recent shorter one: [1 2 3] matches at end 3 only.
  const std::vector<int32_t> u = {1, 2, 3, 7, 7, 2, 3, 6, 1, 2, 3};
  EXPECT_EQ(NgramDrafter::lookup(u, 1, 4, 2), (std::vector<int32_t>{7, 7}));
  // No match of length >= min: nothing.
  EXPECT_TRUE(NgramDrafter::lookup(std::vector<int32_t>{1, 2, 3, 4}, 1, 4, 3).empty());
  // Fewer drafts when the context ends first.
  EXPECT_EQ(NgramDrafter::lookup(std::vector<int32_t>{5, 6, 5}, 1, 4, 4), (std::vector<int32_t>{6, 5}));
}

TEST(NgramDrafter, IndexedEqualsReferenceAsContextsGrow) {
  for (int alphabet : {2, 3, 17}) {
    core::Rng rng(static_cast<uint64_t>(alphabet));
    for (int32_t min_n : {1, 2})
      for (int32_t max_n : {min_n, 4}) {
        NgramDrafter d(min_n, max_n);
        std::vector<int32_t> t = random_tokens(rng, 5, alphabet);
        for (int step = 0; step < 97; ++step) {
          const int32_t k = 1 + static_cast<int32_t>(rng.next_u64() % 5);
          ASSERT_EQ(propose(d, 7, t, k), NgramDrafter::lookup(t, min_n, max_n, k))
              << "alphabet " << alphabet << " n " << min_n << ".." << max_n << " step " << step;
          // Grow by 1..3 tokens (a verify step appends several).
          const auto more = random_tokens(rng, 1 + static_cast<int>(rng.next_u64() % 3), alphabet);
          t.insert(t.end(), more.begin(), more.end());
        }
        // A different context under the same id is re-indexed, not mixed with the old one.
        const std::vector<int32_t> other = random_tokens(rng, 54, alphabet);
        EXPECT_EQ(propose(d, 7, other, 3), NgramDrafter::lookup(other, min_n, max_n, 3));
        d.release(7);
        EXPECT_EQ(d.num_indexed(), 0u);
      }
  }
}

TEST(NgramDrafter, BatchAndBadConfig) {
  NgramDrafter d;
  const std::vector<int32_t> a = {4, 5, 6, 4, 5}, b = {1, 1, 1};
  DraftQuery q[2] = {{1, a, 2, 3}, {2, b, 1, 0}};
  Draft out[2];
  out[1].tokens = {99};  // stale content is cleared
  d.propose(q, out);
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{6, 4, 5}));
  EXPECT_TRUE(out[1].tokens.empty());  // max_drafts 0
  EXPECT_THROW(NgramDrafter(0, 3), core::Error);
  EXPECT_THROW(NgramDrafter(3, 2), core::Error);
}

TEST(SyntheticDrafter, ProposesAtMostAlMinusOne) {
  SyntheticDrafter d(3);
  EXPECT_TRUE(d.synthetic());
  EXPECT_EQ(d.name(), "synthetic");
  const std::vector<int32_t> t = {10, 11, 12};
  DraftQuery q[2] = {{1, t, 2, 5}, {2, t, 2, 1}};
  Draft out[2];
  d.propose(q, out);
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{12, 12}));
  EXPECT_EQ(out[1].tokens, (std::vector<int32_t>{12}));
  EXPECT_THROW(SyntheticDrafter(0), core::Error);
}

// Rows of logits [k+1, V] whose argmax at row j is argmax[j].
std::vector<float> peaked_rows(const std::vector<int32_t>& argmax, int32_t V) {
  std::vector<float> rows(argmax.size() * static_cast<size_t>(V));
  for (size_t j = 0; j < argmax.size(); ++j)
    for (int32_t v = 0; v < V; ++v)
      rows[j * static_cast<size_t>(V) + static_cast<size_t>(v)] = v == argmax[j] ? 3.0f
                                                                                 : -0.1f * static_cast<float>(v % 7);
  return rows;
}

TEST(Acceptance, GreedyLongestPrefixThenCorrectionOrBonus) {
  const int32_t V = 17;
  runner::Sampler s({}, V);
  const std::vector<int32_t> prompt = {1, 2}, output = {3};
  std::vector<int32_t> scratch;
  Verified v;
  // Target argmax per row: 5 6 7 8. Drafts 5 6 9: accept 2, correction 7.
  accept_point_mass(s, peaked_rows({5, 6, 7, 8}, V), V, prompt, output, std::vector<int32_t>{5, 6, 9}, v, scratch);
  EXPECT_EQ(v.num_accepted, 2);
  ASSERT_EQ(v.tokens.size(), 3u);
  EXPECT_EQ(v.tokens[0].token, 5);
  EXPECT_EQ(v.tokens[1].token, 6);
  EXPECT_EQ(v.tokens[2].token, 7);
  // All accepted: the bonus token from the last row.
  accept_point_mass(s, peaked_rows({5, 6, 7, 8}, V), V, prompt, output, std::vector<int32_t>{5, 6, 7}, v, scratch);
  EXPECT_EQ(v.num_accepted, 3);
  EXPECT_EQ(v.tokens.back().token, 8);
  // First wrong: only the target's token.
  accept_point_mass(s, peaked_rows({5, 6}, V), V, prompt, output, std::vector<int32_t>{4}, v, scratch);
  EXPECT_EQ(v.num_accepted, 0);
  ASSERT_EQ(v.tokens.size(), 1u);
  EXPECT_EQ(v.tokens[0].token, 5);
  // Wrong row count.
  EXPECT_THROW(accept_point_mass(s, peaked_rows({5}, V), V, prompt, output, std::vector<int32_t>{4}, v, scratch),
               core::Error);
}

TEST(Acceptance, PenaltiesSeeTheAcceptedDrafts) {
  // With a strong presence penalty, row 1's argmax (token 5) is penalised once draft 5 is in the
  // output, so the target picks its runner-up 6 there: the draft 5 at position 2 is rejected.
  const int32_t V = 9;
  runner::SamplingParams p;
  p.presence_penalty = 2.0f;
  runner::Sampler s(p, V);
  std::vector<float> rows(2 * V, 0.0f);
  rows[5] = 3.0f;      // row 0: 5
  rows[V + 5] = 3.0f;  // row 1: 5 (before the penalty) ...
  rows[V + 6] = 2.0f;  // ... 6 after it (3 - 2 = 1 < 2)
  std::vector<int32_t> scratch;
  Verified v;
  accept_point_mass(s, rows, V, std::vector<int32_t>{1}, std::vector<int32_t>{}, std::vector<int32_t>{5}, v, scratch);
  EXPECT_EQ(v.num_accepted, 1);
  EXPECT_EQ(v.tokens.back().token, 6);
}

TEST(Acceptance, SampledTokensEqualPlainSamplingWithTheSameSeed) {
  // T = 1, top-k 5: a verify over k drafts emits exactly the tokens (and consumes exactly the
  // draws) that sampling the same rows one by one gives.
  const int32_t V = 23;
  runner::SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 5;
  p.seed = 42;
  core::Rng rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int k = 1 + trial % 4;
    std::vector<float> rows(static_cast<size_t>(k + 1) * V);
    for (auto& x : rows) x = static_cast<float>(rng.normal());
    std::vector<int32_t> drafts(static_cast<size_t>(k));
    runner::Sampler plain(p, V);
    for (int j = 0; j < k; ++j)  // plausible drafts: often what plain sampling picks
      drafts[static_cast<size_t>(j)] =
          rng.uniform() < 0.7 ? plain.sample(std::span(rows).subspan(static_cast<size_t>(j) * V, V), {}, {}).token
                              : static_cast<int32_t>(rng.next_u64() % V);
    runner::Sampler a(p, V), b(p, V);
    std::vector<int32_t> scratch;
    Verified v;
    accept_point_mass(a, rows, V, {}, {}, drafts, v, scratch);
    for (size_t j = 0; j < v.tokens.size(); ++j)
      EXPECT_EQ(v.tokens[j].token, b.sample(std::span(rows).subspan(j * V, V), {}, {}).token);
    // The Rngs are in step: the next draws agree too.
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(a.sample(std::span(rows).first(V), {}, {}).token, b.sample(std::span(rows).first(V), {}, {}).token);
  }
}

TEST(Acceptance, SyntheticAcceptsExactlyAlMinusOne) {
  const int32_t V = 11;
  runner::Sampler s({}, V);
  std::vector<int32_t> scratch;
  Verified v;
  const std::vector<int32_t> drafts = {9, 9, 9};
  accept_synthetic(s, peaked_rows({1, 2, 3, 4}, V), V, {}, {}, drafts, 3, v, scratch);
  EXPECT_EQ(v.num_accepted, 2);
  ASSERT_EQ(v.tokens.size(), 3u);
  EXPECT_EQ(v.tokens[0].token, 9);
  EXPECT_EQ(v.tokens[1].token, 9);
  EXPECT_EQ(v.tokens[2].token, 3);                                                      // the target's token at row 2
  accept_synthetic(s, peaked_rows({1, 2, 3, 4}, V), V, {}, {}, drafts, 9, v, scratch);  // AL > k+1: all
  EXPECT_EQ(v.num_accepted, 3);
  EXPECT_EQ(v.tokens.back().token, 4);
}

// The distribution rejection_step produces, integrated over a stratified N x N grid of
// (u_accept, u_residual): each cell's outcome is weighted 1/N^2.
std::vector<double> outcome_distribution(const std::vector<float>& p, const std::vector<float>& q, int32_t draft,
                                         int N) {
  std::vector<double> dist(p.size(), 0.0);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < N; ++j) {
      const RejectionOutcome o = rejection_step(p, q, draft, (i + 0.5) / N, (j + 0.5) / N);
      dist[static_cast<size_t>(o.token)] += 1.0 / (double(N) * N);
    }
  return dist;
}

TEST(RejectionStep, PointMassAndGeneralQGiveExactlyP) {
  const std::vector<float> p = {0.1f, 0.4f, 0.0f, 0.3f, 0.2f};
  const int N = 1000;  // resolution 1/N on each axis
  for (int32_t d = 0; d < 5; ++d) {
    if (p[static_cast<size_t>(d)] == 0.0f) continue;
    // Point mass: P(token = d) = p(d) (accept) and the rest from p without d.
    const std::vector<double> dist = outcome_distribution(p, {}, d, N);
    for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(dist[i], p[i], 2.0 / N) << "draft " << d << " token " << i;
  }
  // Averaged over a draft distribution q: sum_d q(d) dist_d = p.
  const std::vector<float> q = {0.3f, 0.1f, 0.2f, 0.2f, 0.2f};
  std::vector<double> mix(p.size(), 0.0);
  for (int32_t d = 0; d < 5; ++d) {
    const std::vector<double> dist = outcome_distribution(p, q, d, N);
    for (size_t i = 0; i < p.size(); ++i) mix[i] += q[static_cast<size_t>(d)] * dist[i];
  }
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(mix[i], p[i], 4.0 / N) << "token " << i;
  // Accept probability exactly min(1, p/q) at the boundary.
  EXPECT_TRUE(rejection_step(p, q, 1, 0.999, 0.5).accepted);  // p/q = 4 >= 1: always
  EXPECT_TRUE(rejection_step(p, q, 0, 0.333, 0.5).accepted);  // p/q = 1/3
  EXPECT_FALSE(rejection_step(p, q, 0, 0.334, 0.5).accepted);
  EXPECT_THROW(rejection_step(p, q, 7, 0.1, 0.1), core::Error);
  EXPECT_THROW(rejection_step(p, std::vector<float>{1.0f}, 0, 0.1, 0.1), core::Error);
}

TEST(DraftLength, AdaptsWithinBounds) {
  DraftLengthController c(4, true);
  EXPECT_EQ(c.next(1), 4);
  for (int i = 0; i < 6; ++i) c.record(1, c.next(1), 0);
  EXPECT_EQ(c.next(1), 1);  // keeps failing: shrinks to 1
  for (int i = 0; i < 10; ++i) c.record(1, c.next(1), c.next(1));
  EXPECT_EQ(c.next(1), 4);  // keeps succeeding: back to K, never above
  c.record(1, 0, 0);        // nothing proposed: no change
  EXPECT_EQ(c.next(1), 4);
  c.release(1);
  EXPECT_EQ(c.num_tracked(), 0u);
  DraftLengthController fixed(4, false);
  for (int i = 0; i < 6; ++i) fixed.record(1, 4, 0);
  EXPECT_EQ(fixed.next(1), 4);
  EXPECT_LT(fixed.rate(1), 0.2);
}

TEST(DraftLength, PausesWhenDraftsNeverMatchAndProbesWithGrowingPauses) {
  DraftLengthController c(4, true);
  int32_t k = c.take_step(1);
  int steps_to_pause = 0;
  while (k > 0) {  // every draft rejected: 4, 2, 1, 1, ... then the pause
    c.record(1, k, 0);
    k = c.take_step(1);
    ASSERT_LT(++steps_to_pause, 12) << "never paused";
  }
  EXPECT_EQ(c.next(1), 0);
  // The first pause: 8 plain steps in all (the one just taken included), then one probe.
  int plain = 1;
  while ((k = c.take_step(1)) == 0) ++plain;
  EXPECT_EQ(plain, 8);
  EXPECT_EQ(k, 1);
  c.record(1, 1, 0);  // the probe fails: the next pause is twice as long
  plain = 0;
  while ((k = c.take_step(1)) == 0) ++plain;
  EXPECT_EQ(plain, 16);
  c.record(1, 1, 1);  // the probe is accepted: drafting resumes and grows again
  EXPECT_EQ(c.take_step(1), 2);
  for (int i = 0; i < 6; ++i) c.record(1, c.take_step(1), c.next(1));
  EXPECT_EQ(c.take_step(1), 4);
  // Pauses never exceed 64 steps.
  for (int round = 0; round < 8; ++round) {
    while ((k = c.take_step(1)) > 0) c.record(1, k, 0);
    plain = 1;
    while ((k = c.take_step(1)) == 0) ++plain;
    EXPECT_LE(plain, 64);
    c.record(1, k, 0);
  }
  // Without adaptation nothing pauses.
  DraftLengthController fixed(4, false);
  for (int i = 0; i < 50; ++i) {
    ASSERT_EQ(fixed.take_step(2), 4);
    fixed.record(2, 4, 0);
  }
}

// A new request starts from the population's recent acceptance: after one request's drafts kept
// failing, the next starts shorter with a lower rate (the gate expects less of it), down to one
// probing draft; after drafts that keep succeeding, new requests start at K again. Without
// adaptation the length stays K and only the rate follows.
TEST(DraftLength, NewRequestsStartFromThePopulationRate) {
  DraftLengthController c(4, true);
  EXPECT_EQ(c.next(1), 4);
  EXPECT_EQ(c.rate(1), 1.0);
  int failures = 0;
  auto fail_until = [&](int n) {
    for (; failures < n; ++failures) c.record(1, std::max(1, c.take_step(1)), 0);
  };
  fail_until(6);  // population 0.9^6 = 0.53
  EXPECT_NEAR(c.population_rate(), std::pow(0.9, 6), 1e-12);
  EXPECT_EQ(c.next(2), 3);
  EXPECT_EQ(c.take_step(2), 3);
  EXPECT_NEAR(c.rate(2), std::pow(0.9, 6), 1e-12);
  fail_until(16);  // 0.19
  EXPECT_EQ(c.next(2), 2);
  fail_until(22);  // 0.098: a new request probes with one draft
  EXPECT_EQ(c.next(2), 1);
  for (int i = 0; i < 7; ++i) c.record(2, c.next(2), c.next(2));
  EXPECT_LT(c.population_rate(), 0.6);
  EXPECT_LT(c.next(3), 4);
  c.record(2, c.next(2), c.next(2));  // the 8th success: 1 - 0.902 * 0.9^8 = 0.61
  EXPECT_GE(c.population_rate(), 0.6);
  EXPECT_EQ(c.next(3), 4);
  DraftLengthController fixed(4, false);
  for (int i = 0; i < 30; ++i) fixed.record(1, 4, 0);
  EXPECT_EQ(fixed.next(2), 4);
  EXPECT_LT(fixed.rate(2), 0.1);
}

TEST(SpecCounters, PerPositionCounts) {
  SpecCounters s;
  s.record(3, 2);
  s.record(3, 0);
  s.record(0, 0);  // no drafts: not a verify step
  s.record(4, 4);
  EXPECT_EQ(s.num_drafts, 3);
  EXPECT_EQ(s.num_draft_tokens, 10);
  EXPECT_EQ(s.num_accepted_tokens, 6);
  EXPECT_EQ(s.accepted_per_pos, (std::vector<int64_t>{2, 2, 1, 1}));
  EXPECT_DOUBLE_EQ(s.mean_acceptance_length(), 3.0);
}

TEST(SpecConfig, ParseValidateAndMake) {
  EXPECT_EQ(parse_spec_method("ngram"), SpecMethod::ngram);
  EXPECT_EQ(parse_spec_method("synthetic"), SpecMethod::synthetic);
  EXPECT_THROW(parse_spec_method("eagle"), core::Error);
  SpeculativeConfig c;
  EXPECT_FALSE(c.enabled());
  c.method = SpecMethod::synthetic;
  c.num_speculative_tokens = 0;
  EXPECT_THROW(c.validate(), core::Error);
  c.num_speculative_tokens = 3;
  c.synthetic_acceptance_length = 5;
  EXPECT_THROW(c.validate(), core::Error);  // AL > K+1
  c.synthetic_acceptance_length = 2;
  EXPECT_NO_THROW(c.validate());
  EXPECT_NE(describe(c).find("SYNTHETIC"), std::string::npos);
  EXPECT_TRUE(make_drafter(c)->synthetic());
  c.method = SpecMethod::ngram;
  c.ngram_min = 3;
  c.ngram_max = 2;
  EXPECT_THROW(c.validate(), core::Error);
  c.ngram_max = 5;
  EXPECT_EQ(make_drafter(c)->name(), "ngram");
  c.method = SpecMethod::dspark;
  EXPECT_THROW(make_drafter(c), core::Error);
}

}  // namespace
}  // namespace k3::spec
