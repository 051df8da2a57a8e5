// kernels/kda/kda_decode_test.cpp: the fused KDA decode op's CPU reference against the
// standard path's op sequence (linear f_b, kda_conv x3, kda_recurrent, kda_output_gate, run through
// the reference registry exactly as model/layers/kda.cpp calls them): outputs, o trace, both state
// pools bit for bit in fp32 and bf16, at odd shapes (row-strided column slices of one fused
// projection buffer, padded pool slots, shuffled rows and slots, an uncovered row, positions 0 and
// mid-stream, multi-row verify sequences) and at one TP8 rank's K3 shapes; no_commit leaves both
// pools byte-identical; verify then replay of the accepted prefix equals decoding row by row; bad
// arguments fail with messages naming them.
#include "kernels/kda/kda_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/kda/cases.h"
#include "kernels/kda/kda_test_util.h"
#include "kernels/registry.h"

namespace k3::kernels {
namespace {

using namespace kda_test;

using Shapes = kernels::KdaDecodeShape;  // kernels/kda/cases.h

// A state pool [num_slots, inner...] whose slots sit `pad` elements apart beyond their size (the
// slot stride is free in both pools), backed by one tensor.
struct Pool {
  Tensor backing;
  TensorView view;
  Pool copy() const {
    Pool p{kda_test::copy(backing), view};
    p.view.data = p.backing.data<float>();
    return p;
  }
  std::span<const float> all() const { return backing.span<float>(); }
};
Pool make_pool(core::Rng& rng, core::Shape shape, int64_t pad, double std, Precision p) {
  int64_t slot_elems = 1;
  for (int i = 1; i < shape.rank(); ++i) slot_elems *= shape[i];
  Pool pool{random(rng, {shape[0], slot_elems + pad}, 0.0, std, p), {}};
  pool.view.data = pool.backing.data<float>();
  pool.view.dtype = core::DType::f32;
  pool.view.shape = shape;
  int64_t stride = 1;
  for (int i = shape.rank() - 1; i >= 1; --i) pool.view.strides[i] = stride, stride *= shape[i];
  pool.view.strides[0] = slot_elems + pad;
  return pool;
}
void zero_slot(Pool& pool, int64_t slot) {
  std::fill_n(pool.backing.data<float>() + slot * pool.view.strides[0], pool.view.strides[0], 0.0f);
}

// Part i of the conv storage as the pool the conv op takes (model/layers/kda.cpp conv_pool).
TensorView conv_pool(const TensorView& s, int64_t i) {
  TensorView v = s;
  v.data = static_cast<char*>(s.data) + i * s.strides[1] * static_cast<int64_t>(core::dtype_size(s.dtype));
  v.shape = core::Shape{s.dim(0), s.dim(2), s.dim(3)};
  v.strides = {s.strides[0], s.strides[2], s.strides[3], 0};
  return v;
}

// Every input of one layer's step: the fused projection buffer [T, 4P + R + H + 3] (q_in, k_in,
// v_in, g, f_a, b side by side, 3 spare columns so the row stride is odd), weights, both pools.
struct Layer {
  Shapes s;
  int64_t T = 0, P = 0, num_slots = 0;
  Precision p = Precision::fp32;
  Tensor proj, q_conv, k_conv, v_conv, a_log, dt_bias, o_norm;
  LinearWeight f_b;
  Pool conv, state;

