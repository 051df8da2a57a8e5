// kernels/kda/recurrent_test.cpp: the recurrent KDA delta rule (spec §5.3-5.5) against a naive
// double form at the shapes and token counts of cases.h (one TP8 rank of K3: prefill, then decode
// and verify steps), a hand-computed D=2 example, the V-major state layout, per-head A_log, the gate
// bound, continuation and multi-token decode, head independence and strided inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/kda/cases.h"
#include "kernels/kda/gate.h"
#include "kernels/kda/kda.h"
#include "kernels/kda/kda_test_util.h"

namespace k3::kernels {
namespace {

using namespace kda_test;

// Runs the recurrent form over tokens [t0, t0+n) of `in` from `state` (updated); returns o [n, H*D].
Tensor recurrent(const AttnInputs& in, const Tensor& state, Precision p, int64_t t0 = 0, int64_t n = -1) {
  if (n < 0) n = in.T - t0;
  Tensor out = poisoned({n, static_cast<int64_t>(in.H) * in.D});
  kda_recurrent_reference(in.args(state, out, p, 64, t0, n));
  return out;
}

TEST(KdaRecurrent, MatchesNaiveOnOddShapes) {
  uint64_t seed = 100;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    for (const KdaAttnShape& sh : kKdaAttnOddShapes)
      for (int64_t T : kKdaAttnOddTokens) {
        SCOPED_TRACE(std::string(sh.name) + " T=" + std::to_string(T) + (p == Precision::bf16 ? " bf16" : " fp32"));
        const AttnInputs in = AttnInputs::random(seed++, static_cast<int>(T), sh.H, sh.D, p);
        std::vector<double> S = to_dvec(in.state0);
        const std::vector<double> ref = naive_recurrent(in, S);
        Tensor state = copy(in.state0);
        Tensor out = recurrent(in, state, p);
        if (p == Precision::fp32) EXPECT_LT(rel_err(out.span<float>(), ref), 1e-5);
        else EXPECT_TRUE(bf16_close(out.span<float>(), ref));
        EXPECT_LT(rel_err(state.span<float>(), S), 1e-5);  // the state is fp32 in both modes
      }
  }
}

// One head, D = 2, two tokens, every §5.3-5.5 step written out by hand in fp32.
TEST(KdaRecurrent, HandComputedTwoByTwo) {
  AttnInputs in;
  in.T = 2, in.H = 1, in.D = 2;
  auto fill = [](Shape s, std::vector<float> v) {
    Tensor t = f32(s);
    std::copy(v.begin(), v.end(), t.data<float>());
    return t;
  };
  in.q = fill({2, 2}, {3.0f, 4.0f, -1.0f, 2.0f});
  in.k = fill({2, 2}, {1.0f, 2.0f, 2.0f, -0.5f});
  in.v = fill({2, 2}, {2.0f, 5.0f, -3.0f, 1.0f});
  in.f = fill({2, 2}, {0.0f, -2.0f, 1.0f, 0.5f});
  in.b = fill({2, 1}, {0.0f, 1.0f});
  in.a_log = fill({1}, {0.25f});
  in.dt_bias = fill({2}, {0.5f, -0.25f});
  // Non-symmetric initial state, V-major: S[v][k] at v*2 + k.
  in.state0 = fill({1, 2, 2}, {1.0f, 2.0f, 3.0f, 4.0f});

  float s00 = 1.0f, s01 = 2.0f, s10 = 3.0f, s11 = 4.0f;  // S[v][k]
  const float A = std::exp(0.25f);
  std::vector<float> expect_o;
  for (int t = 0; t < 2; ++t) {
    const float* q = in.q.data<float>() + 2 * t;
    const float* k = in.k.data<float>() + 2 * t;
    const float* v = in.v.data<float>() + 2 * t;
    const float* f = in.f.data<float>() + 2 * t;
    const float nq = std::sqrt(q[0] * q[0] + q[1] * q[1] + 1e-6f), nk = std::sqrt(k[0] * k[0] + k[1] * k[1] + 1e-6f);
    const float scale = 1.0f / std::sqrt(2.0f);
    const float q0 = q[0] / nq * scale, q1 = q[1] / nq * scale, k0 = k[0] / nk, k1 = k[1] / nk;
    // g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias)), alpha = exp(g)
    const float a0 = std::exp(-5.0f * (1.0f / (1.0f + std::exp(-(A * (f[0] + 0.5f))))));
    const float a1 = std::exp(-5.0f * (1.0f / (1.0f + std::exp(-(A * (f[1] + -0.25f))))));
    const float beta = 1.0f / (1.0f + std::exp(-in.b.data<float>()[t]));
    s00 *= a0, s01 *= a1, s10 *= a0, s11 *= a1;                      // 1. decay along the key axis
    const float r0 = s00 * k0 + s01 * k1, r1 = s10 * k0 + s11 * k1;  // 2. read
    const float u0 = beta * (v[0] - r0), u1 = beta * (v[1] - r1);    // 3. delta
    s00 += u0 * k0, s01 += u0 * k1, s10 += u1 * k0, s11 += u1 * k1;  // 4. write
    expect_o.push_back(s00 * q0 + s01 * q1);                         // 5. output, post-update state
    expect_o.push_back(s10 * q0 + s11 * q1);
  }
  Tensor state = copy(in.state0);
  Tensor out = recurrent(in, state, Precision::fp32);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(out.data<float>()[i], expect_o[i]) << i;
  const float expect_s[4] = {s00, s01, s10, s11};  // memory order: V-major
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(state.data<float>()[i], expect_s[i]) << i;

  // The same tokens from the transposed initial state give something else.
  Tensor transposed = fill({1, 2, 2}, {1.0f, 3.0f, 2.0f, 4.0f});
  Tensor out_t = recurrent(in, transposed, Precision::fp32);
  EXPECT_GT(std::abs(out_t.data<float>()[0] - expect_o[0]) + std::abs(out_t.data<float>()[1] - expect_o[1]), 1e-3);
}

TEST(KdaRecurrent, StateIsVMajorNotKMajor) {
  const AttnInputs in = AttnInputs::random(7, 9, 2, 32);
  const int H = 2, D = 32;
  // Same state in the other orientation: S'[h][k][v] = S[h][v][k].
  Tensor transposed = f32({H, D, D});
  for (int h = 0; h < H; ++h)
    for (int a = 0; a < D; ++a)
      for (int b = 0; b < D; ++b)
        transposed.data<float>()[(h * D + a) * D + b] = in.state0.data<float>()[(h * D + b) * D + a];
  std::vector<double> S = to_dvec(in.state0);
  const std::vector<double> ref = naive_recurrent(in, S);  // naive reads S[h][v][k]
  Tensor state = copy(in.state0);
  Tensor out = recurrent(in, state, Precision::fp32);
  Tensor out_t = recurrent(in, transposed, Precision::fp32);
  EXPECT_LT(rel_err(out.span<float>(), ref), 1e-5);
  EXPECT_GT(rel_err(out_t.span<float>(), ref), 1e-2);  // the orientation is visible in o
}

TEST(KdaRecurrent, ALogIsPerHeadAndOnlyTheFirstHEntriesMatter) {
  const int T = 17, H = 3, D = 32;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const AttnInputs base = AttnInputs::random(31, T, H, D, p);
    Tensor s0 = copy(base.state0);
    const Tensor o0 = recurrent(base, s0, p);

    AttnInputs junk = base;  // entries H..2H-1 changed
    junk.a_log = copy(base.a_log);
    for (int i = H; i < 2 * H; ++i) junk.a_log.data<float>()[i] += 3.0f;
    Tensor s1 = copy(base.state0);
    const Tensor o1 = recurrent(junk, s1, p);
    EXPECT_TRUE(bits_equal(o1.span<float>(), o0.span<float>()));
    EXPECT_TRUE(bits_equal(s1.span<float>(), s0.span<float>()));

    AttnInputs head1 = base;  // entry 1 changed: only head 1 moves
    head1.a_log = copy(base.a_log);
    head1.a_log.data<float>()[1] += 1.0f;
    Tensor s2 = copy(base.state0);
    const Tensor o2 = recurrent(head1, s2, p);
    for (int h = 0; h < H; ++h) {
      bool same = true;
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < D; ++i)
          same &= o2.data<float>()[(t * H + h) * D + i] == o0.data<float>()[(t * H + h) * D + i];
      const std::span<const float> st2(s2.data<float>() + h * D * D, D * D), st0(s0.data<float>() + h * D * D, D * D);
      EXPECT_EQ(same, h != 1) << "head " << h;
      EXPECT_EQ(bits_equal(st2, st0), h != 1) << "head " << h;
    }
  }
}

