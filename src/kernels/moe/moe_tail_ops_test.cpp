// kernels/moe/moe_tail_ops_test.cpp: the fused moe_tail_combine op (the MoE tail after the routed
// experts: situ_glu, shared_down, routed rmsnorm, latent_up, add) on every device backend against the
// CPU reference, both modes: odd shapes (strided inputs, out a column slice of a NaN-poisoned buffer whose
// gaps must stay NaN; with and without the routed norm and the shared experts; both rmsnorm styles) and
// one TP8 rank's shapes (L 3584, SI 768, hidden 7168) at T = 1, 2, 3, 8, 9, 64. Every case checks which
// implementation ran. bf16 with L and SI multiples of 8: cuda_tail_one_launch (one kernel) for one row
// when the input rows are 16-byte aligned and its shared memory fits; else cuda_tail_mma (two launches)
// up to 16 rows; cuda_tail_cublaslt above. cuda_tail_rowdot otherwise (every fp32 case). The one-launch
// kernel must also equal cuda_tail_mma BIT FOR BIT (same prologue math, same per-warp k-block order).
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/moe/cases.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

constexpr const char* kOneLaunch = "cuda_tail_one_launch";
constexpr const char* kTwoLaunchMma = "cuda_tail_mma";
constexpr const char* kCublasLt = "cuda_tail_cublaslt";
constexpr const char* kRowdot = "cuda_tail_rowdot";

// The bf16 strategy for T rows with 16-byte aligned input rows and a shared-memory footprint that fits.
const char* bf16_aligned_impl(int64_t T) { return T <= 1 ? kOneLaunch : T <= 16 ? kTwoLaunchMma : kCublasLt; }

TensorView columns(const Tensor& t, int64_t c0, int64_t cols) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + c0 * static_cast<int64_t>(core::dtype_size(v.dtype));
  v.shape[1] = cols;
  return v;
}

struct TailCase {
  std::string name;
  int64_t T, L, SI, hidden;
  bool use_norm = true, shared = true;
  kernels::RmsNormStyle style = kernels::RmsNormStyle::moonshot;
  int64_t offset = 0;  // inputs and out are columns [offset, offset + width) of buffers 2 * offset wider
};

struct TailWeights {
  kernels::LinearWeight up, down;
  Tensor norm;  // bf16 [L]
};

TailWeights make_weights(core::Rng& rng, const TailCase& c) {
  TailWeights w;
  w.up.weight = random_bf16_weight(rng, c.hidden, c.L);
  w.down.weight = random_bf16_weight(rng, c.hidden, c.SI);
  w.norm = Tensor::zeros(DType::bf16, {c.L});
  for (int64_t i = 0; i < c.L; ++i)
    w.norm.data<uint16_t>()[i] = core::f32_to_bf16_bits(static_cast<float>(rng.normal(1.0, 0.5)));
  return w;
}

// One call's inputs (host, then device) and the arguments over column slices of them.
struct TailInputs {
  Tensor u, gate, up;  // host, [T, width + 2 offset]
  Tensor du, dgate, dup, dnorm;
  kernels::LinearWeight d_up, d_down;

  TailInputs(Device* dev, Mode mode, const TailWeights& w, const TailCase& c, uint64_t seed) {
    core::Rng rng(seed);
    const int64_t pad = 2 * c.offset;
    u = random_act(rng, {c.T, c.L + pad}, mode);
    gate = random_act(rng, {c.T, c.SI + pad}, mode, 0.0, 6.0);  // both SiTU saturations
    up = random_act(rng, {c.T, c.SI + pad}, mode, 0.0, 30.0);
    d_up = dev->upload(w.up);
    d_down = dev->upload(w.down);
    dnorm = dev->upload(w.norm);
    du = dev->act(u, mode);
    dgate = dev->act(gate, mode);
    dup = dev->act(up, mode);
  }
};

