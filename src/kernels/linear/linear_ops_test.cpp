// kernels/linear/linear_ops_test.cpp: linear y = x W^T on every device backend against the CPU reference:
// bf16 / f32 / MXFP4 weights, rounded outputs and f32 logits, strided rows (column slices of wider
// tensors), random odd shapes and every per-GPU TP8 linear shape of spec §11. The TP8 cases also
// check which implementation ran (cuBLASLt for bf16 x bf16, the row-dot kernel otherwise).
#include <cmath>
#include <string>
#include <vector>

#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

enum class WKind { bf16, f32, mxfp4 };
const char* wkind_name(WKind k) { return k == WKind::bf16 ? "w_bf16" : k == WKind::f32 ? "w_f32" : "w_mxfp4"; }

kernels::LinearWeight make_weight(core::Rng& rng, WKind kind, int64_t out, int64_t in) {
  kernels::LinearWeight w;
  if (kind == WKind::mxfp4) return random_mxfp4_weight(rng, out, in);
  if (kind == WKind::bf16) {
    w.weight = random_bf16_weight(rng, out, in);
  } else {
    w.weight = random_uniform_f32(rng, {out, in}, 1.0 / std::sqrt(static_cast<double>(in)));
  }
  return w;
}

// A [rows, cols] view that is a column slice (starting at column 3) of a wider tensor, when `strided`.
TensorView slice(const Tensor& t, int64_t cols, bool strided) {
  TensorView v = t.view();
  if (!strided) return v;
  v.data = static_cast<char*>(v.data) + 3 * static_cast<int64_t>(core::dtype_size(v.dtype));
  v.shape[1] = cols;
  return v;
}

struct LinearCase {
  int64_t T, in, out;
  bool logits = false;      // round_output = false, f32 out (router, lm_head)
  bool strided = false;     // x and out are column slices of wider tensors
  std::string expect_impl;  // when set, the implementation that must be selected
};

void check_linear(Device* dev, Mode mode, const kernels::LinearWeight& w, WKind kind, const LinearCase& c,
                  uint64_t seed) {
  core::Rng rng(seed);
  const int64_t pad = c.strided ? 7 : 0;
  const Tensor x_full = random_act(rng, {c.T, c.in + pad}, mode);
  const TensorView x = slice(x_full, c.in, c.strided);
  const Precision p = precision(mode);
  Tensor want_full = nan_tensor({c.T, c.out + pad});
  const TensorView want = slice(want_full, c.out, c.strided);
  cpu_registry().linear.run({x, &w, want, !c.logits, p}, core::Device::cpu);

  const kernels::LinearWeight dw = dev->upload(w);
  const Tensor dx_full = dev->act(x_full, mode);
  const DType out_dtype = c.logits ? DType::f32 : act_dtype(mode);
  const Tensor dout_full = dev->poisoned(out_dtype, {c.T, c.out + pad});
  const TensorView dout = slice(dout_full, c.out, c.strided);
  const kernels::LinearArgs args{slice(dx_full, c.in, c.strided), &dw, dout, !c.logits, p};
  expect_device_impl(dev->registry().linear, args, dev);
  if (!c.expect_impl.empty()) {
    EXPECT_EQ(dev->registry().linear.select(args, dev->kind()).name, c.expect_impl);
  }
  dev->registry().linear.run(args, dev->kind());
  const Tensor got = dev->to_host_f32(dout);
  const Tensor want_c = copy_rows(want);
  std::string what = std::string(wkind_name(kind)) + (c.logits ? "_logits" : "") + (c.strided ? "_strided" : "");
  expect_close("linear", shape_str({c.T, c.in, c.out}), mode, what, got, want_c, tol_reduction(mode));
}

TEST(OpsOdd, Linear) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(2000);
  struct Shape3 {
    int64_t in, out;
  };
  for (WKind kind : {WKind::bf16, WKind::f32, WKind::mxfp4}) {
    // MXFP4 needs in % 32 == 0; the dense cases use odd widths.
    for (Shape3 s : kind == WKind::mxfp4 ? std::vector<Shape3>{{96, 17}, {64, 97}}
                                         : std::vector<Shape3>{{97, 54}, {54, 17}, {17, 97}}) {
      const kernels::LinearWeight w = make_weight(rng, kind, s.out, s.in);
      for (Mode m : kModes)
        for (int64_t T : {1, 17, 54, 97}) {
          check_linear(dev, m, w, kind, {T, s.in, s.out, false, false, ""}, 2100 + T);
          if (T == 17) check_linear(dev, m, w, kind, {T, s.in, s.out, true, true, ""}, 2200 + T);
        }
    }
  }
}

TEST(OpsTp8, Linear) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(3000);
  struct Tp8Shape {
    const char* name;
    int64_t out, in;
    bool logits;
  };
  // Spec §11, per GPU at TP8 (bf16 weights).
  const Tp8Shape shapes[] = {{"kda.qkvg", 6144, 7168, false},       {"kda.f_a", 128, 7168, false},
                             {"kda.f_b", 1536, 128, false},         {"kda.b", 12, 7168, false},
                             {"attn.o_proj", 7168, 1536, false},    {"mla.q_a", 1536, 7168, false},
                             {"mla.kv_a", 576, 7168, false},        {"mla.q_b", 2304, 1536, false},
                             {"mla.g", 1536, 7168, false},          {"moe.router", 896, 7168, true},
                             {"moe.down", 3584, 7168, false},       {"moe.up", 7168, 3584, false},
                             {"shared.gate_up", 1536, 7168, false}, {"shared.down", 7168, 768, false},
                             {"dense0.gate", 4224, 7168, false},    {"lm_head", 20480, 7168, true}};
  for (const Tp8Shape& s : shapes) {
    SCOPED_TRACE(s.name);
    const kernels::LinearWeight w = make_weight(rng, WKind::bf16, s.out, s.in);
    for (int64_t T : {1, 8}) {
      // bf16 x bf16: cuBLASLt; f32 activations with bf16 weights: the row-dot kernel.
      check_linear(dev, Mode::bf16, w, WKind::bf16, {T, s.in, s.out, s.logits, false, "cuda_cublaslt"}, 3100 + T);
      if (T == 8)
        check_linear(dev, Mode::fp32, w, WKind::bf16, {T, s.in, s.out, s.logits, false, "cuda_rowdot"}, 3200 + T);
    }
  }
  // MXFP4 weights at expert shapes (the rowdot path's MXFP4 decode), f32 weights through cuBLASLt.
  const kernels::LinearWeight w13 = make_weight(rng, WKind::mxfp4, 384, 3584),
                              w2 = make_weight(rng, WKind::mxfp4, 3584, 384);
  const kernels::LinearWeight wf = make_weight(rng, WKind::f32, 1536, 7168);
  for (Mode m : kModes)
    for (int64_t T : {1, 8}) {
      check_linear(dev, m, w13, WKind::mxfp4, {T, 3584, 384, false, false, "cuda_rowdot"}, 3300 + T);
      check_linear(dev, m, w2, WKind::mxfp4, {T, 384, 3584, false, false, "cuda_rowdot"}, 3400 + T);
    }
  check_linear(dev, Mode::fp32, wf, WKind::f32, {8, 7168, 1536, false, false, "cuda_cublaslt"}, 3500);
}

}  // namespace
}  // namespace k3::ops_test
