// kernels/kda/batch_test.cpp: the batched KDA attention contract (kda.h): one call over several
// sequences (mixed row counts, shuffled slots of a state pool, nonzero positions, a gap row) gives
// the bits of one call per sequence, for the recurrent and chunked forms; the chunked grid lies on
// absolute positions (a prefill split anywhere equals one unsplit prefill); the SeqBatch checks
// name the bad table.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/kda/kda.h"
#include "kernels/kda/kda_test_util.h"

namespace k3::kernels {
namespace {

using namespace kda_test;

// Four sequences of 1, 3, 17 and 64 rows in a shuffled row order (rows 3 and 85 belong to none),
// slots shuffled over a pool of 7, positions off the chunk grid.
const std::vector<SeqSpec> kMixed = {{4, 17, 5, 70}, {0, 3, 0, 5}, {86, 1, 3, 13}, {21, 64, 6, 0}};
constexpr int kMixedRows = 87, kPoolSlots = 7;

void run_form(bool chunked, const KdaAttentionArgs& a) {
  chunked ? kda_chunked_reference(a) : kda_recurrent_reference(a);
}

void expect_batched_equals_per_sequence(bool chunked, int H, int D, int chunk, Precision p, uint64_t seed) {
  const AttnInputs in = AttnInputs::random(seed, kMixedRows, H, D, p);
  const int64_t P = static_cast<int64_t>(H) * D;
  core::Rng rng(seed + 1);
  const Tensor pool0 = random(rng, {kPoolSlots, H, D, D}, 0.0, 0.5);
  Tensor pool = copy(pool0), out = poisoned({kMixedRows, P});
  const HostSeqs seqs = make_seqs(kMixed);
  KdaAttentionArgs a = in.args(in.state0, out, p, chunk);
  a.state = pool.view();
  a.seqs = seqs.batch;
  run_form(chunked, a);

  for (const SeqSpec& sp : kMixed) {
    SCOPED_TRACE("rows=" + std::to_string(sp.num_rows) + " slot=" + std::to_string(sp.slot) +
                 " position=" + std::to_string(sp.position));
    Tensor state = f32({H, D, D}), o = poisoned({sp.num_rows, P});
    const std::span<float> s0 = slot_span(pool0, sp.slot);
    std::copy(s0.begin(), s0.end(), state.data<float>());
    KdaAttentionArgs one = in.args(state, o, p, chunk, sp.row_begin, sp.num_rows);
    one.seqs = single_seq(sp.num_rows, sp.position);
    run_form(chunked, one);
    EXPECT_TRUE(bits_equal(o.span<float>(), out.span<float>().subspan(sp.row_begin * P, sp.num_rows * P)));
    EXPECT_TRUE(bits_equal(state.span<float>(), slot_span(pool, sp.slot)));
  }
  for (int64_t free_slot : {1, 2, 4}) EXPECT_TRUE(bits_equal(slot_span(pool, free_slot), slot_span(pool0, free_slot)));
  for (int64_t gap : {3, 85})
    for (int64_t c = 0; c < P; ++c) ASSERT_TRUE(std::isnan(out.data<float>()[gap * P + c])) << "row " << gap;
}

TEST(KdaBatch, RecurrentBatchedEqualsOneCallPerSequence) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(p == Precision::bf16 ? "bf16" : "fp32");
    expect_batched_equals_per_sequence(false, 3, 32, 64, p, 601);
    expect_batched_equals_per_sequence(false, 2, 17, 64, p, 602);
  }
}

TEST(KdaBatch, ChunkedBatchedEqualsOneCallPerSequence) {
  for (Precision p : {Precision::fp32, Precision::bf16})
    for (int chunk : {16, 64}) {
      SCOPED_TRACE(std::string(p == Precision::bf16 ? "bf16" : "fp32") + " chunk=" + std::to_string(chunk));
      expect_batched_equals_per_sequence(true, 3, 32, chunk, p, 611 + chunk);
      expect_batched_equals_per_sequence(true, 2, 17, chunk, p, 612 + chunk);
    }
}

