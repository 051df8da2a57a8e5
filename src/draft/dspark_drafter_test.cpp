// draft/dspark_drafter_test.cpp: end to end on the k3-tiny target: target taps through the model's
// trace hook, DsparkDrafter observe -> propose -> greedy verify rounds with valid token ids, the
// context kept in step with the target, out-of-step requests proposing nothing, and release()
// freeing the request's cache.
#include "draft/dspark_drafter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "draft/target_taps.h"
#include "draft/test_util.h"
#include "model/local_cache.h"

namespace k3::draft {
namespace {

int32_t argmax_row(const core::Tensor& logits, int64_t row) {
  const float* z = logits.data<const float>() + row * logits.dim(1);
  return static_cast<int32_t>(std::max_element(z, z + logits.dim(1)) - z);
}

// The k3-tiny target (random weights, written and loaded once) and the k3-tiny-dspark draft.
class TinyPair : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir;
    checkpoint::write_random_checkpoint(config::builtin_config("k3-tiny"), {}, dir_->path() / "target");
    loaded_ = new checkpoint::LoadedModel(checkpoint::load_checkpoint(dir_->path() / "target"));
    write_random_draft(builtin_draft_config("k3-tiny-dspark"), 5, dir_->path() / "draft");
    draft_ = new LoadedDraft(load_draft(dir_->path() / "draft", loaded_->config, loaded_->weights));
  }
  static void TearDownTestSuite() {
    delete draft_;
    delete loaded_;
    delete dir_;
  }
  model::Model target(kernels::Precision p = kernels::Precision::bf16) const {
    model::ModelOptions o;
    o.precision = p;
    return model::Model(loaded_->config, loaded_->weights, testing::reference_ops(), o);
  }
  // A fresh target run over `tokens` (prefill), as the committed state after those tokens.
  TargetStep run(const model::Model& m, const std::vector<int32_t>& tokens) const {
    model::LocalCache cache(loaded_->config, 1, 128);
    model::SequenceState s = cache.new_sequence();
    return run_target_with_taps(m, cache.storage(), s, tokens, draft_->config.target_layer_ids);
  }
  static std::vector<int32_t> prompt(int n, uint64_t seed) {
    core::Rng rng(seed);
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng.next_u64() % 700));
    return t;
  }
  static testing::TempDir* dir_;
  static checkpoint::LoadedModel* loaded_;
  static LoadedDraft* draft_;
};
testing::TempDir* TinyPair::dir_ = nullptr;
checkpoint::LoadedModel* TinyPair::loaded_ = nullptr;
LoadedDraft* TinyPair::draft_ = nullptr;

spec::HiddenTapRows rows_of(const TargetStep& s, const std::vector<int32_t>& tokens, int64_t begin, int64_t end) {
  core::TensorView v = s.taps.view();
  v.data = s.taps.data<float>() + begin * s.taps.dim(1);
  v.shape = {end - begin, s.taps.dim(1)};
  return {v, begin, std::span<const int32_t>(tokens.data() + begin, size_t(end - begin))};
}

TEST_F(TinyPair, TargetTapsAreTheNextLayersMixtures) {
  const model::Model m = target(kernels::Precision::fp32);
  const std::vector<int32_t> p = prompt(30, 1);
  const TargetStep a = run(m, p);
  const int64_t H = loaded_->config.hidden_size;
  ASSERT_EQ(a.taps.shape(), (core::Shape{30, 3 * H}));
  EXPECT_TRUE(testing::all_finite(a.taps));
  // Each tap is its own layer's mixture (they differ), and causal: a longer run has the same rows.
  EXPECT_NE(a.taps.data<float>()[0], a.taps.data<float>()[H]);
  std::vector<int32_t> longer = p;
  longer.insert(longer.end(), {3, 4, 5});
  const TargetStep b = run(m, longer);
  for (int64_t r = 0; r < 30; ++r)
    for (int64_t i = 0; i < 3 * H; ++i)
      ASSERT_NEAR(a.taps.data<float>()[r * 3 * H + i], b.taps.data<float>()[r * 3 * H + i], 1e-4) << r << " " << i;
  // A tap without a next layer is refused.
  model::LocalCache cache(loaded_->config, 1, 64);
  model::SequenceState s = cache.new_sequence();
  const int bad[] = {3};
  EXPECT_THROW(run_target_with_taps(m, cache.storage(), s, p, bad), core::Error);
}

