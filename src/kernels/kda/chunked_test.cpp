// kernels/kda/chunked_test.cpp: the chunked KDA form (spec §5.7) against the recurrent form (§5.5),
// the golden test of spec §15.1, at the shapes and token counts of cases.h: chunk 16 and 64 (and odd
// sizes), partial last chunk, non-zero initial state, fp32 relative error <= 1e-5; bf16 mode;
// prefill-then-decode continuation; splits on and off the chunk grid; maximal decay (no e^{-G}
// overflow); A_log per head; one TP8 rank of K3 at prefill token counts around and beyond a chunk.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/kda/cases.h"
#include "kernels/kda/kda.h"
#include "kernels/kda/kda_test_util.h"

namespace k3::kernels {
namespace {

using namespace kda_test;

Tensor run(bool chunked, const AttnInputs& in, const Tensor& state, Precision p, int chunk = 64, int64_t t0 = 0,
           int64_t n = -1) {
  if (n < 0) n = in.T - t0;
  Tensor out = poisoned({n, static_cast<int64_t>(in.H) * in.D});
  const KdaAttentionArgs a = in.args(state, out, p, chunk, t0, n);
  chunked ? kda_chunked_reference(a) : kda_recurrent_reference(a);
  return out;
}

// "H3 D17 T=54 chunk=16": a case of cases.h, for SCOPED_TRACE.
std::string at(const KdaAttnShape& sh, int64_t T, int chunk) {
  return std::string(sh.name) + " T=" + std::to_string(T) + " chunk=" + std::to_string(chunk);
}

// Largest |a - b| over max(|a|, |b|) per element (plus a small absolute floor), for bf16 outputs.
double max_ulp_rel(std::span<const float> a, std::span<const float> b, double floor) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / (std::max(std::abs(a[i]), std::abs(b[i])) + floor));
  return worst;
}

TEST(KdaChunked, EqualsRecurrentInFp32) {
  uint64_t seed = 500;
  double worst = 0;
  for (int chunk : kKdaChunkSizes)
    for (const KdaAttnShape& sh : kKdaAttnOddShapes)
      for (int64_t T : kKdaAttnOddTokens) {
        SCOPED_TRACE(at(sh, T, chunk));
        const AttnInputs in = AttnInputs::random(seed++, static_cast<int>(T), sh.H, sh.D);
        Tensor s_rec = copy(in.state0), s_chk = copy(in.state0);
        const Tensor o_rec = run(false, in, s_rec, Precision::fp32);
        const Tensor o_chk = run(true, in, s_chk, Precision::fp32, chunk);
        const double eo = rel_err(o_chk.span<float>(), o_rec.span<float>());
        const double es = rel_err(s_chk.span<float>(), s_rec.span<float>());
        EXPECT_LE(eo, 1e-5);
        EXPECT_LE(es, 1e-5);
        worst = std::max({worst, eo, es});
      }
  std::printf("[   info   ] worst chunked-vs-recurrent relative error (o, state): %.2e\n", worst);
}

TEST(KdaChunked, AnyChunkSizeIncludingOneAndLargerThanT) {
  uint64_t seed = 61;
  for (const KdaAttnShape& sh : kKdaAttnOddShapes) {
    const AttnInputs in = AttnInputs::random(seed++, static_cast<int>(kKdaOddChunkTokens), sh.H, sh.D);
    Tensor s_rec = copy(in.state0);
    const Tensor o_rec = run(false, in, s_rec, Precision::fp32);
    for (int chunk : kKdaOddChunkSizes) {
      SCOPED_TRACE(at(sh, kKdaOddChunkTokens, chunk));
      Tensor s = copy(in.state0);
      const Tensor o = run(true, in, s, Precision::fp32, chunk);
      EXPECT_LE(rel_err(o.span<float>(), o_rec.span<float>()), 1e-5);
      EXPECT_LE(rel_err(s.span<float>(), s_rec.span<float>()), 1e-5);
    }
  }
}

