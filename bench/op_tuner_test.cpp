// bench/op_tuner_test.cpp: the tuning recorder on stand-in timings: interleaved timed rounds and
// their median, the order at each size (from the stated one, beyond a margin), rules merged across
// sizes with one order, and a table that reads back as a kernels::TuningTable.
#include "bench/op_tuner.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "kernels/tuning.h"

namespace k3::bench {
namespace {

TEST(OpTuner, TheOrderFollowsTheSummedTimeOverTheCallsBothRan) {
  // b is faster than a on both calls; c ran only in the second call, faster than both there.
  const std::vector<std::map<std::string, double>> calls = {{{"a", 5}, {"b", 3}}, {{"a", 9}, {"b", 4}, {"c", 1}}};
  EXPECT_EQ(rank_implementations(calls), (std::vector<std::string>{"c", "b", "a"}));
  EXPECT_EQ(rank_implementations({{{"x", 2}, {"y", 2}}}), (std::vector<std::string>{"x", "y"}));  // ties keep order
}

TEST(OpTuner, TheStatedOrderStandsUnlessBeatenByMoreThanTheMargin) {
  // y is 2% faster than x: within a 3% margin, so the stated x-first order stands; z, which the
  // stated order does not list, is 20% faster than both and moves ahead.
  const std::vector<std::map<std::string, double>> calls = {{{"x", 100}, {"y", 98}},
                                                            {{"x", 100}, {"y", 98}, {"z", 80}}};
  EXPECT_EQ(rank_implementations(calls, {"x", "y"}, 0.03), (std::vector<std::string>{"z", "x", "y"}));
  EXPECT_EQ(rank_implementations(calls, {"x", "y"}, 0.0), (std::vector<std::string>{"z", "y", "x"}));
  // A 10% win beats the margin.
  EXPECT_EQ(rank_implementations({{{"x", 100}, {"y", 90}}}, {"x", "y"}, 0.03), (std::vector<std::string>{"y", "x"}));
  // Names the stated order lists but no call offered are left out.
  EXPECT_EQ(rank_implementations({{{"y", 1}}}, {"x", "y"}, 0.03), (std::vector<std::string>{"y"}));
}

// Each candidate is warmed up once, then timed `runs` times in interleaved rounds; the median counts.
TEST(OpTuner, CandidatesAreTimedInInterleavedRoundsAndTheMedianCounts) {
  std::vector<std::string> timed;
  std::map<std::string, std::vector<double>> scripted = {{"a", {9, 1, 2}}, {"b", {3, 30, 4}}};
  std::map<std::string, size_t> next;
  std::string running;
  OpTuningRecorder rec(
      [&](const std::function<void()>& run) {
        run();
        timed.push_back(running);
        return scripted[running][next[running]++];
      },
      3);
  std::map<std::string, int> runs;
  const auto cand = [&](const std::string& name) {
    return kernels::OpTuner::Candidate{name, [&, name] {
                                         running = name;
                                         ++runs[name];
                                       }};
  };
  rec.observe("op", "rows", 1, {cand("a"), cand("b")});
  EXPECT_EQ(timed, (std::vector<std::string>{"a", "b", "a", "b", "a", "b"}));
  EXPECT_EQ(runs["a"], 4);  // the warm-up, then three timed runs
  const nlohmann::json t = rec.table("Test GPU", kernels::TuningTable::parse(R"({"gpu": "*", "ops": {}})", "stated"),
                                     0);
  EXPECT_DOUBLE_EQ(t["measurements"]["op"][0]["us"]["a"].get<double>(), 2.0);  // median of 9, 1, 2
  EXPECT_DOUBLE_EQ(t["measurements"]["op"][0]["us"]["b"].get<double>(), 4.0);  // median of 3, 30, 4
  EXPECT_EQ(t["ops"]["op"]["rules"][0]["order"], nlohmann::json({"a", "b"}));
}

TEST(OpTuner, SizesWithOneOrderBecomeOneRuleAndTheTableReadsBack) {
  // Stand-in timing: each candidate's run() sets the time it "took" at the current size.
  double took = 0;
  OpTuningRecorder rec(
      [&](const std::function<void()>& run) {
        run();
        return took;
      },
      1);
  int64_t size = 0;
  const auto cand = [&](const std::string& name, std::map<int64_t, double> us) {
    return kernels::OpTuner::Candidate{name, [&took, &size, us] { took = us.at(size); }};
  };
  // fast wins at 1, 2 and 4; wide at 8 and 16.
  const std::map<int64_t, double> fast = {{1, 1}, {2, 2}, {4, 3}, {8, 9}, {16, 20}};
  const std::map<int64_t, double> wide = {{1, 5}, {2, 5}, {4, 5}, {8, 6}, {16, 7}};
  for (int64_t s : {1, 2, 4, 8, 16}) {
    size = s;
    rec.observe("linear", "rows", s, {cand("fast", fast), cand("wide", wide)});
  }
  const nlohmann::json t = rec.table("Test GPU", kernels::TuningTable::parse(R"({"gpu": "*", "ops": {}})", "stated"),
                                     0);
  const kernels::TuningTable table = kernels::TuningTable::parse(t.dump(), "tuned.json");
  EXPECT_EQ(table.gpu(), "Test GPU");
  const auto& rules = table.ops().at("linear").rules;
  ASSERT_EQ(rules.size(), 2u) << t.dump(2);
  EXPECT_EQ(rules[0].lo, 0);
  EXPECT_EQ(rules[0].hi, 4);
  EXPECT_EQ(rules[0].order, (std::vector<std::string>{"fast", "wide"}));
  EXPECT_EQ(rules[1].lo, 5);
  EXPECT_EQ(rules[1].hi, 16);
  EXPECT_EQ(rules[1].order, (std::vector<std::string>{"wide", "fast"}));
  EXPECT_EQ(table.find("linear", 17), nullptr);  // above what was measured: tuning/default.json's
  EXPECT_EQ(t["measurements"]["linear"].size(), 5u);
  EXPECT_DOUBLE_EQ(t["measurements"]["linear"][3]["us"]["wide"].get<double>(), 6.0);
}

}  // namespace
}  // namespace k3::bench