TEST(KdaRecurrent, GateStaysWithinTheLowerBound) {
  core::Rng rng(9);
  for (float lb : {-5.0f, -3.0f}) {
    for (int i = 0; i < 2000; ++i) {  // moderate inputs (|exp(A_log) z| < 15): strictly inside (lb, 0)
      const float f = static_cast<float>(rng.normal(0, 3)), dt = static_cast<float>(rng.normal(0, 1)),
                  a_log = static_cast<float>(rng.normal(0, 0.5));
      if (std::abs(std::exp(a_log) * (f + dt)) >= 15.0f) continue;
      const float g = kda_detail::kda_gate(f, dt, a_log, lb);
      ASSERT_GT(g, lb);
      ASSERT_LT(g, 0.0f);
      ASSERT_LE(std::exp(g), 1.0f);  // g may be tiny: e^g rounds to 1
    }
    for (float f : {-1e30f, -1e4f, 1e4f, 1e30f}) {  // saturated: at most the bound itself, never beyond
      const float g = kda_detail::kda_gate(f, 0.0f, 2.0f, lb);
      EXPECT_GE(g, lb);
      EXPECT_LE(g, 0.0f);
      EXPECT_LE(std::exp(g), 1.0f);
    }
    EXPECT_FLOAT_EQ(kda_detail::kda_gate(0.0f, 0.0f, 1.0f, lb), lb / 2);  // sigmoid(0) = 1/2
  }
  // Through the op: a maximal decay everywhere (f huge) keeps everything finite and applies e^lb.
  AttnInputs in = AttnInputs::random(5, 17, 2, 32);
  for (float& x : in.f.span<float>()) x = 1e4f;
  std::vector<double> S = to_dvec(in.state0);
  const std::vector<double> ref = naive_recurrent(in, S);
  Tensor state = copy(in.state0);
  Tensor out = recurrent(in, state, Precision::fp32);
  EXPECT_TRUE(all_finite(out.span<float>()));
  EXPECT_LT(rel_err(out.span<float>(), ref), 1e-5);
}