TEST_F(TinyPair, DraftVerifyRoundsKeepContextInStepAndReleaseFrees) {
  const model::Model m = target();
  const DraftModel dm(draft_->config, draft_->weights, testing::reference_ops());
  DsparkDrafter drafter(dm);
  EXPECT_EQ(drafter.name(), "dspark");
  EXPECT_EQ(drafter.hidden_tap().layers, (std::vector<int32_t>{0, 1, 2}));

  std::vector<int32_t> tokens = prompt(23, 2);
  TargetStep step = run(m, tokens);
  drafter.observe(1, rows_of(step, tokens, 0, 23));  // prefill: every row committed
  tokens.push_back(argmax_row(step.logits, 22));     // x_0: sampled, not yet run through the target
  int proposed_total = 0;
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(drafter.context_rows(1), int64_t(tokens.size()) - 1);
    const spec::DraftQuery q{1, tokens, 23, 4};
    spec::Draft d;
    drafter.propose(std::span(&q, 1), std::span(&d, 1));
    ASSERT_EQ(d.tokens.size(), 4u);
    EXPECT_TRUE(d.probs.empty());
    for (int32_t t : d.tokens) {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, loaded_->config.vocab_size);
    }
    proposed_total += int(d.tokens.size());
    // Verify greedily against a fresh target run over tokens ++ drafts.
    std::vector<int32_t> all = tokens;
    all.insert(all.end(), d.tokens.begin(), d.tokens.end());
    const TargetStep v = run(m, all);
    const int64_t base = int64_t(tokens.size()) - 1;  // row of x_0
    size_t n = 0;
    while (n < d.tokens.size() && argmax_row(v.logits, base + int64_t(n)) == d.tokens[n]) ++n;
    const int32_t bonus = argmax_row(v.logits, base + int64_t(n));
    // Committed rows: x_0 and the n accepted drafts, at positions base .. base + n.
    drafter.observe(1, rows_of(v, all, base, base + int64_t(n) + 1));
    drafter.on_accepted(1, int32_t(d.tokens.size()), int32_t(n));
    tokens.resize(size_t(base + 1));
    tokens.insert(tokens.end(), d.tokens.begin(), d.tokens.begin() + int64_t(n));
    tokens.push_back(bonus);
  }
  EXPECT_EQ(proposed_total, 12);
  EXPECT_EQ(drafter.context_rows(1), int64_t(tokens.size()) - 1);

  // Out of step (one token ahead of the context): nothing proposed. Unknown request: nothing.
  std::vector<int32_t> ahead = tokens;
  ahead.push_back(1);
  spec::DraftQuery qs[2] = {{1, ahead, 23, 4}, {99, tokens, 23, 4}};
  spec::Draft ds[2];
  ds[0].tokens = {1, 2};  // stale content is cleared
  drafter.propose(qs, ds);
  EXPECT_TRUE(ds[0].tokens.empty());
  EXPECT_TRUE(ds[1].tokens.empty());

  // A second request in the same batch, and release() frees exactly its cache.
  std::vector<int32_t> other = prompt(9, 3);
  const TargetStep s2 = run(m, other);
  drafter.observe(2, rows_of(s2, other, 0, 9));
  other.push_back(argmax_row(s2.logits, 8));
  spec::DraftQuery both[2] = {{1, tokens, 23, 2}, {2, other, 9, 3}};
  spec::Draft out[2];
  drafter.propose(both, out);
  EXPECT_EQ(out[0].tokens.size(), 2u);
  EXPECT_EQ(out[1].tokens.size(), 3u);
  EXPECT_EQ(drafter.num_requests(), 2u);
  const int64_t bytes_both = drafter.cache_bytes();
  drafter.release(1);
  EXPECT_EQ(drafter.num_requests(), 1u);
  EXPECT_LT(drafter.cache_bytes(), bytes_both);
  EXPECT_EQ(drafter.context_rows(1), -1);
  drafter.release(2);
  EXPECT_EQ(drafter.num_requests(), 0u);
  EXPECT_EQ(drafter.cache_bytes(), 0);
  drafter.propose(std::span(both, 1), std::span(out, 1));
  EXPECT_TRUE(out[0].tokens.empty());
}

TEST_F(TinyPair, LoadedDrafterOwnsItsModelAndMatchesTheManualOne) {
  std::unique_ptr<DsparkDrafter> owned = load_dspark_drafter(dir_->path() / "draft", loaded_->config, loaded_->weights,
                                                             testing::reference_ops());
  const DraftModel dm(draft_->config, draft_->weights, testing::reference_ops());
  DsparkDrafter manual(dm);
  const model::Model m = target();
  std::vector<int32_t> toks = prompt(12, 8);
  const TargetStep s = run(m, toks);
  for (spec::Drafter* d : {static_cast<spec::Drafter*>(owned.get()), static_cast<spec::Drafter*>(&manual)})
    d->observe(3, rows_of(s, toks, 0, 12));
  toks.push_back(argmax_row(s.logits, 11));
  const spec::DraftQuery q{3, toks, 12, 4};
  spec::Draft a, b;
  owned->propose(std::span(&q, 1), std::span(&a, 1));
  manual.propose(std::span(&q, 1), std::span(&b, 1));
  EXPECT_EQ(a.tokens.size(), 4u);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_THROW(load_dspark_drafter(dir_->path() / "nothing", loaded_->config, loaded_->weights,
                                   testing::reference_ops()),
               core::Error);
}