// The chunk grid lies on absolute positions. (1) One call at position p equals a call over its
// rows up to the next multiple of chunk_size, then a call over the rest (which starts on the
// grid): the first chunk of a call at p ends at that multiple. (2) So pieces split at multiples of
// chunk_size give the bits of one unsplit prefill, whatever the piece lengths; a split inside a
// chunk changes only how that chunk is computed (equal to rounding).
TEST(KdaBatch, ChunkedGridFollowsAbsolutePositions) {
  const int T = 150, H = 2, D = 32;
  for (int chunk : {16, 64, 7}) {
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      SCOPED_TRACE("chunk=" + std::to_string(chunk) + (p == Precision::bf16 ? " bf16" : " fp32"));
      const AttnInputs in = AttnInputs::random(700 + chunk, T, H, D, p);
      // Runs pieces [cuts[i], cuts[i+1]) in order, each at its absolute position; returns o [T, H*D].
      const auto pieces = [&](Tensor& s, std::vector<int> cuts) {
        cuts.insert(cuts.begin(), 0);
        cuts.push_back(T);
        std::vector<float> o;
        for (size_t i = 0; i + 1 < cuts.size(); ++i) {
          const int t0 = cuts[i], n = cuts[i + 1] - t0;
          Tensor piece = poisoned({n, H * D});
          kda_chunked_reference(in.args(s, piece, p, chunk, t0, n));  // one sequence at position t0
          o.insert(o.end(), piece.span<float>().begin(), piece.span<float>().end());
        }
        return o;
      };
      // (1) The first chunk of a call at a position off the grid ends on the grid.
      for (int pos : {5, 37, chunk - 1, chunk + 1, 100}) {
        const int next = (pos / chunk + 1) * chunk;
        Tensor s_one = copy(in.state0), s_two = copy(in.state0);
        const std::vector<float> o_one = pieces(s_one, {pos});        // [0, pos), then one call at pos
        const std::vector<float> o_two = pieces(s_two, {pos, next});  // ... split again at `next`
        EXPECT_TRUE(bits_equal(o_two, o_one)) << "position " << pos;
        EXPECT_TRUE(bits_equal(s_two.span<float>(), s_one.span<float>())) << "position " << pos;
      }
      // (2) Splits at multiples of the chunk: the bits of one call.
      Tensor s_all = copy(in.state0);
      const std::vector<float> o_all = pieces(s_all, {});
      for (const std::vector<int>& cuts : {std::vector<int>{chunk}, {chunk, 2 * chunk}, {2 * chunk}}) {
        Tensor s = copy(in.state0);
        EXPECT_TRUE(bits_equal(pieces(s, cuts), o_all)) << "first cut " << cuts[0];
        EXPECT_TRUE(bits_equal(s.span<float>(), s_all.span<float>())) << "first cut " << cuts[0];
      }
      for (const std::vector<int>& cuts : {std::vector<int>{37}, {1, 2, 50, 99}, {63, 65, 149}}) {
        Tensor s = copy(in.state0);
        EXPECT_LE(rel_err(pieces(s, cuts), o_all), 1e-5);
        EXPECT_LE(rel_err(s.span<float>(), s_all.span<float>()), 1e-5);
      }
      // The grid really moves with position: the rows from 37 on claiming position 0 lay their
      // chunks from row 37, and the (fp32) state differs from the call at position 37.
      Tensor s_at = copy(in.state0), s_zero = copy(in.state0), o1 = poisoned({37, H * D}),
             o2 = poisoned({T - 37, H * D});
      pieces(s_at, {37});
      kda_chunked_reference(in.args(s_zero, o1, p, chunk, 0, 37));
      KdaAttentionArgs second = in.args(s_zero, o2, p, chunk, 37, T - 37);
      second.seqs = single_seq(T - 37, 0);
      kda_chunked_reference(second);
      EXPECT_FALSE(bits_equal(s_zero.span<float>(), s_at.span<float>()));
      EXPECT_LE(rel_err(s_zero.span<float>(), s_at.span<float>()), 1e-5);
    }
  }
}

