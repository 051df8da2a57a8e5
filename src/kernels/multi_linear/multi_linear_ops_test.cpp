// kernels/multi_linear/multi_linear_ops_test.cpp: the fused multi_linear op (several linears over one x, one
// launch) on every device backend against the CPU reference, both modes: odd shapes (mixed bf16/f32
// weights, f32 logits beside rounded outputs, outputs as column slices of one NaN-poisoned buffer
// whose gaps must stay NaN, strided x) and the three per-GPU TP8 groups of spec §11 (KDA six, MLA
// three, MoE front four) at T = 1, 2, 8, 64. Every case checks which implementation ran:
// cuda_multi_mma (tensor cores) for bf16 x bf16 with in % 8 == 0, cuda_multi_rowdot otherwise; above
// 16 rows cuda_multi_cublaslt (a cuBLASLt GEMM per output) where cuBLASLt takes every output.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

enum class WKind { bf16, f32 };

kernels::LinearWeight make_weight(core::Rng& rng, WKind kind, int64_t out, int64_t in) {
  kernels::LinearWeight w;
  if (kind == WKind::bf16) w.weight = random_bf16_weight(rng, out, in);
  else w.weight = random_uniform_f32(rng, {out, in}, 1.0 / std::sqrt(static_cast<double>(in)));
  return w;
}

TensorView columns(const Tensor& t, int64_t c0, int64_t cols) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + c0 * static_cast<int64_t>(core::dtype_size(v.dtype));
  v.shape[1] = cols;
  return v;
}

struct OutCase {
  int64_t out;
  WKind kind;
  bool logits = false;  // round_output = false, f32 out (the router)
};

struct MultiCase {
  std::string name;
  int64_t T, in;
  int64_t x_offset = 0;  // x is columns [x_offset, x_offset + in) of a [T, in + x_pad] buffer
  int64_t x_pad = 0;
  std::string expect_impl;  // the implementation that must be selected
};

// Output i lives at columns [c0_i, c0_i + out_i) of one [T, width] buffer (gaps of kGap between
// and around them): rounded outputs in the activation buffer, logits in an f32 buffer.
constexpr int64_t kGap = 8;

