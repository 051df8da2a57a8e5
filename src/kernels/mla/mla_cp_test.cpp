// kernels/mla/mla_cp_test.cpp: MLA under decode context parallelism (mla_cp.h) on the CPU: the four
// steps with cp = 1 give mla_absorbed_reference's output, and cp = 2, 3, 4 ranks simulated in one
// process (cache split by p % cp, the collectives done by hand in rank order) give the absorbed form
// over the whole cache; rows at global position 0 (ranks > 0 see nothing) and verify rows included.
// The checks reject bad shapes / dtypes naming the field. mla_w_uv with the output gate equals mla_w_uv
// then the gate bit for bit, also when out is the gate view.
#include "kernels/mla/mla_cp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "kernels/mla/mla_test_util.h"

namespace k3::kernels {
namespace {

using mla_test::MlaBatch;
using mla_test::MlaDims;
using mla_test::MlaProblem;
using mla_test::nan_filled;

constexpr core::DType kF32 = core::DType::f32, kBf16 = core::DType::bf16, kFp8 = core::DType::f8_e4m3;

// Local position of global position p on its rank, and the number of local positions rank r holds
// of a sequence of S tokens (mla_cp.h: p lives on rank p % cp at local position p / cp).
int64_t local_tokens(int64_t S, int cp, int r) { return S <= r ? 0 : (S - 1 - r) / cp + 1; }

// Columns [begin, end) of a 2-D f32 tensor, copied.
core::Tensor columns(const core::Tensor& t, int64_t begin, int64_t end) {
  core::Tensor out = core::Tensor::zeros(kF32, {t.dim(0), end - begin});
  for (int64_t r = 0; r < t.dim(0); ++r)
    std::memcpy(out.data<float>() + r * (end - begin), t.data<const float>() + r * t.dim(1) + begin,
                sizeof(float) * static_cast<size_t>(end - begin));
  return out;
}

// kv_b rows of heads [h0, h0 + n): the weight a rank owning those heads holds.
LinearWeight head_slice(const LinearWeight& kv_b, const MlaDims& d, int64_t h0, int64_t n) {
  const int64_t per_head = d.nope + d.v, cols = kv_b.weight.dim(1);
  const size_t esize = core::dtype_size(kv_b.weight.dtype());
  LinearWeight w;
  w.weight = core::Tensor::zeros(kv_b.weight.dtype(), {n * per_head, cols});
  std::memcpy(w.weight.view().data, static_cast<const char*>(kv_b.weight.view().data) + h0 * per_head * cols * esize,
              static_cast<size_t>(n * per_head * cols) * esize);
  return w;
}

core::TensorView f32_view(const core::Tensor& t, core::Shape shape) {
  EXPECT_EQ(shape.numel(), t.numel());
  return core::TensorView::contiguous(t.view().data, kF32, shape);
}

// The group of cp ranks over one MlaBatch: rank r owns heads [r * Hr, (r + 1) * Hr) and the
// positions p % cp == r of every sequence, at local position p / cp, in pages of block_size tokens
// whose (shuffled) ids are the same on every rank. run() does the four steps and two collectives.
struct CpGroup {
  const MlaBatch& batch;
  const MlaDims d;
  int cp;
  int64_t Hr, bs, max_blocks = 0;
  core::Tensor block_table;         // i32 [S, max_blocks]: LOCAL positions, every rank
  std::vector<core::Tensor> pages;  // per rank
  std::vector<LinearWeight> kv_b;   // per rank
  std::vector<core::Tensor> q;      // per rank [rows, Hr * (nope + rope)]

