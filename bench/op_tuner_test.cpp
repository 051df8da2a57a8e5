// bench/op_tuner_test.cpp: the tuning recorder on stand-in timings: the order at each size, rules
// merged across sizes with one order, and a table that reads back as a kernels::TuningTable.
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

TEST(OpTuner, SizesWithOneOrderBecomeOneRuleAndTheTableReadsBack) {
  // Stand-in timing: each candidate's run() sets the time it "took" at the current size.
  double took = 0;
  OpTuningRecorder rec([&](const std::function<void()>& run) {
    run();
    return took;
  });
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
  const nlohmann::json t = rec.table("Test GPU");
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
