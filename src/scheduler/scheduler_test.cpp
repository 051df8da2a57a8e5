// scheduler/scheduler_test.cpp: one behaviour per test: chunk cutting (page and checkpoint
// boundaries, budget), chunked prefill (a lone prompt takes the budget, long prompts capped
// beside others, the long-prefill limit), decodes first, partial-prefill limit, prefix hits
// restoring a checkpoint, finish reasons, abort in every state, preemption order and
// recompute, failed steps, validation messages, and the lifecycle's legal transitions.
#include "scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "core/error.h"
#include "scheduler/fake_kv_storage.h"

namespace k3::scheduler {
namespace {

static_assert(kLegalTransition<Waiting, Prefilling>);
static_assert(kLegalTransition<Decoding, Preempted>);
static_assert(!kLegalTransition<Finished, Prefilling>);  // a finished request never runs again
static_assert(!kLegalTransition<Waiting, Decoding>);     // decoding needs a prefill first
static_assert(!kLegalTransition<Decoding, Prefilling>);  // only through preemption
static_assert(!kLegalTransition<Preempted, Decoding>);
static_assert(!kLegalTransition<Finished, Finished>);  // finishes exactly once

cache::CacheConfig cache_config(int32_t blocks = 64, int32_t interval = 2) {
  cache::CacheConfig c;
  c.block_size = 16;
  c.num_blocks = blocks;
  c.num_slots = 8;
  c.num_checkpoints = 16;
  c.checkpoint_interval_blocks = interval;  // boundaries every 32 tokens
  return c;
}

SchedulerConfig sched_config() {
  SchedulerConfig s;
  s.max_num_seqs = 8;
  s.max_num_batched_tokens = 64;
  s.long_prefill_token_threshold = 48;
  s.max_partial_prefills = 2;
  s.max_model_len = 512;
  return s;
}

RequestSpec spec(int n, int64_t max_tokens, int32_t seed = 0) {
  RequestSpec r;
  for (int i = 0; i < n; ++i) r.prompt.push_back((i * 7 + seed * 13) % 97 + 3);
  r.max_tokens = max_tokens;
  return r;
}

// Drives a scheduler with the fake storage, checking invariants after every step.
struct Harness {
  explicit Harness(const SchedulerConfig& s = sched_config(), const cache::CacheConfig& c = cache_config())
      : sched(s, c), kv(c, 100) {}
  StepPlan out;
  std::vector<RequestEvent> events;
  Scheduler sched;
  testing::FakeKvStorage kv;
  std::vector<int32_t> forced;  // tokens to sample instead of the fake's, in order