  CpGroup(const MlaBatch& b, int group, uint64_t seed)
      : batch(b), d(b.probs.front()->d), cp(group), Hr(d.heads / group), bs(b.block_size) {
    const MlaProblem& p0 = *b.probs.front();
    EXPECT_EQ(d.heads % cp, 0);
    core::Rng rng(seed);
    const auto n = static_cast<int64_t>(b.probs.size());
    int64_t blocks = 0;
    for (const MlaProblem* p : b.probs) {
      const int64_t need = (local_tokens(p->S, cp, 0) + bs - 1) / bs;  // rank 0 holds the most
      blocks += need;
      max_blocks = std::max(max_blocks, need + 1);
    }
    const std::vector<int32_t> pool = mla_test::shuffled_ids(blocks + 3, rng);
    std::vector<int32_t> table(static_cast<size_t>(n * max_blocks), -1);
    size_t next = 0;
    for (int64_t k = 0; k < n; ++k)
      for (int64_t blk = 0; blk * bs < local_tokens(b.probs[k]->S, cp, 0); ++blk)
        table[k * max_blocks + blk] = pool[next++];
    block_table = mla_test::i32_tensor(table, {n, max_blocks});
    const int64_t E = d.kv_lora + d.rope, qw = d.nope + d.rope;
    for (int r = 0; r < cp; ++r) {
      pages.push_back(mla_test::poisoned_pages(p0.pages.dtype(), blocks + 3, bs, E));
      std::vector<int32_t> rows;
      std::vector<float> c, pe;
      for (int64_t k = 0; k < n; ++k) {
        const MlaProblem& p = *b.probs[k];
        for (int64_t pos = r; pos < p.S; pos += cp) {
          const int64_t local = pos / cp;
          rows.push_back(table[k * max_blocks + local / bs] * static_cast<int32_t>(bs) +
                         static_cast<int32_t>(local % bs));
          c.insert(c.end(), p.c_n.data<const float>() + pos * d.kv_lora,
                   p.c_n.data<const float>() + (pos + 1) * d.kv_lora);
          pe.insert(pe.end(), p.k_pe.data<const float>() + pos * d.rope,
                    p.k_pe.data<const float>() + (pos + 1) * d.rope);
        }
      }
      if (!rows.empty()) {
        const auto m = static_cast<int64_t>(rows.size());
        core::Tensor ct = core::Tensor::zeros(kF32, {m, d.kv_lora}), pt = core::Tensor::zeros(kF32, {m, d.rope});
        std::copy(c.begin(), c.end(), ct.data<float>());
        std::copy(pe.begin(), pe.end(), pt.data<float>());
        const core::Tensor rt = mla_test::i32_tensor(rows);
        mla_cache_write_reference({ct.view(), pt.view(), pages.back().view(), rt.view(), p0.k_scale});
      }
      kv_b.push_back(head_slice(p0.kv_b, d, r * Hr, Hr));
      q.push_back(columns(b.q, r * Hr * qw, (r + 1) * Hr * qw));
    }
  }

  SeqBatch local_seqs() const {
    SeqBatch s = batch.seqs();
    s.block_table = block_table.view();
    s.max_tokens = max_blocks * bs;
    return s;
  }

  // Steps 1-2 on every rank; the lse each rank computed [cp, T, Hr] and its o_part [cp, T, Hr, L].
  struct Partial {
    std::vector<core::Tensor> o_part, lse;
  };
  Partial partial(Precision precision) const {
    const int64_t T = batch.rows, E = d.kv_lora + d.rope, L = d.kv_lora;
    const MlaProblem& p0 = *batch.probs.front();
    // Step 1 on each rank, then the all-gather (first axis: rank r's rows at [r * T, (r + 1) * T)).
    core::Tensor qc_all = nan_filled({cp * T, Hr * E});
    for (int r = 0; r < cp; ++r) {
      MlaQAbsorbArgs a;
      a.q = q[r].view();
      a.seqs = batch.seqs();
      a.kv_b = &kv_b[r];
      core::Tensor qc = nan_filled({T, Hr * E});
      a.qc = f32_view(qc, {T, Hr, E});
      a.num_heads = static_cast<int>(Hr);
      a.qk_nope = d.nope, a.qk_rope = d.rope, a.v_head_dim = d.v, a.kv_lora = d.kv_lora;
      a.precision = precision;
      mla_q_absorb_reference(a);
      std::memcpy(qc_all.data<float>() + r * T * Hr * E, qc.data<const float>(), static_cast<size_t>(qc.nbytes()));
    }
    Partial out;
    for (int r = 0; r < cp; ++r) {
      out.o_part.push_back(nan_filled({cp * T * Hr, L}));
      out.lse.push_back(nan_filled({cp * T, Hr}));
      MlaPartialAttentionArgs a;
      a.qc = f32_view(qc_all, {cp, T, Hr, E});
      a.pages = pages[r].view();
      a.seqs = local_seqs();
      a.k_scale = p0.k_scale;
      a.o_part = f32_view(out.o_part.back(), {cp, T, Hr, L});
      a.lse = f32_view(out.lse.back(), {cp, T, Hr});
      a.cp_size = cp, a.cp_rank = r;
      a.scale = p0.default_scale();
      mla_partial_attention_reference(a);
    }
    return out;
  }