// A decode step of many sequences (one row each, like the model's decode batch) in one call.
TEST(KdaBatch, DecodeStepOfSixtyFourSequences) {
  const int S = 64, H = 2, D = 32;
  const AttnInputs in = AttnInputs::random(801, S, H, D, Precision::bf16);
  core::Rng rng(802);
  const Tensor pool0 = random(rng, {S + 3, H, D, D}, 0.0, 0.5);
  std::vector<SeqSpec> specs;
  for (int s = 0; s < S; ++s) specs.push_back({s, 1, (s * 37 + 5) % (S + 3), 100 + s});  // 37 coprime to 67
  const HostSeqs seqs = make_seqs(specs);
  for (bool chunked : {false, true}) {
    Tensor pool = copy(pool0), out = poisoned({S, H * D});
    KdaAttentionArgs a = in.args(in.state0, out, Precision::bf16);
    a.state = pool.view(), a.seqs = seqs.batch;
    run_form(chunked, a);
    for (const SeqSpec& sp : specs) {
      Tensor state = f32({H, D, D}), o = poisoned({1, H * D});
      const std::span<float> s0 = slot_span(pool0, sp.slot);
      std::copy(s0.begin(), s0.end(), state.data<float>());
      run_form(chunked, in.args(state, o, Precision::bf16, 64, sp.row_begin, 1));
      ASSERT_TRUE(bits_equal(o.span<float>(), out.span<float>().subspan(sp.row_begin * H * D, H * D)));
      ASSERT_TRUE(bits_equal(state.span<float>(), slot_span(pool, sp.slot)));
    }
  }
}

TEST(KdaBatch, AttentionCheckNamesTheBadSequenceTable) {
  const int T = 10, H = 2, D = 8;
  const AttnInputs in = AttnInputs::random(901, T, H, D);
  core::Rng rng(902);
  Tensor pool = random(rng, {4, H, D, D}, 0.0, 0.5), out = f32({T, H * D});
  auto reason = [&](const std::vector<SeqSpec>& specs, auto mutate) {
    const HostSeqs seqs = make_seqs(specs);
    KdaAttentionArgs a = in.args(in.state0, out, Precision::fp32);
    a.state = pool.view(), a.seqs = seqs.batch;
    mutate(a);
    core::Status s = kda_attention_check(a);
    return s ? std::string("ok") : s.reason();
  };
  const auto none = [](KdaAttentionArgs&) {};
  const auto has = [](const std::string& r, const std::string& what) {
    return ::testing::AssertionResult(r.find(what) != std::string::npos) << r;
  };
  EXPECT_EQ(reason({{0, 3, 1, 7}, {3, 7, 0, 0}}, none), "ok");
  EXPECT_TRUE(has(reason({{0, 3, 4, 0}}, none), "seqs.slot[0] = 4"));
  EXPECT_TRUE(has(reason({{0, 3, 1, 0}, {3, 3, 1, 0}}, none), "share a slot"));
  EXPECT_TRUE(has(reason({{0, 3, 1, 0}, {5, 6, 2, 0}}, none), "seqs.row_begin[1] = 5"));
  EXPECT_TRUE(has(reason({{0, 5, 1, 0}, {4, 2, 2, 0}}, none), "overlap"));
  EXPECT_TRUE(has(reason({{0, 3, 1, -2}}, none), "seqs.position[0] = -2"));
  EXPECT_TRUE(
      has(reason({{0, 3, 1, 0}}, [](KdaAttentionArgs& a) { a.seqs.position = TensorView{}; }), "seqs.position"));
  EXPECT_TRUE(has(reason({{0, 3, 1, 0}}, [](KdaAttentionArgs& a) { a.seqs.max_rows = 1; }), "seqs.num_rows[0] = 3"));
  // Tables on another device than the activations (the view only claims CUDA; nothing is read).
  EXPECT_TRUE(has(reason({{0, 3, 1, 0}}, [](KdaAttentionArgs& a) { a.seqs.slot.device = core::Device::cuda; }),
                  "seqs.slot must be on the activations' device"));
  // The pool: the wrong per-slot shape, and a slot stride that would overlap slots.
  Tensor bad_pool = f32({4, H, D, D + 1});
  EXPECT_TRUE(has(reason({{0, 3, 1, 0}}, [&](KdaAttentionArgs& a) { a.state = bad_pool.view(); }), "state must be"));
  EXPECT_TRUE(has(reason({{0, 3, 1, 0}}, [](KdaAttentionArgs& a) { a.state.strides[0] = 8; }), "state slot stride"));
  const HostSeqs bad = make_seqs({{0, 3, 1, 0}, {3, 3, 1, 0}});
  KdaAttentionArgs a = in.args(in.state0, out, Precision::fp32);
  a.state = pool.view(), a.seqs = bad.batch;
  EXPECT_THROW(kda_recurrent_reference(a), core::Error);
  EXPECT_THROW(kda_chunked_reference(a), core::Error);
}

}  // namespace
}  // namespace k3::kernels
