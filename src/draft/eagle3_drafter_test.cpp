// draft/eagle3_drafter_test.cpp: Eagle3Drafter's bookkeeping against the model driven by hand:
// its chain equals context rows (token p + 1 with the fused taps of p) followed by chain rows on the
// draft's own pre-norm output; verify rounds that accept some drafts and re-observe rows keep it in
// step; a request first seen mid-sequence (a prefix-cache hit) drafts; a gap or an out-of-step query
// proposes nothing until it is in step again; release() frees the request.
#include "draft/eagle3_drafter.h"

#include <gtest/gtest.h>

#include <vector>

#include "draft/test_util.h"

namespace k3::draft {
namespace {

using testing::random_act;

struct Fixture {
  Eagle3Config config = builtin_eagle3_config("k3-tiny-eagle3");
  core::Tensor embed = testing::random_bf16(config.vocab_size, config.hidden_size, 2);
  Eagle3Weights weights = random_eagle3_weights(config, 4, embed);
  Eagle3Model model{config, weights, testing::reference_ops(), {kernels::Precision::fp32}};
  int64_t tap_width() const { return int64_t{config.num_taps()} * config.target_hidden_size; }
};

spec::HiddenTapRows rows_of(const core::Tensor& taps, const std::vector<int32_t>& tokens, int64_t begin, int64_t end) {
  core::TensorView v = taps.view();
  v.data = const_cast<float*>(taps.data<const float>()) + begin * taps.dim(1);
  v.shape = {end - begin, taps.dim(1)};
  return {v, begin, std::span<const int32_t>(tokens.data() + begin, size_t(end - begin))};
}

// The chain the drafter should give: context rows [first, P) of `taps` (row p with token p + 1,
// tokens[P] the newest sampled one), then K - 1 chain rows.
std::vector<int32_t> expected_chain(const Fixture& f, const core::Tensor& taps, const std::vector<int32_t>& tokens,
                                    int64_t first, int64_t P, int K) {
  Eagle3Cache cache;
  cache.first_position = first;
  Eagle3Cache* caches[] = {&cache};
  core::Tensor rows = core::Tensor::zeros(core::DType::f32, {P - first, taps.dim(1)});
  std::copy(taps.data<const float>() + first * taps.dim(1), taps.data<const float>() + P * taps.dim(1),
            rows.data<float>());
  std::vector<int32_t> next(tokens.begin() + first + 1, tokens.begin() + P + 1);
  const int64_t n[] = {P - first};
  Eagle3Output o = f.model.forward(caches, n, next, f.model.fuse_taps(rows.view()).view());
  std::vector<int32_t> out;
  int64_t last = P - first - 1;
  const int64_t H = f.config.hidden_size;
  for (int k = 0; k < K; ++k) {
    core::Tensor normed = core::Tensor::zeros(core::DType::f32, {1, H});
    std::copy(o.normed.data<const float>() + last * H, o.normed.data<const float>() + (last + 1) * H,
              normed.data<float>());
    out.push_back(f.model.greedy_tokens(f.model.logits(normed.view()).view()).at(0));
    core::Tensor h = core::Tensor::zeros(core::DType::f32, {1, H});
    std::copy(o.prenorm.data<const float>() + last * H, o.prenorm.data<const float>() + (last + 1) * H,
              h.data<float>());
    const int64_t one[] = {1};
    const int32_t t[] = {out.back()};
    o = f.model.forward(caches, one, t, h.view());
    last = 0;
  }
  return out;
}

std::vector<int32_t> propose(Eagle3Drafter& d, spec::RequestId id, const std::vector<int32_t>& tokens, int K) {
  spec::DraftQuery q{id, tokens, 4, K};
  spec::Draft out;
  d.propose(std::span(&q, 1), std::span(&out, 1));
  EXPECT_TRUE(out.probs.empty()) << "greedy drafts are point masses";
  return out.tokens;
}

TEST(Eagle3Drafter, ChainsFromTheCommittedTapsAndStaysInStepThroughVerifyRounds) {
  Fixture f;
  Eagle3Drafter d(f.model);
  EXPECT_EQ(d.hidden_tap().layers, (std::vector<int32_t>{0, 1, 2}));
  core::Rng rng(9);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(static_cast<int32_t>(rng.next_u64() % 1024));
  const core::Tensor taps = random_act(40, f.tap_width(), 5);
  // Prefill of 10 tokens, newest sampled token tokens[10].
  d.observe(1, rows_of(taps, tokens, 0, 10));
  std::vector<int32_t> seq(tokens.begin(), tokens.begin() + 11);
  EXPECT_EQ(propose(d, 1, seq, 4), expected_chain(f, taps, tokens, 0, 10, 4));
  // Proposing again without a step in between gives the same chain (the chain rows were dropped).
  EXPECT_EQ(propose(d, 1, seq, 4), expected_chain(f, taps, tokens, 0, 10, 4));
  // A verify step committing 3 rows (positions 10..12), newest token tokens[13].
  d.observe(1, rows_of(taps, tokens, 10, 13));
  seq.assign(tokens.begin(), tokens.begin() + 14);
  EXPECT_EQ(propose(d, 1, seq, 3), expected_chain(f, taps, tokens, 0, 13, 3));
  // A rollback: positions 12.. observed again (another verify's rows replaced them).
  d.observe(1, rows_of(taps, tokens, 12, 16));
  seq.assign(tokens.begin(), tokens.begin() + 17);
  EXPECT_EQ(propose(d, 1, seq, 2), expected_chain(f, taps, tokens, 0, 16, 2));
  EXPECT_EQ(d.observed_end(1), 16);
  // Out of step (tokens the drafter has not seen the taps of): nothing proposed.
  seq.assign(tokens.begin(), tokens.begin() + 19);
  EXPECT_TRUE(propose(d, 1, seq, 2).empty());
  // max_drafts bounds the chain, one request at a time or batched with another.
  d.observe(2, rows_of(taps, tokens, 0, 5));
  const std::vector<int32_t> seq1(tokens.begin(), tokens.begin() + 17), seq2(tokens.begin(), tokens.begin() + 6);
  spec::DraftQuery qs[] = {{1, seq1, 4, 1}, {2, seq2, 4, 3}};
  spec::Draft outs[2];
  d.propose(qs, outs);
  EXPECT_EQ(outs[0].tokens, expected_chain(f, taps, tokens, 0, 16, 1));
  EXPECT_EQ(outs[1].tokens, expected_chain(f, taps, tokens, 0, 5, 3));
  EXPECT_EQ(d.num_requests(), 2u);
  d.release(1);
  d.release(2);
  EXPECT_EQ(d.num_requests(), 0u);
  EXPECT_EQ(d.cache_bytes(), 0);
}

TEST(Eagle3Drafter, DraftsAfterAPrefixHitAndRestartsAfterAGap) {
  Fixture f;
  Eagle3Drafter d(f.model);
  core::Rng rng(3);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 60; ++i) tokens.push_back(static_cast<int32_t>(rng.next_u64() % 1024));
  const core::Tensor taps = random_act(60, f.tap_width(), 6);
  // First observed at 32 (the first 32 tokens came from the prefix cache).
  d.observe(7, rows_of(taps, tokens, 32, 40));
  std::vector<int32_t> seq(tokens.begin(), tokens.begin() + 41);
  EXPECT_EQ(propose(d, 7, seq, 3), expected_chain(f, taps, tokens, 32, 40, 3));
  // A gap (positions 40..44 never observed, e.g. a preemption's recompute done elsewhere): the
  // drafter starts again at 45.
  d.observe(7, rows_of(taps, tokens, 45, 50));
  seq.assign(tokens.begin(), tokens.begin() + 51);
  EXPECT_EQ(propose(d, 7, seq, 3), expected_chain(f, taps, tokens, 45, 50, 3));
  // Unknown requests propose nothing.
  EXPECT_TRUE(propose(d, 99, seq, 3).empty());
}

}  // namespace
}  // namespace k3::draft
