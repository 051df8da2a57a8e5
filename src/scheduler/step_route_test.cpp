// scheduler/step_route_test.cpp: route_step, the one choice of each step's decode path and graph
// bucket, on plans built by hand: every fallback reason, every graph shape it takes and refuses;
// and the scheduler writing the route into the plans it makes.
#include "scheduler/step_route.h"

#include <gtest/gtest.h>

#include "scheduler/scheduler.h"
#include "scheduler/step_plan.h"

namespace k3::scheduler {
namespace {

// A plan of sequences with these row counts (decode; `verify`: rows - 1 drafts each), plus
// `prefills` prefill sequences of 5 rows; every table `blocks` wide.
StepPlan plan_of(std::vector<int32_t> rows, bool verify = false, int prefills = 0, int32_t blocks = 4) {
  StepPlan p;
  for (int32_t r : rows) {
    ScheduledSequence q;
    q.kind = StepKind::decode;
    q.num_tokens = r;
    q.num_drafts = verify ? r - 1 : 0;
    q.num_blocks = blocks;
    p.seqs.push_back(q);
    p.num_tokens += r;
    ++p.num_decodes;
  }
  for (int i = 0; i < prefills; ++i) {
    ScheduledSequence q;
    q.kind = StepKind::prefill;
    q.num_tokens = 5;
    q.num_blocks = blocks;
    p.seqs.push_back(q);
    p.num_tokens += 5;
    ++p.num_prefills;
  }
  return p;
}

ExecutionScope fused_with_graphs() {
  ExecutionScope s;
  s.fused_selected = true;
  s.fused_max_rows = 64;
  s.graph_max_batch = 64;
  s.graph_max_rows = 64;
  s.graph_max_blocks = 8;
  return s;
}

TEST(StepRoute, TheFusedPathServesPureDecodeStepsWithinItsRows) {
  const ExecutionScope s = fused_with_graphs();
  const StepRoute one = route_step(plan_of({1}), s);
  EXPECT_EQ(one.path, DecodePath::fused);
  EXPECT_TRUE(one.fallback.empty());
  EXPECT_EQ(one.graph, (GraphBucket{1, 1}));
  const StepRoute verify = route_step(plan_of({8, 8}, true), s);
  EXPECT_EQ(verify.path, DecodePath::fused);
  EXPECT_EQ(verify.graph, (GraphBucket{2, 8}));
  EXPECT_EQ(route_step(plan_of(std::vector<int32_t>(64, 1)), s).path, DecodePath::fused);
}

TEST(StepRoute, EveryFallbackHasItsReason) {
  ExecutionScope s = fused_with_graphs();
  const StepRoute mixed = route_step(plan_of({1, 1}, false, 1), s);
  EXPECT_EQ(mixed.path, DecodePath::standard);
  EXPECT_EQ(mixed.fallback, kNotPureDecode);
  EXPECT_FALSE(mixed.graph.captured());
  EXPECT_EQ(route_step(plan_of({}, false, 2), s).fallback, kNotPureDecode);
  const StepRoute wide = route_step(plan_of(std::vector<int32_t>(65, 1)), s);
  EXPECT_EQ(wide.path, DecodePath::standard);
  EXPECT_EQ(wide.fallback, "more_than_64_rows");
  EXPECT_EQ(route_step(plan_of({9, 9, 9, 9, 9, 9, 9, 9}, true), s).fallback, "more_than_64_rows");  // 72 rows
  s.fused_problem = "gpu_not_sm90";
  const StepRoute problem = route_step(plan_of({1}), s);
  EXPECT_EQ(problem.path, DecodePath::standard);
  EXPECT_EQ(problem.fallback, "gpu_not_sm90");
  EXPECT_EQ(problem.graph, (GraphBucket{1, 1}));  // the standard path's graphs still serve it
}

TEST(StepRoute, TheStandardBackendIsAChoiceNotAFallback) {
  ExecutionScope s = fused_with_graphs();
  s.fused_selected = false;
  const StepRoute r = route_step(plan_of({1, 1, 1}), s);
  EXPECT_EQ(r.path, DecodePath::standard);
  EXPECT_TRUE(r.fallback.empty());
  EXPECT_EQ(r.graph, (GraphBucket{3, 1}));
  EXPECT_TRUE(route_step(plan_of({}, false, 1), s).fallback.empty());
  const StepRoute empty = route_step(StepPlan{}, fused_with_graphs());  // a step that runs nothing
  EXPECT_EQ(empty.path, DecodePath::standard);
  EXPECT_TRUE(empty.fallback.empty());
  EXPECT_FALSE(empty.graph.captured());
}

TEST(StepRoute, GraphBucketsOnlyForUniformDecodeStepsThatFit) {
  const ExecutionScope s = fused_with_graphs();
  EXPECT_FALSE(route_step(plan_of({2, 3}, true), s).graph.captured());                 // unequal drafts
  EXPECT_FALSE(route_step(plan_of(std::vector<int32_t>(65, 1)), s).graph.captured());  // over the batch
  EXPECT_FALSE(route_step(plan_of({33, 33}, true), s).graph.captured());               // 66 verify rows
  EXPECT_FALSE(route_step(plan_of({1}, false, 0, 9), s).graph.captured());             // table wider than the graphs'
  EXPECT_EQ(route_step(plan_of({1}, false, 0, 8), s).graph, (GraphBucket{1, 1}));
  StepPlan verify_beside_plain = plan_of({3, 3}, true);
  verify_beside_plain.seqs[1].num_drafts = 0;  // 3 rows of a plain sequence: not a decode row
  EXPECT_FALSE(route_step(verify_beside_plain, s).graph.captured());
  ExecutionScope eager = s;
  eager.graph_max_batch = 0;
  EXPECT_FALSE(route_step(plan_of({1}), eager).graph.captured());
  EXPECT_EQ(route_step(plan_of({1}), eager).path, DecodePath::fused);
}

// A step of a captured bucket carries its graph's kernels (the executor's GraphKernels, as it
// captures and drops graphs); an eager step, a bucket not captured, or the bucket's graph of the
// other path carries none.
TEST(StepRoute, AStepOfACapturedBucketNamesItsGraphsKernels) {
  ExecutionScope s = fused_with_graphs();
  auto graphs = std::make_shared<core::GraphKernels>();
  s.graph_kernels = graphs;
  EXPECT_EQ(route_step(plan_of({1, 1}), s).kernels, nullptr);  // not captured yet
  const auto fused_2x1 = std::make_shared<const core::KernelList>(
      core::KernelList{{"kda_decode", "cuda_vsplit_cluster"}, {"linear", "cuda_cublaslt"}});
  graphs->publish(DecodePath::fused, {2, 1}, fused_2x1);
  EXPECT_EQ(route_step(plan_of({1, 1}), s).kernels, fused_2x1);
  EXPECT_EQ(route_step(plan_of({1}), s).kernels, nullptr);               // another bucket
  EXPECT_EQ(route_step(plan_of({1, 1}, false, 1), s).kernels, nullptr);  // a mixed step: eager
  ExecutionScope standard = s;
  standard.fused_selected = false;
  EXPECT_EQ(route_step(plan_of({1, 1}), standard).kernels, nullptr);  // the standard path's 2x1 graph
  graphs->erase(DecodePath::fused, {2, 1});
  EXPECT_EQ(route_step(plan_of({1, 1}), s).kernels, nullptr);  // dropped
}

TEST(StepRoute, CountersCountEachRouteAndFlagTheFirstOfEachKind) {
  DecodePathCounters c;
  StepRoute fused{DecodePath::fused, "", {1, 1}}, prefill{DecodePath::standard, kNotPureDecode, {}},
      chosen{DecodePath::standard, "", {}};
  EXPECT_TRUE(c.count(fused));
  EXPECT_FALSE(c.count(fused));
  EXPECT_TRUE(c.count(prefill));
  EXPECT_FALSE(c.count(prefill));
  EXPECT_FALSE(c.count(chosen));
  EXPECT_EQ(c.fused_steps, 2);
  EXPECT_EQ(c.standard_steps, 3);
  ASSERT_EQ(c.fallbacks.size(), 1u);
  EXPECT_EQ(c.fallbacks[0], (std::pair<std::string, int64_t>{kNotPureDecode, 2}));
}

// The scheduler writes each plan's route from the scope it was given: the prompt's prefill falls
// back, the decodes that follow are fused graph steps.
TEST(StepRoute, TheSchedulerRoutesEveryPlan) {
  cache::CacheConfig cc;
  cc.block_size = 4;
  cc.num_blocks = 16;
  cc.num_slots = 2;
  cc.enable_prefix_cache = false;
  SchedulerConfig sc;
  sc.max_num_seqs = 2;
  sc.max_num_batched_tokens = 32;
  sc.long_prefill_token_threshold = 32;
  sc.max_model_len = 32;
  sc.validate(cc);
  Scheduler sched(sc, cc);
  sched.set_execution_scope(fused_with_graphs());
  RequestSpec spec;
  spec.prompt = {1, 2, 3, 4, 5};
  spec.max_tokens = 3;
  sched.add(1, spec);
  StepPlan plan;
  std::vector<RequestEvent> events;
  sched.schedule(plan);
  EXPECT_EQ(plan.route.fallback, kNotPureDecode);
  sched.update(plan, std::vector<int32_t>{7}, events);
  sched.schedule(plan);
  EXPECT_EQ(plan.route.path, DecodePath::fused);
  EXPECT_EQ(plan.route.graph, (GraphBucket{1, 1}));
  sched.update(plan, std::vector<int32_t>{8}, events);
}

}  // namespace
}  // namespace k3::scheduler
