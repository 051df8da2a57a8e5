// kernels/registry/registry_test.cpp: reference ops cover every op table; selection by capability
// and tuning rules, its log and its errors; the tuner hook.
#include "kernels/registry.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/thread_pool.h"

namespace k3::kernels {
namespace {

using core::DType;
using core::Tensor;

// A valid rmsnorm call: x [3, 8], w [8] = 1, out [3, 8].
struct NormCall {
  Tensor x = Tensor::zeros(DType::f32, {3, 8});
  Tensor w = Tensor::zeros(DType::f32, {8});
  Tensor w_bad = Tensor::zeros(DType::f32, {7});
  Tensor out = Tensor::zeros(DType::f32, {3, 8});
  NormCall() {
    for (int64_t i = 0; i < 24; ++i) x.data<float>()[i] = static_cast<float>(i % 5) - 2.0f;
    for (float& v : w.span<float>()) v = 1.0f;
  }
  RmsNormArgs args() const { return {x.view(), w.view(), out.view()}; }
  RmsNormArgs bad_args() const { return {x.view(), w_bad.view(), out.view()}; }
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const core::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Registry, ReferenceOpsFillEveryTableWithACpuImplementation) {
  Registry r;
  register_reference_ops(r);
  int tables = 0;
  r.for_each([&](auto& table) {
    ++tables;
    int cpu_refs = 0;
    for (const auto& impl : table.impls())
      cpu_refs += impl.device == core::Device::cpu && impl.name == "reference" && impl.run != nullptr;
    EXPECT_EQ(cpu_refs, 1) << table.op();
  });
  EXPECT_GE(tables, 14);  // the 14 ops of the skeleton, plus any added since
}

// The references run on the pool the registry was given (no process-wide pool): a second
// registry's pool sees none of the first one's calls, and the results equal a direct call's
// (which runs inline).
TEST(Registry, ReferenceOpsRunOnThePoolTheyWereRegisteredWith) {
  const auto pool = std::make_shared<backends::cpu::ThreadPool>(3);
  const auto other = std::make_shared<backends::cpu::ThreadPool>(2);
  Registry r, s;
  register_reference_ops(r, pool);
  register_reference_ops(s, other);
  NormCall call;
  r.rmsnorm.run(call.args(), core::Device::cpu);
  EXPECT_EQ(pool->calls(), 1);
  EXPECT_EQ(other->calls(), 0);
  Tensor want = Tensor::zeros(DType::f32, {3, 8});
  rmsnorm_reference({call.x.view(), call.w.view(), want.view()});
  EXPECT_EQ(pool->calls(), 1);  // a direct call without a pool runs inline
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(call.out.data<float>()[i], want.data<float>()[i]);
  s.rmsnorm.run(call.args(), core::Device::cpu);
  EXPECT_EQ(other->calls(), 1);
}

TEST(Registry, SelectOnCpuPicksTheReferenceAndRunsIt) {
  Registry r;
  register_reference_ops(r);
  NormCall call;
  const auto& impl = r.rmsnorm.select(call.args(), core::Device::cpu);
  EXPECT_EQ(impl.name, "reference");
  r.rmsnorm.run(call.args(), core::Device::cpu);
  Tensor want = Tensor::zeros(DType::f32, {3, 8});
  rmsnorm_reference({call.x.view(), call.w.view(), want.view()});
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(call.out.data<float>()[i], want.data<float>()[i]);

  LinearWeight w;
  w.weight = Tensor::zeros(DType::bf16, {5, 8});
  Tensor y = Tensor::zeros(DType::f32, {3, 5});
  EXPECT_EQ(r.linear.select({call.x.view(), &w, y.view()}, core::Device::cpu).name, "reference");
}

TEST(Registry, BadArgumentShapeThrowsNamingTheOp) {
  Registry r;
  register_reference_ops(r);
  NormCall call;
  std::string msg = error_of([&] { r.rmsnorm.select(call.bad_args(), core::Device::cpu); });
  EXPECT_NE(msg.find("rmsnorm"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[7]"), std::string::npos) << msg;
  LinearWeight w;
  w.weight = Tensor::zeros(DType::bf16, {5, 9});
  Tensor y = Tensor::zeros(DType::f32, {3, 5});
  msg = error_of([&] { r.linear.run({call.x.view(), &w, y.view()}, core::Device::cpu); });
  EXPECT_NE(msg.find("linear"), std::string::npos) << msg;
  EXPECT_NE(msg.find("x must be"), std::string::npos) << msg;
}

TEST(Registry, CudaHasNoImplementationYet) {
  Registry r;
  register_reference_ops(r);
  NormCall call;
  const std::string msg = error_of([&] { r.rmsnorm.select(call.args(), core::Device::cuda); });
  EXPECT_NE(msg.find("no implementation on cuda"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rmsnorm"), std::string::npos) << msg;
}

// A linear call with x [rows, 4], W [3, 4], out [rows, 3] (f32, CPU): the measure is "rows".
struct LinearCall {
  Tensor x, w = Tensor::zeros(DType::f32, {3, 4}), out;
  LinearWeight weight;
  explicit LinearCall(int64_t rows)
      : x(Tensor::zeros(DType::f32, {rows, 4})), out(Tensor::zeros(DType::f32, {rows, 3})) {
    weight.weight = w;
  }
  LinearArgs args() const { return {x.view(), &weight, out.view(), false, Precision::fp32}; }
};

Tuning tuning_of(const std::string& gpu_json, const std::string& default_json) {
  Tuning t;
  if (!gpu_json.empty()) t.gpu = std::make_shared<const TuningTable>(TuningTable::parse(gpu_json, "gpu.json"));
  if (!default_json.empty())
    t.fallback = std::make_shared<const TuningTable>(TuningTable::parse(default_json, "default.json"));
  return t;
}

// Two stand-in CPU linears beside the reference, "fast" refusing when `refuse` is set.
struct ThreeLinears {
  Registry r;
  bool refuse = false;
  std::vector<std::string> ran;
  ThreeLinears() {
    register_reference_ops(r);
    r.linear.add({"fast", core::Device::cpu,
                  [this](const LinearArgs&) { return refuse ? core::Status::fail("refused") : core::Status::ok(); },
                  [this](const LinearArgs&) { ran.push_back("fast"); }});
    r.linear.add({"wide", core::Device::cpu, nullptr, [this](const LinearArgs&) { ran.push_back("wide"); }});
  }
};

TEST(Registry, WithoutATableTheFirstCapableInRegistrationOrderRuns) {
  ThreeLinears t;
  LinearCall call(2);
  EXPECT_EQ(t.r.linear.select(call.args(), core::Device::cpu).name, "reference");
  EXPECT_EQ(t.r.linear.reason(call.args(), core::Device::cpu), "registration order");
}

TEST(Registry, TheTuningRuleOfTheSizeOrdersTheCapableImplementations) {
  ThreeLinears t;
  t.r.set_tuning(core::Device::cpu, tuning_of(R"({"gpu": "X", "ops": {"linear": {"measure": "rows", "rules": [
      {"sizes": [1, 4], "order": ["fast", "wide"]},
      {"sizes": [5, null], "order": ["wide", "fast"]}]}}})",
                                              ""));
  std::vector<std::string> log;
  t.r.set_log([&](const std::string& line) { log.push_back(line); });
  LinearCall small(3), large(9);
  EXPECT_EQ(t.r.linear.select(small.args(), core::Device::cpu).name, "fast");
  EXPECT_EQ(t.r.linear.reason(small.args(), core::Device::cpu), "gpu.json rows 1..4");
  EXPECT_EQ(t.r.linear.select(large.args(), core::Device::cpu).name, "wide");
  EXPECT_EQ(t.r.linear.reason(large.args(), core::Device::cpu), "gpu.json rows 5+");
  // supports() still decides what can run: a refusal falls to the next name of the order.
  t.refuse = true;
  EXPECT_EQ(t.r.linear.select(small.args(), core::Device::cpu).name, "wide");
  t.r.linear.run(small.args(), core::Device::cpu);
  EXPECT_EQ(t.ran, std::vector<std::string>{"wide"});
  // Each implementation's first choice is logged once, with the rule that chose it.
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0], "kernel linear -> cpu/fast (first at rows 3: gpu.json rows 1..4)");
  EXPECT_EQ(log[1], "kernel linear -> cpu/wide (first at rows 9: gpu.json rows 5+)");
}

