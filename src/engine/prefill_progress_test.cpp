// engine/prefill_progress_test.cpp: long prefills report as they go, short ones stay quiet.
#include "engine/prefill_progress.h"

#include <gtest/gtest.h>

namespace k3::engine {
namespace {

using namespace std::chrono_literals;

scheduler::StepPlan chunk(scheduler::RequestId id, int64_t start, int32_t n) {
  scheduler::StepPlan out;
  scheduler::ScheduledSequence s;
  s.id = id;
  s.start = start;
  s.num_tokens = n;
  s.kind = scheduler::StepKind::prefill;
  out.seqs.push_back(s);
  return out;
}

TEST(PrefillProgress, LongPromptsReportEveryIntervalAndWhenDone) {
  std::vector<std::string> lines;
  PrefillProgress p([&](const std::string& l) { lines.push_back(l); }, 1000, 2s);
  p.begin(7, 3000);
  p.begin(8, 999);  // too short to report
  const auto t0 = PrefillProgress::Clock::now();
  p.step(chunk(7, 0, 512), t0);         // starts the clock
  p.step(chunk(7, 512, 512), t0 + 1s);  // within the interval: quiet
  p.step(chunk(7, 1024, 512), t0 + 2500ms);
  p.step(chunk(8, 0, 999), t0 + 3s);
  p.step(chunk(7, 1536, 1464), t0 + 3s);  // done
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "prefill: request 7: 1536 / 3000 prompt tokens (51%), 614 tokens/s, 2.5 s");
  EXPECT_EQ(lines[1], "prefill: request 7: 3000 / 3000 prompt tokens (100%), 1000 tokens/s, 3.0 s");
  p.step(chunk(7, 0, 100), t0 + 10s);  // forgotten once done
  EXPECT_EQ(lines.size(), 2u);
}

TEST(PrefillProgress, NamesThePrefixCacheHitAndForgetsEndedRequests) {
  std::vector<std::string> lines;
  PrefillProgress p([&](const std::string& l) { lines.push_back(l); }, 100, 1s);
  p.begin(1, 5000);
  const auto t0 = PrefillProgress::Clock::now();
  p.step(chunk(1, 4000, 500), t0);
  p.step(chunk(1, 4500, 500), t0 + 500ms);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("(4000 from the prefix cache)"), std::string::npos) << lines[0];
  p.begin(2, 5000);
  p.end(2);
  p.step(chunk(2, 0, 5000), t0 + 2s);
  EXPECT_EQ(lines.size(), 1u);
  PrefillProgress off;  // no log: nothing tracked
  EXPECT_FALSE(off.enabled());
  off.begin(3, 1 << 20);
  off.step(chunk(3, 0, 10));
}

}  // namespace
}  // namespace k3::engine