TEST(KdaChunked, AgreesWithRecurrentInBf16Mode) {
  // Both forms keep the state fp32 and round only o: at most one bf16 step apart.
  uint64_t seed = 71;
  for (int chunk : kKdaChunkSizes)
    for (const KdaAttnShape& sh : kKdaAttnOddShapes)
      for (int64_t T : kKdaAttnOddTokens) {
        SCOPED_TRACE(at(sh, T, chunk));
        const AttnInputs in = AttnInputs::random(seed++, static_cast<int>(T), sh.H, sh.D, Precision::bf16);
        Tensor s_rec = copy(in.state0), s_chk = copy(in.state0);
        const Tensor o_rec = run(false, in, s_rec, Precision::bf16);
        const Tensor o_chk = run(true, in, s_chk, Precision::bf16, chunk);
        for (float x : o_chk.span<float>()) ASSERT_EQ(core::bf16_round(x), x);
        EXPECT_LE(max_ulp_rel(o_chk.span<float>(), o_rec.span<float>(), 1e-3), 1.0 / 128);
        EXPECT_LE(rel_err(o_chk.span<float>(), o_rec.span<float>()), 2e-3);
        EXPECT_LE(rel_err(s_chk.span<float>(), s_rec.span<float>()), 1e-5);
      }
}

TEST(KdaChunked, PrefillThenRecurrentDecodeEqualsRecurrentOverAll) {
  const int k = 5;  // decode tokens after the prefill
  uint64_t seed = 81;
  for (int chunk : kKdaChunkSizes)
    for (const KdaAttnShape& sh : kKdaAttnOddShapes)
      for (int64_t T : kKdaAttnOddTokens) {
        SCOPED_TRACE(at(sh, T, chunk));
        const AttnInputs in = AttnInputs::random(seed++, static_cast<int>(T) + k, sh.H, sh.D);
        Tensor s_all = copy(in.state0);
        const Tensor o_all = run(false, in, s_all, Precision::fp32);
        Tensor s = copy(in.state0);
        const Tensor o_pre = run(true, in, s, Precision::fp32, chunk, 0, T);
        std::vector<float> o(o_pre.span<float>().begin(), o_pre.span<float>().end());
        for (int i = 0; i < k; ++i) {  // decode one token at a time from the chunked prefill's state
          const Tensor od = run(false, in, s, Precision::fp32, chunk, T + i, 1);
          o.insert(o.end(), od.span<float>().begin(), od.span<float>().end());
        }
        EXPECT_LE(rel_err(o, o_all.span<float>()), 1e-5);
        EXPECT_LE(rel_err(s.span<float>(), s_all.span<float>()), 1e-5);
      }
}

TEST(KdaChunked, SplitAtAChunkBoundaryIsBitExact) {
  // Prefix caching restores the state at a block boundary and continues: with the split on a chunk
  // boundary (64, a multiple of every chunk size of cases.h) the chunk grid is unchanged, so the
  // bits are.
  const int64_t split = 64, off_grid = 37;
  uint64_t seed = 91;
  for (int chunk : kKdaChunkSizes)
    for (const KdaAttnShape& sh : kKdaAttnOddShapes)
      for (int64_t T : kKdaAttnOddTokens) {
        if (T <= split) continue;
        for (Precision p : {Precision::fp32, Precision::bf16}) {
          SCOPED_TRACE(at(sh, T, chunk) + (p == Precision::bf16 ? " bf16" : " fp32"));
          const AttnInputs in = AttnInputs::random(seed++, static_cast<int>(T), sh.H, sh.D, p);
          Tensor s_all = copy(in.state0);
          const Tensor o_all = run(true, in, s_all, p, chunk);
          Tensor s = copy(in.state0);
          const Tensor o1 = run(true, in, s, p, chunk, 0, split);
          const Tensor o2 = run(true, in, s, p, chunk, split, T - split);
          std::vector<float> o(o1.span<float>().begin(), o1.span<float>().end());
          o.insert(o.end(), o2.span<float>().begin(), o2.span<float>().end());
          EXPECT_TRUE(bits_equal(o, o_all.span<float>()));
          EXPECT_TRUE(bits_equal(s.span<float>(), s_all.span<float>()));
          // Off the grid the chunk holding the split is computed in two pieces: equal to rounding (the
          // chunks after it stay on the absolute grid, batch_test.cpp).
          Tensor s3 = copy(in.state0);
          run(true, in, s3, p, chunk, 0, off_grid);
          run(true, in, s3, p, chunk, off_grid, T - off_grid);
          EXPECT_LE(rel_err(s3.span<float>(), s_all.span<float>()), 1e-5);
        }
      }
}

