// scheduler/scheduler_spec_test.cpp: speculative verify steps in the scheduler: a decoding
// request with drafts runs [last, drafts] as one decode sequence whose rows count against the
// token budget and get pages; update() keeps the accepted drafts plus the target's token (one
// event each), truncated by a stop token or max_tokens; drafts are capped by budget, max_tokens,
// max_model_len, free pages (drafts never preempt) and the next checkpoint boundary (a verify step
// never saves a checkpoint); aborts and preemption between verify steps leave no page, slot or
// checkpoint behind.
#include <gtest/gtest.h>

#include "core/error.h"
#include "scheduler/scheduler.h"

namespace k3::scheduler {
namespace {

cache::CacheConfig cache_config(int32_t blocks = 64, bool prefix_cache = true) {
  cache::CacheConfig c;
  c.block_size = 16;
  c.num_blocks = blocks;
  c.num_slots = 8;
  c.num_checkpoints = prefix_cache ? 16 : 0;
  c.checkpoint_interval_blocks = 2;  // boundaries every 32 tokens
  c.enable_prefix_cache = prefix_cache;
  return c;
}

SchedulerConfig sched_config(int32_t budget = 64) {
  SchedulerConfig s;
  s.max_num_seqs = 8;
  s.max_num_batched_tokens = budget;
  s.long_prefill_token_threshold = 48;
  s.max_partial_prefills = 2;
  s.max_model_len = 256;
  return s;
}

RequestSpec spec(int n, int64_t max_tokens, int32_t seed = 0) {
  RequestSpec r;
  for (int i = 0; i < n; ++i) r.prompt.push_back((i * 7 + seed * 13) % 97 + 3);
  r.max_tokens = max_tokens;
  return r;
}

struct Harness {
  explicit Harness(const SchedulerConfig& s = sched_config(), const cache::CacheConfig& c = cache_config())
      : sched(s, c) {}
  Scheduler sched;
  StepPlan out;
  std::vector<RequestEvent> events;