TEST(Registry, ShapesTheGpuTableLacksFallBackToTheDefaultThenToRegistrationOrder) {
  ThreeLinears t;
  t.r.set_tuning(core::Device::cpu, tuning_of(R"({"gpu": "X", "ops": {"linear": {"measure": "rows", "rules": [
      {"sizes": [1, 4], "order": ["fast"]}]}}})",
                                              R"({"gpu": "*", "ops": {"linear": {"measure": "rows", "rules": [
      {"sizes": [1, 8], "order": ["wide"]}]}}})"));
  LinearCall in_gpu(4), in_default(8), in_neither(20);
  EXPECT_EQ(t.r.linear.select(in_gpu.args(), core::Device::cpu).name, "fast");
  EXPECT_EQ(t.r.linear.select(in_default.args(), core::Device::cpu).name, "wide");
  EXPECT_EQ(t.r.linear.reason(in_default.args(), core::Device::cpu), "default.json rows 1..8");
  EXPECT_EQ(t.r.linear.select(in_neither.args(), core::Device::cpu).name, "reference");
  // Names a rule leaves out come after the listed ones, in registration order.
  t.refuse = true;
  EXPECT_EQ(t.r.linear.select(in_gpu.args(), core::Device::cpu).name, "reference");
}

TEST(Registry, ATableNamingAnUnknownImplementationOrAnotherMeasureIsAnError) {
  ThreeLinears t;
  const std::string unknown = error_of([&] {
    t.r.set_tuning(core::Device::cpu, tuning_of(R"({"gpu": "X", "ops": {"linear": {"measure": "rows", "rules": [
        {"sizes": [0, null], "order": ["fast", "cuda_gone"]}]}}})",
                                                ""));
  });
  EXPECT_NE(unknown.find("gpu.json: ops.linear lists 'cuda_gone', which is not an implementation on cpu"),
            std::string::npos)
      << unknown;
  const std::string measure = error_of([&] {
    t.r.set_tuning(core::Device::cpu, tuning_of("", R"({"gpu": "*", "ops": {"linear": {"measure": "tokens", "rules": [
        {"sizes": [0, null], "order": ["fast"]}]}}})"));
  });
  EXPECT_NE(measure.find("default.json: ops.linear.measure is 'tokens', the op's is 'rows'"), std::string::npos)
      << measure;
}

