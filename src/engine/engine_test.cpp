// engine/engine_test.cpp: the Engine with the fake executor (no model): token streams and
// finish events, per-request stats, validation messages for every parameter, abort in any
// state, callbacks, logprobs, a failing step, the loop on its own thread with concurrent
// clients, and a randomized run (shared prefixes, tight memory, aborts) whose greedy outputs
// match a run without prefix cache, with no leaked id.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/rng.h"
#include "engine/fake_executor.h"

namespace k3::engine {
namespace {

constexpr int32_t kVocab = 64;

EngineConfig engine_config(int32_t blocks = 64, bool prefix_cache = true) {
  EngineConfig c;
  c.cache.block_size = 8;
  c.cache.num_blocks = blocks;
  c.cache.num_slots = 6;
  c.cache.num_checkpoints = 16;
  c.cache.checkpoint_interval_blocks = 2;
  c.cache.enable_prefix_cache = prefix_cache;
  c.scheduler.max_num_seqs = 6;
  c.scheduler.max_num_batched_tokens = 64;
  c.scheduler.long_prefill_token_threshold = 32;
  c.scheduler.max_partial_prefills = 2;
  c.scheduler.max_model_len = 160;
  c.eos_token_id = 0;
  return c;
}

struct Rig {
  explicit Rig(const EngineConfig& c = engine_config(), scheduler::ExecutionScope scope = {}) {
    auto ex = std::make_unique<testing::FakeExecutor>(c.cache, kVocab);
    ex->set_scope(std::move(scope));
    fake = ex.get();
    engine = std::make_unique<Engine>(c, std::move(ex));
    fake->set_tokens_of([this](RequestId id) { return engine->scheduler().find(id)->tokens(); });
  }
  testing::FakeExecutor* fake;
  std::unique_ptr<Engine> engine;
};

GenerateRequest request(int n, int64_t max_tokens, int32_t salt = 0) {
  GenerateRequest r;
  for (int i = 0; i < n; ++i) r.prompt.push_back(1 + (i * 5 + salt * 11) % (kVocab - 1));
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

std::vector<TokenEvent> drain(TokenStream& s) {
  std::vector<TokenEvent> out;
  while (auto e = s.try_next()) out.push_back(std::move(*e));
  return out;
}

TEST(Engine, StreamsTokensThenOneFinishWithStats) {
  Rig rig;
  auto sub = rig.engine->submit(request(20, 5));
  rig.engine->run_until_idle();
  const auto events = drain(*sub.stream);
  ASSERT_EQ(events.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(events[i].id, sub.id);
    EXPECT_GE(events[i].token, 0);
    EXPECT_EQ(events[i].finished, i == 4);
  }
  EXPECT_EQ(events[4].reason, FinishReason::length);
  const RequestStats& st = events[4].stats;
  EXPECT_EQ(st.prompt_tokens, 20);
  EXPECT_EQ(st.output_tokens, 5);
  EXPECT_GT(st.ttft_seconds(), 0.0);
  EXPECT_GE(st.ttft_seconds(), st.queue_seconds());
  EXPECT_GE(st.decode_tokens_per_second(), 0.0);
  EXPECT_TRUE(sub.stream->done());
  EXPECT_FALSE(sub.stream->next().has_value());  // after the last event: nothing, no block
  const EngineStats s = rig.engine->stats();
  EXPECT_EQ(s.submitted, 1);
  EXPECT_EQ(s.finished, 1);
  EXPECT_EQ(s.generated_tokens, 5);
  EXPECT_EQ(s.cache.slots_in_use, 0);
  EXPECT_EQ(rig.fake->num_states(), 0u);
}

// Every step is routed once, by the executor's scope, in the plan the executor runs; the engine
// counts the routes that ran. Three requests of different lengths, fused path for at most 2 rows,
// graphs for at most 2 sequences: prefill steps fall back with kNotPureDecode, 3-row decode steps
// with more_than_2_rows and no bucket, the 2- and 1-row decode steps at the end are fused graph steps.
TEST(Engine, RoutesEveryStepByTheExecutorsScopeAndCountsThem) {
  scheduler::ExecutionScope scope;
  scope.fused_selected = true;
  scope.fused_max_rows = 2;
  scope.graph_max_batch = 2;
  scope.graph_max_rows = 8;
  scope.graph_max_blocks = 64;
  Rig rig(engine_config(), scope);
  std::vector<Engine::Submission> subs;
  for (int i = 0; i < 3; ++i) subs.push_back(rig.engine->submit(request(10 + 3 * i, 3 + 2 * i, i)));
  rig.engine->run_until_idle();
  for (auto& s : subs) EXPECT_EQ(drain(*s.stream).back().reason, FinishReason::length);
  const std::vector<core::StepRoute>& routes = rig.fake->routes();
  core::DecodePathCounters want;
  std::set<std::string> reasons;
  bool saw_graph_1 = false, saw_graph_2 = false;
  for (const core::StepRoute& r : routes) {
    want.count(r);
    if (r.path == core::DecodePath::fused) {
      EXPECT_TRUE(r.fallback.empty());
      EXPECT_TRUE(r.graph.captured());
      EXPECT_EQ(r.graph.rows, 1);
      saw_graph_1 |= r.graph.batch == 1;
      saw_graph_2 |= r.graph.batch == 2;
    } else {
      reasons.insert(r.fallback);
      if (r.fallback == scheduler::too_many_rows(2)) EXPECT_FALSE(r.graph.captured()) << "3 sequences: no bucket";
    }
  }
  EXPECT_EQ(reasons, (std::set<std::string>{scheduler::kNotPureDecode, "more_than_2_rows"}));
  EXPECT_TRUE(saw_graph_1 && saw_graph_2);
  const core::DecodePathCounters got = rig.engine->stats().decode_paths;
  EXPECT_EQ(got.fused_steps, want.fused_steps);
  EXPECT_EQ(got.standard_steps, want.standard_steps);
  EXPECT_EQ(got.fallbacks, want.fallbacks);
  EXPECT_EQ(got.fused_steps + got.standard_steps, static_cast<int64_t>(routes.size()));
  EXPECT_EQ(rig.engine->last_route().path, core::DecodePath::fused);  // the longest request's last step, alone
}

TEST(Engine, RejectsEveryBadParameterWithItsName) {
  Rig rig;
  auto message = [&](GenerateRequest r) {
    try {
      rig.engine->submit(std::move(r));
    } catch (const core::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto has = [](const std::string& m, const char* what) { return m.find(what) != std::string::npos; };
  GenerateRequest r = request(4, 4);
  r.prompt[2] = kVocab;
  EXPECT_TRUE(has(message(r), "prompt token 2 (id 64) is outside the vocabulary"));
  EXPECT_TRUE(has(message(request(0, 4)), "prompt is empty"));
  EXPECT_TRUE(has(message(request(4, 0)), "max_tokens must be >= 1"));
  EXPECT_TRUE(has(message(request(150, 11)), "exceeds max_model_len (160)"));
  EXPECT_TRUE(has(message(request(160, 1)), "max_model_len is 160"));
  r = request(4, 4);
  r.stop_token_ids = {-1};
  EXPECT_TRUE(has(message(r), "stop_token_ids"));
  r = request(4, 4);
  r.sampling.temperature = -1;
  EXPECT_TRUE(has(message(r), "temperature"));
  r = request(4, 4);
  r.sampling.logprobs = 21;
  EXPECT_TRUE(has(message(r), "logprobs"));
  r = request(4, 4);
  r.sampling.logit_bias = {{kVocab, 1.0f}};
  EXPECT_TRUE(has(message(r), "logit_bias"));
  EXPECT_EQ(rig.engine->stats().submitted, 0);
}

TEST(Engine, AbortInAnyStateEndsTheStreamOnce) {
  EngineConfig c = engine_config();
  c.scheduler.max_num_seqs = 2;
  Rig rig(c);
  auto running = rig.engine->submit(request(20, 100, 1));
  auto prefilling = rig.engine->submit(request(120, 30, 2));
  auto waiting = rig.engine->submit(request(10, 10, 3));
  EXPECT_TRUE(rig.engine->step());
  EXPECT_TRUE(rig.engine->step());
  EXPECT_TRUE(rig.engine->abort(waiting.id));
  EXPECT_TRUE(rig.engine->abort(prefilling.id));
  rig.engine->step();
  EXPECT_TRUE(rig.engine->abort(running.id));
  EXPECT_FALSE(rig.engine->abort(waiting.id));  // already finished
  EXPECT_FALSE(rig.engine->abort(999));
  rig.engine->run_until_idle();
  for (auto* sub : {&running, &prefilling, &waiting}) {
    const auto ev = drain(*sub->stream);
    ASSERT_FALSE(ev.empty());
    EXPECT_TRUE(ev.back().finished);
    EXPECT_EQ(ev.back().reason, FinishReason::abort);
    int finishes = 0;
    for (const auto& e : ev) finishes += e.finished;
    EXPECT_EQ(finishes, 1);
  }
  EXPECT_EQ(rig.engine->stats().aborted, 3);
  EXPECT_EQ(rig.engine->scheduler().check(), "");
  EXPECT_EQ(rig.engine->stats().cache.blocks_in_use, 0);
  EXPECT_EQ(rig.fake->num_states(), 0u);
}

TEST(Engine, CallbackAndLogprobs) {
  Rig rig;
  std::vector<TokenEvent> seen;
  GenerateRequest r = request(9, 3);
  r.sampling.logprobs = 4;
  r.on_event = [&](const TokenEvent& e) { seen.push_back(e); };
  auto sub = rig.engine->submit(std::move(r));
  rig.engine->run_until_idle();
  const auto on_stream = drain(*sub.stream);  // only the last event
  ASSERT_EQ(on_stream.size(), 1u);
  EXPECT_TRUE(on_stream[0].finished);
  ASSERT_EQ(seen.size(), 3u);
  for (const auto& e : seen) {
    ASSERT_EQ(e.top_logprobs.size(), 4u);
    EXPECT_EQ(e.top_logprobs[0].first, e.token);  // greedy: the top token is the sampled one
    EXPECT_FLOAT_EQ(e.top_logprobs[0].second, e.logprob);
    EXPECT_LT(e.logprob, 0.0f);
  }
}

// A client that has its last event already finds its tokens and its finish in stats(): the
// server's /metrics must not lag the replies (a load generator diffs them right after a run).
TEST(Engine, StatsCountEveryEventBeforeTheClientSeesIt) {
  Rig rig;
  int64_t seen_tokens = 0, seen_finishes = 0, lagging = 0;
  const auto on_event = [&](const TokenEvent& e) {
    seen_tokens += e.token >= 0 ? 1 : 0;
    seen_finishes += e.finished ? 1 : 0;
    const EngineStats s = rig.engine->stats();
    if (s.generated_tokens < seen_tokens || s.finished < seen_finishes) ++lagging;
  };
  for (int32_t salt = 0; salt < 4; ++salt) {
    GenerateRequest r = request(9 + salt, 2 + salt, salt);
    r.on_event = on_event;
    rig.engine->submit(std::move(r));
  }
  GenerateRequest r = request(12, 50, 7);
  r.on_event = on_event;
  auto aborted = rig.engine->submit(std::move(r));
  rig.engine->step();
  rig.engine->step();
  rig.engine->abort(aborted.id);
  rig.engine->run_until_idle();
  EXPECT_EQ(lagging, 0);
  EXPECT_EQ(seen_finishes, 5);
  const EngineStats end = rig.engine->stats();
  EXPECT_EQ(end.generated_tokens, seen_tokens);
  EXPECT_EQ(end.finished, 5);
  EXPECT_EQ(end.aborted, 1);
  const auto ev = drain(*aborted.stream);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().reason, FinishReason::abort);
}

TEST(Engine, FailedStepErrorsItsRequestsAndTheRestContinue) {
  Rig rig;
  rig.fake->fail_on_call(2);
  auto a = rig.engine->submit(request(10, 6, 1));
  auto b = rig.engine->submit(request(10, 6, 2));
  rig.engine->step();
  rig.engine->step();  // fails: a and b finish with error
  EXPECT_FALSE(rig.engine->scheduler().has_work());
  auto c = rig.engine->submit(request(10, 4, 3));  // arrives after the failure
  rig.engine->run_until_idle();
  for (auto* s : {&a, &b}) {
    const auto ev = drain(*s->stream);
    ASSERT_FALSE(ev.empty());
    EXPECT_EQ(ev.back().reason, FinishReason::error);
    EXPECT_NE(ev.back().error.find("injected failure"), std::string::npos);
  }
  const auto ev = drain(*c.stream);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev.back().reason, FinishReason::length);
  EXPECT_EQ(rig.engine->stats().failed, 2);
  EXPECT_EQ(rig.engine->scheduler().check(), "");
  EXPECT_EQ(rig.engine->stats().cache.slots_in_use, 0);
}

TEST(Engine, LoopThreadServesConcurrentClients) {
  Rig rig;
  rig.engine->start();
  std::vector<std::thread> clients;
  std::atomic<int> finished{0}, tokens{0};
  for (int t = 0; t < 4; ++t)
    clients.emplace_back([&, t] {
      for (int k = 0; k < 10; ++k) {
        auto sub = rig.engine->submit(request(5 + k * 3, 4 + k % 3, t * 10 + k));
        if (k % 4 == 3) rig.engine->abort(sub.id);
        while (auto e = sub.stream->next()) {
          tokens += e->token >= 0;
          finished += e->finished;
        }
      }
    });
  for (auto& c : clients) c.join();
  rig.engine->stop();
  EXPECT_EQ(finished.load(), 40);
  const EngineStats s = rig.engine->stats();
  EXPECT_EQ(s.submitted, 40);
  EXPECT_EQ(s.finished, 40);
  EXPECT_EQ(s.generated_tokens, tokens.load());
  EXPECT_EQ(s.cache.slots_in_use, 0);
}

TEST(Engine, DestructorAbortsWhatIsLeft) {
  std::shared_ptr<TokenStream> stream;
  {
    Rig rig;
    stream = rig.engine->submit(request(10, 50)).stream;
    rig.engine->step();
  }
  std::optional<TokenEvent> last;
  while (auto e = stream->next()) last = std::move(e);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->reason, FinishReason::abort);
}

// Many requests, shared prefixes, tight memory, aborts: outputs equal a roomy uncached run.
TEST(Engine, RandomizedGreedyOutputsMatchUncachedRoomyRun) {
  core::Rng rng(42);
  std::vector<std::vector<int32_t>> prefixes(4);
  for (auto& p : prefixes) {
    p.resize(20 + rng.next_u64() % 60);
    for (auto& t : p) t = 1 + static_cast<int32_t>(rng.next_u64() % (kVocab - 1));
  }
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 200; ++i) {
    GenerateRequest r;
    if (rng.uniform() < 0.8) r.prompt = prefixes[rng.next_u64() % 4];
    const int extra = 1 + static_cast<int>(rng.next_u64() % 20);
    for (int k = 0; k < extra; ++k) r.prompt.push_back(1 + static_cast<int32_t>(rng.next_u64() % (kVocab - 1)));
    r.max_tokens = 1 + static_cast<int64_t>(rng.next_u64() % 30);
    r.ignore_eos = rng.uniform() < 0.5;
    reqs.push_back(r);
  }
  struct RunResult {
    std::vector<std::vector<int32_t>> outputs;
    std::vector<FinishReason> reasons;
    EngineStats stats;
  };
  auto run = [&](const EngineConfig& c, double abort_rate) {
    Rig rig(c);
    std::vector<Engine::Submission> subs;
    core::Rng arng(7);
    size_t next = 0;
    while (next < reqs.size() || rig.engine->scheduler().has_work()) {
      for (int k = 0; k < 3 && next < reqs.size(); ++k, ++next) subs.push_back(rig.engine->submit(reqs[next]));
      if (abort_rate > 0 && arng.uniform() < abort_rate) rig.engine->abort(subs[arng.next_u64() % subs.size()].id);
      rig.engine->step();
      const std::string inv = rig.engine->scheduler().check();
      if (!inv.empty()) {
        ADD_FAILURE() << inv;
        break;
      }
    }
    RunResult res;
    res.outputs.resize(reqs.size());
    res.reasons.resize(reqs.size());
    for (size_t i = 0; i < subs.size(); ++i) {
      int finishes = 0;
      for (const TokenEvent& e : drain(*subs[i].stream)) {
        if (e.token >= 0) res.outputs[i].push_back(e.token);
        finishes += e.finished;
        if (e.finished) res.reasons[i] = e.reason;
      }
      EXPECT_EQ(finishes, 1) << "request " << i;
    }
    res.stats = rig.engine->stats();
    EXPECT_EQ(res.stats.cache.blocks_in_use, 0);
    EXPECT_EQ(res.stats.cache.slots_in_use, 0);
    EXPECT_EQ(res.stats.cache.checkpoints_pending, 0);
    EXPECT_EQ(rig.fake->num_states(), 0u);
    return res;
  };
  const RunResult ref = run(engine_config(200, false), 0.0);
  const RunResult tight = run(engine_config(22, true), 0.0);
  EXPECT_EQ(ref.stats.prefix_hit_tokens, 0);
  EXPECT_GT(tight.stats.prefix_hit_tokens, 0);
  EXPECT_GT(tight.stats.preemptions, 0);
  EXPECT_EQ(tight.outputs, ref.outputs);
  EXPECT_EQ(tight.reasons, ref.reasons);
  // With aborts: every request still finishes once; an aborted one got a prefix of its output.
  const RunResult aborted = run(engine_config(22, true), 0.1);
  int n_aborted = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& got = aborted.outputs[i];
    ASSERT_LE(got.size(), ref.outputs[i].size());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), ref.outputs[i].begin())) << "request " << i;
    if (aborted.reasons[i] == FinishReason::abort) ++n_aborted;
    else EXPECT_EQ(got, ref.outputs[i]);
  }
  EXPECT_GT(n_aborted, 5);
}