kernels::MoeTailCombineArgs tail_args(const TailCase& c, Mode mode, const Tensor& u, const Tensor& norm,
                                      const kernels::LinearWeight* w_up, const Tensor& gate, const Tensor& up,
                                      const kernels::LinearWeight* w_down, const TensorView& out) {
  kernels::MoeTailCombineArgs a;
  a.u = columns(u, c.offset, c.L);
  a.latent_norm = c.use_norm ? norm.view() : TensorView{};
  a.latent_up = w_up;
  if (c.shared) {
    a.shared_gate = columns(gate, c.offset, c.SI);
    a.shared_up = columns(up, c.offset, c.SI);
    a.shared_down = w_down;
  }
  a.out = out;
  a.use_norm = c.use_norm;
  a.style = c.style;
  a.precision = precision(mode);
  return a;
}

void check_tail(Device* dev, Mode mode, const TailWeights& w, const TailCase& c, const std::string& expect_impl,
                uint64_t seed) {
  SCOPED_TRACE(c.name + " T " + std::to_string(c.T) + " " + mode_name(mode));
  const TailInputs in(dev, mode, w, c, seed);
  const int64_t width = c.hidden + 2 * c.offset;

  // CPU oracle.
  Tensor want = nan_tensor({c.T, width});
  cpu_registry().moe_tail_combine.run(tail_args(c, mode, in.u, w.norm, &w.up, in.gate, in.up, &w.down,
                                                columns(want, c.offset, c.hidden)),
                                      core::Device::cpu);

  // Device, NaN-poisoned out.
  const Tensor dout = dev->poisoned(act_dtype(mode), {c.T, width});
  const kernels::MoeTailCombineArgs args = tail_args(c, mode, in.du, in.dnorm, &in.d_up, in.dgate, in.dup, &in.d_down,
                                                     columns(dout, c.offset, c.hidden));
  expect_device_impl(dev->registry().moe_tail_combine, args, dev);
  EXPECT_EQ(dev->registry().moe_tail_combine.select(args, dev->kind()).name, expect_impl);
  dev->registry().moe_tail_combine.run(args, dev->kind());

  const Tensor got = dev->to_host_f32(args.out);
  const Tensor want_f = copy_rows(columns(want, c.offset, c.hidden));
  expect_close("moe_tail_combine", shape_str({c.T, c.L, c.SI, c.hidden}), mode, c.name, got, want_f,
               tol_reduction(mode));
  // Nothing outside out was written: the gap columns are still NaN.
  const Tensor all = dev->to_host_f32(dout.view());
  int64_t stray = 0;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t col = 0; col < width; ++col)
      if ((col < c.offset || col >= c.offset + c.hidden) && !std::isnan(all.data<float>()[t * width + col])) ++stray;
  EXPECT_EQ(stray, 0) << "elements written outside out";
}

const kernels::OpImpl<kernels::MoeTailCombineArgs>& tail_impl(Device* dev, const std::string& name) {
  for (const auto& impl : dev->registry().moe_tail_combine.impls())
    if (impl.name == name && impl.device == dev->kind()) return impl;
  throw core::Error("no moe_tail_combine implementation " + name + " registered");
}

// The one-launch kernel (the registry's pick) and the two-launch cuda_tail_mma (run by name) write the
// same bf16 bytes: x is the workspace's bits and the GEMM sums in the same order.
void check_one_launch_equals_two_launch(Device* dev, const TailWeights& w, const TailCase& c, uint64_t seed) {
  SCOPED_TRACE(c.name + " T " + std::to_string(c.T) + " one launch vs two");
  const TailInputs in(dev, Mode::bf16, w, c, seed);
  const Tensor out_one = dev->poisoned(DType::bf16, {c.T, c.hidden}),
               out_two = dev->poisoned(DType::bf16, {c.T, c.hidden});
  const auto args_for = [&](const Tensor& out) {
    return tail_args(c, Mode::bf16, in.du, in.dnorm, &in.d_up, in.dgate, in.dup, &in.d_down, out.view());
  };
  const kernels::MoeTailCombineArgs one = args_for(out_one), two = args_for(out_two);
  ASSERT_EQ(dev->registry().moe_tail_combine.select(one, dev->kind()).name, kOneLaunch);
  dev->registry().moe_tail_combine.run(one, dev->kind());
  const auto& mma = tail_impl(dev, kTwoLaunchMma);
  const core::Status s = mma.supports(two);
  ASSERT_TRUE(s) << s.reason();
  mma.run(two);
  const Tensor a = dev->to_host(out_one.view()), b = dev->to_host(out_two.view());
  const auto x = a.span<const uint16_t>(), y = b.span<const uint16_t>();
  int64_t differ = 0, first = -1, nan = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if ((x[i] & 0x7fffu) > 0x7f80u) ++nan;
    if (x[i] != y[i] && differ++ == 0) first = static_cast<int64_t>(i);
  }
  EXPECT_EQ(nan, 0) << "NaN left in the one-launch output (unwritten)";
  EXPECT_EQ(differ, 0) << differ << " of " << x.size() << " outputs differ; first at row " << first / c.hidden
                       << " column " << first % c.hidden << ": " << (first >= 0 ? x[first] : 0) << " vs "
                       << (first >= 0 ? y[first] : 0) << " (bf16 bits)";
}