  // All four steps: out [rows, H * v] with each rank's heads in its columns.
  core::Tensor run(Precision precision) const {
    const int64_t T = batch.rows, L = d.kv_lora;
    Partial part = partial(precision);
    // all_gather(lse, first): [cp (rank), cp (owner), T, Hr], the same on every rank.
    core::Tensor lse_all = nan_filled({cp * cp * T, Hr});
    for (int r = 0; r < cp; ++r)
      std::memcpy(lse_all.data<float>() + r * cp * T * Hr, part.lse[r].data<const float>(),
                  static_cast<size_t>(part.lse[r].nbytes()));
    for (int r = 0; r < cp; ++r) {
      MlaLseRescaleArgs a;
      a.o_part = f32_view(part.o_part[r], {cp, T, Hr, L});
      a.lse_all = f32_view(lse_all, {cp, cp, T, Hr});
      a.seqs = batch.seqs();
      a.cp_rank = r;
      mla_lse_rescale_reference(a);
    }
    core::Tensor out = nan_filled({T, d.heads * int64_t{d.v}});
    for (int g = 0; g < cp; ++g) {
      // reduce_scatter_sum: owner g's slice, summed over ranks in rank order (acc = x_0; acc += x_1 ...).
      core::Tensor o_lat = core::Tensor::zeros(kF32, {T * Hr, L});
      const int64_t n = T * Hr * L;
      for (int r = 0; r < cp; ++r) {
        const float* src = part.o_part[r].data<const float>() + g * n;
        for (int64_t i = 0; i < n; ++i) o_lat.data<float>()[i] = r == 0 ? src[i] : o_lat.data<float>()[i] + src[i];
      }
      core::Tensor out_g = nan_filled({T, Hr * d.v});
      MlaWUvArgs a;
      a.o_lat = f32_view(o_lat, {T, Hr, L});
      a.seqs = batch.seqs();
      a.kv_b = &kv_b[g];
      a.out = out_g.view();
      a.num_heads = static_cast<int>(Hr);
      a.qk_nope = d.nope, a.v_head_dim = d.v, a.kv_lora = d.kv_lora;
      a.precision = precision;
      mla_w_uv_reference(a);
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(out.data<float>() + t * out.dim(1) + g * Hr * d.v, out_g.data<const float>() + t * Hr * d.v,
                    sizeof(float) * static_cast<size_t>(Hr * d.v));
    }
    return out;
  }
};

// Bf16 mode: the combine sums o_lat in another order than the absorbed form, so a value may land on
// the other side of a bf16 rounding boundary (one ulp of o_lat, then of out): few elements, small.
struct Agreement {
  double rel = 0;
  double differ = 0;  // fraction of elements not bit-equal
};
Agreement agreement(const core::Tensor& a, const core::Tensor& b) {
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) differ += a.data<const float>()[i] != b.data<const float>()[i];
  return {mla_test::rel_err(a, b), a.numel() ? double(differ) / double(a.numel()) : 0.0};
}

struct Case {
  int64_t S, T;  // rows at global positions S-T .. S-1
};

// Runs the group over one batch of problems and checks every problem's rows against the absorbed
// form over the whole cache, and the unowned rows untouched (NaN).
void expect_group_matches_absorbed(const MlaDims& dims, std::vector<Case> cases, int cp, int64_t block_size,
                                   core::DType cache_dtype, uint64_t seed) {
  std::vector<MlaProblem> probs;
  probs.reserve(cases.size());
  for (const Case& c : cases)
    probs.emplace_back(dims, c.S, c.T, cache_dtype, kBf16, cache_dtype == kFp8 ? 0.41f : 1.0f, seed + probs.size());
  std::vector<const MlaProblem*> ptrs;
  for (const MlaProblem& p : probs) ptrs.push_back(&p);
  const MlaBatch batch(ptrs, block_size, seed ^ 0x55);
  const CpGroup group(batch, cp, seed ^ 0x77);
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision == Precision::fp32 ? "fp32" : "bf16");
    const core::Tensor ref = batch.run(mla_absorbed_reference, precision);
    const core::Tensor got = group.run(precision);
    for (size_t k = 0; k < probs.size(); ++k) {
      SCOPED_TRACE("S=" + std::to_string(probs[k].S) + " T=" + std::to_string(probs[k].T));
      const core::Tensor a = batch.rows_of(got, k), b = batch.rows_of(ref, k);
      ASSERT_TRUE(mla_test::all_finite(a));
      const Agreement ag = agreement(a, b);
      if (precision == Precision::fp32 || cp == 1) {
        // cp = 1: the rescale weight is exactly 1, so the steps are the absorbed form's arithmetic.
        // fp32: the two-level softmax reassociates the normaliser (observed: docs/perf/kernel-notes.md).
        EXPECT_LT(ag.rel, cp == 1 ? 1e-7 : 1e-5);
      } else {
        EXPECT_LT(ag.rel, 1e-2);    // one bf16 ulp of o_lat through W_UV
        EXPECT_LT(ag.differ, 0.1);  // most outputs bit-equal
      }
    }
    for (int64_t r : batch.unowned_rows())
      for (int64_t c = 0; c < got.dim(1); ++c) EXPECT_TRUE(std::isnan(got.data<const float>()[r * got.dim(1) + c]));
  }
}