TEST(KdaRecurrent, ContinuationAndMultiTokenDecode) {
  const int T = 17, k = 4, H = 3, D = 32;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const AttnInputs in = AttnInputs::random(41, T + k, H, D, p);
    Tensor s_full = copy(in.state0);
    const Tensor o_full = recurrent(in, s_full, p);
    // Prefill T, then the k decode tokens in one multi-token call (speculative verify).
    Tensor s_multi = copy(in.state0);
    const Tensor o_pre = recurrent(in, s_multi, p, 0, T);
    const Tensor o_multi = recurrent(in, s_multi, p, T, k);
    // Prefill T, then k single-token calls.
    Tensor s_single = copy(in.state0);
    recurrent(in, s_single, p, 0, T);
    std::vector<float> o_single;
    for (int i = 0; i < k; ++i) {
      const Tensor o = recurrent(in, s_single, p, T + i, 1);
      o_single.insert(o_single.end(), o.span<float>().begin(), o.span<float>().end());
    }
    const int64_t P = static_cast<int64_t>(H) * D;
    EXPECT_TRUE(bits_equal(o_pre.span<float>(), o_full.span<float>().subspan(0, T * P)));
    EXPECT_TRUE(bits_equal(o_multi.span<float>(), o_full.span<float>().subspan(T * P)));
    EXPECT_TRUE(bits_equal(o_single, o_multi.span<float>()));
    EXPECT_TRUE(bits_equal(s_multi.span<float>(), s_full.span<float>()));
    EXPECT_TRUE(bits_equal(s_single.span<float>(), s_full.span<float>()));
  }
}

TEST(KdaRecurrent, HeadsAreIndependentAndStridedInputsWork) {
  // Each head alone (a 1-head call on row-strided column slices) gives the bits of the H-head call,
  // whatever the thread pool does with the heads.
  const int T = 54, H = 4, D = 32;
  const AttnInputs in = AttnInputs::random(77, T, H, D, Precision::bf16);
  Tensor state = copy(in.state0);
  const Tensor out = recurrent(in, state, Precision::bf16);
  for (int h = 0; h < H; ++h) {
    Tensor s_h = f32({1, D, D});
    std::copy(in.state0.data<float>() + h * D * D, in.state0.data<float>() + (h + 1) * D * D, s_h.data<float>());
    Tensor o_h = poisoned({T, H * D});
    Tensor a_log_h = f32({1}), dt_h = f32({D});
    a_log_h.data<float>()[0] = in.a_log.data<float>()[h];
    std::copy(in.dt_bias.data<float>() + h * D, in.dt_bias.data<float>() + (h + 1) * D, dt_h.data<float>());
    KdaAttentionArgs a = in.args(s_h, o_h, Precision::bf16);
    a.q = cols(in.q.view(), h * D, D), a.k = cols(in.k.view(), h * D, D), a.v = cols(in.v.view(), h * D, D);
    a.f = cols(in.f.view(), h * D, D), a.b = cols(in.b.view(), h, 1), a.out = cols(o_h.view(), h * D, D);
    a.a_log = a_log_h.view(), a.dt_bias = dt_h.view(), a.num_heads = 1;
    kda_recurrent_reference(a);
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < D; ++i)
        ASSERT_EQ(o_h.data<float>()[(t * H + h) * D + i], out.data<float>()[(t * H + h) * D + i]);
    EXPECT_TRUE(bits_equal(s_h.span<float>(), std::span<const float>(state.data<float>() + h * D * D, D * D)));
  }
}

