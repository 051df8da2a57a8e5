// backends/cuda/graph_test.cpp: CUDA graphs and the pool's graph ownership of blocks: a capture of
// cuBLASLt GEMMs, device copies, a memset and a pool allocation runs nothing, replays twice with the
// right values and counts its nodes; blocks a live graph owns are never handed out by allocate()
// and come back when the graph dies; illegal calls during a capture become core::Error and leave
// the stream and pool usable. Device cases skip without a GPU (the pool-only rules still need one
// for cudaMalloc).
#include "backends/cuda/graph.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "backends/cuda/device.h"
#include "backends/cuda/device_tensor.h"

namespace k3::backends::cuda {
namespace {

#define K3_REQUIRE_GPU()                        \
  std::string why_;                             \
  if (device_count(&why_) == 0) {               \
    GTEST_SKIP() << "no CUDA device: " << why_; \
  }

// y[T, n] = x[T, n] · W[n, n]^T in f32 (exact here: small integers times powers of two).
GemmArgs square_gemm(const void* x, const void* w, void* y, int64_t T, int64_t n) {
  GemmArgs g;
  g.tokens = T, g.in = n, g.out = n;
  g.x = x, g.x_ld = n, g.w = w, g.w_ld = n, g.y = y, g.y_ld = n;
  g.in_type = GemmType::f32, g.out_type = GemmType::f32;
  return g;
}

bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  K3_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  return st != cudaStreamCaptureStatusNone;
}

TEST(Graph, CaptureRunsNothingAndTwoReplaysGiveTheRightValuesAndNodeCounts) {
  K3_REQUIRE_GPU();
  auto ctx = Context::create(0);
  const cudaStream_t s = ctx->stream();
  const int64_t T = 3, n = 32;
  core::Tensor x = core::Tensor::zeros(core::DType::f32, {T, n}), w = core::Tensor::zeros(core::DType::f32, {n, n});
  for (int64_t i = 0; i < T * n; ++i) x.data<float>()[i] = static_cast<float>(i % 7) - 3.0f;
  for (int64_t i = 0; i < n; ++i) w.data<float>()[i * n + i] = 2.0f;  // W = 2 I: each GEMM doubles x
  const core::Tensor dx = upload(x.view(), ctx->pool(), s), dw = upload(w.view(), ctx->pool(), s);
  const core::Tensor mark = empty_poisoned(ctx->pool(), core::DType::u8, {77}, s);
  const size_t bytes = static_cast<size_t>(T * n) * sizeof(float) + 3 * 512 * 1024;  // a size no one used yet

  // cuBLASLt may launch more than one kernel per GEMM (split-K reduction): learn how many first.
  const core::Tensor dy = empty(ctx->pool(), core::DType::f32, {T, n});
  ASSERT_TRUE(ctx->blas().supports(square_gemm(dx.view().data, dw.view().data, dy.view().data, T, n)));
  const Graph one = Graph::capture(*ctx, [&] {
    ctx->blas().gemm(square_gemm(dx.view().data, dw.view().data, dy.view().data, T, n), s);
  });
  const GraphNodeCounts per_gemm = one.nodes();
  ASSERT_GE(per_gemm.kernels, 1u);

  void* inside = nullptr;
  const size_t mallocs_before = ctx->pool().stats().cuda_mallocs;
  Graph g = Graph::capture(*ctx, [&] {
    std::shared_ptr<void> tmp = ctx->scratch(bytes);  // a fresh cudaMalloc during the capture
    inside = tmp.get();
    for (int i = 0; i < 2; ++i) {
      ctx->blas().gemm(square_gemm(dx.view().data, dw.view().data, tmp.get(), T, n), s);
      K3_CUDA_CHECK(
          cudaMemcpyAsync(dx.view().data, tmp.get(), static_cast<size_t>(dx.nbytes()), cudaMemcpyDeviceToDevice, s));
    }
    K3_CUDA_CHECK(cudaMemsetAsync(mark.view().data, 0x2a, 77, s));
  });  // tmp was freed inside the capture: the graph keeps its block
  EXPECT_EQ(ctx->pool().stats().cuda_mallocs, mallocs_before + 1);
  EXPECT_EQ(g.nodes().kernels, 2 * per_gemm.kernels);
  EXPECT_EQ(g.nodes().memcpys, 2 + 2 * per_gemm.memcpys);
  EXPECT_EQ(g.nodes().memsets, 1 + 2 * per_gemm.memsets);
  EXPECT_EQ(g.nodes().other, 2 * per_gemm.other);
  EXPECT_EQ(g.nodes().total(), g.nodes().kernels + g.nodes().memcpys + g.nodes().memsets + g.nodes().other);

  // The capture ran nothing.
  const core::Tensor after_capture = download(dx.view(), s);
  for (int64_t i = 0; i < T * n; ++i) ASSERT_EQ(after_capture.data<float>()[i], x.data<float>()[i]) << i;
  EXPECT_EQ(download(mark.view(), s).data<uint8_t>()[0], 0xff);

  // The graph's block is not handed out while it lives.
  void* probe = ctx->pool().allocate(bytes);
  EXPECT_NE(probe, inside);
  ctx->pool().deallocate(probe);
  EXPECT_GE(ctx->pool().graph_cached_bytes(g.owner()), bytes);

  float factor = 1.0f;
  for (int replay = 1; replay <= 2; ++replay) {
    g.replay();
    factor *= 4.0f;
    const core::Tensor got = download(dx.view(), s);
    for (int64_t i = 0; i < T * n; ++i)
      ASSERT_EQ(got.data<float>()[i], factor * x.data<float>()[i]) << "replay " << replay << " element " << i;
    const core::Tensor m = download(mark.view(), s);
    for (int i = 0; i < 77; ++i) ASSERT_EQ(m.data<uint8_t>()[i], 0x2a) << i;
  }
}

TEST(Graph, BlocksComeBackToThePoolWhenTheGraphIsDestroyed) {
  K3_REQUIRE_GPU();
  auto ctx = Context::create(0);
  const size_t bytes = 4096;
  void* inside = nullptr;
  {
    const Graph g = Graph::capture(*ctx, [&] {
      std::shared_ptr<void> t = ctx->scratch(bytes);
      inside = t.get();
      K3_CUDA_CHECK(cudaMemsetAsync(t.get(), 0, bytes, ctx->stream()));
    });
    EXPECT_EQ(g.nodes().memsets, 1u);
    EXPECT_EQ(ctx->pool().graph_cached_bytes(g.owner()), bytes);
    EXPECT_EQ(ctx->pool().stats().graph_cached_bytes, bytes);
    void* q = ctx->pool().allocate(bytes);
    EXPECT_NE(q, inside);
    ctx->pool().deallocate(q);
  }
  EXPECT_EQ(ctx->pool().stats().graph_cached_bytes, 0u);
  void* a = ctx->pool().allocate(bytes);
  void* b = ctx->pool().allocate(bytes);
  EXPECT_TRUE(a == inside || b == inside);
  ctx->pool().deallocate(a);
  ctx->pool().deallocate(b);
}

TEST(Graph, IllegalCallsDuringCaptureBecomeErrorsAndLeaveStreamAndPoolUsable) {
  K3_REQUIRE_GPU();
  auto ctx = Context::create(0);
  const cudaStream_t s = ctx->stream();
  const auto expect_capture_error = [&](const std::function<void()>& body, const std::string& needle) {
    try {
      (void)Graph::capture(*ctx, body);
      ADD_FAILURE() << "capture did not fail (expected: " << needle << ")";
    } catch (const core::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("CUDA graph capture failed"), std::string::npos) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
    EXPECT_FALSE(capturing(s));
    EXPECT_EQ(ctx->pool().capturing(), 0u);
  };
  // Synchronizing the capturing stream, checked: the body's own error, with the hint.
  expect_capture_error([&] { K3_CUDA_CHECK(cudaStreamSynchronize(s)); }, "StreamCapture");
  // The same with the error ignored: the capture is invalidated.
  expect_capture_error(
      [&] {
        (void)cudaStreamSynchronize(s);
        K3_CUDA_CHECK(cudaMemsetAsync(ctx->scratch(512).get(), 0, 512, s));
      },
      "capture");
  // A raw cudaMalloc (not the pool) is unsafe on the capturing thread.
  expect_capture_error(
      [&] {
        void* p = nullptr;
        K3_CUDA_CHECK(cudaMalloc(&p, 1 << 20));
        (void)cudaFree(p);
      },
      "StreamCapture");
  // A plain exception keeps its message; a nested capture is refused.
  expect_capture_error([&] { throw core::Error("boom from the body"); }, "boom from the body");
  expect_capture_error([&] { (void)Graph::capture(*ctx, [] {}); }, "already capturing");

  // Everything still works: a capture, a replay, ordinary pool reuse.
  const core::Tensor buf = empty_poisoned(ctx->pool(), core::DType::u8, {64}, s);
  Graph g = Graph::capture(*ctx, [&] { K3_CUDA_CHECK(cudaMemsetAsync(buf.view().data, 7, 64, s)); });
  g.replay();
  EXPECT_EQ(download(buf.view(), s).data<uint8_t>()[63], 7);
  void* p = ctx->pool().allocate(12345);
  ctx->pool().deallocate(p);
  EXPECT_EQ(ctx->pool().allocate(12345), p);
  ctx->pool().deallocate(p);
  // A moved-from graph says so instead of launching nothing.
  Graph moved = std::move(g);
  moved.replay();
  EXPECT_THROW(g.replay(), core::Error);  // NOLINT(bugprone-use-after-move): the point of the check
  K3_CUDA_CHECK(cudaStreamSynchronize(s));
}

TEST(DevicePoolGraphs, OwnedBlocksAreHeldForTheGraphUntilItIsReleased) {
  K3_REQUIRE_GPU();
  auto pool = DevicePool::create(0);
  void* before = pool->allocate(1000);  // ordinary, freed during the capture below
  const uint64_t owner = pool->new_graph_owner();
  pool->begin_capture(owner);
  EXPECT_EQ(pool->capturing(), owner);
  EXPECT_THROW(pool->begin_capture(pool->new_graph_owner()), core::Error);  // one capture at a time
  void* a = pool->allocate(1000);
  pool->deallocate(a);
  void* a2 = pool->allocate(1000);  // the capture may reuse its own block (one stream-ordered chain)
  EXPECT_EQ(a2, a);
  void* live = pool->allocate(1000);  // still live when the graph is released
  pool->deallocate(before);           // freed during the capture: the graph may have used it
  pool->end_capture();
  pool->deallocate(a2);  // freed after the capture: still the graph's
  EXPECT_EQ(pool->graph_cached_bytes(owner), 2048u);
  EXPECT_EQ(pool->stats().graph_cached_bytes, 2048u);
  EXPECT_EQ(pool->stats().graph_owned_in_use_bytes, 1024u);
  EXPECT_EQ(pool->stats().cached_bytes, 0u);

  std::vector<void*> outside;
  for (int i = 0; i < 3; ++i) outside.push_back(pool->allocate(1000));
  for (void* p : outside) {
    EXPECT_NE(p, a);
    EXPECT_NE(p, before);
    EXPECT_NE(p, live);
  }
  for (void* p : outside) pool->deallocate(p);

  pool->release_graph(owner);
  EXPECT_EQ(pool->graph_cached_bytes(owner), 0u);
  EXPECT_EQ(pool->stats().graph_cached_bytes, 0u);
  EXPECT_EQ(pool->stats().graph_owned_in_use_bytes, 0u);
  std::vector<void*> got;
  for (int i = 0; i < 5; ++i) got.push_back(pool->allocate(1000));  // the 3 + the graph's 2
  EXPECT_NE(std::find(got.begin(), got.end(), a), got.end());
  EXPECT_NE(std::find(got.begin(), got.end(), before), got.end());
  for (void* p : got) pool->deallocate(p);
  // The block that was live at release is an ordinary one now.
  pool->deallocate(live);
  EXPECT_EQ(pool->graph_cached_bytes(owner), 0u);
  EXPECT_EQ(pool->stats().cached_bytes, 6u * 1024u);
}

TEST(DevicePoolGraphs, ABlockTwoGraphsUsedIsHeldUntilBothAreReleased) {
  K3_REQUIRE_GPU();
  auto pool = DevicePool::create(0);
  const uint64_t g1 = pool->new_graph_owner(), g2 = pool->new_graph_owner();
  pool->begin_capture(g1);
  void* x = pool->allocate(5000);  // owned by g1, still live
  pool->end_capture();
  pool->begin_capture(g2);
  pool->deallocate(x);  // g2's capture may have read it too
  pool->end_capture();
  EXPECT_EQ(pool->graph_cached_bytes(g1), 5120u);
  EXPECT_EQ(pool->graph_cached_bytes(g2), 5120u);
  pool->release_graph(g1);
  EXPECT_EQ(pool->graph_cached_bytes(g2), 5120u);
  void* y = pool->allocate(5000);
  EXPECT_NE(y, x);
  pool->deallocate(y);
  pool->release_graph(g2);
  EXPECT_EQ(pool->stats().graph_cached_bytes, 0u);
  void* z1 = pool->allocate(5000);
  void* z2 = pool->allocate(5000);
  EXPECT_TRUE(z1 == x || z2 == x);
  pool->deallocate(z1);
  pool->deallocate(z2);
}

}  // namespace
}  // namespace k3::backends::cuda