TEST(OpsOdd, MoeTailCombine) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(8000);
  uint64_t seed = 8100;
  // Odd widths: the row-dot kernel in both modes; every norm/shared/style combination.
  for (const kernels::MoeTailShape& s : kernels::kMoeTailOddShapes)  // kernels/moe/cases.h
    for (bool use_norm : {true, false})
      for (bool shared : {true, false}) {
        TailCase c{s.name, 1, s.L, s.SI, s.hidden, use_norm, shared};
        c.style = shared ? kernels::RmsNormStyle::moonshot : kernels::RmsNormStyle::fused;
        const TailWeights w = make_weights(rng, c);
        for (Mode m : kModes)
          for (int64_t T : kernels::kMoeTailOddRows) {
            c.T = T;
            c.offset = T % 2 ? 3 : 0;
            check_tail(dev, m, w, c, kRowdot, ++seed);
          }
      }
  // L, SI multiples of 8, 16-byte aligned column slices: one launch at 1 row, cuda_tail_mma at 2..16 (9: two
  // n8 tiles), cuBLASLt above 16, row-dot in fp32 mode. L 96 / SI 40: whole and partial 32-wide k-blocks,
  // x rows 17 units apart (odd); L 136 / SI 40: partial k-blocks of both weights, x pitch padded from 22 to
  // 23 units (12 to 13 without shared experts). hidden 97: the last CTA has 1 of its 32 rows (one launch)
  // or 1 of 16 (cuda_tail_mma).
  for (const auto& [L, SI] : std::vector<std::array<int64_t, 2>>{{96, 40}, {136, 40}})
    for (bool use_norm : {true, false})
      for (bool shared : {true, false}) {
        TailCase c{"aligned_L" + std::to_string(L), 1, L, SI, 97, use_norm, shared};
        c.style = use_norm == shared ? kernels::RmsNormStyle::moonshot : kernels::RmsNormStyle::fused;
        const TailWeights w = make_weights(rng, c);
        for (Mode m : kModes)
          for (int64_t T : {1, 2, 3, 8, 9, 17, 54, 97}) {
            c.T = T;
            c.offset = T % 2 ? 8 : 0;
            check_tail(dev, m, w, c, m == Mode::bf16 ? bf16_aligned_impl(T) : kRowdot, ++seed);
          }
      }
  // Full tiles (hidden % 32 == 0, L and SI multiples of 256): the one-launch kernel's full-tile form.
  for (bool shared : {true, false}) {
    TailCase c{"full_tiles", 1, 512, 256, 96, true, shared};
    c.offset = 8;
    check_tail(dev, Mode::bf16, make_weights(rng, c), c, kOneLaunch, ++seed);
  }
  // Aligned widths but inputs at an odd column offset: the one-launch kernel's cp.async staging needs
  // 16-byte aligned rows, so two launches (the workspace keeps the GEMM aligned: still tensor cores).
  for (int64_t T : {1, 5}) {
    TailCase c{"unaligned_inputs", T, 96, 40, 54};
    c.offset = 3;
    const TailWeights w = make_weights(rng, c);
    check_tail(dev, Mode::bf16, w, c, kTwoLaunchMma, ++seed);
  }
  // Shared memory too small for one launch: at L = SI = 32768 one row's x (131 KB) and the staging area
  // (SI x 2 + L x 2 = 131 KB) exceed 227 KB; at L = SI = 8192 (33 KB + 33 KB) they fit.
  for (const auto& [L, impl] :
       std::vector<std::pair<int64_t, const char*>>{{32768, kTwoLaunchMma}, {8192, kOneLaunch}}) {
    TailCase c{"smem_L" + std::to_string(L), 1, L, L, 33};
    const TailWeights w = make_weights(rng, c);
    check_tail(dev, Mode::bf16, w, c, impl, ++seed);
  }
}

