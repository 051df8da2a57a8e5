// scheduler/scheduler_sim_test.cpp: randomized workload simulations of scheduler + cache with
// the fake storage (fake_kv_storage.h) standing in for the model: hundreds of requests with
// random lengths, shared prefixes, stop tokens, aborts, arrivals over time, and memory tight
// enough to preempt. After every step: Scheduler::check() (no leaked page, slot or checkpoint;
// ref counts match the live block tables), every request finishes exactly once, no event after
// its finish; the fake storage checks every KV read. Across configurations (prefix cache on and
// off, tight and roomy memory, other budgets and granularities) each request's output tokens
// are identical: cached runs and preempted runs compute what uncached runs compute.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/rng.h"
#include "scheduler/fake_kv_storage.h"
#include "scheduler/scheduler.h"

namespace k3::scheduler {
namespace {

constexpr int32_t kVocab = 60;
constexpr int32_t kEos = 0;

struct Workload {
  struct Item {
    int arrival_step;
    RequestSpec spec;
  };
  std::vector<Item> items;
};

Workload make_workload(uint64_t seed, int n, int64_t max_model_len) {
  core::Rng rng(seed);
  auto uniform_int = [&](int lo, int hi) {
    return lo + static_cast<int>(rng.next_u64() % static_cast<uint64_t>(hi - lo + 1));
  };
  std::vector<std::vector<int32_t>> prefixes(6);
  for (auto& p : prefixes) {
    p.resize(static_cast<size_t>(uniform_int(8, 120)));
    for (auto& t : p) t = uniform_int(1, kVocab - 1);
  }
  Workload w;
  int step = 0;
  for (int i = 0; i < n; ++i) {
    step += uniform_int(0, 2);
    RequestSpec s;
    if (rng.uniform() < 0.7) s.prompt = prefixes[static_cast<size_t>(uniform_int(0, 5))];
    const int suffix = uniform_int(rng.uniform() < 0.2 ? 0 : 1, 50);
    for (int k = 0; k < suffix || s.prompt.empty(); ++k) s.prompt.push_back(uniform_int(1, kVocab - 1));
    const int64_t room = max_model_len - static_cast<int64_t>(s.prompt.size());
    s.max_tokens = std::min<int64_t>(room, uniform_int(1, 40));
    if (rng.uniform() < 0.3) s.stop_token_ids = {uniform_int(1, kVocab - 1)};
    s.eos_token_id = kEos;
    s.ignore_eos = rng.uniform() < 0.2;
    w.items.push_back({step, std::move(s)});
  }
  return w;
}

struct SimConfig {
  cache::CacheConfig cache;
  SchedulerConfig sched;
  double abort_rate = 0.0;  // per step, abort one random live request
  uint64_t abort_seed = 1;
};

struct SimResult {
  std::map<RequestId, std::vector<int32_t>> outputs;
  std::map<RequestId, FinishReason> reasons;
  SchedulerCounters counters;
  int steps = 0;
};

SimResult simulate(const Workload& w, const SimConfig& cfg) {
  Scheduler sched(cfg.sched, cfg.cache);
  testing::FakeKvStorage kv(cfg.cache, kVocab);
  core::Rng abort_rng(cfg.abort_seed);
  SimResult res;
  StepPlan out;
  std::vector<RequestEvent> events;
  std::vector<int32_t> sampled;
  std::set<RequestId> live;
  size_t next = 0;
  auto tokens_of = [&](RequestId id) { return sched.find(id)->tokens(); };
  auto consume = [&]() {
    for (const RequestEvent& e : events) {
      EXPECT_FALSE(res.reasons.contains(e.id)) << "event after finish for request " << e.id;
      if (e.token >= 0) res.outputs[e.id].push_back(e.token);
      if (e.finished) {
        res.reasons[e.id] = e.reason;
        live.erase(e.id);
        kv.drop(e.id);
        EXPECT_EQ(e.stats.output_tokens, static_cast<int64_t>(res.outputs[e.id].size()));
      }
    }
    events.clear();
  };
  for (int step = 0; next < w.items.size() || sched.has_work(); ++step) {
    if (step > 200000) {
      ADD_FAILURE() << "simulation did not finish";
      break;
    }
    while (next < w.items.size() && w.items[next].arrival_step <= step) {
      sched.add(next + 1, w.items[next].spec);
      live.insert(next + 1);
      ++next;
    }
    if (cfg.abort_rate > 0 && !live.empty() && abort_rng.uniform() < cfg.abort_rate) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(abort_rng.next_u64() % live.size()));
      EXPECT_TRUE(sched.abort(*it, events));
      consume();
      const std::string inv = sched.check();
      if (!inv.empty()) {
        ADD_FAILURE() << "after abort: " << inv;
        break;
      }
    }
    sched.schedule(out);
    sampled.clear();
    try {
      kv.run_step(out, tokens_of, sampled);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "step " << step << ": " << e.what();
      break;
    }
    if (!out.empty()) sched.update(out, sampled, events);
    consume();
    ++res.steps;
    const std::string inv = sched.check();
    if (!inv.empty()) {
      ADD_FAILURE() << "step " << step << ": " << inv;
      break;
    }
  }
  EXPECT_EQ(res.reasons.size(), w.items.size()) << "every request finishes exactly once";
  const auto u = sched.cache().usage();
  EXPECT_EQ(u.blocks_in_use, 0);
  EXPECT_EQ(u.slots_in_use, 0);
  EXPECT_EQ(u.checkpoints_pending, 0);
  EXPECT_EQ(kv.num_sequences(), 0u);
  EXPECT_EQ(sched.check(), "");
  res.counters = sched.counters();
  return res;
}

