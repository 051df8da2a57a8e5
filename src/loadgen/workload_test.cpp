// loadgen/workload_test.cpp: workload generators are deterministic by seed, keep lengths and
// token ids in their ranges, share prefixes where they should; agentic sessions grow by the
// previous reply plus the configured increment; the trace reader's sessions, shared blocks,
// timings, and errors that name the line and the field.
#include "loadgen/workload.h"

#include <gtest/gtest.h>

#include <limits>
#include <set>

#include "core/error.h"
#include "loadgen/runner.h"
#include "loadgen/stats.h"

namespace k3::loadgen {
namespace {

bool same_sessions(const std::vector<Session>& a, const std::vector<Session>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].id != b[i].id || a[i].turns.size() != b[i].turns.size()) return false;
    for (size_t t = 0; t < a[i].turns.size(); ++t) {
      const Turn &x = a[i].turns[t], &y = b[i].turns[t];
      if (x.append != y.append || x.output_tokens != y.output_tokens || x.delay_before_s != y.delay_before_s ||
          !same_sessions(x.subagents, y.subagents))
        return false;
    }
  }
  return true;
}

void expect_ids_in_range(const std::vector<int32_t>& ids, const WorkloadSpec& spec) {
  for (int32_t id : ids) {
    ASSERT_GE(id, spec.token_low);
    ASSERT_LT(id, spec.token_high);
  }
}

TEST(Workload, RandomIsDeterministicAndInRange) {
  WorkloadSpec spec;
  spec.kind = "random";
  spec.seed = 17;
  spec.num_sessions = 97;
  spec.input = {54, 0.5};
  spec.output = {17, 0.25};
  spec.token_low = 3;
  spec.token_high = 100;
  const auto a = build_workload(spec), b = build_workload(spec);
  ASSERT_EQ(a.size(), 97u);
  EXPECT_TRUE(same_sessions(a, b));
  std::set<int64_t> input_lengths;
  for (const Session& s : a) {
    ASSERT_EQ(s.turns.size(), 1u);
    const int64_t in = static_cast<int64_t>(s.turns[0].append.size());
    EXPECT_GE(in, 27);
    EXPECT_LE(in, 81);
    EXPECT_GE(s.turns[0].output_tokens, 12);
    EXPECT_LE(s.turns[0].output_tokens, 21);
    input_lengths.insert(in);
    expect_ids_in_range(s.turns[0].append, spec);
  }
  EXPECT_GT(input_lengths.size(), 10u);  // lengths really vary
  spec.seed = 18;
  EXPECT_FALSE(same_sessions(a, build_workload(spec)));
  EXPECT_EQ(count_requests(a), 97);
}

TEST(Workload, FixedLengthsWithZeroRangeRatio) {
  WorkloadSpec spec;
  spec.num_sessions = 5;
  spec.input = {1, 0};
  spec.output = {1, 0};
  for (const Session& s : build_workload(spec)) {
    EXPECT_EQ(s.turns[0].append.size(), 1u);
    EXPECT_EQ(s.turns[0].output_tokens, 1);
  }
}

TEST(Workload, SharedPrefixGroups) {
  WorkloadSpec spec;
  spec.kind = "shared_prefix";
  spec.num_sessions = 9;
  spec.num_prefixes = 2;
  spec.prefix_len = 54;
  spec.input = {17, 0};
  const auto sessions = build_workload(spec);
  auto prefix = [&](size_t i) {
    const auto& a = sessions[i].turns[0].append;
    return std::vector<int32_t>(a.begin(), a.begin() + 54);
  };
  for (size_t i = 0; i < sessions.size(); ++i) {
    ASSERT_EQ(sessions[i].turns[0].append.size(), 54u + 17u);
    EXPECT_EQ(prefix(i), prefix(i % 2)) << "session " << i;
  }
  EXPECT_NE(prefix(0), prefix(1));
  // The suffixes are each session's own.
  EXPECT_NE(sessions[0].turns[0].append, sessions[2].turns[0].append);
}