  // One step in which every sampling sequence gets `tokens_of(seq)` and `accepted_of(seq)`.
  template <class Tokens, class Accepted>
  void step(Tokens tokens_of, Accepted accepted_of) {
    sched.schedule(out);
    std::vector<int32_t> sampled, accepted;
    for (const ScheduledSequence& s : out.seqs) {
      if (!s.sample) continue;
      const int32_t a = accepted_of(s);
      const std::vector<int32_t> t = tokens_of(s);
      sampled.insert(sampled.end(), t.begin(), t.begin() + a + 1);
      accepted.push_back(a);
    }
    events.clear();
    if (!out.empty()) sched.update(out, sampled, accepted, events);
    ASSERT_EQ(sched.check(), "");
  }
  // A plain step: token 50 for every sampling sequence.
  void plain_step() {
    step([](const ScheduledSequence&) { return std::vector<int32_t>{50}; }, [](const ScheduledSequence&) { return 0; });
  }
};

// A constrained request's sampled rows get grammar mask rows in the plan (one for a plain row,
// every row of a verify); its prefill chunks that sample nothing and unconstrained requests get
// none.
TEST(SchedulerSpec, ConstrainedSampledRowsGetMaskRows) {
  SchedulerConfig sc = sched_config(/*budget=*/40);
  Harness h(sc, cache_config(64, /*prefix_cache=*/false));
  RequestSpec constrained = spec(60, 20);
  constrained.constrained = true;
  h.sched.add(1, constrained);
  h.sched.add(2, spec(5, 20, 1));
  // Step 1: request 1's first chunk (60 tokens take two), which samples nothing; request 2's prompt.
  h.plain_step();
  const auto seq_of = [&](RequestId id) -> const ScheduledSequence& {
    for (const ScheduledSequence& q : h.out.seqs)
      if (q.id == id) return q;
    throw core::Error("request " + std::to_string(id) + " is not in the plan");
  };
  EXPECT_FALSE(seq_of(1).sample);
  EXPECT_EQ(seq_of(1).mask_row, -1);
  EXPECT_EQ(seq_of(2).mask_row, -1);
  EXPECT_EQ(h.out.num_mask_rows, 0);
  h.plain_step();  // step 2: request 1's last chunk, sampled; request 2 decodes
  EXPECT_TRUE(seq_of(1).sample);
  EXPECT_EQ(seq_of(1).mask_row, 0);
  EXPECT_EQ(seq_of(2).mask_row, -1);
  EXPECT_EQ(h.out.num_mask_rows, 1);
  h.sched.set_drafts(1, std::vector<int32_t>{7, 8, 9});
  h.sched.set_drafts(2, std::vector<int32_t>{7, 8});
  h.sched.schedule(h.out);
  ASSERT_EQ(h.out.seqs.size(), 2u);
  for (const ScheduledSequence& q : h.out.seqs) {
    EXPECT_TRUE(q.verify()) << q.id;
    EXPECT_EQ(q.mask_row, q.id == 1 ? 0 : -1) << q.id;
    EXPECT_EQ(q.mask_rows(), q.id == 1 ? 4 : 0) << q.id;
  }
  EXPECT_EQ(h.out.num_mask_rows, 4);
}

TEST(SchedulerSpec, VerifyRowsBudgetPagesAndEvents) {
  Harness h(sched_config(), cache_config(64, /*prefix_cache=*/false));
  h.sched.add(1, spec(30, 20));
  h.plain_step();  // prefill 30 -> first token
  ASSERT_TRUE(h.sched.find(1)->is<Decoding>());
  const int64_t computed = h.sched.find(1)->running()->num_computed;
  EXPECT_EQ(computed, 30);
  h.sched.set_drafts(1, std::vector<int32_t>{7, 8, 9});
  h.sched.schedule(h.out);
  ASSERT_EQ(h.out.seqs.size(), 1u);
  const ScheduledSequence& s = h.out.seqs[0];
  EXPECT_EQ(s.kind, StepKind::decode);
  EXPECT_EQ(s.num_drafts, 3);
  EXPECT_EQ(s.num_tokens, 4);
  EXPECT_EQ(h.out.num_tokens, 4);  // the budget counts K+1 rows
  EXPECT_EQ(h.out.num_verifies, 1);
  EXPECT_EQ(h.out.num_draft_tokens, 3);
  const auto tokens = h.out.tokens_of(s);
  EXPECT_EQ(std::vector<int32_t>(tokens.begin(), tokens.end()), (std::vector<int32_t>{50, 7, 8, 9}));
  // Pages cover all rows: positions 30..33 -> 3 pages of 16.
  EXPECT_EQ(h.sched.find(1)->running()->cache.blocks.size(), 3u);
  // Accept 2 of 3: tokens 7, 8 then the target's 11.
  std::vector<int32_t> sampled = {7, 8, 11}, accepted = {2};
  h.events.clear();
  h.sched.update(h.out, sampled, accepted, h.events);
  ASSERT_EQ(h.sched.check(), "");
  ASSERT_EQ(h.events.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(h.events[static_cast<size_t>(i)].token, sampled[static_cast<size_t>(i)]);
    EXPECT_EQ(h.events[static_cast<size_t>(i)].sample_index, i);
    EXPECT_FALSE(h.events[static_cast<size_t>(i)].finished);
  }
  const Request& r = *h.sched.find(1);
  EXPECT_EQ(r.running()->num_computed, computed + 3);  // last + 2 accepted; the bonus is next
  EXPECT_EQ(r.num_tokens(), computed + 4);
  EXPECT_TRUE(r.drafts.empty());
  // The counts must match what was scheduled.
  h.sched.set_drafts(1, std::vector<int32_t>{1, 2});
  h.sched.schedule(h.out);
  EXPECT_THROW(h.sched.update(h.out, std::vector<int32_t>{1, 2, 3, 4}, std::vector<int32_t>{3}, h.events), core::Error);
}

TEST(SchedulerSpec, StopTokenAndMaxTokensTruncateTheAcceptedRun) {
  for (bool by_stop : {true, false}) {
    Harness h;
    RequestSpec sp = spec(20, by_stop ? 50 : 4);
    sp.stop_token_ids = {8};
    h.sched.add(1, sp);
    h.plain_step();
    // max_tokens 4 with 1 output: at most 2 drafts (3 new tokens) are verified.
    h.sched.set_drafts(1, std::vector<int32_t>{by_stop ? 7 : 6, 8, 9, 10});
    h.sched.schedule(h.out);
    EXPECT_EQ(h.out.seqs[0].num_drafts, by_stop ? 4 : 2);
    std::vector<int32_t> sampled, accepted;
    if (by_stop) {
      sampled = {7, 8, 9, 10, 12};  // all accepted, but 8 stops the request
      accepted = {4};
    } else {
      sampled = {6, 8, 5};  // the stop id 8 is in the run: truncated there, reason stop
      accepted = {2};
    }
    h.events.clear();
    h.sched.update(h.out, sampled, accepted, h.events);
    ASSERT_EQ(h.events.size(), 2u);
    EXPECT_TRUE(h.events[1].finished);
    EXPECT_EQ(h.events[1].token, 8);
    EXPECT_EQ(h.events[1].reason, FinishReason::stop);
    EXPECT_EQ(h.sched.find(1), nullptr);
    const cache::CacheUsage u = h.sched.cache().usage();
    EXPECT_EQ(u.blocks_in_use, 0);
    EXPECT_EQ(u.slots_in_use, 0);
    EXPECT_EQ(u.checkpoints_pending, 0);
  }
  // Length: max_tokens 3, one output so far: 1 draft at most; accepting it ends with "length".
  Harness h;
  h.sched.add(1, spec(20, 3));
  h.plain_step();
  h.sched.set_drafts(1, std::vector<int32_t>{7, 8, 9});
  h.sched.schedule(h.out);
  EXPECT_EQ(h.out.seqs[0].num_drafts, 1);
  h.events.clear();
  h.sched.update(h.out, std::vector<int32_t>{7, 11}, std::vector<int32_t>{1}, h.events);
  ASSERT_EQ(h.events.size(), 2u);
  EXPECT_EQ(h.events[1].reason, FinishReason::length);
  EXPECT_EQ(h.events[1].stats.output_tokens, 3);
}

TEST(SchedulerSpec, DraftsCappedByBudgetAndCheckpointBoundary) {
  // Budget 16 for three decoding requests: the first takes 1 + 13 rows (leaving one row for each
  // later decode), the second 1 + 0, the third 1.
  Harness tight(sched_config(16), cache_config(64, false));
  for (RequestId id = 1; id <= 3; ++id) tight.sched.add(id, spec(5, 40, static_cast<int32_t>(id)));
  while (tight.sched.num_waiting() > 0 || !tight.sched.find(3)->is<Decoding>()) tight.plain_step();
  tight.sched.set_drafts(1, std::vector<int32_t>(20, 3));
  tight.sched.set_drafts(2, std::vector<int32_t>{1, 2, 3});
  tight.sched.schedule(tight.out);
  ASSERT_EQ(tight.out.seqs.size(), 3u);
  EXPECT_EQ(tight.out.seqs[0].num_drafts, 13);
  EXPECT_EQ(tight.out.seqs[1].num_drafts, 0);
  EXPECT_EQ(tight.out.seqs[2].num_drafts, 0);
  EXPECT_EQ(tight.out.num_tokens, 16);

  // Prefix cache on, boundaries every 32: from computed 20 the rows must end before 32.
  Harness c;
  c.sched.add(1, spec(20, 100));
  c.plain_step();  // computed 20
  int64_t saw_checkpoint_at = -1;
  for (int step = 0; step < 12; ++step) {
    c.sched.set_drafts(1, std::vector<int32_t>(8, 5));
    c.sched.schedule(c.out);
    const ScheduledSequence s = c.out.seqs[0];
    const int64_t end = s.start + s.num_tokens;
    EXPECT_TRUE(s.num_drafts == 0 || end % 32 != 0) << "a verify step ending on a boundary";
    EXPECT_TRUE(s.num_drafts == 0 || (s.start / 32) == ((end - 1) / 32)) << "a verify step crossing a boundary";
    if (s.save_checkpoint >= 0) {
      EXPECT_EQ(s.num_drafts, 0);
      if (saw_checkpoint_at < 0) saw_checkpoint_at = end;
    }
    // Accept everything.
    std::vector<int32_t> sampled(static_cast<size_t>(s.num_drafts), 5);
    sampled.push_back(6);
    c.sched.update(c.out, sampled, std::vector<int32_t>{s.num_drafts}, c.events);
    ASSERT_EQ(c.sched.check(), "");
  }
  EXPECT_EQ(saw_checkpoint_at, 32);  // 20 -> 29 (8 drafts) -> 31 (1 draft) -> 32 (plain, saved)
  EXPECT_GE(c.sched.cache().usage().checkpoints_attached, 1);
}

TEST(SchedulerSpec, DraftsNeverPreempt) {
  // 4 pages, two requests of 31 tokens holding 2 each: request 1's next decode fits its page, its
  // drafts would need a fifth page: it decodes plainly and nobody is preempted.
  SchedulerConfig sc = sched_config(64);
  sc.max_model_len = 64;
  Harness h(sc, cache_config(4, /*prefix_cache=*/false));
  h.sched.add(1, spec(31, 20, 1));
  h.sched.add(2, spec(31, 20, 2));
  h.plain_step();
  ASSERT_TRUE(h.sched.find(2)->is<Decoding>());
  EXPECT_EQ(h.sched.cache().usage().blocks_free, 0);
  h.sched.set_drafts(1, std::vector<int32_t>{3, 3, 3});
  h.sched.schedule(h.out);
  EXPECT_TRUE(h.out.preempted.empty());
  ASSERT_EQ(h.out.seqs.size(), 2u);
  EXPECT_EQ(h.out.seqs[0].num_drafts, 0);
  EXPECT_EQ(h.out.seqs[0].num_tokens, 1);
}

TEST(SchedulerSpec, AbortAndPreemptionBetweenVerifyStepsLeakNothing) {
  // 6 pages of 16 for 3 requests that each want to grow: preemptions happen; every request is
  // aborted at the end; nothing stays allocated.
  SchedulerConfig sc = sched_config(64);
  sc.max_model_len = 64;
  Harness h(sc, cache_config(6, /*prefix_cache=*/false));
  for (RequestId id = 1; id <= 3; ++id) h.sched.add(id, spec(12, 40, static_cast<int32_t>(id)));
  int64_t preemptions = 0;
  for (int step = 0; step < 30; ++step) {
    std::vector<const Request*> decoding;
    h.sched.decoding_requests(decoding);
    for (const Request* r : decoding) h.sched.set_drafts(r->id(), std::vector<int32_t>{4, 4, 4, 4});
    h.step([](const ScheduledSequence& s) { return std::vector<int32_t>(static_cast<size_t>(s.num_drafts) + 1, 4); },
           [](const ScheduledSequence& s) { return s.num_drafts / 2; });
    preemptions += static_cast<int64_t>(h.out.preempted.size());
    if (step == 20) {  // abort one in the middle of its verify steps
      std::vector<RequestEvent> ev;
      h.sched.abort(1, ev);
      ASSERT_EQ(h.sched.check(), "");
    }
  }
  EXPECT_GT(preemptions, 0);
  std::vector<RequestEvent> ev;
  for (RequestId id = 1; id <= 3; ++id) h.sched.abort(id, ev);
  const cache::CacheUsage u = h.sched.cache().usage();
  EXPECT_EQ(u.blocks_in_use, 0);
  EXPECT_EQ(u.slots_in_use, 0);
  EXPECT_EQ(u.checkpoints_pending, 0);
  EXPECT_EQ(h.sched.check(), "");
}

}  // namespace
}  // namespace k3::scheduler