constexpr MlaDims kOdd1{1, 13, 7, 11, 37}, kOdd3{3, 13, 7, 11, 37};

// (a) cp = 1: q_absorb -> partial (G = 1) -> rescale (one rank) -> w_uv is mla_absorbed_reference.
TEST(MlaCp, OneRankIsTheAbsorbedForm) {
  uint64_t seed = 100;
  for (const MlaDims& dims : {kOdd1, kOdd3})
    for (int64_t bs : {16, 7})
      for (core::DType dtype : {kF32, kFp8}) {
        SCOPED_TRACE("H=" + std::to_string(dims.heads) + " bs=" + std::to_string(bs) +
                     (dtype == kFp8 ? " fp8" : " f32"));
        expect_group_matches_absorbed(dims, {{1, 1}, {18, 1}, {55, 3}, {98, 1}}, 1, bs, dtype, seed += 10);
      }
}

// The cp = 1 path is bit-for-bit the absorbed form, in both precisions (the rescale weight is 1).
TEST(MlaCp, OneRankIsBitForBitTheAbsorbedForm) {
  const MlaProblem p(kOdd3, 54, 3, kF32, kBf16, 1.0f, 7, 7);
  const MlaBatch batch({&p}, 7, 8);
  const CpGroup group(batch, 1, 9);
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    const core::Tensor a = group.run(precision), b = batch.run(mla_absorbed_reference, precision);
    for (int64_t i = 0; i < a.numel(); ++i) {
      const float x = a.data<const float>()[i], y = b.data<const float>()[i];
      EXPECT_TRUE((std::isnan(x) && std::isnan(y)) || x == y) << i;
    }
  }
}

// (b) cp = 2, 3, 4: the cache split over ranks by p % cp, combined by log-sum-exp.
TEST(MlaCp, SplitCacheMatchesTheWholeCache) {
  uint64_t seed = 300;
  for (int cp : {2, 3, 4})
    for (int64_t bs : {16, 7})
      for (core::DType dtype : {kF32, kFp8}) {
        SCOPED_TRACE("cp=" + std::to_string(cp) + " bs=" + std::to_string(bs) + (dtype == kFp8 ? " fp8" : " f32"));
        const MlaDims dims{cp * (cp == 3 ? 1 : 2), 13, 7, 11, 37};
        // Position 0 (only rank 0 sees anything), fewer tokens than ranks with verify rows, odd
        // lengths, a verify step across a block boundary.
        expect_group_matches_absorbed(dims, {{1, 1}, {3, 3}, {18, 1}, {55, 4}, {98, 1}}, cp, bs, dtype, seed += 10);
      }
}