TEST(Workload, AgenticSessionsGrowByReplyPlusIncrement) {
  WorkloadSpec spec;
  spec.kind = "agentic";
  spec.seed = 3;
  spec.num_sessions = 4;
  spec.first_turn = {500, 0.1};
  spec.turn_increment = {80, 0.25};
  spec.agent_output = {50, 0};
  spec.turns_min = 10;
  spec.turns_max = 15;
  spec.pause_mean_s = 2.0;
  const auto sessions = build_workload(spec);
  EXPECT_TRUE(same_sessions(sessions, build_workload(spec)));
  std::set<size_t> turn_counts;
  for (const Session& s : sessions) {
    ASSERT_GE(s.turns.size(), 10u);
    ASSERT_LE(s.turns.size(), 15u);
    turn_counts.insert(s.turns.size());
    const int64_t first = static_cast<int64_t>(s.turns[0].append.size());
    EXPECT_GE(first, 450);
    EXPECT_LE(first, 550);
    EXPECT_EQ(s.turns[0].delay_before_s, 0);
    int64_t context = first;
    for (size_t t = 1; t < s.turns.size(); ++t) {
      const Turn& turn = s.turns[t];
      EXPECT_FALSE(turn.reset_context);  // append-only: each prompt extends the previous one
      const int64_t growth = static_cast<int64_t>(turn.append.size());
      const int64_t increment = growth - s.turns[t - 1].output_tokens;
      EXPECT_GE(increment, 60) << "turn " << t;
      EXPECT_LE(increment, 100) << "turn " << t;
      EXPECT_GE(turn.delay_before_s, 1.0);
      EXPECT_LE(turn.delay_before_s, 3.0);
      EXPECT_EQ(turn.output_tokens, 50);
      context += growth;
      expect_ids_in_range(turn.append, spec);
    }
    EXPECT_GT(context, first + static_cast<int64_t>(s.turns.size() - 1) * (50 + 60) - 1);
  }
  EXPECT_EQ(count_requests(sessions), static_cast<int64_t>(sessions[0].turns.size() + sessions[1].turns.size() +
                                                           sessions[2].turns.size() + sessions[3].turns.size()));
}

TEST(Workload, AgenticSubagentsForkFromTheMiddleTurn) {
  WorkloadSpec spec;
  spec.kind = "agentic";
  spec.num_sessions = 3;
  spec.first_turn = {97, 0};
  spec.turn_increment = {17, 0};
  spec.agent_output = {5, 0};
  spec.turns_min = spec.turns_max = 5;
  spec.subagents = 2;
  spec.subagent_turns = 3;
  spec.subagent_increment = {11, 0};
  const auto sessions = build_workload(spec);
  std::set<int64_t> ids;
  for (const Session& s : sessions) {
    ids.insert(s.id);
    for (size_t t = 0; t < s.turns.size(); ++t) {
      if (t != 2) {
        EXPECT_TRUE(s.turns[t].subagents.empty());
        continue;
      }
      ASSERT_EQ(s.turns[t].subagents.size(), 2u);
      for (const Session& sub : s.turns[t].subagents) {
        ids.insert(sub.id);
        ASSERT_EQ(sub.turns.size(), 3u);
        EXPECT_EQ(sub.turns[0].append.size(), 11u);  // new input only: the parent's context is shared
        EXPECT_EQ(sub.turns[1].append.size(), 5u + 11u);
        EXPECT_TRUE(sub.turns[0].subagents.empty());
      }
    }
  }
  EXPECT_EQ(ids.size(), 3u + 3u * 2u);  // every session and sub-agent has its own id
  EXPECT_EQ(count_requests(sessions), 3 * 5 + 3 * 2 * 3);
}

TEST(Workload, ValidationNamesTheField) {
  WorkloadSpec spec;
  spec.kind = "chat";
  EXPECT_THROW(spec.validate(), core::Error);
  spec.kind = "agentic";
  spec.turns_min = 5;
  spec.turns_max = 4;
  try {
    spec.validate();
    FAIL() << "no error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("turns"), std::string::npos) << e.what();
  }
  spec = WorkloadSpec{};
  spec.input = {10, 1.5};
  try {
    spec.validate();
    FAIL() << "no error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("input range ratio"), std::string::npos) << e.what();
  }
  spec = WorkloadSpec{};
  spec.kind = "trace";
  EXPECT_THROW(spec.validate(), core::Error);  // no trace file
  EXPECT_EQ(WorkloadSpec::from_json(WorkloadSpec{}.to_json()).to_json(), WorkloadSpec{}.to_json());
}

