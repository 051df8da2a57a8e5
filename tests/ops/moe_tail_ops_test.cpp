// tests/ops/moe_tail_ops_test.cpp: the fused moe_tail_combine op (the MoE tail after the routed
// experts: situ_glu, shared_down, routed rmsnorm, latent_up, add; two launches on CUDA) on every device
// backend against the CPU reference, both modes: odd shapes (strided inputs, out a column slice of a
// NaN-poisoned buffer whose gaps must stay NaN; with and without the routed norm and the shared
// experts; both rmsnorm styles) and one TP8 rank's shapes (L 3584, SI 768, hidden 7168) at T = 1, 2, 8,
// 64. Every case checks which implementation ran: for bf16 with L and SI multiples of 8 cuda_tail_mma
// (tensor cores) up to 16 rows and cuda_tail_cublaslt above; cuda_tail_rowdot otherwise (every fp32 case).
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "tests/ops/op_harness.h"

namespace k3::ops_test {
namespace {

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

void check_tail(Device* dev, Mode mode, const TailWeights& w, const TailCase& c, const std::string& expect_impl,
                uint64_t seed) {
  SCOPED_TRACE(c.name + " T " + std::to_string(c.T) + " " + mode_name(mode));
  core::Rng rng(seed);
  const Precision p = precision(mode);
  const int64_t pad = 2 * c.offset;
  const Tensor u = random_act(rng, {c.T, c.L + pad}, mode);
  const Tensor gate = random_act(rng, {c.T, c.SI + pad}, mode, 0.0, 6.0);   // both SiTU saturations
  const Tensor up = random_act(rng, {c.T, c.SI + pad}, mode, 0.0, 30.0);
  const int64_t width = c.hidden + pad;

  const auto args_for = [&](const TensorView& u_v, const TensorView& norm_v, const kernels::LinearWeight* w_up,
                            const TensorView& gate_v, const TensorView& up_v, const kernels::LinearWeight* w_down,
                            const TensorView& out_v) {
    kernels::MoeTailCombineArgs a;
    a.u = u_v;
    a.latent_norm = c.use_norm ? norm_v : TensorView{};
    a.latent_up = w_up;
    if (c.shared) {
      a.shared_gate = gate_v;
      a.shared_up = up_v;
      a.shared_down = w_down;
    }
    a.out = out_v;
    a.use_norm = c.use_norm;
    a.style = c.style;
    a.precision = p;
    return a;
  };

  // CPU oracle.
  Tensor want = nan_tensor({c.T, width});
  cpu_registry().moe_tail_combine.run(args_for(columns(u, c.offset, c.L), w.norm.view(), &w.up,
                                               columns(gate, c.offset, c.SI), columns(up, c.offset, c.SI), &w.down,
                                               columns(want, c.offset, c.hidden)),
                                      core::Device::cpu);

  // Device, NaN-poisoned out.
  const kernels::LinearWeight d_up = dev->upload(w.up), d_down = dev->upload(w.down);
  const Tensor d_norm = dev->upload(w.norm);
  const Tensor du = dev->act(u, mode), dgate = dev->act(gate, mode), dup = dev->act(up, mode);
  const Tensor dout = dev->poisoned(act_dtype(mode), {c.T, width});
  const kernels::MoeTailCombineArgs args =
      args_for(columns(du, c.offset, c.L), d_norm.view(), &d_up, columns(dgate, c.offset, c.SI),
               columns(dup, c.offset, c.SI), &d_down, columns(dout, c.offset, c.hidden));
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

TEST(OpsOdd, MoeTailCombine) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(8000);
  uint64_t seed = 8100;
  // Odd widths: the row-dot kernel in both modes; every norm/shared/style combination.
  for (const auto& [L, SI, hidden] : std::vector<std::array<int64_t, 3>>{{17, 54, 97}, {97, 1, 54}})
    for (bool use_norm : {true, false})
      for (bool shared : {true, false}) {
        TailCase c{"odd", 1, L, SI, hidden, use_norm, shared};
        c.style = shared ? kernels::RmsNormStyle::moonshot : kernels::RmsNormStyle::fused;
        const TailWeights w = make_weights(rng, c);
        for (Mode m : kModes)
          for (int64_t T : {1, 17, 54}) {
            c.T = T;
            c.offset = T % 2 ? 3 : 0;
            check_tail(dev, m, w, c, "cuda_tail_rowdot", ++seed);
          }
      }
  // L, SI multiples of 8: tensor cores in bf16 mode up to 16 rows (T 9 the 2-tile form; hidden 97 a partial
  // 16-column tile), cuBLASLt above (T 17, 54, 97), row-dot in fp32 mode.
  for (bool use_norm : {true, false})
    for (bool shared : {true, false}) {
      TailCase c{"aligned", 1, 96, 40, 97, use_norm, shared};
      const TailWeights w = make_weights(rng, c);
      for (Mode m : kModes)
        for (int64_t T : {1, 9, 17, 54, 97}) {
          c.T = T;
          c.offset = T % 2 ? 8 : 0;  // 16-byte aligned column slices
          const char* bf16_impl = T > 16 ? "cuda_tail_cublaslt" : "cuda_tail_mma";
          check_tail(dev, m, w, c, m == Mode::bf16 ? bf16_impl : "cuda_tail_rowdot", ++seed);
        }
    }
  // Aligned widths but inputs at an odd column offset: the workspace keeps the GEMM aligned, so still mma.
  {
    TailCase c{"unaligned_inputs", 5, 96, 40, 54};
    c.offset = 3;
    const TailWeights w = make_weights(rng, c);
    check_tail(dev, Mode::bf16, w, c, "cuda_tail_mma", ++seed);
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
  TailCase c{"tp8", 1, 3584, 768, 7168};
  const TailWeights w = make_weights(rng, c);
  for (int64_t T : {1, 2, 8, 64}) {
    c.T = T;
    check_tail(dev, Mode::bf16, w, c, T > 16 ? "cuda_tail_cublaslt" : "cuda_tail_mma", 9100 + T);
    check_tail(dev, Mode::fp32, w, c, "cuda_tail_rowdot", 9200 + T);
  }
}

}  // namespace
}  // namespace k3::ops_test