// Real per-GPU K3 head shapes (spec §11: nope 128, rope 64, v 128, kv_lora 512), 8 heads over 4 ranks.
TEST(MlaCp, SplitCacheMatchesTheWholeCacheAtK3Shapes) {
  expect_group_matches_absorbed({8, 128, 64, 128, 512}, {{97, 1}, {40, 5}}, 4, 16, kFp8, 500);
  expect_group_matches_absorbed({4, 128, 64, 128, 512}, {{54, 2}}, 2, 64, kF32, 510);
}

// A row whose global position is below a rank's first token: lse = -inf and o_part = 0 there, and
// the rescale gives it weight 0; rank 0 (which holds position 0) gets the whole weight.
TEST(MlaCp, RanksWithoutVisibleTokensGetWeightZero) {
  const MlaProblem p({4, 13, 7, 11, 37}, 2, 2, kF32, kBf16, 1.0f, 41, 7);  // rows at positions 0 and 1
  const MlaBatch batch({&p}, 7, 42);
  const CpGroup group(batch, 4, 43);
  const CpGroup::Partial part = group.partial(Precision::fp32);
  const int64_t T = batch.rows, H = 1, L = 37, row0 = batch.first_row[0];
  for (int r = 0; r < 4; ++r)
    for (int64_t g = 0; g < 4; ++g)
      for (int64_t t = 0; t < 2; ++t) {
        const bool sees = t >= r;  // global position t sees local position 0 of rank r iff r <= t
        const float lse = part.lse[r].data<const float>()[(g * T + row0 + t) * H];
        const float* o = part.o_part[r].data<const float>() + ((g * T + row0 + t) * H) * L;
        if (sees) {
          EXPECT_TRUE(std::isfinite(lse)) << r << " " << g << " " << t;
        } else {
          EXPECT_EQ(lse, -std::numeric_limits<float>::infinity()) << r << " " << g << " " << t;
          for (int64_t i = 0; i < L; ++i) EXPECT_EQ(o[i], 0.0f);
        }
      }
  // The rescale of rank 0 for the position-0 row is exactly 1 (every other lse is -inf).
  core::Tensor lse_all = nan_filled({4 * 4 * T, H});
  for (int r = 0; r < 4; ++r)
    std::memcpy(lse_all.data<float>() + r * 4 * T * H, part.lse[r].data<const float>(),
                static_cast<size_t>(part.lse[r].nbytes()));
  core::Tensor o0 = core::Tensor::copy_of(part.o_part[0].view());
  MlaLseRescaleArgs a{f32_view(o0, {4, T, H, L}), f32_view(lse_all, {4, 4, T, H}), batch.seqs(), 0};
  mla_lse_rescale_reference(a);
  for (int64_t i = 0; i < L; ++i)
    EXPECT_EQ(o0.data<const float>()[(0 * T + row0) * L + i],
              part.o_part[0].data<const float>()[(0 * T + row0) * L + i]);
}

// ---- (c) checks ----------------------------------------------------------------------------------

void expect_fail(const core::Status& st, std::initializer_list<std::string> needles) {
  ASSERT_FALSE(st.is_ok());
  for (const std::string& n : needles) EXPECT_NE(st.reason().find(n), std::string::npos) << st.reason();
}