TEST(KdaRecurrent, RealTp8ShardPrefillThenDecodeAndVerifySteps) {
  // One TP8 rank of K3 (cases.h): a prefill of each K3 token count, then one call per row count of
  // the K3 decode and verify steps (1, 4 and 8 rows), each continuing the state; against one naive
  // pass over all the rows.
  const KdaAttnShape& k3 = kKdaAttnK3Tp8;
  int64_t step_rows = 0;
  for (const KdaAttnStep& st : kKdaRecurrentK3Steps) step_rows += st.rows;
  uint64_t seed = 2024;
  for (int64_t T : kKdaChunkedK3Tokens) {
    SCOPED_TRACE(std::string(k3.name) + " T=" + std::to_string(T));
    const AttnInputs in = AttnInputs::random(seed++, static_cast<int>(T + step_rows), k3.H, k3.D, Precision::bf16);
    std::vector<double> S = to_dvec(in.state0);
    const std::vector<double> ref = naive_recurrent(in, S);
    Tensor state = copy(in.state0);
    const Tensor o_pre = recurrent(in, state, Precision::bf16, 0, T);
    std::vector<float> o(o_pre.span<float>().begin(), o_pre.span<float>().end());
    int64_t t0 = T;
    for (const KdaAttnStep& st : kKdaRecurrentK3Steps) {
      const Tensor o_step = recurrent(in, state, Precision::bf16, t0, st.rows);
      o.insert(o.end(), o_step.span<float>().begin(), o_step.span<float>().end());
      t0 += st.rows;
    }
    EXPECT_TRUE(bf16_close(o, ref));
    EXPECT_LT(rel_err(state.span<float>(), S), 1e-5);
  }
}

TEST(KdaAttentionCheck, NamesTheBadArgument) {
  const AttnInputs in = AttnInputs::random(1, 5, 2, 8);
  Tensor state = copy(in.state0), out = f32({5, 16});
  auto reason = [&](auto mutate) {
    KdaAttentionArgs a = in.args(state, out, Precision::fp32);
    mutate(a);
    core::Status s = kda_attention_check(a);
    return s ? std::string("ok") : s.reason();
  };
  auto names = [&](auto mutate, const std::string& what) { return reason(mutate).find(what) != std::string::npos; };
  EXPECT_EQ(reason([](KdaAttentionArgs&) {}), "ok");
  Tensor short_a_log = f32({1}), bad_state = f32({2, 8, 4}), bad_b = f32({5, 3}), bad_dt = f32({8}),
         bad_v = f32({4, 16});
  Tensor bf16_k = Tensor::zeros(core::DType::bf16, {5, 16});
  EXPECT_TRUE(names([&](KdaAttentionArgs& a) { a.a_log = short_a_log.view(); }, "a_log"));
  EXPECT_TRUE(names([&](KdaAttentionArgs& a) { a.state = bad_state.view(); }, "state"));
  EXPECT_TRUE(names([&](KdaAttentionArgs& a) { a.b = bad_b.view(); }, "b must"));
  EXPECT_TRUE(names([&](KdaAttentionArgs& a) { a.dt_bias = bad_dt.view(); }, "dt_bias"));
  EXPECT_TRUE(names([&](KdaAttentionArgs& a) { a.v = bad_v.view(); }, "v must"));
  EXPECT_TRUE(names([&](KdaAttentionArgs& a) { a.k = bf16_k.view(); }, "k must be F32"));
  EXPECT_TRUE(names([&](KdaAttentionArgs& a) { a.chunk_size = 0; }, "chunk_size"));
  EXPECT_TRUE(names([&](KdaAttentionArgs& a) { a.num_heads = 0; }, "num_heads"));
  EXPECT_TRUE(names([&](KdaAttentionArgs& a) { a.lower_bound = 1.0f; }, "lower_bound"));
  EXPECT_TRUE(names([&](KdaAttentionArgs& a) { a.out = TensorView{}; }, "out"));
  KdaAttentionArgs bad = in.args(bad_state, out, Precision::fp32);
  EXPECT_THROW(kda_recurrent_reference(bad), core::Error);
  EXPECT_THROW(kda_chunked_reference(bad), core::Error);
}

}  // namespace
}  // namespace k3::kernels