  Layer(uint64_t seed, Shapes sh, int64_t T_, int64_t slots, Precision prec, bool bf16_weights, bool conv_rank3)
      : s(sh), T(T_), P(static_cast<int64_t>(sh.H) * sh.D), num_slots(slots), p(prec) {
    core::Rng rng(seed);
    proj = random(rng, {T, 4 * P + s.R + s.H + 3}, 0.0, 1.0, p);
    // f_b [P, R], std 1/sqrt(R) around a negative mean so decays spread; bf16 or f32.
    Tensor fb = random(rng, {P, s.R}, -0.3 / s.R, 2.0 / std::sqrt(static_cast<double>(s.R)));
    if (bf16_weights) {
      Tensor w = Tensor::zeros(core::DType::bf16, {P, s.R});
      for (int64_t i = 0; i < fb.numel(); ++i) w.data<uint16_t>()[i] = core::f32_to_bf16_bits(fb.data<float>()[i]);
      f_b.weight = w;
    } else {
      f_b.weight = fb;
    }
    const core::Shape cw = conv_rank3 ? core::Shape{P, 1, s.K} : core::Shape{P, s.K};
    q_conv = random(rng, cw, 0.0, 0.6), k_conv = random(rng, cw, 0.0, 0.6), v_conv = random(rng, cw, 0.0, 0.6);
    a_log = random(rng, {s.H + 2}, 0.0, 0.5);  // junk past H is never read
    dt_bias = random(rng, {P}, 0.0, 1.0);
    o_norm = random(rng, {s.D}, 1.0, 0.3);
    conv = make_pool(rng, {slots, 3, P, s.K - 1}, 5, 1.0, p);  // bf16 values in bf16 mode
    state = make_pool(rng, {slots, s.H, s.D, s.D}, 7, 0.5, Precision::fp32);
  }
  TensorView col(int64_t c0, int64_t n) const { return cols(proj.view(), c0, n); }
  TensorView q_in() const { return col(0, P); }
  TensorView k_in() const { return col(P, P); }
  TensorView v_in() const { return col(2 * P, P); }
  TensorView g() const { return col(3 * P, P); }
  TensorView f_a() const { return col(4 * P, s.R); }
  TensorView b() const { return col(4 * P + s.R, s.H); }

  KdaDecodeArgs args(const Pool& conv_pool_, const Pool& state_pool, const Tensor& out, const SeqBatch& seqs,
                     bool no_commit) const {
    KdaDecodeArgs a;
    a.q_in = q_in(), a.k_in = k_in(), a.v_in = v_in(), a.g = g(), a.f_a = f_a(), a.f_b = &f_b, a.b = b();
    a.q_conv = q_conv.view(), a.k_conv = k_conv.view(), a.v_conv = v_conv.view();
    a.conv_state = conv_pool_.view, a.a_log = a_log.view(), a.dt_bias = dt_bias.view();
    a.state = state_pool.view, a.o_norm = o_norm.view(), a.out = out.view();
    a.num_heads = s.H, a.head_dim = s.D, a.lower_bound = -5.0f, a.rms_eps = 1e-5f, a.precision = p;
    a.seqs = seqs, a.no_commit = no_commit;
    return a;
  }
};

Registry& reference_registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    register_reference_ops(*reg);
    return reg;
  }();
  return *r;
}

// The conv weight as the [P, K] the conv op takes (model/layers/kda.cpp conv_weight).
TensorView conv_weight(const Tensor& w) {
  if (w.view().rank() == 2) return w.view();
  return TensorView::contiguous(w.data<void>(), w.dtype(), {w.dim(0), w.dim(2)});
}

// The standard path's op sequence over `seqs` (model/layers/kda.cpp attention(), decode and verify
// branches): y [T, P] and o [T, P] (poisoned where no sequence writes).
void run_standard(const Layer& L, Pool& conv, Pool& state, const SeqBatch& seqs, bool no_commit, Tensor& y, Tensor& o) {
  Registry& reg = reference_registry();
  const int64_t T = L.T, P = L.P;
  Tensor f = poisoned({T, P}), q = poisoned({T, P}), k = poisoned({T, P}), v = poisoned({T, P});
  LinearArgs lin{L.f_a(), &L.f_b, f.view(), true, L.p};
  reg.linear.run(lin, core::Device::cpu);
  const TensorView ins[3] = {L.q_in(), L.k_in(), L.v_in()};
  const Tensor* ws[3] = {&L.q_conv, &L.k_conv, &L.v_conv};
  Tensor* outs[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) {
    KdaConvArgs c{ins[i], conv_weight(*ws[i]), conv_pool(conv.view, i), outs[i]->view(), L.p, seqs};
    c.no_commit = no_commit;
    reg.kda_conv.run(c, core::Device::cpu);
  }
  o = poisoned({T, P});
  KdaAttentionArgs r{
      q.view(), k.view(), v.view(), f.view(), L.b(), L.a_log.view(), L.dt_bias.view(), state.view, o.view(), L.s.H,
      L.s.D,    -5.0f,    64,       L.p,      seqs};
  r.no_commit = no_commit;
  reg.kda_recurrent.run(r, core::Device::cpu);
  y = poisoned({T, P});
  reg.kda_output_gate.run({o.view(), L.g(), L.o_norm.view(), y.view(), L.s.H, L.s.D, 1e-5f, L.p}, core::Device::cpu);
}

