// kernels/multi_linear/multi_linear_router_ops_test.cpp: multi_linear's router epilogue (the MoE front: router
// logits, latent down, shared gate and up over one x, then the router's top-k) on the GPU.
// The routes must be exactly router_topk's on the op's own logits (the same GPU's router kernel run
// after it: the same ids and weight bits), the logits as the CPU's (tolerance), and the count of
// kernels proves where the selection ran: inside cuda_multi_mma's launch up to
// kMultiLinearRouterInKernelRows rows (one kernel), after it above (two), after the GEMMs of the
// other strategies. Shapes: one TP8 rank (896 experts, top-16, in 7168) and odd ones (E 37 / 97 / 300,
// k 1 / 5 / 32: warps with fewer than k experts, k = 32; E 1100, k 40: the radix form beyond it).
#include <cstring>
#include <string>
#include <vector>

#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

struct FrontCase {
  std::string name;
  int64_t T, in, E, k;
  std::vector<int64_t> others;  // output widths after the router's (rounded outputs)
  Mode mode;
  std::string expect_impl;
  int64_t expect_kernels;  // kernels per call; 0: not checked (cuBLASLt may launch several per GEMM)
};

void check_front(Device* dev, const FrontCase& c, uint64_t seed) {
  SCOPED_TRACE(c.name + " T " + std::to_string(c.T) + " E " + std::to_string(c.E) + " k " + std::to_string(c.k) + " " +
               mode_name(c.mode));
  core::Rng rng(seed);
  const Precision p = precision(c.mode);
  const kernels::LinearWeight w_router{random_bf16_weight(rng, c.E, c.in), {}};
  std::vector<kernels::LinearWeight> ws;
  ws.push_back(dev->upload(w_router));
  for (int64_t o : c.others) ws.push_back(dev->upload(kernels::LinearWeight{random_bf16_weight(rng, o, c.in), {}}));
  const Tensor x = dev->act(random_act(rng, {c.T, c.in}, c.mode), c.mode);
  const Tensor bias = dev->upload(random_uniform_f32(rng, {c.E}, 0.05));
  const Tensor logits = dev->poisoned(DType::f32, {c.T, c.E});
  std::vector<Tensor> ys;
  for (int64_t o : c.others) ys.push_back(dev->poisoned(act_dtype(c.mode), {c.T, o}));
  const Tensor ids = dev->poisoned(DType::i32, {c.T, c.k}), weights = dev->poisoned(DType::f32, {c.T, c.k});

  kernels::MultiLinearArgs args;
  args.x = x.view();
  args.precision = p;
  args.add(&ws[0], logits.view(), /*round_output=*/false);
  for (size_t i = 0; i < ys.size(); ++i) args.add(&ws[i + 1], ys[i].view());
  args.router = {0, bias.view(), ids.view(), weights.view(), true, 2.5f};
  ASSERT_EQ(dev->registry().multi_linear.select(args, dev->kind()).name, c.expect_impl);
  if (c.expect_kernels > 0) {
    const auto op = [&] { dev->registry().multi_linear.run(args, dev->kind()); };
    EXPECT_EQ(dev->kernels_queued_by(op), c.expect_kernels) << "kernels of one call";
  }
  dev->registry().multi_linear.run(args, dev->kind());
  // Twice: the ticket of the in-kernel selection must be back at 0 for the next call.
  const Tensor ids1 = dev->to_host(ids.view()), weights1 = dev->to_host(weights.view());
  dev->registry().multi_linear.run(args, dev->kind());

  // The router kernel on the same logits.
  const Tensor want_ids = dev->poisoned(DType::i32, {c.T, c.k}), want_w = dev->poisoned(DType::f32, {c.T, c.k});
  dev->registry().router_topk.run({logits.view(), bias.view(), want_ids.view(), want_w.view(), true, 2.5f},
                                  dev->kind());
  const Tensor got_ids = dev->to_host(ids.view()), got_w = dev->to_host(weights.view());
  const Tensor exp_ids = dev->to_host(want_ids.view()), exp_w = dev->to_host(want_w.view());
  const size_t bytes = static_cast<size_t>(c.T * c.k) * 4;
  EXPECT_EQ(std::memcmp(got_ids.data<const int32_t>(), exp_ids.data<const int32_t>(), bytes), 0) << "ids";
  EXPECT_EQ(std::memcmp(got_w.data<const float>(), exp_w.data<const float>(), bytes), 0) << "weights";
  EXPECT_EQ(std::memcmp(ids1.data<const int32_t>(), got_ids.data<const int32_t>(), bytes), 0) << "ids, second call";
  EXPECT_EQ(std::memcmp(weights1.data<const float>(), got_w.data<const float>(), bytes), 0) << "weights, second call";
  for (int64_t i = 0; i < c.T * c.k; ++i) {
    const int32_t id = got_ids.data<const int32_t>()[i];
    ASSERT_TRUE(id >= 0 && id < c.E) << "route " << i << " id " << id;
  }

  // The logits as the CPU computes them from the same x (tolerance: another summation order).
  Tensor want_logits = nan_tensor({c.T, c.E});
  cpu_registry().linear.run({dev->to_host_f32(x.view()).view(), &w_router, want_logits.view(), false, p},
                            core::Device::cpu);
  expect_close("multi_linear_router", shape_str({c.T, c.in, c.E}), c.mode, c.name + ".logits",
               dev->to_host_f32(logits.view()), want_logits, tol_reduction(c.mode));
}

TEST(OpsTp8, MultiLinearRouterEpilogue) {
  K3_REQUIRE_CUDA(dev);
  const std::vector<int64_t> front = {3584, 768, 768};  // latent_down, shared gate, shared up
  uint64_t seed = 9100;
  // The selection inside the GEMM kernel: one launch.
  check_front(dev, {"moe_front", 1, 7168, 896, 16, front, Mode::bf16, "cuda_multi_mma", 1}, seed++);
  for (int64_t T : {2, 8, 16})  // the tensor-core GEMM, then the router kernel
    check_front(dev, {"moe_front", T, 7168, 896, 16, front, Mode::bf16, "cuda_multi_mma", 2}, seed++);
  for (int64_t T : {17, 64})  // a cuBLASLt GEMM per output, then the router kernel
    check_front(dev, {"moe_front", T, 7168, 896, 16, front, Mode::bf16, "cuda_multi_cublaslt", 0}, seed++);
  for (int64_t T : {1, 8})  // exact mode: the row-dot kernel, then the router kernel
    check_front(dev, {"moe_front", T, 7168, 896, 16, front, Mode::fp32, "cuda_multi_rowdot", 2}, seed++);
}

TEST(OpsOdd, MultiLinearRouterEpilogue) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9200;
  struct Shape {
    int64_t E, k;
  };
  for (const Shape s : {Shape{37, 5}, Shape{300, 1}, Shape{97, 32}})
    for (int64_t T : {1, 3, 8})
      check_front(dev, {"odd", T, 96, s.E, s.k, {54, 5}, Mode::bf16, "cuda_multi_mma", T == 1 ? 1 : 2}, seed++);
  // Beyond the ranking selection (1100 experts, k 40): the radix form after the GEMM, at any T.
  for (int64_t T : {1, 5}) check_front(dev, {"wide", T, 96, 1100, 40, {54}, Mode::bf16, "cuda_multi_mma", 2}, seed++);
  // Odd in: the row-dot GEMM, then the router kernel.
  check_front(dev, {"odd_in", 3, 97, 37, 5, {54}, Mode::bf16, "cuda_multi_rowdot", 2}, seed++);
}

}  // namespace
}  // namespace k3::ops_test