SimConfig base_config(int32_t block_size, int32_t interval, int32_t num_blocks) {
  SimConfig c;
  c.cache.block_size = block_size;
  c.cache.num_blocks = num_blocks;
  c.cache.num_slots = 8;
  c.cache.num_checkpoints = 12;
  c.cache.checkpoint_interval_blocks = interval;
  c.sched.max_num_seqs = 8;
  c.sched.max_num_batched_tokens = 96;
  c.sched.long_prefill_token_threshold = 48;
  c.sched.max_partial_prefills = 3;
  c.sched.max_model_len = 224;
  return c;
}

struct SimCase {
  uint64_t seed;
  int32_t block_size;
  int32_t interval;
};

class SchedulerSim : public ::testing::TestWithParam<SimCase> {};

TEST_P(SchedulerSim, InvariantsHoldAndOutputsMatchAcrossConfigs) {
  const SimCase p = GetParam();
  const int32_t min_blocks = (224 + p.block_size - 1) / p.block_size;
  const Workload w = make_workload(p.seed, 300, 224);

  SimConfig roomy = base_config(p.block_size, p.interval, min_blocks * 8);
  roomy.cache.num_checkpoints = 48;
  const SimResult ref = simulate(w, roomy);
  EXPECT_GT(ref.counters.prefix_hit_tokens, 0) << "the workload shares prefixes: the cache must hit";

  SimConfig off = roomy;
  off.cache.enable_prefix_cache = false;
  const SimResult uncached = simulate(w, off);
  EXPECT_EQ(uncached.counters.prefix_hit_tokens, 0);

  SimConfig tight = base_config(p.block_size, p.interval, min_blocks + 2);
  tight.cache.num_checkpoints = 3;
  const SimResult pressed = simulate(w, tight);
  EXPECT_GT(pressed.counters.preemptions, 0) << "memory this tight must preempt";

  SimConfig other = roomy;
  other.sched.max_num_batched_tokens = 40;
  other.sched.long_prefill_token_threshold = 2 * p.block_size;
  other.sched.max_partial_prefills = 1;
  other.cache.checkpoint_interval_blocks = p.interval + 1;
  const SimResult reshaped = simulate(w, other);

  for (const SimResult* r : {&uncached, &pressed, &reshaped}) {
    EXPECT_EQ(r->outputs, ref.outputs);
    EXPECT_EQ(r->reasons, ref.reasons);
  }
  int stops = 0, lengths = 0;
  for (const auto& [id, reason] : ref.reasons) (reason == FinishReason::stop ? stops : lengths)++;
  EXPECT_GT(stops, 0);
  EXPECT_GT(lengths, 0);
}

TEST_P(SchedulerSim, RandomAbortsUnderPressureLeakNothing) {
  const SimCase p = GetParam();
  const int32_t min_blocks = (224 + p.block_size - 1) / p.block_size;
  const Workload w = make_workload(p.seed + 100, 300, 224);
  SimConfig tight = base_config(p.block_size, p.interval, min_blocks + 3);
  tight.cache.num_checkpoints = 4;
  tight.abort_rate = 0.08;
  tight.abort_seed = p.seed;
  const SimResult r = simulate(w, tight);
  int aborts = 0;
  for (const auto& [id, reason] : r.reasons) aborts += reason == FinishReason::abort;
  EXPECT_GT(aborts, 10);
  EXPECT_GT(r.counters.preemptions, 0);
}

INSTANTIATE_TEST_SUITE_P(Seeds, SchedulerSim,
                         ::testing::Values(SimCase{1, 16, 1}, SimCase{2, 16, 2}, SimCase{3, 4, 3}, SimCase{4, 8, 1},
                                           SimCase{5, 4, 1}));

}  // namespace
}  // namespace k3::scheduler