// Scoring requests (prompt_logits, forced_output) in a cache so tight that requests are preempted
// and recomputed: each still gets every position's row once, in order, and the forced tokens as
// its output; the free requests beside them are unaffected.
TEST(Engine, ScoringRowsComeOncePerPositionThroughPreemption) {
  auto run = [](const EngineConfig& c, std::vector<std::vector<int64_t>>* positions) {
    Rig rig(c);
    std::vector<Engine::Submission> subs;
    positions->assign(12, {});
    for (int i = 0; i < 12; ++i) {
      GenerateRequest r = request(30 + 3 * i, 12, i);
      if (i % 2 == 0) {
        r.prompt_logits = true;
        r.forced_output = {5, 6, 7, static_cast<int32_t>(8 + i)};
        r.on_logits = [positions, i](int64_t p, std::span<const float> row) {
          EXPECT_EQ(row.size(), static_cast<size_t>(kVocab));
          (*positions)[static_cast<size_t>(i)].push_back(p);
        };
      }
      subs.push_back(rig.engine->submit(std::move(r)));
    }
    rig.engine->run_until_idle();
    std::vector<std::vector<int32_t>> outputs;
    for (const Engine::Submission& s : subs) {
      outputs.emplace_back();
      for (const TokenEvent& e : drain(*s.stream))
        if (e.token >= 0) outputs.back().push_back(e.token);
    }
    EXPECT_EQ(rig.engine->stats().cache.blocks_in_use, 0);
    return std::make_pair(outputs, rig.engine->stats().preemptions);
  };
  std::vector<std::vector<int64_t>> roomy_pos, tight_pos;
  const auto roomy = run(engine_config(200, false), &roomy_pos);
  const auto tight = run(engine_config(22, false), &tight_pos);
  EXPECT_EQ(roomy.second, 0);
  EXPECT_GT(tight.second, 0);
  EXPECT_EQ(tight.first, roomy.first);
  for (int i = 0; i < 12; i += 2) {
    const auto& out = tight.first[static_cast<size_t>(i)];
    ASSERT_EQ(out.size(), 12u);
    EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 4), (std::vector<int32_t>{5, 6, 7, 8 + i}));
    // Rows after every prompt position and every output token but the last.
    std::vector<int64_t> want(static_cast<size_t>(30 + 3 * i + 12 - 1));
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(tight_pos[static_cast<size_t>(i)], want) << "request " << i;
    EXPECT_EQ(roomy_pos[static_cast<size_t>(i)], want) << "request " << i;
  }
}

}  // namespace
}  // namespace k3::engine
