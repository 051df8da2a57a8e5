// kernels/kda/no_commit_test.cpp: the speculative-verify mode of the KDA conv and recurrent ops
// (no_commit, spec §5.9 (b)): a no-commit call gives the outputs of a committing call bit for bit
// and leaves the state pool untouched; replaying the first n+1 rows with commit then gives the
// state of plain decoding; several sequences of a pool each keep their slot; chunked refuses it.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/kda/kda.h"
#include "kernels/kda/kda_test_util.h"

namespace k3::kernels {
namespace {

using namespace kda_test;

Tensor run_recurrent(const AttnInputs& in, const Tensor& state, Precision p, int64_t t0, int64_t n, bool no_commit) {
  Tensor out = poisoned({n, static_cast<int64_t>(in.H) * in.D});
  KdaAttentionArgs a = in.args(state, out, p, 64, t0, n);
  a.no_commit = no_commit;
  kda_recurrent_reference(a);
  return out;
}

TEST(KdaNoCommit, RecurrentVerifyThenReplayEqualsPlainDecode) {
  for (Precision p : {Precision::fp32, Precision::bf16})
    for (int H : {1, 3}) {
      const int T = 17, K1 = 5, D = 32;  // 17 committed tokens, then a verify of K+1 = 5 rows
      const AttnInputs in = AttnInputs::random(7 + H, T + K1, H, D, p);
      Tensor committed = copy(in.state0);
      run_recurrent(in, committed, p, 0, T, false);
      const Tensor before = copy(committed);
      // Verify: every row's output, state untouched.
      const Tensor o_verify = run_recurrent(in, committed, p, T, K1, true);
      EXPECT_TRUE(bits_equal(committed.span<float>(), before.span<float>()));
      Tensor plain = copy(before);
      const Tensor o_plain = run_recurrent(in, plain, p, T, K1, false);
      EXPECT_TRUE(bits_equal(o_verify.span<float>(), o_plain.span<float>()));
      // Accept n = 0..K1-1 drafts: replaying the n+1 rows equals decoding them one by one.
      for (int n = 0; n < K1; ++n) {
        Tensor replay = copy(before);
        run_recurrent(in, replay, p, T, n + 1, false);
        Tensor token_by_token = copy(before);
        for (int i = 0; i <= n; ++i) run_recurrent(in, token_by_token, p, T + i, 1, false);
        EXPECT_TRUE(bits_equal(replay.span<float>(), token_by_token.span<float>())) << "n = " << n;
      }
    }
}

TEST(KdaNoCommit, RecurrentBatchLeavesEverySlotAlone) {
  // Three sequences (1, 4 and 2 rows) in slots 2, 0, 3 of a 4-slot pool, real TP8 shard head size.
  const int H = 2, D = 128, T = 7;
  const AttnInputs in = AttnInputs::random(99, T, H, D, Precision::bf16);
  core::Rng rng(5);
  Tensor pool = random(rng, {4, H, D, D}, 0.0, 0.5);
  const Tensor before = copy(pool);
  Tensor out = poisoned({T, H * D});
  KdaAttentionArgs a = in.args(in.state0, out, Precision::bf16);
  a.state = pool.view();
  a.seqs = kept(make_seqs({{0, 1, 2, 10}, {1, 4, 0, 3}, {5, 2, 3, 40}}));
  a.no_commit = true;
  kda_recurrent_reference(a);
  EXPECT_TRUE(bits_equal(pool.span<float>(), before.span<float>()));
  EXPECT_TRUE(all_finite(out.span<float>()));
  // The committing call writes the same outputs.
  Tensor out2 = poisoned({T, H * D});
  a.out = out2.view();
  a.no_commit = false;
  kda_recurrent_reference(a);
  EXPECT_TRUE(bits_equal(out.span<float>(), out2.span<float>()));
  EXPECT_FALSE(bits_equal(pool.span<float>(), before.span<float>()));
  EXPECT_TRUE(bits_equal(slot_span(pool, 1), slot_span(before, 1)));  // slot 1 is in no sequence
}

TEST(KdaNoCommit, ConvVerifyThenReplayEqualsPlainDecode) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const int K1 = 4, C = 97, K = 4;
    core::Rng rng(11);
    const Tensor x = random(rng, {K1, C}, 0.0, 1.0, p), w = random(rng, {C, K}, 0.0, 0.6);
    const Tensor state0 = random(rng, {C, K - 1}, 0.0, 1.0, p);
    auto conv = [&](const Tensor& state, int64_t t0, int64_t n, bool no_commit) {
      Tensor out = poisoned({n, C});
      KdaConvArgs a;
      a.x = rows(x.view(), t0, n);
      a.weight = w.view();
      a.state = pool1(state);
      a.out = out.view();
      a.precision = p;
      a.seqs = single_seq(n);
      a.no_commit = no_commit;
      kda_conv_reference(a);
      return out;
    };
    Tensor s = copy(state0);
    const Tensor o_verify = conv(s, 0, K1, true);
    EXPECT_TRUE(bits_equal(s.span<float>(), state0.span<float>()));
    Tensor s_plain = copy(state0);
    EXPECT_TRUE(bits_equal(o_verify.span<float>(), conv(s_plain, 0, K1, false).span<float>()));
    for (int n = 0; n < K1; ++n) {
      Tensor replay = copy(state0);
      conv(replay, 0, n + 1, false);
      Tensor single = copy(state0);
      for (int i = 0; i <= n; ++i) conv(single, i, 1, false);
      EXPECT_TRUE(bits_equal(replay.span<float>(), single.span<float>())) << "n = " << n;
    }
  }
}

TEST(KdaNoCommit, ChunkedRefusesIt) {
  const AttnInputs in = AttnInputs::random(3, 4, 1, 32);
  Tensor state = copy(in.state0);
  Tensor out = poisoned({4, 32});
  KdaAttentionArgs a = in.args(state, out, Precision::fp32);
  a.no_commit = true;
  EXPECT_THROW(kda_chunked_reference(a), core::Error);
}

}  // namespace
}  // namespace k3::kernels
