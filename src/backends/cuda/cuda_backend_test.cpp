// backends/cuda/cuda_backend_test.cpp: the CUDA backend's own pieces: checked calls name file:line
// and CUDA's error (runs without a GPU), the pool reuses blocks, and host <-> device copies keep
// values (bf16 conversion, strided rows, NaN poison). Device cases skip without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "backends/cuda/device.h"
#include "backends/cuda/device_tensor.h"
#include "core/bf16.h"

namespace k3::backends::cuda {
namespace {

TEST(CudaCheck, FailureNamesFileLineExpressionAndCudaError) {
  try {
    K3_CUDA_CHECK(cudaErrorMemoryAllocation);
    FAIL() << "K3_CUDA_CHECK did not throw";
  } catch (const core::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cuda_backend_test.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("cudaErrorMemoryAllocation"), std::string::npos) << m;
    EXPECT_NE(m.find("CUDA error at"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(K3_CUDA_CHECK(cudaSuccess));
}

TEST(CudaCheck, DeviceCountNeverThrows) {
  std::string why;
  const int n = device_count(&why);
  if (n == 0) {
    EXPECT_FALSE(why.empty());
  }
}

#define K3_REQUIRE_GPU()                        \
  std::string why_;                             \
  if (device_count(&why_) == 0) {               \
    GTEST_SKIP() << "no CUDA device: " << why_; \
  }

TEST(DevicePool, ReusesFreedBlocksAndCountsBytes) {
  K3_REQUIRE_GPU();
  auto pool = DevicePool::create(0);
  void* a = pool->allocate(1000);
  EXPECT_EQ(pool->stats().in_use_bytes, 1024u);
  pool->deallocate(a);
  EXPECT_EQ(pool->stats().in_use_bytes, 0u);
  void* b = pool->allocate(900);  // fits the cached 1024-byte block
  EXPECT_EQ(a, b);
  EXPECT_EQ(pool->stats().cuda_mallocs, 1u);
  pool->deallocate(b);
  EXPECT_THROW(pool->deallocate(reinterpret_cast<void*>(0x1234)), core::Error);
}

TEST(DeviceTensor, RoundTripsWithBf16ConversionStridesAndPoison) {
  K3_REQUIRE_GPU();
  auto ctx = Context::create(0);
  core::Tensor host = core::Tensor::zeros(core::DType::f32, {3, 5});
  for (int i = 0; i < 15; ++i) host.data<float>()[i] = 0.1f * static_cast<float>(i) - 0.7f;
  const core::Tensor dev_f32 = upload(host.view(), ctx->pool(), ctx->stream());
  const core::Tensor back = download_f32(dev_f32.view(), ctx->stream());
  for (int i = 0; i < 15; ++i) EXPECT_EQ(back.data<float>()[i], host.data<float>()[i]);
  const core::Tensor dev_bf16 = upload(host.view(), core::DType::bf16, ctx->pool(), ctx->stream());
  const core::Tensor back16 = download_f32(dev_bf16.view(), ctx->stream());
  for (int i = 0; i < 15; ++i) EXPECT_EQ(back16.data<float>()[i], core::bf16_round(host.data<float>()[i]));
  // Columns 1..3 of the device tensor: a row-strided view.
  const core::Tensor cols = download_f32(cols_of(dev_f32.view(), 1, 3), ctx->stream());
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(cols.data<float>()[r * 3 + c], host.data<float>()[r * 5 + 1 + c]);
  poison_nan(cols_of(dev_f32.view(), 1, 3), ctx->stream());
  const core::Tensor poisoned = download_f32(dev_f32.view(), ctx->stream());
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 5; ++c)
      EXPECT_EQ(std::isnan(poisoned.data<float>()[r * 5 + c]), c >= 1 && c <= 3) << r << "," << c;
}

TEST(BlasLt, Bf16GemmMatchesAPlainSum) {
  K3_REQUIRE_GPU();
  auto ctx = Context::create(0);
  const int64_t T = 3, in = 64, out = 5;
  core::Tensor x = core::Tensor::zeros(core::DType::bf16, {T, in}),
               w = core::Tensor::zeros(core::DType::bf16, {out, in});
  for (int64_t i = 0; i < T * in; ++i) x.data<uint16_t>()[i] = core::f32_to_bf16_bits(static_cast<float>(i % 7) - 3.0f);
  for (int64_t i = 0; i < out * in; ++i)
    w.data<uint16_t>()[i] = core::f32_to_bf16_bits(static_cast<float>(i % 5) * 0.25f);
  const core::Tensor dx = upload(x.view(), ctx->pool(), ctx->stream()),
                     dw = upload(w.view(), ctx->pool(), ctx->stream());
  const core::Tensor dy = empty_poisoned(ctx->pool(), core::DType::f32, {T, out}, ctx->stream());
  GemmArgs g;
  g.tokens = T, g.in = in, g.out = out;
  g.x = dx.view().data, g.x_ld = in, g.w = dw.view().data, g.w_ld = in, g.y = dy.view().data, g.y_ld = out;
  g.in_type = GemmType::bf16, g.out_type = GemmType::f32;
  ASSERT_TRUE(ctx->blas().supports(g));
  ctx->blas().gemm(g, ctx->stream());
  const core::Tensor y = download_f32(dy.view(), ctx->stream());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;  // small integers and quarters: exact in any order
      for (int64_t i = 0; i < in; ++i)
        s += static_cast<double>(core::bf16_bits_to_f32(x.data<uint16_t>()[t * in + i])) *
             core::bf16_bits_to_f32(w.data<uint16_t>()[o * in + i]);
      EXPECT_EQ(y.data<float>()[t * out + o], static_cast<float>(s)) << t << "," << o;
    }
}

}  // namespace
}  // namespace k3::backends::cuda
