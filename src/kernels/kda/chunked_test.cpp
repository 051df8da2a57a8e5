// kernels/kda/chunked_test.cpp: the chunked KDA form (spec §5.7) against the recurrent form (§5.5),
// the golden test of spec §15.1: chunk 16 and 64 (and odd sizes), partial last chunk, non-zero
// initial state, fp32 relative error <= 1e-5; bf16 mode; prefill-then-decode continuation;
// maximal decay (no e^{-G} overflow); A_log per head; the real TP8 shard.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

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

// Largest |a - b| over max(|a|, |b|) per element (plus a small absolute floor), for bf16 outputs.
double max_ulp_rel(std::span<const float> a, std::span<const float> b, double floor) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / (std::max(std::abs(a[i]), std::abs(b[i])) + floor));
  return worst;
}

TEST(KdaChunked, EqualsRecurrentInFp32) {
  const int Ts[] = {1, 17, 54, 97, 150};
  uint64_t seed = 500;
  int variant = 0;
  double worst = 0;
  for (int chunk : {16, 64}) {
    for (int T : Ts) {
      const int H = 1 + variant % 4, D = (variant % 2) ? 128 : 32;
      ++variant;
      SCOPED_TRACE("chunk=" + std::to_string(chunk) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
                   " D=" + std::to_string(D));
      const AttnInputs in = AttnInputs::random(seed++, T, H, D);
      Tensor s_rec = copy(in.state0), s_chk = copy(in.state0);
      const Tensor o_rec = run(false, in, s_rec, Precision::fp32);
      const Tensor o_chk = run(true, in, s_chk, Precision::fp32, chunk);
      const double eo = rel_err(o_chk.span<float>(), o_rec.span<float>());
      const double es = rel_err(s_chk.span<float>(), s_rec.span<float>());
      EXPECT_LE(eo, 1e-5);
      EXPECT_LE(es, 1e-5);
      worst = std::max({worst, eo, es});
    }
  }
  std::printf("[   info   ] worst chunked-vs-recurrent relative error (o, state): %.2e\n", worst);
}

TEST(KdaChunked, AnyChunkSizeIncludingOneAndLargerThanT) {
  const AttnInputs in = AttnInputs::random(61, 37, 2, 32);
  Tensor s_rec = copy(in.state0);
  const Tensor o_rec = run(false, in, s_rec, Precision::fp32);
  for (int chunk : {1, 7, 36, 37, 100}) {
    SCOPED_TRACE("chunk=" + std::to_string(chunk));
    Tensor s = copy(in.state0);
    const Tensor o = run(true, in, s, Precision::fp32, chunk);
    EXPECT_LE(rel_err(o.span<float>(), o_rec.span<float>()), 1e-5);
    EXPECT_LE(rel_err(s.span<float>(), s_rec.span<float>()), 1e-5);
  }
}

TEST(KdaChunked, AgreesWithRecurrentInBf16Mode) {
  // Both forms keep the state fp32 and round only o: at most one bf16 step apart.
  for (int chunk : {16, 64}) {
    const AttnInputs in = AttnInputs::random(71 + chunk, 97, 3, 128, Precision::bf16);
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
  const int T = 54, k = 5, H = 2, D = 128;
  const AttnInputs in = AttnInputs::random(81, T + k, H, D);
  Tensor s_all = copy(in.state0);
  const Tensor o_all = run(false, in, s_all, Precision::fp32);
  Tensor s = copy(in.state0);
  const Tensor o_pre = run(true, in, s, Precision::fp32, 16, 0, T);
  std::vector<float> o(o_pre.span<float>().begin(), o_pre.span<float>().end());
  for (int i = 0; i < k; ++i) {  // decode one token at a time from the chunked prefill's state
    const Tensor od = run(false, in, s, Precision::fp32, 64, T + i, 1);
    o.insert(o.end(), od.span<float>().begin(), od.span<float>().end());
  }
  EXPECT_LE(rel_err(o, o_all.span<float>()), 1e-5);
  EXPECT_LE(rel_err(s.span<float>(), s_all.span<float>()), 1e-5);
}

TEST(KdaChunked, SplitAtAChunkBoundaryIsBitExact) {
  // Prefix caching restores the state at a block boundary and continues: with the split on a chunk
  // boundary the chunk grid is unchanged, so the bits are.
  const int T = 150, H = 2, D = 32, chunk = 16;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const AttnInputs in = AttnInputs::random(91, T, H, D, p);
    Tensor s_all = copy(in.state0);
    const Tensor o_all = run(true, in, s_all, p, chunk);
    Tensor s = copy(in.state0);
    const Tensor o1 = run(true, in, s, p, chunk, 0, 64);
    const Tensor o2 = run(true, in, s, p, chunk, 64, T - 64);
    std::vector<float> o(o1.span<float>().begin(), o1.span<float>().end());
    o.insert(o.end(), o2.span<float>().begin(), o2.span<float>().end());
    EXPECT_TRUE(bits_equal(o, o_all.span<float>()));
    EXPECT_TRUE(bits_equal(s.span<float>(), s_all.span<float>()));
    // Off the grid the chunk holding the split is computed in two pieces: equal to rounding (the
    // chunks after it stay on the absolute grid, batch_test.cpp).
    Tensor s3 = copy(in.state0);
    run(true, in, s3, p, chunk, 0, 37);
    run(true, in, s3, p, chunk, 37, T - 37);
    EXPECT_LE(rel_err(s3.span<float>(), s_all.span<float>()), 1e-5);
  }
}

TEST(KdaChunked, MaximalDecayNeverOverflows) {
  // g = lower_bound on every channel: G reaches -5 * 64 = -320 inside a chunk; e^{-G} = e^{320}
  // would overflow fp32, differences never do.
  AttnInputs in = AttnInputs::random(101, 150, 2, 32);
  for (float& x : in.f.span<float>()) x = 1e4f;
  Tensor s_rec = copy(in.state0), s_chk = copy(in.state0);
  const Tensor o_rec = run(false, in, s_rec, Precision::fp32);
  const Tensor o_chk = run(true, in, s_chk, Precision::fp32, 64);
  EXPECT_TRUE(all_finite(o_chk.span<float>()));
  EXPECT_TRUE(all_finite(s_chk.span<float>()));
  EXPECT_LE(rel_err(o_chk.span<float>(), o_rec.span<float>()), 1e-5);
  EXPECT_LE(rel_err(s_chk.span<float>(), s_rec.span<float>()), 1e-5);
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
  const int T = 20, H = 12, D = 128;
  const AttnInputs in = AttnInputs::random(131, T + 1, H, D);
  Tensor s_rec = copy(in.state0);
  const Tensor o_rec = run(false, in, s_rec, Precision::fp32);
  for (int chunk : {16, 64}) {
    Tensor s = copy(in.state0);
    const Tensor o_pre = run(true, in, s, Precision::fp32, chunk, 0, T);
    const Tensor o_dec = run(false, in, s, Precision::fp32, chunk, T, 1);
    std::vector<float> o(o_pre.span<float>().begin(), o_pre.span<float>().end());
    o.insert(o.end(), o_dec.span<float>().begin(), o_dec.span<float>().end());
    EXPECT_LE(rel_err(o, o_rec.span<float>()), 1e-5);
    EXPECT_LE(rel_err(s.span<float>(), s_rec.span<float>()), 1e-5);
  }
}

}  // namespace
}  // namespace k3::kernels