TEST(Registry, TheTunerIsHandedEveryCapableImplementationOfACallAndTheChosenOneStillRuns) {
  ThreeLinears t;
  struct Recorder : OpTuner {
    std::vector<std::string> seen;
    void observe(const std::string& op, const std::string& measure, int64_t size,
                 const std::vector<Candidate>& candidates) override {
      seen.push_back(op + " " + measure + " " + std::to_string(size) + ":");
      for (const Candidate& c : candidates) {
        seen.back() += " " + c.name;
        c.run();
      }
    }
  } tuner;
  t.r.set_tuner(&tuner);
  t.refuse = true;
  LinearCall call(5);
  t.r.linear.run(call.args(), core::Device::cpu);
  ASSERT_EQ(tuner.seen.size(), 1u);
  EXPECT_EQ(tuner.seen[0], "linear rows 5: reference wide");
  EXPECT_EQ(t.ran, (std::vector<std::string>{"wide"}));  // the tuner's run of wide; reference left no mark
  // Ops with one capable implementation are not offered.
  NormCall norm;
  t.r.rmsnorm.run(norm.args(), core::Device::cpu);
  EXPECT_EQ(tuner.seen.size(), 1u);
}

TEST(Registry, WithNoCapableImplementationEveryRefusalIsInTheError) {
  Registry only_fast;
  only_fast.rmsnorm.add({"fast_cpu", core::Device::cpu,
                         [](const RmsNormArgs&) { return core::Status::fail("only on Tuesdays"); },
                         [](const RmsNormArgs&) {}});
  NormCall call;
  const std::string msg = error_of([&] { only_fast.rmsnorm.select(call.args(), core::Device::cpu); });
  EXPECT_NE(msg.find("fast_cpu: only on Tuesdays"), std::string::npos) << msg;
}

// The registry's trace (what DecodeGraphs records a captured graph's kernels with) holds each
// call's implementation while started, in call order, a composite implementation's parts right
// after it; a recorder watching the registry at the same time sees the same calls.
TEST(Registry, TheTraceRecordsEachCallsImplementationInCallOrder) {
  ThreeLinears t;
  NormCall norm;
  t.r.linear.add({"composite", core::Device::cpu, nullptr,
                  [&](const LinearArgs&) { t.r.rmsnorm.run(norm.args(), core::Device::cpu); }});
  t.r.set_tuning(core::Device::cpu, tuning_of("", R"({"gpu": "*", "ops": {"linear": {"measure": "rows", "rules": [
      {"sizes": [2, 2], "order": ["composite"]}]}}})"));
  OpRecorder recorder;
  t.r.set_recorder(&recorder);
  LinearCall one(1), two(2);
  t.r.linear.run(two.args(), core::Device::cpu);  // before start(): not traced
  t.r.trace().start();
  recorder.start();
  t.r.linear.run(two.args(), core::Device::cpu);  // the composite, then its rmsnorm
  t.r.linear.run(one.args(), core::Device::cpu);  // rows 1: no rule, registration order
  const core::KernelList traced = t.r.trace().stop();
  const std::vector<OpRecorder::Call> recorded = recorder.stop();
  t.r.linear.run(two.args(), core::Device::cpu);  // after stop(): not traced
  const core::KernelList want{{"linear", "composite"}, {"rmsnorm", "reference"}, {"linear", "reference"}};
  EXPECT_EQ(traced, want);
  ASSERT_EQ(recorded.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(recorded[i].op, want[i].op) << i;
    EXPECT_EQ(recorded[i].impl, want[i].impl) << i;
  }
  EXPECT_EQ(recorded[1].depth, 1);  // the composite's part
  EXPECT_TRUE(t.r.trace().stop().empty());
}

}  // namespace
}  // namespace k3::kernels