void check_multi(Device* dev, Mode mode, const std::vector<kernels::LinearWeight>& ws, const std::vector<OutCase>& outs,
                 const MultiCase& c, uint64_t seed) {
  SCOPED_TRACE(c.name + " T " + std::to_string(c.T) + " " + mode_name(mode));
  core::Rng rng(seed);
  const Precision p = precision(mode);
  const Tensor x_full = random_act(rng, {c.T, c.in + c.x_pad}, mode);
  const TensorView x = columns(x_full, c.x_offset, c.in);
  std::vector<int64_t> c0s;
  int64_t width = kGap;
  for (const OutCase& o : outs) {
    c0s.push_back(width);
    width += o.out + kGap;
  }

  // CPU oracle.
  Tensor want = nan_tensor({c.T, width});
  kernels::MultiLinearArgs cpu_args;
  cpu_args.x = x;
  cpu_args.precision = p;
  for (size_t i = 0; i < outs.size(); ++i) cpu_args.add(&ws[i], columns(want, c0s[i], outs[i].out), !outs[i].logits);
  cpu_registry().multi_linear.run(cpu_args, core::Device::cpu);

  // Device, NaN-poisoned.
  std::vector<kernels::LinearWeight> dws;
  for (const auto& w : ws) dws.push_back(dev->upload(w));
  const Tensor dx_full = dev->act(x_full, mode);
  const Tensor act_buf = dev->poisoned(act_dtype(mode), {c.T, width});
  const Tensor f32_buf = dev->poisoned(DType::f32, {c.T, width});
  kernels::MultiLinearArgs args;
  args.x = columns(dx_full, c.x_offset, c.in);
  args.precision = p;
  for (size_t i = 0; i < outs.size(); ++i)
    args.add(&dws[i], columns(outs[i].logits ? f32_buf : act_buf, c0s[i], outs[i].out), !outs[i].logits);
  expect_device_impl(dev->registry().multi_linear, args, dev);
  // Above 16 rows one cuBLASLt GEMM per output takes over when the linear op would run every
  // output on cuBLASLt (cuda_multi_cublaslt); otherwise the case's own implementation.
  std::string expect_impl = c.expect_impl;
  if (c.T > 16) {
    bool all_cublaslt = true;
    for (int i = 0; i < args.num_outputs; ++i) {
      const auto& o = args.outputs[static_cast<size_t>(i)];
      const auto* impl = dev->registry().linear.find({args.x, o.w, o.out, o.round_output, p}, dev->kind(), nullptr);
      all_cublaslt &= impl != nullptr && impl->name == "cuda_cublaslt";
    }
    if (all_cublaslt) expect_impl = "cuda_multi_cublaslt";
  }
  EXPECT_EQ(dev->registry().multi_linear.select(args, dev->kind()).name, expect_impl);
  dev->registry().multi_linear.run(args, dev->kind());

  for (size_t i = 0; i < outs.size(); ++i) {
    const Tensor got = dev->to_host_f32(args.outputs[i].out);
    const Tensor want_i = copy_rows(columns(want, c0s[i], outs[i].out));
    const std::string what = "out" + std::to_string(i) + (outs[i].kind == WKind::f32 ? "_w_f32" : "_w_bf16") +
                             (outs[i].logits ? "_logits" : "");
    expect_close("multi_linear", shape_str({c.T, c.in, outs[i].out}), mode, c.name + "." + what, got, want_i,
                 tol_reduction(mode));
  }
  // Nothing outside the outputs was written: every other column of both buffers is still NaN.
  const Tensor act_host = dev->to_host_f32(act_buf.view()), f32_host = dev->to_host_f32(f32_buf.view());
  int64_t stray = 0;
  for (int64_t col = 0; col < width; ++col) {
    bool in_act = false, in_f32 = false;
    for (size_t i = 0; i < outs.size(); ++i)
      if (col >= c0s[i] && col < c0s[i] + outs[i].out) (outs[i].logits ? in_f32 : in_act) = true;
    for (int64_t t = 0; t < c.T; ++t) {
      if (!in_act && !std::isnan(act_host.data<float>()[t * width + col])) ++stray;
      if (!in_f32 && !std::isnan(f32_host.data<float>()[t * width + col])) ++stray;
    }
  }
  EXPECT_EQ(stray, 0) << "elements written outside the outputs";
}

std::vector<kernels::LinearWeight> make_weights(core::Rng& rng, const std::vector<OutCase>& outs, int64_t in) {
  std::vector<kernels::LinearWeight> ws;
  for (const OutCase& o : outs) ws.push_back(make_weight(rng, o.kind, o.out, in));
  return ws;
}

TEST(OpsOdd, MultiLinear) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(6000);
  // Mixed weight dtypes: the row-dot kernel in both modes (odd and aligned widths).
  const std::vector<OutCase> mixed = {{1, WKind::bf16}, {5, WKind::f32}, {54, WKind::bf16, true}, {97, WKind::f32}};
  for (int64_t in : {17, 97, 1000}) {
    const auto ws = make_weights(rng, mixed, in);
    for (Mode m : kModes)
      for (int64_t T : {1, 3, 17, 64})
        check_multi(dev, m, ws, mixed, {"mixed", T, in, T % 2, 3, "cuda_multi_rowdot"}, 6100 + T);
  }
  // All bf16: tensor cores in bf16 mode when in % 8 == 0 (T 9 and 17 take the 2- and 4-tile forms,
  // 97 two grid.y slices), row-dot otherwise.
  const std::vector<OutCase> dense = {{1, WKind::bf16}, {5, WKind::bf16}, {54, WKind::bf16, true}, {97, WKind::bf16}};
  for (int64_t in : {96, 1000, 17}) {
    const auto ws = make_weights(rng, dense, in);
    for (Mode m : kModes)
      for (int64_t T : {1, 3, 9, 17, 64, 97}) {
        const bool mma = m == Mode::bf16 && in % 8 == 0;
        // x as a 16-byte aligned column slice (offset 8 of in + 16 columns) or contiguous.
        const int64_t off = T % 2 ? 8 : 0, pad = T % 2 ? 16 : 0;
        check_multi(dev, m, ws, dense, {"bf16", T, in, off, pad, mma ? "cuda_multi_mma" : "cuda_multi_rowdot"},
                    6200 + T);
      }
  }
  // bf16 weights, but x at an odd column offset: no 16-byte rows, so the row-dot kernel.
  {
    const auto ws = make_weights(rng, dense, 96);
    check_multi(dev, Mode::bf16, ws, dense, {"unaligned_x", 5, 96, 3, 5, "cuda_multi_rowdot"}, 6300);
  }
}