  void step() {
    sched.schedule(out);
    std::vector<int32_t> sampled;
    kv.run_step(
        out, [&](RequestId id) { return sched.find(id)->tokens(); }, sampled);
    for (auto& t : sampled)
      if (!forced.empty()) {
        t = forced.front();
        forced.erase(forced.begin());
      }
    if (!out.empty()) sched.update(out, sampled, events);
    ASSERT_EQ(sched.check(), "");
  }
  const ScheduledSequence* seq_of(RequestId id) const {
    for (const auto& s : out.seqs)
      if (s.id == id) return &s;
    return nullptr;
  }
};

TEST(Scheduler, ChunksEndOnCheckpointBoundariesAndSaveThere) {
  SchedulerConfig s = sched_config();
  s.max_num_batched_tokens = 48;  // alone, the prompt takes the whole budget
  Harness h(s);
  h.sched.add(1, spec(100, 3));
  std::vector<std::pair<int64_t, int32_t>> chunks;  // (start, n)
  std::vector<bool> saved;
  for (int i = 0; i < 4; ++i) {
    h.step();
    ASSERT_EQ(h.out.seqs.size(), 1u);
    chunks.emplace_back(h.out.seqs[0].start, h.out.seqs[0].num_tokens);
    saved.push_back(h.out.seqs[0].save_checkpoint >= 0);
  }
  // Budget 48 but a checkpoint is due every 32 tokens: 32-token chunks, then the 4-token tail.
  EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int32_t>>{{0, 32}, {32, 32}, {64, 32}, {96, 4}}));
  EXPECT_EQ(saved, (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(h.out.seqs[0].sample, true);
  EXPECT_EQ(h.kv.saves(), 3);
}

// Checkpoints due more often than the budget: a chunk runs to its budget and ends at the LAST
// boundary it reaches (one step per budget, not one per interval; K3 checkpoints every 64
// tokens), saving there; the boundaries it passes keep none, and a later prompt hits the deepest
// saved one.
TEST(Scheduler, ChunksRunToTheLastCheckpointBoundaryTheyReach) {
  SchedulerConfig config = sched_config();
  config.max_num_batched_tokens = 48;
  Harness h(config, cache_config(64, /*interval=*/1));  // boundaries every 16 tokens
  h.sched.add(1, spec(100, 1));
  std::vector<std::pair<int64_t, int32_t>> chunks;
  std::vector<bool> saved;
  for (int i = 0; i < 4 && chunks.size() < 3; ++i) {
    h.step();
    if (h.out.seqs.empty()) continue;
    chunks.emplace_back(h.out.seqs[0].start, h.out.seqs[0].num_tokens);
    saved.push_back(h.out.seqs[0].save_checkpoint >= 0);
  }
  // Budget 48 (a multiple of 16): 48-token chunks, then 96 -> 100 (the tail after the last boundary).
  EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int32_t>>{{0, 48}, {48, 48}, {96, 4}}));
  EXPECT_EQ(saved, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(h.kv.saves(), 2);
  ASSERT_TRUE(h.sched.find(1) == nullptr || h.sched.find(1)->is<Finished>());  // max_tokens 1: done
  // The same prompt again: it restores the checkpoint at 96, the deepest one saved.
  h.sched.add(2, spec(100, 1));
  h.step();
  const ScheduledSequence* s = h.seq_of(2);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->start, 96);
  EXPECT_GE(s->restore_checkpoint, 0);
}

TEST(Scheduler, WithoutPrefixCacheChunksFollowBudgetAndPageBoundaries) {
  cache::CacheConfig c = cache_config();
  c.enable_prefix_cache = false;
  SchedulerConfig s = sched_config();
  s.max_num_batched_tokens = 40;  // not a page multiple: cut back to 32
  Harness h(s, c);
  h.sched.add(1, spec(90, 2));
  h.step();
  EXPECT_EQ(h.out.seqs[0].num_tokens, 32);
  EXPECT_EQ(h.out.seqs[0].save_checkpoint, -1);
  EXPECT_FALSE(h.out.seqs[0].sample);
  h.step();
  EXPECT_EQ(h.out.seqs[0].num_tokens, 32);  // [32, 72) cut back to the page boundary 64
  h.step();
  EXPECT_EQ(h.out.seqs[0].num_tokens, 26);  // the last chunk needs no alignment
  EXPECT_TRUE(h.out.seqs[0].sample);
  EXPECT_EQ(h.out.seqs[0].kind, StepKind::prefill);
  h.step();
  EXPECT_EQ(h.out.seqs[0].kind, StepKind::decode);
  EXPECT_EQ(h.out.seqs[0].start, 90);
}