TEST(KdaChunked, MaximalDecayNeverOverflows) {
  // g = lower_bound on every channel: G reaches -5 * 64 = -320 inside a chunk of 64; e^{-G} = e^{320}
  // would overflow fp32, differences never do.
  uint64_t seed = 101;
  for (int chunk : kKdaChunkSizes)
    for (const KdaAttnShape& sh : kKdaAttnOddShapes)
      for (int64_t T : kKdaAttnOddTokens) {
        SCOPED_TRACE(at(sh, T, chunk));
        AttnInputs in = AttnInputs::random(seed++, static_cast<int>(T), sh.H, sh.D);
        for (float& x : in.f.span<float>()) x = 1e4f;
        Tensor s_rec = copy(in.state0), s_chk = copy(in.state0);
        const Tensor o_rec = run(false, in, s_rec, Precision::fp32);
        const Tensor o_chk = run(true, in, s_chk, Precision::fp32, chunk);
        EXPECT_TRUE(all_finite(o_chk.span<float>()));
        EXPECT_TRUE(all_finite(s_chk.span<float>()));
        EXPECT_LE(rel_err(o_chk.span<float>(), o_rec.span<float>()), 1e-5);
        EXPECT_LE(rel_err(s_chk.span<float>(), s_rec.span<float>()), 1e-5);
      }
}

TEST(KdaChunked, WeakDecayLongMemory) {
  // g close to 0 (f very negative): the state carries across chunks; the initial state matters.
  AttnInputs in = AttnInputs::random(111, 97, 2, 128);
  for (float& x : in.f.span<float>()) x -= 8.0f;
  Tensor s_rec = copy(in.state0), s_chk = copy(in.state0);
  const Tensor o_rec = run(false, in, s_rec, Precision::fp32);
  const Tensor o_chk = run(true, in, s_chk, Precision::fp32, 16);
  EXPECT_LE(rel_err(o_chk.span<float>(), o_rec.span<float>()), 1e-5);
  EXPECT_LE(rel_err(s_chk.span<float>(), s_rec.span<float>()), 1e-5);
  Tensor zero = f32({2, 128, 128});
  const Tensor o_zero = run(true, in, zero, Precision::fp32, 16);
  EXPECT_GT(rel_err(o_zero.span<float>(), o_rec.span<float>()), 1e-2);  // the state is really used
}

TEST(KdaChunked, ALogOnlyFirstHEntries) {
  const int T = 40, H = 3, D = 32;
  const AttnInputs base = AttnInputs::random(121, T, H, D);
  Tensor s0 = copy(base.state0);
  const Tensor o0 = run(true, base, s0, Precision::fp32, 16);
  AttnInputs junk = base;
  junk.a_log = copy(base.a_log);
  for (int i = H; i < 2 * H; ++i) junk.a_log.data<float>()[i] = -7.0f;
  Tensor s1 = copy(base.state0);
  const Tensor o1 = run(true, junk, s1, Precision::fp32, 16);
  EXPECT_TRUE(bits_equal(o1.span<float>(), o0.span<float>()));
  EXPECT_TRUE(bits_equal(s1.span<float>(), s0.span<float>()));
}

TEST(KdaChunked, RealTp8ShardPrefillThenDecode) {
  // One TP8 rank of K3 (cases.h): a chunked prefill of each K3 token count, then one decode token.
  const KdaAttnShape& k3 = kKdaAttnK3Tp8;
  uint64_t seed = 131;
  for (int64_t T : kKdaChunkedK3Tokens) {
    const AttnInputs in = AttnInputs::random(seed++, static_cast<int>(T) + 1, k3.H, k3.D);
    Tensor s_rec = copy(in.state0);
    const Tensor o_rec = run(false, in, s_rec, Precision::fp32);
    for (int chunk : kKdaChunkSizes) {
      SCOPED_TRACE(at(k3, T, chunk));
      Tensor s = copy(in.state0);
      const Tensor o_pre = run(true, in, s, Precision::fp32, chunk, 0, T);
      const Tensor o_dec = run(false, in, s, Precision::fp32, chunk, T, 1);
      std::vector<float> o(o_pre.span<float>().begin(), o_pre.span<float>().end());
      o.insert(o.end(), o_dec.span<float>().begin(), o_dec.span<float>().end());
      EXPECT_LE(rel_err(o, o_rec.span<float>()), 1e-5);
      EXPECT_LE(rel_err(s.span<float>(), s_rec.span<float>()), 1e-5);
    }
  }
}

}  // namespace
}  // namespace k3::kernels