TEST(Trace, SessionsBlocksAndTimes) {
  WorkloadSpec spec;
  spec.trace_block_size = 16;
  spec.trace_time_scale = 0.5;
  const std::string text =
      "# a comment line, then a blank one\n"
      "\n"
      "{\"session_id\": \"a\", \"timestamp\": 10.0, \"input_length\": 40, \"output_length\": 7, \"hash_ids\": [1, 2, 3]}\n"
      "{\"session_id\": 5, \"timestamp\": 12.0, \"input_length\": 20, \"output_length\": 3, \"hash_ids\": [1]}\n"
      "{\"session_id\": \"a\", \"delay\": 4.0, \"input_length\": 54, \"output_length\": 9, \"hash_ids\": [1, 2, 3, 4]}\n"
      "{\"input_length\": 17, \"output_length\": 1}\n";
  const auto sessions = parse_trace(text, spec, "t.jsonl");
  ASSERT_EQ(sessions.size(), 3u);
  ASSERT_EQ(sessions[0].turns.size(), 2u);
  ASSERT_EQ(sessions[1].turns.size(), 1u);
  ASSERT_EQ(sessions[2].turns.size(), 1u);
  const auto& a0 = sessions[0].turns[0].append;
  const auto& a1 = sessions[0].turns[1].append;
  const auto& b0 = sessions[1].turns[0].append;
  EXPECT_EQ(a0.size(), 40u);
  EXPECT_EQ(a1.size(), 54u);
  EXPECT_EQ(b0.size(), 20u);
  EXPECT_EQ(sessions[2].turns[0].append.size(), 17u);
  EXPECT_TRUE(sessions[0].turns[1].reset_context);
  EXPECT_EQ(sessions[0].turns[1].output_tokens, 9);
  // Block 1 opens all three prompts; blocks 1-3 (48 tokens) open turn 2, of which turn 1 is the first 40.
  EXPECT_TRUE(std::equal(a0.begin(), a0.begin() + 16, b0.begin()));
  EXPECT_TRUE(std::equal(a0.begin(), a0.end(), a1.begin()));
  EXPECT_NE(std::vector<int32_t>(b0.begin() + 16, b0.end()), std::vector<int32_t>(a0.begin() + 16, a0.begin() + 20));
  // Times: relative to the first timestamp, scaled by 0.5; the delay is scaled too.
  EXPECT_DOUBLE_EQ(sessions[0].arrival_s, 0.0);
  EXPECT_DOUBLE_EQ(sessions[1].arrival_s, 1.0);
  EXPECT_DOUBLE_EQ(sessions[2].arrival_s, -1.0);
  EXPECT_DOUBLE_EQ(sessions[0].turns[1].delay_before_s, 2.0);
  EXPECT_EQ(count_requests(sessions), 4);
}

std::string trace_error(const std::string& text) {
  try {
    parse_trace(text, WorkloadSpec{}, "bad.jsonl");
  } catch (const core::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Trace, ErrorsNameLineAndField) {
  const std::string ok = "{\"input_length\": 5, \"output_length\": 1}\n";
  EXPECT_NE(trace_error(ok + "{\"output_length\": 1}\n").find("bad.jsonl line 2: field 'input_length' is missing"),
            std::string::npos);
  EXPECT_NE(trace_error(ok + ok + "{\"input_length\": 0, \"output_length\": 1}\n")
                .find("line 3: field 'input_length' must be a positive integer, got 0"),
            std::string::npos);
  EXPECT_NE(trace_error("{\"input_length\": 5, \"output_length\": \"x\"}").find("line 1: field 'output_length'"),
            std::string::npos);
  EXPECT_NE(trace_error("{\"input_length\": 5, \"output_length\": 2, \"hash_ids\": [1, \"a\"]}")
                .find("line 1: field 'hash_ids[1]' must be an integer"),
            std::string::npos);
  EXPECT_NE(trace_error("{\"input_length\": 5, \"output_length\": 2, \"timestamp\": -1}").find("field 'timestamp'"),
            std::string::npos);
  EXPECT_NE(trace_error(ok + "{not json\n").find("bad.jsonl line 2: not valid JSON"), std::string::npos);
  EXPECT_NE(trace_error("[1, 2]").find("line 1: expected a JSON object"), std::string::npos);
  EXPECT_NE(trace_error("\n# nothing\n").find("no requests"), std::string::npos);
}

TEST(Arrivals, PoissonAtTheRateAndTraceTimestamps) {
  std::vector<Session> sessions(2000);
  const std::vector<double> t = arrival_times(sessions, 4.0, 5);
  ASSERT_EQ(t.size(), 2000u);
  std::vector<double> gaps;
  for (size_t i = 0; i < t.size(); ++i) gaps.push_back(t[i] - (i ? t[i - 1] : 0.0));
  for (double g : gaps) ASSERT_GE(g, 0);
  // Exponential gaps of mean 1/4 s: mean and standard deviation both 0.25 (within sampling error).
  EXPECT_NEAR(mean(gaps), 0.25, 0.02);
  EXPECT_NEAR(stddev(gaps), 0.25, 0.03);
  EXPECT_EQ(arrival_times(sessions, 4.0, 5), t);  // seeded
  EXPECT_NE(arrival_times(sessions, 4.0, 6), t);
  for (double x : arrival_times(sessions, std::numeric_limits<double>::infinity(), 5)) ASSERT_EQ(x, 0);
  // Sessions with timestamps start at them; the others follow the Poisson clock from there.
  std::vector<Session> trace(3);
  trace[0].arrival_s = 0;
  trace[1].arrival_s = 7.5;
  const std::vector<double> tt = arrival_times(trace, 1e9, 1);
  EXPECT_EQ(tt[0], 0);
  EXPECT_EQ(tt[1], 7.5);
  EXPECT_NEAR(tt[2], 7.5, 1e-6);
  EXPECT_THROW(arrival_times(trace, 0, 1), core::Error);
}

}  // namespace
}  // namespace k3::loadgen