bool rows_bits_equal(const Tensor& a, const Tensor& b, int64_t t) {
  const int64_t P = a.dim(1);
  return bits_equal({a.data<float>() + t * P, static_cast<size_t>(P)},
                    {b.data<float>() + t * P, static_cast<size_t>(P)});
}
bool row_all_nan(const Tensor& a, int64_t t) {
  for (int64_t c = 0; c < a.dim(1); ++c)
    if (!std::isnan(a.data<float>()[t * a.dim(1) + c])) return false;
  return true;
}

// Runs the fused op (through the registry) and the standard sequence on copies of the same pools
// and expects equal bits everywhere: out and o_trace rows of the sequences, both pools; rows no
// sequence covers stay NaN.
void expect_fused_equals_standard(const Layer& L, const std::vector<SeqSpec>& specs, bool no_commit,
                                  const std::string& what) {
  SCOPED_TRACE(what + (L.p == Precision::bf16 ? " bf16" : " fp32") + (no_commit ? " no_commit" : " commit"));
  const HostSeqs hs = make_seqs(specs);
  Pool conv_f = L.conv.copy(), state_f = L.state.copy(), conv_s = L.conv.copy(), state_s = L.state.copy();
  Tensor out = poisoned({L.T, L.P}), o_trace = poisoned({L.T, L.P});
  KdaDecodeArgs a = L.args(conv_f, state_f, out, hs.batch, no_commit);
  a.o_trace = o_trace.view();
  EXPECT_EQ(reference_registry().kda_decode.select(a, core::Device::cpu).name, "reference");
  reference_registry().kda_decode.run(a, core::Device::cpu);

  Tensor y, o;
  run_standard(L, conv_s, state_s, hs.batch, no_commit, y, o);
  std::vector<bool> covered(static_cast<size_t>(L.T), false);
  for (const SeqSpec& s : specs)
    for (int64_t t = s.row_begin; t < s.row_begin + s.num_rows; ++t) covered[static_cast<size_t>(t)] = true;
  for (int64_t t = 0; t < L.T; ++t) {
    if (covered[static_cast<size_t>(t)]) {
      EXPECT_TRUE(all_finite({out.data<float>() + t * L.P, static_cast<size_t>(L.P)})) << "row " << t;
      EXPECT_TRUE(rows_bits_equal(out, y, t)) << "out row " << t;
      EXPECT_TRUE(rows_bits_equal(o_trace, o, t)) << "o_trace row " << t;
    } else {
      EXPECT_TRUE(row_all_nan(out, t)) << "row " << t << " belongs to no sequence but was written";
      EXPECT_TRUE(row_all_nan(o_trace, t)) << "o_trace row " << t << " belongs to no sequence but was written";
    }
  }
  EXPECT_TRUE(bits_equal(conv_f.all(), conv_s.all())) << "conv pool";
  EXPECT_TRUE(bits_equal(state_f.all(), state_s.all())) << "state pool";
  if (no_commit) {
    EXPECT_TRUE(bits_equal(conv_f.all(), L.conv.all())) << "no_commit changed the conv pool";
    EXPECT_TRUE(bits_equal(state_f.all(), L.state.all())) << "no_commit changed the state pool";
  }
}

