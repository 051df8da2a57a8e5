// kernels/mla/mla_cp_w_uv_test.cpp: mla_w_uv (kernels/mla/mla_cp.h), the last step of MLA under decode
// context parallelism, with the layer's output gate, on the CPU: the gated op equals mla_w_uv then the
// gate's element bit for bit (both precisions, bf16 and f32 kv_b), also when out is the gate view, at the
// odd shapes of kMlaCpWUvOddCases and one TP8 rank of K3 (kernels/mla/cases.h), over the rows of
// kMlaCpWUvOddRows with rows of no sequence between them; the check rejects a bad gate naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/mla/mla_cp.h"
#include "kernels/mla/mla_test_util.h"

namespace k3::kernels {
namespace {

using mla_test::expect_fail;
using mla_test::f32_view;
using mla_test::MlaBatch;
using mla_test::MlaDims;
using mla_test::MlaProblem;
using mla_test::nan_filled;

constexpr core::DType kF32 = core::DType::f32, kBf16 = core::DType::bf16;

// Normal(0, sd) f32 values rounded to bf16 (activations reach the op rounded), from `seed`.
core::Tensor random_bf16_values(core::Shape shape, double sd, uint64_t seed) {
  core::Rng rng(seed);
  core::Tensor t = core::Tensor::zeros(kF32, shape);
  for (float& x : t.span<float>()) x = core::bf16_round(static_cast<float>(rng.normal(0.0, sd)));
  return t;
}

// Every shape the CPU tests here run: the odd mla_w_uv cases and one TP8 rank of K3.
std::vector<MlaShape> shapes() {
  std::vector<MlaShape> out;
  for (const MlaCpWUvCase& c : kMlaCpWUvOddCases) out.push_back(c.shape);
  out.push_back(kMlaK3Tp8);
  return out;
}
std::string describe(const MlaShape& d) {
  return "H=" + std::to_string(d.heads) + " nope=" + std::to_string(d.nope) + " v=" + std::to_string(d.v) +
         " L=" + std::to_string(d.kv_lora);
}

// mla_w_uv over one batch of sequences of kMlaCpWUvOddRows rows (in a shuffled order, an unowned row
// before each and one at the end): o_lat [rows, H, L] unrounded f32, gate logits [rows, H * v]
// bf16-representable, the first sequence's kv_b.
struct WUvCase {
  MlaDims d;
  std::vector<MlaProblem> probs;
  MlaBatch batch;
  core::Tensor o_lat, gate;
  static std::vector<MlaProblem> problems(const MlaDims& dims, core::DType kv_b_dtype, uint64_t seed) {
    std::vector<MlaProblem> ps;
    ps.reserve(std::size(kMlaCpWUvOddRows));
    for (int64_t T : kMlaCpWUvOddRows) ps.emplace_back(dims, T, T, kF32, kv_b_dtype, 1.0f, seed + ps.size(), 7);
    return ps;
  }
  static std::vector<const MlaProblem*> pointers(const std::vector<MlaProblem>& ps) {
    std::vector<const MlaProblem*> out;
    for (const MlaProblem& p : ps) out.push_back(&p);
    return out;
  }
  WUvCase(const MlaDims& dims, core::DType kv_b_dtype, uint64_t seed)
      : d(dims),
        probs(problems(dims, kv_b_dtype, seed)),
        batch(pointers(probs), 7, seed + 100),
        o_lat(random_bf16_values({batch.rows, int64_t{dims.heads} * dims.kv_lora}, 1.0, seed + 101)),
        gate(random_bf16_values({batch.rows, int64_t{dims.heads} * dims.v}, 2.0, seed + 102)) {
    // Unrounded o_lat (the reduce-scatter's fp32 sum): the op rounds it in bf16 mode.
    for (float& x : o_lat.span<float>()) x *= 1.0f + 1.0f / 3000.0f;
  }
  MlaWUvArgs args(core::TensorView gate_view, core::TensorView out, Precision precision) const {
    MlaWUvArgs a;
    a.o_lat = f32_view(o_lat, {batch.rows, d.heads, d.kv_lora});
    a.seqs = batch.seqs();
    a.kv_b = &probs.front().kv_b;
    a.gate = gate_view;
    a.out = out;
    a.num_heads = d.heads, a.qk_nope = d.nope, a.v_head_dim = d.v, a.kv_lora = d.kv_lora;
    a.precision = precision;
    return a;
  }
  // The standard pair on one output: mla_w_uv without the gate into o, then sigmoid_gate's element
  // round(o * round(sigmoid(g))) on the owned rows (kernels/elementwise/reference.cpp; the literal
  // sigmoid_gate_reference is compared in kernels/mla/mla_cp_w_uv_ops_test.cpp, which links it).
  core::Tensor unfused(Precision precision) const {
    core::Tensor o = nan_filled({batch.rows, int64_t{d.heads} * d.v});
    mla_w_uv_reference(args({}, o.view(), precision));
    for (size_t k = 0; k < batch.probs.size(); ++k)
      for (int64_t t = batch.first_row[k]; t < batch.first_row[k] + batch.probs[k]->T; ++t)
        for (int64_t c = 0; c < o.dim(1); ++c) {
          float& x = o.data<float>()[t * o.dim(1) + c];
          const float g = gate.data<const float>()[t * o.dim(1) + c];
          x = round_act(x * round_act(1.0f / (1.0f + std::exp(-g)), precision), precision);
        }
    return o;
  }
};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// The gated op equals mla_w_uv + sigmoid_gate bit for bit (both precisions, bf16 and f32 kv_b, odd and
// K3 head dims); rows of no sequence stay NaN; without a gate it is the plain W_UV output.
TEST(MlaCpWUvGate, IsWUvThenTheGateBitForBit) {
  uint64_t seed = 700;
  for (const MlaShape& dims : shapes())
    for (core::DType kv_b_dtype : {kBf16, kF32})
      for (Precision precision : {Precision::fp32, Precision::bf16}) {
        SCOPED_TRACE(describe(dims) + (kv_b_dtype == kBf16 ? " kv_b bf16" : " kv_b f32") +
                     (precision == Precision::bf16 ? " bf16" : " fp32"));
        const WUvCase c(dims, kv_b_dtype, seed += 1000);
        const core::Tensor want = c.unfused(precision);
        core::Tensor got = nan_filled(want.shape());
        mla_w_uv_reference(c.args(c.gate.view(), got.view(), precision));
        const int64_t W = got.dim(1);
        for (int64_t i = 0; i < got.numel(); ++i) {
          const float a = got.data<const float>()[i], b = want.data<const float>()[i];
          ASSERT_TRUE(same_bits(a, b) || (std::isnan(a) && std::isnan(b))) << "at " << i << ": " << a << " vs " << b;
        }
        for (int64_t r : c.batch.unowned_rows())
          for (int64_t col = 0; col < W; ++col) EXPECT_TRUE(std::isnan(got.data<const float>()[r * W + col]));
        // The gate really changes the owned outputs, so the comparison above tests it.
        core::Tensor plain = nan_filled(want.shape());
        mla_w_uv_reference(c.args({}, plain.view(), precision));
        int64_t gated_differs = 0;
        for (int64_t i = 0; i < got.numel(); ++i) {
          const float a = got.data<const float>()[i], b = plain.data<const float>()[i];
          gated_differs += std::isfinite(a) && a != b;
        }
        EXPECT_GT(gated_differs, got.numel() / 2);
      }
}

// out may be exactly the gate view: each element's gate is read before its out is written; rows of no
// sequence keep their gate values.
TEST(MlaCpWUvGate, OutMayBeTheGateView) {
  uint64_t seed = 800;
  for (const MlaShape& dims : shapes())
    for (Precision precision : {Precision::fp32, Precision::bf16}) {
      SCOPED_TRACE(describe(dims) + (precision == Precision::bf16 ? " bf16" : " fp32"));
      const WUvCase c(dims, kBf16, seed += 1000);
      core::Tensor want = nan_filled({c.batch.rows, int64_t{dims.heads} * dims.v});
      mla_w_uv_reference(c.args(c.gate.view(), want.view(), precision));
      core::Tensor both = core::Tensor::copy_of(c.gate.view());
      ASSERT_TRUE(mla_w_uv_check(c.args(both.view(), both.view(), precision)).is_ok());
      mla_w_uv_reference(c.args(both.view(), both.view(), precision));
      std::vector<bool> owned(static_cast<size_t>(c.batch.rows), true);
      for (int64_t r : c.batch.unowned_rows()) owned[static_cast<size_t>(r)] = false;
      for (int64_t r = 0; r < c.batch.rows; ++r)
        for (int64_t col = 0; col < both.dim(1); ++col) {
          const int64_t i = r * both.dim(1) + col;
          const float expect = owned[static_cast<size_t>(r)] ? want.data<const float>()[i]     // the gated output
                                                             : c.gate.data<const float>()[i];  // untouched
          ASSERT_TRUE(same_bits(both.data<const float>()[i], expect)) << "row " << r << " col " << col;
        }
    }
}

// On kMlaOdd (the messages name its sizes).
TEST(MlaCpWUvGate, ChecksNameTheBadGate) {
  const WUvCase c(kMlaOdd, kBf16, 900);
  const int64_t R = c.batch.rows, W = int64_t{kMlaOdd.heads} * kMlaOdd.v;
  const std::string rows = std::to_string(R);
  core::Tensor out = nan_filled({R, W}), wide = nan_filled({R + 1, W});
  const auto check = [&](core::TensorView gate, core::TensorView o) {
    return mla_w_uv_check(c.args(gate, o, Precision::bf16));
  };
  EXPECT_TRUE(check(c.gate.view(), out.view()).is_ok()) << check(c.gate.view(), out.view()).reason();
  core::TensorView bad = c.gate.view();
  bad.shape = {R, W - 1};
  expect_fail(check(bad, out.view()),
              {"mla_w_uv", "gate must be undefined (no gate) or F32", "[" + rows + ", " + std::to_string(W) + "]",
               "got F32 [" + rows + ", " + std::to_string(W - 1) + "]"});
  bad = f32_view(c.gate, {R * W});
  expect_fail(check(bad, out.view()), {"gate must be", "unit inner stride"});
  const core::Tensor i32_gate = core::Tensor::zeros(core::DType::i32, {R, W});
  expect_fail(check(i32_gate.view(), out.view()), {"gate must be", "(out's dtype)", "got I32"});
  bad = c.gate.view();
  bad.device = core::Device::cuda;  // never read: the check fails first
  expect_fail(check(bad, out.view()), {"gate must be on cpu", "(o_lat's device)"});
  // out one row below the gate in one buffer: overlapping but not the same view.
  const core::TensorView top = core::TensorView::contiguous(wide.view().data, kF32, {R, W});
  const core::TensorView below = core::TensorView::contiguous(wide.data<float>() + W, kF32, {R, W});
  expect_fail(check(top, below), {"out overlaps gate without being the same view"});
  // out over o_lat's bytes.
  const core::TensorView on_o_lat = core::TensorView::contiguous(c.o_lat.view().data, kF32, {R, W});
  expect_fail(check({}, on_o_lat), {"out must not overlap o_lat"});
  EXPECT_THROW(mla_w_uv_reference(c.args(top, below, Precision::bf16)), core::Error);
}

}  // namespace
}  // namespace k3::kernels