TEST(Scheduler, DecodesFirstAndLongPromptsShareTheBudget) {
  cache::CacheConfig c = cache_config(128, 64);  // checkpoints rare: chunks follow the cap
  SchedulerConfig s = sched_config();
  s.max_num_batched_tokens = 64;
  s.long_prefill_token_threshold = 32;
  s.max_partial_prefills = 2;
  s.max_long_partial_prefills = 2;
  Harness h(s, c);
  for (RequestId id = 1; id <= 3; ++id) h.sched.add(id, spec(5, 50, static_cast<int32_t>(id)));
  h.step();  // three short prompts in one step? partial-prefill limit 2: two of them
  EXPECT_EQ(h.out.seqs.size(), 2u);
  h.step();  // the two decode, the third prefills
  EXPECT_EQ(h.out.num_decodes, 2);
  EXPECT_EQ(h.out.num_prefills, 1);
  h.sched.add(10, spec(300, 5, 10));
  h.sched.add(11, spec(300, 5, 11));
  h.sched.add(12, spec(300, 5, 12));
  for (int i = 0; i < 6; ++i) {
    h.step();
    // Decodes come first and all three are in every step; each long prompt takes at most 32,
    // at most two prompts advance, and the step stays within 64 tokens.
    ASSERT_GE(h.out.seqs.size(), 3u);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(h.out.seqs[static_cast<size_t>(k)].kind, StepKind::decode);
    EXPECT_LE(h.out.num_tokens, 64);
    EXPECT_LE(h.out.num_prefills, 2);
    for (const auto& q : h.out.seqs) EXPECT_LE(q.num_tokens, 32);
  }
  EXPECT_EQ(h.seq_of(12), nullptr);  // the third long prompt waits for a partial-prefill place
}

// Chunked prefill: budget 256, threshold 32, checkpoints rare. (start, tokens) of request `id` in
// the step just run, or (-1, 0) when it did not advance.
struct ChunkedPrefill : Harness {
  static SchedulerConfig config(int32_t long_places) {
    SchedulerConfig s = sched_config();
    s.max_num_batched_tokens = 256;
    s.long_prefill_token_threshold = 32;
    s.max_partial_prefills = 4;
    s.max_long_partial_prefills = long_places;
    return s;
  }
  explicit ChunkedPrefill(int32_t long_places = 1) : Harness(config(long_places), cache_config(128, 64)) {}
  std::pair<int64_t, int32_t> chunk(RequestId id) const {
    const ScheduledSequence* s = seq_of(id);
    return s ? std::pair<int64_t, int32_t>{s->start, s->num_tokens} : std::pair<int64_t, int32_t>{-1, 0};
  }
};

TEST(Scheduler, ALoneLongPromptTakesTheWholeBudget) {
  ChunkedPrefill h;
  h.sched.add(1, spec(300, 2));
  h.step();
  EXPECT_EQ(h.chunk(1), (std::pair<int64_t, int32_t>{0, 256}));  // not 32: nothing else wants the step
  h.step();
  EXPECT_EQ(h.chunk(1), (std::pair<int64_t, int32_t>{256, 44}));
  EXPECT_TRUE(h.out.seqs[0].sample);
}

// A prompt that ends on a checkpoint boundary, alone in its steps: its last chunk stops one
// interval short, so the same prompt sent again restores a checkpoint (a hit leaves one token).
TEST(Scheduler, AWholePromptChunkStopsAtTheLastBoundaryBelowItsEnd) {
  SchedulerConfig s = sched_config();
  Harness h(s, cache_config(64, /*interval=*/2));  // boundaries every 32 tokens, budget 64
  h.sched.add(1, spec(64, 1));
  h.step();
  EXPECT_EQ(h.out.seqs[0].num_tokens, 32);  // [0, 32), not [0, 64): a checkpoint at 32
  h.step();
  EXPECT_EQ(h.out.seqs[0].num_tokens, 32);
  ASSERT_EQ(h.sched.find(1), nullptr);
  h.sched.add(2, spec(64, 1));
  h.step();
  EXPECT_EQ(h.out.seqs[0].start, 32);
  EXPECT_GE(h.out.seqs[0].restore_checkpoint, 0);
}