// Sequences over rows laid out in the given order (row count, slot, position each), leaving row
// `gap` (if >= 0) to no sequence. Returns the specs and sets T.
std::vector<SeqSpec> layout(const std::vector<SeqSpec>& seqs_in, int64_t gap, int64_t* T) {
  std::vector<SeqSpec> out;
  int64_t row = 0;
  for (size_t i = 0; i < seqs_in.size(); ++i) {
    if (static_cast<int64_t>(i) == gap) ++row;
    SeqSpec s = seqs_in[i];
    s.row_begin = row;
    row += s.num_rows;
    out.push_back(s);
  }
  *T = row;
  return out;
}

TEST(KdaDecode, EqualsStandardSequenceAtOddShapes) {
  uint64_t seed = 1;
  for (const Shapes& sh : kernels::kKdaDecodeOddShapes)
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      // Four sequences (decode 1 row, verify 3 and 5 rows, decode 1 row) in shuffled slots of a
      // 6-slot pool, one new (position 0, zero state), one row between them covered by none.
      int64_t T = 0;
      const std::vector<SeqSpec> specs = layout({{0, 1, 4, 9}, {0, 3, 1, 0}, {0, 5, 5, 33}, {0, 1, 0, 1000}}, /*gap=*/2,
                                                &T);
      ++seed;
      Layer L(seed, sh, T, 6, p, /*bf16_weights=*/seed % 2 == 0, /*conv_rank3=*/seed % 3 == 0);
      zero_slot(L.conv, 1), zero_slot(L.state, 1);  // the position-0 sequence starts from nothing
      for (bool no_commit : {false, true}) expect_fused_equals_standard(L, specs, no_commit, sh.name);
    }
}

TEST(KdaDecode, EqualsStandardSequenceAtTp8Shapes) {
  // One TP8 rank of K3 (spec §11, §14.2 k3-layer-tp8): 12 heads of 128, P = 1536, R = 128, K = 4,
  // bf16 f_b, checkpoint conv weights [P, 1, K]; a decode batch of 3 and a verify sequence of 4 rows.
  for (Precision p : {Precision::bf16, Precision::fp32}) {
    int64_t T = 0;
    const std::vector<SeqSpec> specs = layout({{0, 1, 2, 511}, {0, 4, 0, 77}, {0, 1, 3, 0}, {0, 1, 1, 8191}}, -1, &T);
    Layer L(77, kernels::kKdaDecodeK3Tp8, T, 4, p, /*bf16_weights=*/true, /*conv_rank3=*/true);
    zero_slot(L.conv, 3), zero_slot(L.state, 3);
    for (bool no_commit : {false, true}) expect_fused_equals_standard(L, specs, no_commit, "tp8");
  }
}

// Verify (no_commit) of 5 rows, then for each accepted prefix n: the replay of those n rows with
// commit leaves the pools exactly as decoding them one row per call does, and the verify outputs
// equal the committing call's outputs.
TEST(KdaDecode, VerifyThenReplayEqualsRowByRowDecode) {
  for (Precision p : {Precision::bf16, Precision::fp32}) {
    const Shapes sh{"H3 D32 R54 K4", 3, 32, 54, 4};
    const int64_t T = 6;  // rows 0..4: the verify rows of sequence A; row 5: sequence B (decode)
    Layer L(2024, sh, T, 3, p, true, false);
    const HostSeqs verify = make_seqs({{0, 5, 2, 40}, {5, 1, 0, 7}});
    Pool conv_v = L.conv.copy(), state_v = L.state.copy();
    Tensor out_v = poisoned({T, L.P});
    kda_decode_reference(L.args(conv_v, state_v, out_v, verify.batch, true));
    EXPECT_TRUE(bits_equal(conv_v.all(), L.conv.all()));
    EXPECT_TRUE(bits_equal(state_v.all(), L.state.all()));
    Pool conv_c = L.conv.copy(), state_c = L.state.copy();
    Tensor out_c = poisoned({T, L.P});
    kda_decode_reference(L.args(conv_c, state_c, out_c, verify.batch, false));
    EXPECT_TRUE(bits_equal(out_v.span<float>(), out_c.span<float>())) << "verify outputs differ from committing ones";

    for (int64_t n = 1; n <= 5; ++n) {
      SCOPED_TRACE("accepted " + std::to_string(n));
      Pool conv_r = L.conv.copy(), state_r = L.state.copy();
      Tensor scratch = poisoned({T, L.P});
      kda_decode_reference(L.args(conv_r, state_r, scratch, make_seqs({{0, n, 2, 40}}).batch, false));
      Pool conv_1 = L.conv.copy(), state_1 = L.state.copy();
      Tensor out_1 = poisoned({T, L.P});
      for (int64_t i = 0; i < n; ++i)
        kda_decode_reference(L.args(conv_1, state_1, out_1, make_seqs({{i, 1, 2, 40 + i}}).batch, false));
      EXPECT_TRUE(bits_equal(conv_r.all(), conv_1.all())) << "conv pool";
      EXPECT_TRUE(bits_equal(state_r.all(), state_1.all())) << "state pool";
      for (int64_t t = 0; t < n; ++t) EXPECT_TRUE(rows_bits_equal(out_1, out_v, t)) << "row " << t;
    }
  }
}