// The most outputs one call takes (kMultiLinearMaxOutputs = 8), bf16, odd sizes and a logits output:
// one tensor-core launch up to 16 rows, one GEMM per output above where cuBLASLt takes them all.
TEST(OpsOdd, MultiLinearEightOutputs) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(6500);
  const std::vector<OutCase> eight = {{1, WKind::bf16},  {5, WKind::bf16},  {54, WKind::bf16, true}, {97, WKind::bf16},
                                      {16, WKind::bf16}, {33, WKind::bf16}, {128, WKind::bf16},      {7, WKind::bf16}};
  ASSERT_EQ(static_cast<int>(eight.size()), kernels::kMultiLinearMaxOutputs);
  const auto ws = make_weights(rng, eight, 96);
  for (Mode m : kModes)
    for (int64_t T : {1, 9, 17, 64})
      check_multi(dev, m, ws, eight, {"eight", T, 96, 0, 0, m == Mode::bf16 ? "cuda_multi_mma" : "cuda_multi_rowdot"},
                  6600 + T);
}

TEST(OpsOdd, MultiLinearRejectsMxfp4) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(6400);
  const kernels::LinearWeight w = dev->upload(random_mxfp4_weight(rng, 17, 64));
  const Tensor x = dev->act(random_act(rng, {2, 64}, Mode::bf16), Mode::bf16);
  const Tensor y = dev->poisoned(DType::bf16, {2, 17});
  kernels::MultiLinearArgs args;
  args.x = x.view();
  args.add(&w, y.view());
  try {
    dev->registry().multi_linear.select(args, dev->kind());
    FAIL() << "an MXFP4 weight was accepted on CUDA";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("outputs[0].w is MXFP4"), std::string::npos) << e.what();
  }
}

TEST(OpsTp8, MultiLinear) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(7000);
  constexpr int64_t kHidden = 7168;
  struct Group {
    const char* name;
    std::vector<OutCase> outs;
  };
  // Spec §11 / §14.2, one TP8 rank, bf16 weights.
  const Group groups[] = {
      {"kda.q_k_v_g_fa_b",
       {{1536, WKind::bf16},
        {1536, WKind::bf16},
        {1536, WKind::bf16},
        {1536, WKind::bf16},
        {128, WKind::bf16},
        {12, WKind::bf16}}},
      {"mla.qa_kva_g", {{1536, WKind::bf16}, {576, WKind::bf16}, {1536, WKind::bf16}}},
      {"moe.router_down_sgate_sup",
       {{896, WKind::bf16, true}, {3584, WKind::bf16}, {768, WKind::bf16}, {768, WKind::bf16}}},
  };
  for (const Group& g : groups) {
    const auto ws = make_weights(rng, g.outs, kHidden);
    for (int64_t T : {1, 2, 8, 64}) {
      check_multi(dev, Mode::bf16, ws, g.outs, {g.name, T, kHidden, 0, 0, "cuda_multi_mma"}, 7100 + T);
      check_multi(dev, Mode::fp32, ws, g.outs, {g.name, T, kHidden, 0, 0, "cuda_multi_rowdot"}, 7200 + T);
    }
  }
}

}  // namespace
}  // namespace k3::ops_test
