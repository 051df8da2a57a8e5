// kernels/registry/registry_test.cpp: reference ops cover every op table; selection and its errors.
#include "kernels/registry.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

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
      cpu_refs +=
          impl.device == core::Device::cpu && impl.name == "reference" && impl.run != nullptr;
    EXPECT_EQ(cpu_refs, 1) << table.op();
  });
  EXPECT_GE(tables, 14);  // the 14 ops of the skeleton, plus any added since
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

TEST(Registry, PriorityAndSupportsDecideAndTheChoiceIsLoggedOnce) {
  Registry r;
  register_reference_ops(r);
  bool accept = false;
  int fast_runs = 0;
  r.rmsnorm.add({"fast_cpu", core::Device::cpu, 10,
                 [&](const RmsNormArgs&) {
                   return accept ? core::Status::ok() : core::Status::fail("only on Tuesdays");
                 },
                 [&](const RmsNormArgs&) { ++fast_runs; }});
  std::vector<std::string> log;
  r.set_log([&](const std::string& line) { log.push_back(line); });
  NormCall call;
  EXPECT_EQ(r.rmsnorm.select(call.args(), core::Device::cpu).name, "reference");
  EXPECT_EQ(r.rmsnorm.select(call.args(), core::Device::cpu).name, "reference");
  accept = true;
  r.rmsnorm.run(call.args(), core::Device::cpu);
  EXPECT_EQ(fast_runs, 1);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_NE(log[0].find("rmsnorm -> cpu/reference"), std::string::npos) << log[0];
  EXPECT_NE(log[1].find("rmsnorm -> cpu/fast_cpu"), std::string::npos) << log[1];
  // With the reference gone, the refusal reason shows in the error.
  Registry only_fast;
  only_fast.rmsnorm.add({"fast_cpu", core::Device::cpu, 10,
                         [](const RmsNormArgs&) { return core::Status::fail("only on Tuesdays"); },
                         [](const RmsNormArgs&) {}});
  const std::string msg =
      error_of([&] { only_fast.rmsnorm.select(call.args(), core::Device::cpu); });
  EXPECT_NE(msg.find("fast_cpu: only on Tuesdays"), std::string::npos) << msg;
}

}  // namespace
}  // namespace k3::kernels