TEST(OpsOdd, MoeTailCombineOneLaunchEqualsTwoLaunch) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(8200);
  uint64_t seed = 8300;
  // hidden 97: the general item form (partial k-blocks, a last CTA of 1 row). L 256 / SI 256 / hidden 64
  // and L 512 / SI 256 / hidden 96: the full-tile form (hidden % 32 == 0, L and SI multiples of 256; the
  // K3 TP8 shapes take it too), 1 and 2 latent_up items per warp.
  for (const auto& [L, SI, hidden] :
       std::vector<std::array<int64_t, 3>>{{96, 40, 97}, {136, 40, 97}, {256, 256, 64}, {512, 256, 96}})
    for (bool use_norm : {true, false})
      for (bool shared : {true, false})
        for (auto style : {kernels::RmsNormStyle::moonshot, kernels::RmsNormStyle::fused}) {
          TailCase c{"odd", 1, L, SI, hidden, use_norm, shared, style};
          const TailWeights w = make_weights(rng, c);
          check_one_launch_equals_two_launch(dev, w, c, ++seed);  // T = 1: the one-launch bound
        }
}

TEST(OpsOdd, MoeTailCombineRejectsMxfp4) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(8400);
  kernels::LinearWeight up = dev->upload(random_mxfp4_weight(rng, 17, 64));
  const Tensor u = dev->act(random_act(rng, {2, 64}, Mode::bf16), Mode::bf16);
  const Tensor out = dev->poisoned(DType::bf16, {2, 17});
  kernels::MoeTailCombineArgs a;
  a.u = u.view();
  a.use_norm = false;
  a.latent_up = &up;
  a.out = out.view();
  try {
    dev->registry().moe_tail_combine.select(a, dev->kind());
    FAIL() << "an MXFP4 weight was accepted on CUDA";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("latent_up is MXFP4"), std::string::npos) << e.what();
  }
}

// One TP8 rank (spec §11 / §14.2 k3-layer-tp8): L = 3584 (replicated), SI = 2 x 3072 / 8 = 768, hidden 7168.
TEST(OpsTp8, MoeTailCombine) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9000);
  const kernels::MoeTailShape& k3 = kernels::kMoeTailK3Tp8;
  TailCase c{"tp8", 1, k3.L, k3.SI, k3.hidden};
  const TailWeights w = make_weights(rng, c);
  for (int64_t T : kernels::kMoeTailK3Rows) {
    c.T = T;
    check_tail(dev, Mode::bf16, w, c, bf16_aligned_impl(T), 9100 + T);
    check_tail(dev, Mode::fp32, w, c, kRowdot, 9200 + T);
  }
  c.T = 1;  // the one-launch kernel against the two launches, bit for bit
  check_one_launch_equals_two_launch(dev, w, c, 9301);
  // Without the norm and without shared experts, fused style, at the bound.
  TailCase bare{"tp8_bare", 1, k3.L, k3.SI, k3.hidden, false, false, kernels::RmsNormStyle::fused};
  check_tail(dev, Mode::bf16, w, bare, kOneLaunch, 9400);
  TailCase fused_style{"tp8_fused_style", 1, k3.L, k3.SI, k3.hidden, true, true, kernels::RmsNormStyle::fused};
  check_tail(dev, Mode::bf16, w, fused_style, kOneLaunch, 9401);
  check_one_launch_equals_two_launch(dev, w, fused_style, 9402);
}

}  // namespace
}  // namespace k3::ops_test
