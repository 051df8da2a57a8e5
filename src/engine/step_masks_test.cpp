// engine/step_masks_test.cpp: StepMasks fills a plan's grammar mask rows on its worker: a plain
// row is its matcher's mask now, a verify sequence's rows follow its drafts (rows after a refused
// draft repeat the last mask) and its matcher ends where it started; errors come back from wait().
#include "engine/step_masks.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "structured/structured_test_util.h"

namespace k3::engine {
namespace {

using scheduler::ScheduledSequence;
using scheduler::StepPlan;
using structured::Matcher;
namespace st = structured::testing;

// Appends a decode sequence of `tokens` (its last token, then drafts) with `mask_rows` rows from
// plan.num_mask_rows (0: unconstrained).
void add_seq(StepPlan& plan, scheduler::RequestId id, std::vector<int32_t> tokens, bool constrained) {
  ScheduledSequence q;
  q.id = id;
  q.kind = scheduler::StepKind::decode;
  q.token_offset = static_cast<int32_t>(plan.tokens.size());
  q.num_tokens = static_cast<int32_t>(tokens.size());
  q.num_drafts = q.num_tokens - 1;
  q.sample = true;
  plan.tokens.insert(plan.tokens.end(), tokens.begin(), tokens.end());
  if (constrained) {
    q.mask_row = plan.num_mask_rows;
    plan.num_mask_rows += q.mask_rows();
  }
  plan.seqs.push_back(q);
}

std::vector<uint32_t> as_vector(std::span<const uint32_t> s) { return {s.begin(), s.end()}; }

TEST(StepMasks, PlainAndVerifyRowsFollowTheirMatchersAndDrafts) {
  const auto vocab = st::small_vocabulary();
  const auto grammar = st::compile(R"(root ::= "abc" | "abd")", vocab);
  Matcher plain(grammar), verify(grammar);
  ASSERT_TRUE(plain.accept('a'));
  StepPlan plan;
  add_seq(plan, 1, {'a'}, true);                 // row 0: after "a"
  add_seq(plan, 2, {'x'}, false);                // unconstrained: no rows
  add_seq(plan, 3, {'x', 'a', 'b', 'z'}, true);  // rows 1..4: start, after a, after ab, ab again (z refused)
  ASSERT_EQ(plan.num_mask_rows, 5);
  StepMasks masks;
  masks.start(plan, vocab->words(), [&](const ScheduledSequence& q) { return q.id == 1 ? &plain : &verify; });
  masks.wait();
  EXPECT_EQ(as_vector(masks.row(0)), st::reference_mask(plain));
  Matcher walk(grammar);
  EXPECT_EQ(as_vector(masks.row(1)), st::reference_mask(walk));
  ASSERT_TRUE(walk.accept('a'));
  EXPECT_EQ(as_vector(masks.row(2)), st::reference_mask(walk));
  ASSERT_TRUE(walk.accept('b'));
  EXPECT_EQ(as_vector(masks.row(3)), st::reference_mask(walk));
  EXPECT_EQ(as_vector(masks.row(4)), as_vector(masks.row(3)));
  EXPECT_EQ(st::allowed(as_vector(masks.row(3))).size(), 2u) << "c and d after ab";
  // The verify matcher is back where it started; the plain one was not advanced.
  EXPECT_EQ(verify.rollback_depth(), 0);
  EXPECT_EQ(st::reference_mask(verify), as_vector(masks.row(1)));
  EXPECT_EQ(st::reference_mask(plain), as_vector(masks.row(0)));
}

TEST(StepMasks, APlanWithoutMaskRowsStartsNothingAndErrorsComeBackFromWait) {
  const auto vocab = st::small_vocabulary();
  const auto grammar = st::compile(R"(root ::= "ab")", vocab);
  Matcher m(grammar);
  StepMasks masks;
  StepPlan free;
  add_seq(free, 1, {'a'}, false);
  masks.start(free, vocab->words(), [](const ScheduledSequence&) -> Matcher* { return nullptr; });
  masks.wait();  // nothing to wait for

  StepPlan plan;
  add_seq(plan, 7, {'a'}, true);
  try {
    masks.start(plan, vocab->words(), [](const ScheduledSequence&) -> Matcher* { return nullptr; });
    ADD_FAILURE() << "a mask row without a matcher was accepted";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("request 7 has mask rows but no grammar"), std::string::npos) << e.what();
  }
  // A fill that fails on the worker (rows of the wrong width) is reported by wait(), once.
  masks.start(plan, 1, [&](const ScheduledSequence&) { return &m; });
  EXPECT_THROW(masks.wait(), core::Error);
  masks.wait();
  // The worker serves the next step.
  masks.start(plan, vocab->words(), [&](const ScheduledSequence&) { return &m; });
  masks.wait();
  EXPECT_EQ(as_vector(masks.row(0)), st::reference_mask(m));
}

}  // namespace
}  // namespace k3::engine