TEST_F(TinyPair, ObserveGapsAndRollbacks) {
  const DraftModel dm(draft_->config, draft_->weights, testing::reference_ops());
  DsparkDrafter drafter(dm);
  const core::Tensor taps = testing::random_act(10, 3 * 256, 4);
  const std::vector<int32_t> toks = prompt(10, 5);
  TargetStep fake;
  fake.taps = taps;
  drafter.observe(7, rows_of(fake, toks, 3, 10));  // starts mid-sequence (a prefix-cache hit): kept from there
  EXPECT_EQ(drafter.context_rows(7), 7);
  EXPECT_EQ(drafter.first_position(7), 3);
  drafter.observe(7, rows_of(fake, toks, 0, 4));  // rows before the first seen: start again from them
  EXPECT_EQ(drafter.context_rows(7), 4);
  EXPECT_EQ(drafter.first_position(7), 0);
  drafter.observe(7, rows_of(fake, toks, 2, 6));  // re-run rows 2.. (a rollback): replaced
  EXPECT_EQ(drafter.context_rows(7), 6);
  drafter.observe(7, rows_of(fake, toks, 8, 10));  // a gap (rows 6, 7 never seen): start again at 8
  EXPECT_EQ(drafter.context_rows(7), 2);
  EXPECT_EQ(drafter.first_position(7), 8);
  EXPECT_EQ(drafter.num_requests(), 1u);
  drafter.release(7);
  EXPECT_EQ(drafter.num_requests(), 0u);
}

// After a prefix-cache hit the engine shows the drafter only the rows it ran (positions 6..9 of a
// 10-token prompt): the drafter drafts from them, as the model does over a cache of those rows at
// their absolute positions, and the positions matter (the same rows at 0..3 draft other logits).
TEST_F(TinyPair, DraftsAfterAPrefixHitFromThePositionsItSaw) {
  const DraftModel dm(draft_->config, draft_->weights, testing::reference_ops());
  DsparkDrafter drafter(dm);
  TargetStep fake;
  fake.taps = testing::random_act(10, 3 * 256, 9);
  std::vector<int32_t> toks = prompt(10, 8);
  drafter.observe(4, rows_of(fake, toks, 6, 10));
  toks.push_back(5);  // x_0, sampled after position 9
  const spec::DraftQuery q{4, toks, 10, 4};
  spec::Draft d;
  drafter.propose(std::span(&q, 1), std::span(&d, 1));
  ASSERT_EQ(d.tokens.size(), 4u);
  DraftCache from6 = dm.new_cache(6), from0 = dm.new_cache(0);
  dm.append_context(from6, rows_of(fake, toks, 6, 10).hidden);
  dm.append_context(from0, rows_of(fake, toks, 6, 10).hidden);
  EXPECT_EQ(d.tokens, dm.draft(from6, 5, 4).tokens);
  const DraftResult a = dm.draft(from6, 5, 1, true), b = dm.draft(from0, 5, 1, true);
  EXPECT_NE(0, std::memcmp(a.logits.data<float>(), b.logits.data<float>(), size_t(a.logits.nbytes())));
  // A query out of step with the rows seen (one more token than observed) proposes nothing.
  toks.push_back(6);
  const spec::DraftQuery late{4, toks, 10, 4};
  drafter.propose(std::span(&late, 1), std::span(&d, 1));
  EXPECT_TRUE(d.tokens.empty());
}

TEST_F(TinyPair, LowConfidenceStopsDrafting) {
  const DraftModel dm(draft_->config, draft_->weights, testing::reference_ops());
  DsparkOptions opt;
  opt.min_confidence = 1.1f;  // above any sigmoid: the first position already stops
  DsparkDrafter drafter(dm, opt);
  std::vector<int32_t> toks = prompt(6, 6);
  TargetStep fake;
  fake.taps = testing::random_act(6, 3 * 256, 7);
  drafter.observe(1, rows_of(fake, toks, 0, 6));
  toks.push_back(5);
  const spec::DraftQuery q{1, toks, 6, 4};
  spec::Draft d;
  drafter.propose(std::span(&q, 1), std::span(&d, 1));
  EXPECT_TRUE(d.tokens.empty());
}

}  // namespace
}  // namespace k3::draft
