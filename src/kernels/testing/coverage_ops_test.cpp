// kernels/testing/coverage_ops_test.cpp: every op of the registry has a device implementation to test, and
// without a GPU the CUDA implementations say why they cannot run (no silent CPU fallback).
#include <gtest/gtest.h>

#include "kernels/registry.h"
#include "kernels/testing/op_harness.h"

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
      EXPECT_EQ(impl.name.rfind("cuda_", 0), 0u) << table.op() << "/" << impl.name;
      EXPECT_TRUE(impl.supports) << table.op() << "/" << impl.name << " has no supports()";
    }
    EXPECT_GE(cuda_impls, 1) << "op " << table.op() << " has no CUDA implementation";
  });
  EXPECT_EQ(ops,
            36);  // the 18 standard ops, silu_glu and rope_gqa_attention (EAGLE-3), the 3 DSpark draft ops,
                  // token_mask, the 5 MLA decode-context-parallel ops and the 7 fused ops of fastpath/
#endif
}

// Every checked-in table names only ops with their own measure and registered CUDA implementations
// (set_tuning checks both), and the default orders every op with more than one.
TEST(OpsCoverage, TheCheckedInTuningTablesNameRegisteredImplementations) {
#ifndef K3_HAVE_CUDA
  GTEST_SKIP() << "this build has no CUDA backend (K3_HAVE_CUDA is off)";
#else
  kernels::Registry r;
  kernels::register_reference_ops(r);
  kernels::register_cuda_ops(r);
  for (const auto& table : kernels::builtin_tuning_tables()) {
    kernels::Tuning only;
    only.gpu = table;
    EXPECT_NO_THROW(r.set_tuning(core::Device::cuda, only)) << table->source();
  }
  const kernels::Tuning fallback = kernels::builtin_tuning("");
  ASSERT_NE(fallback.fallback, nullptr);
  r.for_each([&](auto& table) {
    int cuda_impls = 0;
    for (const auto& impl : table.impls()) cuda_impls += impl.device == core::Device::cuda;
    if (cuda_impls > 1)
      EXPECT_TRUE(fallback.fallback->ops().count(table.op()))
          << table.op() << " has " << cuda_impls << " CUDA implementations and no order in tuning/default.json";
  });
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