TEST(Scheduler, BesideDecodesALongPromptTakesAtMostTheThreshold) {
  ChunkedPrefill h;
  h.sched.add(1, spec(10, 6));
  h.step();  // request 1 prefills, then decodes
  h.sched.add(2, spec(200, 1, 2));
  std::vector<std::pair<int64_t, int32_t>> chunks;
  while (h.sched.find(1) && h.sched.has_work()) {
    h.step();
    if (h.chunk(2).first >= 0) chunks.push_back(h.chunk(2));
    if (h.seq_of(2)) EXPECT_NE(h.seq_of(1), nullptr);  // request 1 decodes in every step
  }
  // Five steps beside request 1's decodes: 32 tokens each.
  ASSERT_EQ(chunks.size(), 5u);
  for (const auto& c : chunks) EXPECT_EQ(c.second, 32);
  h.step();  // request 1 is done: request 2 is alone and takes the rest at once
  EXPECT_EQ(h.chunk(2), (std::pair<int64_t, int32_t>{160, 40}));
}

TEST(Scheduler, ALongPromptIsCappedBesideAnotherPrompt) {
  ChunkedPrefill h;
  h.sched.add(1, spec(300, 1));
  h.sched.add(2, spec(20, 1, 2));  // short: done in one chunk
  h.step();
  EXPECT_EQ(h.chunk(1), (std::pair<int64_t, int32_t>{0, 32}));
  EXPECT_EQ(h.chunk(2), (std::pair<int64_t, int32_t>{0, 20}));
  h.step();  // request 2 finished (max_tokens 1): request 1 is alone
  EXPECT_EQ(h.chunk(1), (std::pair<int64_t, int32_t>{32, 256}));
}

TEST(Scheduler, ShortPromptsPassAWaitingLongOne) {
  ChunkedPrefill h;  // one long place
  h.sched.add(1, spec(300, 1, 1));
  h.sched.add(2, spec(300, 1, 2));  // long: waits for the long place
  h.sched.add(3, spec(20, 1, 3));   // short: passes request 2
  h.step();
  EXPECT_EQ(h.chunk(1).second, 32);
  EXPECT_EQ(h.chunk(2).first, -1);
  EXPECT_EQ(h.chunk(3).second, 20);
  EXPECT_EQ(h.out.num_prefills, 2);
  // Request 1 stays long while more than 32 tokens are left: [32, 288) in 8 steps of 32.
  for (int i = 0; i < 8; ++i) {
    h.step();
    EXPECT_EQ(h.chunk(1), (std::pair<int64_t, int32_t>{32 + 32 * i, 32}));
    EXPECT_EQ(h.chunk(2).first, -1) << "request 2 advanced while request 1's prompt held the long place";
  }
  h.step();  // 12 tokens left: request 1 is short now, and request 2 takes the long place
  EXPECT_EQ(h.chunk(1), (std::pair<int64_t, int32_t>{288, 12}));
  EXPECT_EQ(h.chunk(2), (std::pair<int64_t, int32_t>{0, 32}));
  ASSERT_EQ(h.sched.find(1), nullptr);
  while (h.sched.has_work()) h.step();
  std::vector<RequestId> order;
  for (const auto& e : h.events) order.push_back(e.id);
  EXPECT_EQ(order, (std::vector<RequestId>{3, 1, 2}));
}

// Admission looks past at most max_partial_prefills (4) waiting long prompts per step: a short
// prompt behind five of them waits until the queue ahead of it shortens.
TEST(Scheduler, AdmissionLooksPastOnlySoManyWaitingLongPrompts) {
  ChunkedPrefill h;
  for (RequestId id = 1; id <= 6; ++id) h.sched.add(id, spec(300, 1, static_cast<int32_t>(id)));
  h.sched.add(7, spec(20, 1, 7));
  h.step();
  EXPECT_EQ(h.chunk(1).second, 32);
  EXPECT_EQ(h.chunk(7).first, -1) << "the short prompt was found behind 5 long ones";
  ChunkedPrefill g;
  for (RequestId id = 1; id <= 4; ++id) g.sched.add(id, spec(300, 1, static_cast<int32_t>(id)));
  g.sched.add(7, spec(20, 1, 7));
  g.step();
  EXPECT_EQ(g.chunk(7).second, 20) << "the short prompt behind 3 waiting long ones was not admitted";
}