TEST(KdaDecode, EmptyBatchTouchesNothing) {
  Layer L(5, {"H2 D16 R8 K4", 2, 16, 8, 4}, 3, 2, Precision::bf16, true, false);
  Pool conv = L.conv.copy(), state = L.state.copy();
  Tensor out = poisoned({L.T, L.P});
  kda_decode_reference(L.args(conv, state, out, make_seqs({}).batch, false));
  for (int64_t t = 0; t < L.T; ++t) EXPECT_TRUE(row_all_nan(out, t));
  EXPECT_TRUE(bits_equal(conv.all(), L.conv.all()));
  EXPECT_TRUE(bits_equal(state.all(), L.state.all()));
}

// A bad argument fails the check with a message naming it.
TEST(KdaDecode, CheckNamesBadArguments) {
  Layer L(9, {"H2 D16 R8 K4", 2, 16, 8, 4}, 3, 2, Precision::fp32, true, false);
  Tensor out = poisoned({L.T, L.P});
  const HostSeqs hs = make_seqs({{0, 2, 1, 0}, {2, 1, 0, 5}});
  const KdaDecodeArgs good = L.args(L.conv, L.state, out, hs.batch, false);
  ASSERT_TRUE(kda_decode_check(good)) << kda_decode_check(good).reason();
  const auto expect_fail = [&](KdaDecodeArgs a, const std::string& needle) {
    const core::Status s = kda_decode_check(a);
    ASSERT_FALSE(s) << "expected a failure naming " << needle;
    EXPECT_NE(s.reason().find(needle), std::string::npos) << s.reason();
  };
  KdaDecodeArgs a = good;
  a.f_b = nullptr;
  expect_fail(a, "f_b");
  Tensor short_bias = f32({L.P - 1});
  a = good, a.dt_bias = short_bias.view();
  expect_fail(a, "dt_bias");
  a = good, a.out = cols(L.proj.view(), 0, L.P);  // out over q_in
  expect_fail(a, "out must not overlap q_in");
  Tensor wide_norm = f32({L.s.D + 1});
  a = good, a.o_norm = wide_norm.view();
  expect_fail(a, "o_norm");
  core::Rng rng(1);
  Pool three = make_pool(rng, {3, L.s.H, L.s.D, L.s.D}, 0, 1.0, Precision::fp32);
  a = good, a.state = three.view;
  expect_fail(a, "slots");
  a = good, a.f_a = cols(L.proj.view(), 4 * L.P, L.s.R - 1);
  expect_fail(a, "f_a");
  Tensor k5 = f32({L.P, 5});
  a = good, a.v_conv = k5.view();
  expect_fail(a, "v_conv");
  a = good, a.lower_bound = 0.5f;
  expect_fail(a, "lower_bound");
  const HostSeqs shared = make_seqs({{0, 1, 1, 0}, {1, 1, 1, 0}});
  a = good, a.seqs = shared.batch;
  expect_fail(a, "never share a slot");
}

}  // namespace
}  // namespace k3::kernels