TEST(MlaCp, ChecksNameTheBadArgument) {
  const MlaProblem p(kOdd3, 20, 2, kF32, kBf16, 1.0f, 61, 7);
  const MlaBatch batch({&p}, 7, 62);
  const CpGroup group(batch, 3, 63);
  const int64_t T = batch.rows, Hr = 1, E = 44, L = 37;
  core::Tensor qc = nan_filled({T, Hr * E}), qc_all = nan_filled({3 * T, Hr * E});
  core::Tensor o_part = nan_filled({3 * T * Hr, L}), lse = nan_filled({3 * T, Hr}), lse_all = nan_filled({9 * T, Hr});
  core::Tensor out = nan_filled({T, Hr * 11});

  MlaQAbsorbArgs qa{group.q[0].view(), batch.seqs(), &group.kv_b[0], f32_view(qc, {T, Hr, E}), 1, 13, 7, 11, 37};
  EXPECT_TRUE(mla_q_absorb_check(qa).is_ok()) << mla_q_absorb_check(qa).reason();
  auto bad = qa;
  bad.qc = f32_view(qc, {T, Hr * E});
  expect_fail(mla_q_absorb_check(bad), {"mla_q_absorb", "qc", "[T, num_heads, kv_lora + qk_rope]"});
  bad = qa;
  bad.q = batch.q.view();  // 3 heads' columns for num_heads 1
  expect_fail(mla_q_absorb_check(bad), {"q must be", "[T, 20]"});
  bad = qa;
  bad.kv_b = nullptr;
  expect_fail(mla_q_absorb_check(bad), {"kv_b is missing"});
  bad = qa;
  bad.kv_b = &p.kv_b;  // the whole group's heads
  expect_fail(mla_q_absorb_check(bad), {"kv_b must be contiguous", "[24, 37]"});
  const core::Tensor bad_rows = mla_test::i32_tensor({static_cast<int32_t>(T)});
  bad = qa;
  bad.seqs.row_begin = bad_rows.view();
  expect_fail(mla_q_absorb_check(bad), {"seqs.row_begin[0]"});
  EXPECT_THROW(mla_q_absorb_reference(bad), core::Error);

  MlaPartialAttentionArgs pa;
  pa.qc = f32_view(qc_all, {3, T, Hr, E});
  pa.pages = group.pages[1].view();
  pa.seqs = group.local_seqs();
  pa.o_part = f32_view(o_part, {3, T, Hr, L});
  pa.lse = f32_view(lse, {3, T, Hr});
  pa.cp_size = 3, pa.cp_rank = 1, pa.scale = 0.15f;
  EXPECT_TRUE(mla_partial_attention_check(pa).is_ok()) << mla_partial_attention_check(pa).reason();
  auto pb = pa;
  pb.cp_rank = 3;
  expect_fail(mla_partial_attention_check(pb), {"cp_rank", "3", "cp_size 3"});
  pb = pa;
  pb.lse = f32_view(lse, {3 * T, Hr});
  expect_fail(mla_partial_attention_check(pb), {"lse must be", "[3, " + std::to_string(T) + ", 1]"});
  pb = pa;
  pb.o_part = f32_view(o_part, {3, T, Hr * L});
  expect_fail(mla_partial_attention_check(pb), {"o_part must be"});
  pb = pa;
  pb.pages = p.pages.view();  // global pages: fine by shape; now a wrong width
  pb.pages.shape = {p.pages.dim(0), p.pages.dim(1), E - 1};
  expect_fail(mla_partial_attention_check(pb), {"pages must be", "kv_lora + rope = 44"});
  pb = pa;
  pb.seqs.max_tokens = 2;  // local bound below what the last row sees on rank 1 (local 0..6)
  expect_fail(mla_partial_attention_check(pb), {"seqs.position[0]", "local position", "max_tokens = 2"});
  const core::Tensor i32_lse = core::Tensor::zeros(core::DType::i32, {3, T, Hr});
  pb = pa;
  pb.lse = i32_lse.view();
  expect_fail(mla_partial_attention_check(pb), {"lse must be", "I32"});
  pb = pa;
  pb.scale = 0.0f;
  expect_fail(mla_partial_attention_check(pb), {"scale"});

  MlaLseRescaleArgs ra{f32_view(o_part, {3, T, Hr, L}), f32_view(lse_all, {3, 3, T, Hr}), batch.seqs(), 2};
  EXPECT_TRUE(mla_lse_rescale_check(ra).is_ok()) << mla_lse_rescale_check(ra).reason();
  auto rb = ra;
  rb.cp_rank = 3;
  expect_fail(mla_lse_rescale_check(rb), {"cp_rank", "cp = 3"});
  rb = ra;
  rb.lse_all = f32_view(lse_all, {9, T, Hr});
  expect_fail(mla_lse_rescale_check(rb), {"lse_all must be", "[cp, 3, " + std::to_string(T) + ", 1]"});

  core::Tensor o_lat = nan_filled({T * Hr, L});
  MlaWUvArgs wa{f32_view(o_lat, {T, Hr, L}), batch.seqs(), &group.kv_b[0], {}, out.view(), 1, 13, 11, 37};
  EXPECT_TRUE(mla_w_uv_check(wa).is_ok()) << mla_w_uv_check(wa).reason();
  auto wb = wa;
  wb.o_lat = f32_view(o_lat, {T, Hr * L});
  expect_fail(mla_w_uv_check(wb), {"o_lat must be", "[T, num_heads, kv_lora]"});
  wb = wa;
  wb.out = batch.q.view();
  expect_fail(mla_w_uv_check(wb), {"out must be", "[" + std::to_string(T) + ", 11]"});
  wb = wa;
  wb.num_heads = 0;
  expect_fail(mla_w_uv_check(wb), {"num_heads"});
}