TEST(Scheduler, LongPlacesLetThatManyLongPromptsAdvanceTogether) {
  ChunkedPrefill h(/*long_places=*/2);
  for (RequestId id = 1; id <= 3; ++id) h.sched.add(id, spec(300, 1, static_cast<int32_t>(id)));
  h.step();
  EXPECT_EQ(h.chunk(1).second, 32);
  EXPECT_EQ(h.chunk(2).second, 32);
  EXPECT_EQ(h.chunk(3).first, -1);
  EXPECT_EQ(h.out.num_prefills, 2);
}

TEST(Scheduler, PrefixHitRestoresTheCheckpointAndSkipsCachedTokens) {
  Harness h;
  h.sched.add(1, spec(80, 1));
  while (h.sched.has_work()) h.step();
  ASSERT_EQ(h.events.size(), 1u);
  RequestSpec b = spec(80, 2);
  b.prompt.resize(70);  // same first 70 tokens: checkpoints at 32 and 64 -> hit 64
  b.prompt.push_back(1);
  h.sched.add(2, b);
  h.step();
  ASSERT_EQ(h.out.seqs.size(), 1u);
  const ScheduledSequence& s = h.out.seqs[0];
  EXPECT_EQ(s.slot_init, SlotInit::restore);
  EXPECT_GE(s.restore_checkpoint, 0);
  EXPECT_EQ(s.start, 64);
  EXPECT_EQ(s.num_blocks, 5);  // 4 shared + 1 new page for tokens 64..70
  EXPECT_EQ(h.sched.counters().prefix_hit_tokens, 64);
  while (h.sched.has_work()) h.step();
  ASSERT_EQ(h.events.back().id, 2u);
  EXPECT_EQ(h.events.back().stats.cached_prompt_tokens, 64);
}

TEST(Scheduler, IgnoreEosRunsToMaxTokens) {
  Harness h;
  RequestSpec r = spec(4, 3);
  r.eos_token_id = 42;
  r.ignore_eos = true;
  h.sched.add(1, r);
  h.forced = {42, 42, 42};
  while (h.sched.has_work()) h.step();
  ASSERT_EQ(h.events.size(), 3u);
  for (const auto& e : h.events) EXPECT_EQ(e.token, 42);
  EXPECT_TRUE(h.events.back().finished);
  EXPECT_EQ(h.events.back().reason, FinishReason::length);
}

TEST(Scheduler, StopTokenEosAndLengthExactly) {
  for (int which = 0; which < 3; ++which) {
    Harness h;
    RequestSpec r = spec(6, 4);
    r.eos_token_id = 9;
    r.stop_token_ids = {11};
    h.sched.add(1, r);
    h.forced = which == 0   ? std::vector<int32_t>{3, 9}
               : which == 1 ? std::vector<int32_t>{3, 4, 11}
                            : std::vector<int32_t>{1, 2, 3, 4};
    while (h.sched.has_work()) h.step();
    ASSERT_TRUE(h.events.back().finished);
    EXPECT_EQ(h.events.back().reason, which == 2 ? FinishReason::length : FinishReason::stop);
    EXPECT_EQ(h.events.back().stats.output_tokens, which == 0 ? 2 : which == 1 ? 3 : 4);
    EXPECT_EQ(h.events.back().token, which == 0 ? 9 : which == 1 ? 11 : 4);  // the stop token is delivered
    EXPECT_EQ(h.sched.cache().usage().slots_in_use, 0);
  }
}

