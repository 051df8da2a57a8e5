// tests/ops/coverage_test.cpp: every op of the registry has a device implementation to test, and
// without a GPU the CUDA implementations say why they cannot run (no silent CPU fallback).
#include <gtest/gtest.h>

#include "kernels/registry.h"
#include "tests/ops/op_harness.h"

namespace k3::ops_test {
namespace {

TEST(OpsCoverage, EveryOpHasACudaImplementationInCudaBuilds) {
#ifndef K3_HAVE_CUDA
  GTEST_SKIP() << "this build has no CUDA backend (K3_HAVE_CUDA is off)";
#else
  kernels::Registry r;
  kernels::register_reference_ops(r);
  kernels::register_cuda_ops(r);  // registered even without a GPU (their supports() says why)
  int ops = 0;
  r.for_each([&](auto& table) {
    ++ops;
    int cuda_impls = 0;
    for (const auto& impl : table.impls()) {
      if (impl.device != core::Device::cuda) continue;
      ++cuda_impls;
      EXPECT_GT(impl.priority, 0) << table.op() << "/" << impl.name;
      EXPECT_EQ(impl.name.rfind("cuda_", 0), 0u) << table.op() << "/" << impl.name;
      EXPECT_TRUE(impl.supports) << table.op() << "/" << impl.name << " has no supports()";
    }
    EXPECT_GE(cuda_impls, 1) << "op " << table.op() << " has no CUDA implementation";
  });
  EXPECT_EQ(ops, 30);  // the 18 standard ops, the 5 MLA decode-context-parallel ops and the 7 fused ops of fastpath/
#endif
}

TEST(OpsCoverage, WithoutAGpuSelectionNamesTheReason) {
  std::string why;
  if (Device::cuda(&why) != nullptr) GTEST_SKIP() << "a CUDA device is present: nothing to check here";
#ifndef K3_HAVE_CUDA
  GTEST_SKIP() << "this build has no CUDA backend";
#else
  kernels::Registry r;
  kernels::register_reference_ops(r);
  kernels::register_cuda_ops(r);
  Tensor a = f32_tensor({2, 3}), b = f32_tensor({2, 3}), out = f32_tensor({2, 3});
  try {
    r.add.select({a.view(), b.view(), out.view()}, core::Device::cuda);
    FAIL() << "selected a CUDA implementation without a usable GPU";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no usable CUDA device"), std::string::npos) << e.what();
  }
#endif
}

}  // namespace
}  // namespace k3::ops_test