// ---- (d) mla_w_uv with the output gate ----------------------------------------------------------

// Normal(0, sd) f32 values rounded to bf16 (activations reach the op rounded), from `seed`.
core::Tensor random_bf16_values(core::Shape shape, double sd, uint64_t seed) {
  core::Rng rng(seed);
  core::Tensor t = core::Tensor::zeros(kF32, shape);
  for (float& x : t.span<float>()) x = core::bf16_round(static_cast<float>(rng.normal(0.0, sd)));
  return t;
}

// mla_w_uv over a batch of two problems (rows at positions 2..4 and 19, an unowned row before each and
// one at the end): o_lat [rows, H, L] unrounded f32, gate logits [rows, H * v] bf16-representable.
struct WUvCase {
  MlaDims d;
  MlaProblem p1, p2;
  MlaBatch batch;
  core::Tensor o_lat, gate;
  WUvCase(const MlaDims& dims, core::DType kv_b_dtype, uint64_t seed)
      : d(dims),
        p1(dims, 5, 3, kF32, kv_b_dtype, 1.0f, seed, 7),
        p2(dims, 20, 1, kF32, kv_b_dtype, 1.0f, seed + 1, 7),
        batch({&p1, &p2}, 7, seed + 2),
        o_lat(random_bf16_values({batch.rows, int64_t{dims.heads} * dims.kv_lora}, 1.0, seed + 3)),
        gate(random_bf16_values({batch.rows, int64_t{dims.heads} * dims.v}, 2.0, seed + 4)) {
    // Unrounded o_lat (the reduce-scatter's fp32 sum): the op rounds it in bf16 mode.
    for (float& x : o_lat.span<float>()) x *= 1.0f + 1.0f / 3000.0f;
  }
  MlaWUvArgs args(core::TensorView gate_view, core::TensorView out, Precision precision) const {
    MlaWUvArgs a;
    a.o_lat = f32_view(o_lat, {batch.rows, d.heads, d.kv_lora});
    a.seqs = batch.seqs();
    a.kv_b = &p1.kv_b;
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
  for (const MlaDims& dims : {MlaDims{3, 13, 7, 11, 37}, MlaDims{2, 128, 64, 128, 512}})
    for (core::DType kv_b_dtype : {kBf16, kF32})
      for (Precision precision : {Precision::fp32, Precision::bf16}) {
        SCOPED_TRACE("L=" + std::to_string(dims.kv_lora) + (kv_b_dtype == kBf16 ? " kv_b bf16" : " kv_b f32") +
                     (precision == Precision::bf16 ? " bf16" : " fp32"));
        const WUvCase c(dims, kv_b_dtype, seed += 10);
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
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    const WUvCase c({3, 13, 7, 11, 37}, kBf16, 800);
    core::Tensor want = nan_filled({c.batch.rows, 3 * 11});
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

TEST(MlaCpWUvGate, ChecksNameTheBadGate) {
  const WUvCase c({3, 13, 7, 11, 37}, kBf16, 900);
  const int64_t R = c.batch.rows, W = 3 * 11;
  core::Tensor out = nan_filled({R, W}), wide = nan_filled({R + 1, W});
  const auto check = [&](core::TensorView gate, core::TensorView o) {
    return mla_w_uv_check(c.args(gate, o, Precision::bf16));
  };
  EXPECT_TRUE(check(c.gate.view(), out.view()).is_ok()) << check(c.gate.view(), out.view()).reason();
  core::TensorView bad = c.gate.view();
  bad.shape = {R, W - 1};
  expect_fail(check(bad, out.view()), {"mla_w_uv", "gate must be undefined (no gate) or F32",
                                       "[" + std::to_string(R) + ", 33]", "got F32 [" + std::to_string(R) + ", 32]"});
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