// One run per live state: pages are tight (10 pages of 16 tokens for three requests), so the run
// preempts. It steps until some request is in the state (a bounded number of steps; the test
// names the state it never saw), aborts that one there, and lets the others run to their end.
// Each time every page, slot and pending checkpoint comes back, each request finishes exactly
// once, and the aborted one finishes with reason abort.
TEST(Scheduler, AbortInEveryStateFreesEverything) {
  cache::CacheConfig c = cache_config(10, 1);  // 10 pages of 16
  SchedulerConfig s = sched_config();
  s.max_model_len = 160;
  struct Target {
    const char* name;
    bool (*in)(const Request&);
  };
  const Target targets[] = {
      {"Waiting", [](const Request& r) { return r.is<Waiting>(); }},
      {"Prefilling", [](const Request& r) { return r.is<Prefilling>(); }},
      {"Decoding", [](const Request& r) { return r.is<Decoding>(); }},
      {"Preempted", [](const Request& r) { return r.is<Preempted>(); }},
  };
  for (const Target& t : targets) {
    SCOPED_TRACE(t.name);
    Harness h(s, c);
    h.sched.add(1, spec(60, 50, 1));   // will decode
    h.sched.add(2, spec(100, 50, 2));  // long prefill
    h.sched.add(3, spec(40, 5, 3));    // waits (partial-prefill limit 2)
    RequestId victim = 0;
    for (int i = 0; i < 200 && victim == 0 && h.sched.has_work(); ++i) {
      h.step();  // at least one step, so the state is one the run reached, not the initial queue
      for (RequestId id : {1u, 2u, 3u})
        if (const Request* r = h.sched.find(id); victim == 0 && r && t.in(*r)) victim = id;
    }
    ASSERT_NE(victim, 0u) << "no request was ever " << t.name << " between steps";
    const size_t events_before = h.events.size();
    ASSERT_TRUE(h.sched.abort(victim, h.events)) << "request " << victim << " in " << t.name;
    ASSERT_EQ(h.sched.check(), "");
    ASSERT_EQ(h.events.size(), events_before + 1);
    EXPECT_EQ(h.events.back().id, victim);
    EXPECT_TRUE(h.events.back().finished);
    EXPECT_EQ(h.events.back().reason, FinishReason::abort);
    EXPECT_FALSE(h.sched.abort(victim, h.events));  // finishes once
    for (int i = 0; i < 2000 && h.sched.has_work(); ++i) h.step();
    ASSERT_FALSE(h.sched.has_work()) << "the others did not finish after the abort";
    EXPECT_FALSE(h.sched.abort(77, h.events));
    const auto u = h.sched.cache().usage();
    EXPECT_EQ(u.blocks_in_use, 0);
    EXPECT_EQ(u.slots_in_use, 0);
    EXPECT_EQ(u.checkpoints_pending, 0);
    std::map<RequestId, std::vector<FinishReason>> finishes;
    for (const auto& e : h.events)
      if (e.finished) finishes[e.id].push_back(e.reason);
    for (RequestId id : {1u, 2u, 3u}) {
      ASSERT_EQ(finishes[id].size(), 1u) << "request " << id;
      EXPECT_EQ(finishes[id][0], id == victim ? FinishReason::abort : FinishReason::length) << "request " << id;
    }
  }
}

TEST(Scheduler, PreemptsTheLatestAdmittedAndRecomputesIt) {
  cache::CacheConfig c = cache_config(8, 1);  // 8 pages of 16 tokens = 128 tokens in all
  SchedulerConfig s = sched_config();
  s.max_model_len = 128;
  s.max_partial_prefills = 4;
  Harness h(s, c);
  h.sched.add(1, spec(30, 90, 1));
  h.sched.add(2, spec(30, 90, 2));
  h.sched.add(3, spec(30, 90, 3));
  std::vector<RequestId> preempted;
  for (int i = 0; i < 2000 && h.sched.has_work(); ++i) {
    h.step();
    preempted.insert(preempted.end(), h.out.preempted.begin(), h.out.preempted.end());
  }
  ASSERT_FALSE(preempted.empty());
  EXPECT_EQ(preempted.front(), 3u);  // the latest admitted goes first
  int finished = 0;
  for (const auto& e : h.events)
    if (e.finished) {
      ++finished;
      EXPECT_EQ(e.reason, FinishReason::length);
      EXPECT_EQ(e.stats.output_tokens, 90);
    }
  EXPECT_EQ(finished, 3);
  EXPECT_GT(h.sched.counters().preemptions, 0);
}

TEST(Scheduler, FailedStepFinishesItsRequestsWithError) {
  Harness h;
  h.sched.add(1, spec(20, 5));
  h.sched.add(2, spec(20, 5, 1));
  h.step();
  h.sched.add(3, spec(20, 5, 2));
  h.sched.schedule(h.out);
  ASSERT_EQ(h.out.seqs.size(), 3u);
  h.sched.fail_step(h.out, h.events);
  EXPECT_EQ(h.sched.check(), "");
  EXPECT_FALSE(h.sched.has_work());
  int errors = 0;
  for (const auto& e : h.events) errors += e.finished && e.reason == FinishReason::error;
  EXPECT_EQ(errors, 3);
  EXPECT_EQ(h.sched.cache().usage().slots_in_use, 0);
}

TEST(Scheduler, RejectsBadRequestsAndConfigsWithClearMessages) {
  Scheduler s(sched_config(), cache_config());
  auto message = [&](RequestId id, RequestSpec r) {
    try {
      s.add(id, std::move(r));
    } catch (const core::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(1, spec(0, 5)).find("prompt is empty"), std::string::npos);
  EXPECT_NE(message(1, spec(5, 0)).find("max_tokens must be >= 1"), std::string::npos);
  EXPECT_NE(message(1, spec(500, 13)).find("exceeds max_model_len (512)"), std::string::npos);
  EXPECT_EQ(message(1, spec(5, 5)), "");
  EXPECT_NE(message(1, spec(5, 5)).find("already in use"), std::string::npos);

  SchedulerConfig bad = sched_config();
  bad.max_num_seqs = 9;  // 8 slots
  EXPECT_THROW(Scheduler(bad, cache_config()), core::Error);
  bad = sched_config();
  bad.long_prefill_token_threshold = 8;  // < block_size
  EXPECT_THROW(Scheduler(bad, cache_config()), core::Error);
  bad = sched_config();
  bad.max_long_partial_prefills = 3;  // > max_partial_prefills (2)
  try {
    Scheduler(bad, cache_config());
    ADD_FAILURE() << "max_long_partial_prefills > max_partial_prefills was accepted";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_long_partial_prefills must be in [1, max_partial_prefills = 2], got 3"),
              std::string::npos)
        << e.what();
  }
  bad.max_long_partial_prefills = 0;
  EXPECT_THROW(Scheduler(bad, cache_config()), core::Error);
  bad = sched_config();
  bad.max_model_len = 64 * 16 + 1;  // one request would not fit in 64 pages
  EXPECT_THROW(Scheduler(bad, cache_config()), core::Error);
  bad = sched_config();
  bad.max_num_batched_tokens = 4;
  EXPECT_THROW(Scheduler(bad, cache_config()), core::Error);
}

TEST(Request, TransitionFromTheWrongStateThrows) {
  Request r(1, spec(3, 1), 16, Clock::now());
  EXPECT_TRUE(r.is<Waiting>());
  EXPECT_THROW(r.transition<Prefilling>([](Prefilling&&) { return Decoding{}; }), core::Error);
  r.transition<Waiting>([](Waiting&&) { return Finished{FinishReason::abort}; });
  EXPECT_TRUE(r.is<Finished>());
  EXPECT_EQ(std::string(state_name(r.state())), "finished");
}

}  // namespace
}  // namespace k3::scheduler
