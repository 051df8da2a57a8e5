// kernels/mla/mla_cp_test.cpp: MLA under decode context parallelism (mla_cp.h) on the CPU, on the
// case tables of kernels/mla/cases.h: cp ranks simulated in one process (cache split by p % cp, the
// collectives done by hand in rank order) give the absorbed form over the whole cache, at every odd
// group size (kMlaCpOddSizes: cp = 1 bit for bit) and rank shape (kMlaCpOddShapes) over contexts
// split unevenly, 1-token contexts and ranks that hold no token (kMlaCpOddBatch, kMlaCpNoTokenBatch),
// and at one TP8 rank of K3 in the DCP groups of kMlaCpK3Groups (kMlaCpK3ChainBatch). A row that sees
// no token of a rank gets lse -inf, o_part 0 and weight 0 there. The checks reject bad shapes / dtypes
// naming the field. mla_w_uv with the output gate: mla_cp_w_uv_test.cpp.
#include "kernels/mla/mla_cp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "core/bf16.h"
#include "kernels/mla/mla_test_util.h"

namespace k3::kernels {
namespace {

using mla_test::as_vector;
using mla_test::expect_fail;
using mla_test::f32_view;
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

// The group of cp ranks over one MlaBatch: rank r owns heads [r * Hr, (r + 1) * Hr) and the
// positions p % cp == r of every sequence, at local position p / cp, in pages of block_size tokens
// whose (shuffled) ids are the same on every rank. run() does the four steps and two collectives.
struct CpGroup {
  const MlaBatch& batch;
  const MlaDims d;
  int cp;
  int64_t Hr, bs, max_blocks = 0;
  core::Tensor block_table;                   // i32 [S, max_blocks]: LOCAL positions, every rank
  std::vector<core::Tensor> pages;            // per rank
  std::vector<LinearWeight> kv_b;             // per rank
  std::vector<core::Tensor> q;                // per rank [rows, Hr * (nope + rope)]
  backends::cpu::ThreadPool* pool = nullptr;  // the references' pool (null: inline)

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
      mla_q_absorb_reference(a, pool);
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
      mla_partial_attention_reference(a, pool);
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
      mla_w_uv_reference(a, pool);
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

std::string describe(const MlaCpGroup& g, int64_t bs, core::DType dtype) {
  const MlaShape& s = g.shape;
  return "cp=" + std::to_string(g.cp) + " H=" + std::to_string(s.heads) + " nope=" + std::to_string(s.nope) +
         " rope=" + std::to_string(s.rope) + " v=" + std::to_string(s.v) + " L=" + std::to_string(s.kv_lora) +
         " bs=" + std::to_string(bs) + (dtype == kFp8 ? " fp8" : " f32");
}

// One problem per sequence of the batch, over the whole group's heads (cp * shape.heads), as one
// batched call.
struct GroupProblems {
  std::vector<MlaProblem> probs;
  std::vector<const MlaProblem*> ptrs;
  GroupProblems(const MlaCpGroup& g, const std::vector<MlaSeq>& seqs, core::DType cache_dtype, uint64_t seed) {
    MlaDims dims = g.shape;
    dims.heads = g.cp * g.shape.heads;
    probs.reserve(seqs.size());
    for (const MlaSeq& s : seqs)
      probs.emplace_back(dims, s.S, s.T, cache_dtype, kBf16, cache_dtype == kFp8 ? 0.41f : 1.0f, seed + probs.size());
    for (const MlaProblem& p : probs) ptrs.push_back(&p);
  }
};

// Runs the group over one batch and checks every sequence's rows against the absorbed form over the
// whole cache (cp = 1: bit for bit), and the rows of no sequence untouched (NaN).
// The references run on `pool` (null: inline).
void expect_group_matches_absorbed(const MlaCpGroup& g, const std::vector<MlaSeq>& seqs, int64_t block_size,
                                   core::DType cache_dtype, uint64_t seed, backends::cpu::ThreadPool* pool = nullptr) {
  const GroupProblems gp(g, seqs, cache_dtype, seed);
  const MlaBatch batch(gp.ptrs, block_size, seed ^ 0x55);
  CpGroup group(batch, g.cp, seed ^ 0x77);
  group.pool = pool;
  const auto absorbed = [pool](const MlaAttentionArgs& a) { mla_absorbed_reference(a, pool); };
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision == Precision::fp32 ? "fp32" : "bf16");
    const core::Tensor ref = batch.run(absorbed, precision);
    const core::Tensor got = group.run(precision);
    for (size_t k = 0; k < seqs.size(); ++k) {
      SCOPED_TRACE("S=" + std::to_string(seqs[k].S) + " T=" + std::to_string(seqs[k].T));
      const core::Tensor a = batch.rows_of(got, k), b = batch.rows_of(ref, k);
      ASSERT_TRUE(mla_test::all_finite(a));
      const Agreement ag = agreement(a, b);
      if (g.cp == 1) {
        // The rescale weight is exactly 1: the steps are the absorbed form's arithmetic.
        EXPECT_EQ(ag.differ, 0.0) << "rel " << ag.rel;
      } else if (precision == Precision::fp32) {
        // The two-level softmax reassociates the normaliser (observed: docs/perf/kernel-notes.md).
        EXPECT_LT(ag.rel, 1e-5);
      } else {
        EXPECT_LT(ag.rel, 1e-2);    // one bf16 ulp of o_lat through W_UV
        EXPECT_LT(ag.differ, 0.1);  // most outputs bit-equal
      }
    }
    for (int64_t r : batch.unowned_rows())
      for (int64_t c = 0; c < got.dim(1); ++c) EXPECT_TRUE(std::isnan(got.data<const float>()[r * got.dim(1) + c]));
  }
}

// Every odd group size and rank shape, both page sizes, f32 and fp8 caches: uneven splits, 1-token
// contexts, verify rows across page boundaries (kMlaCpOddBatch), and ranks without any token of the
// batch (kMlaCpNoTokenBatch).
TEST(MlaCp, SplitCacheMatchesTheWholeCache) {
  uint64_t seed = 300;
  for (const std::vector<MlaSeq>& seqs : {as_vector(kMlaCpOddBatch), as_vector(kMlaCpNoTokenBatch)})
    for (int cp : kMlaCpOddSizes)
      for (const MlaShape& shape : kMlaCpOddShapes)
        for (int64_t bs : kMlaCpOddBlockSizes)
          for (core::DType dtype : {kF32, kFp8}) {
            const MlaCpGroup g{shape, cp};
            SCOPED_TRACE(describe(g, bs, dtype) + " seqs=" + std::to_string(seqs.size()));
            expect_group_matches_absorbed(g, seqs, bs, dtype, seed += 10);
          }
}

// One TP8 rank of K3 (spec §11) in the DCP groups of kMlaCpK3Groups: fp8 pages of 16 at DCP 8, f32
// pages of 64 at DCP 2 (the references on a pool: the whole group's 96 heads over the whole cache).
TEST(MlaCp, SplitCacheMatchesTheWholeCacheAtK3Shapes) {
  backends::cpu::ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  uint64_t seed = 500;
  for (size_t i = 0; i < std::size(kMlaCpK3Groups); ++i) {
    const MlaCpGroup& g = kMlaCpK3Groups[i];
    const int64_t bs = kMlaCpK3BlockSizes[i % std::size(kMlaCpK3BlockSizes)];
    const core::DType dtype = i % 2 == 0 ? kFp8 : kF32;
    SCOPED_TRACE(describe(g, bs, dtype));
    expect_group_matches_absorbed(g, as_vector(kMlaCpK3ChainBatch), bs, dtype, seed += 10, &pool);
  }
}

// A row at global position P sees a token of rank r iff r <= P (rank r's first token is global
// position r). Where it sees none: lse = -inf and o_part = 0, on every owner's heads. A row at
// position 0 sees only rank 0, whose rescale weight is then exactly 1.
void expect_unseen_ranks_get_weight_zero(const MlaCpGroup& g, const std::vector<MlaSeq>& seqs, uint64_t seed) {
  const GroupProblems gp(g, seqs, kF32, seed);
  const MlaBatch batch(gp.ptrs, 7, seed + 1);
  const CpGroup group(batch, g.cp, seed + 2);
  const CpGroup::Partial part = group.partial(Precision::fp32);
  const int cp = g.cp;
  const int64_t T = batch.rows, H = g.shape.heads, L = g.shape.kv_lora;
  core::Tensor lse_all = nan_filled({cp * cp * T, H});
  for (int r = 0; r < cp; ++r)
    std::memcpy(lse_all.data<float>() + r * cp * T * H, part.lse[r].data<const float>(),
                static_cast<size_t>(part.lse[r].nbytes()));
  core::Tensor o0 = core::Tensor::copy_of(part.o_part[0].view());
  mla_lse_rescale_reference({f32_view(o0, {cp, T, H, L}), f32_view(lse_all, {cp, cp, T, H}), batch.seqs(), 0});
  int64_t unseen = 0;
  for (size_t k = 0; k < seqs.size(); ++k)
    for (int64_t i = 0; i < seqs[k].T; ++i) {
      const int64_t P = seqs[k].S - seqs[k].T + i, t = batch.first_row[k] + i;
      for (int r = 0; r < cp; ++r)
        for (int64_t gi = 0; gi < cp; ++gi)
          for (int64_t h = 0; h < H; ++h) {
            const int64_t at = (gi * T + t) * H + h;
            const float lse = part.lse[r].data<const float>()[at];
            const float* o = part.o_part[r].data<const float>() + at * L;
            if (r <= P) {
              EXPECT_TRUE(std::isfinite(lse)) << "rank " << r << " owner " << gi << " P " << P;
              continue;
            }
            ++unseen;
            EXPECT_EQ(lse, -std::numeric_limits<float>::infinity()) << "rank " << r << " owner " << gi << " P " << P;
            for (int64_t c = 0; c < L; ++c) ASSERT_EQ(o[c], 0.0f) << "rank " << r << " P " << P;
          }
      if (P != 0) continue;
      for (int64_t c = 0; c < cp * H * L; ++c) {  // rank 0's weight 1: o_part unchanged
        const int64_t gi = c / (H * L), at = (gi * T + t) * H * L + c % (H * L);
        EXPECT_EQ(o0.data<const float>()[at], part.o_part[0].data<const float>()[at]) << "P 0, owner " << gi;
      }
    }
  if (cp > 1) {
    EXPECT_GT(unseen, 0);
  }
}

TEST(MlaCp, RanksWithoutVisibleTokensGetWeightZero) {
  uint64_t seed = 40;
  for (const std::vector<MlaSeq>& seqs : {as_vector(kMlaCpNoTokenBatch), as_vector(kMlaCpOddBatch)})
    for (int cp : kMlaCpOddSizes)
      for (const MlaShape& shape : {kMlaCpOddShapes[0], kMlaCpOddShapes[1]}) {
        SCOPED_TRACE("cp=" + std::to_string(cp) + " H=" + std::to_string(shape.heads));
        expect_unseen_ranks_get_weight_zero({shape, cp}, seqs, seed += 10);
      }
}

// ---- checks ---------------------------------------------------------------------------------------

// On one odd rank shape in a group of 3 (the messages name its sizes).
TEST(MlaCp, ChecksNameTheBadArgument) {
  const MlaShape s = kMlaCpOddShapes[3];  // 1 head per rank
  const int cp = 3;
  const std::string qw = std::to_string(s.nope + s.rope), kvw = std::to_string(s.nope + s.v);
  const std::string Ls = std::to_string(s.kv_lora), Es = std::to_string(s.kv_lora + s.rope);
  const GroupProblems gp({s, cp}, {{20, 2}}, kF32, 61);
  const MlaProblem& p = gp.probs[0];
  const MlaBatch batch(gp.ptrs, 7, 62);
  const CpGroup group(batch, cp, 63);
  const int64_t T = batch.rows, Hr = s.heads, E = s.kv_lora + s.rope, L = s.kv_lora;
  core::Tensor qc = nan_filled({T, Hr * E}), qc_all = nan_filled({cp * T, Hr * E});
  core::Tensor o_part = nan_filled({cp * T * Hr, L}), lse = nan_filled({cp * T, Hr});
  core::Tensor lse_all = nan_filled({cp * cp * T, Hr}), out = nan_filled({T, Hr * s.v});

  MlaQAbsorbArgs qa{group.q[0].view(), batch.seqs(), &group.kv_b[0], f32_view(qc, {T, Hr, E}),
                    s.heads,           s.nope,       s.rope,         s.v,
                    s.kv_lora};
  EXPECT_TRUE(mla_q_absorb_check(qa).is_ok()) << mla_q_absorb_check(qa).reason();
  auto bad = qa;
  bad.qc = f32_view(qc, {T, Hr * E});
  expect_fail(mla_q_absorb_check(bad), {"mla_q_absorb", "qc", "[T, num_heads, kv_lora + qk_rope]"});
  bad = qa;
  bad.q = batch.q.view();  // the group's heads' columns for num_heads 1
  expect_fail(mla_q_absorb_check(bad), {"q must be", "[T, " + qw + "]"});
  bad = qa;
  bad.kv_b = nullptr;
  expect_fail(mla_q_absorb_check(bad), {"kv_b is missing"});
  bad = qa;
  bad.kv_b = &p.kv_b;  // the whole group's heads
  expect_fail(mla_q_absorb_check(bad), {"kv_b must be contiguous", "[" + kvw + ", " + Ls + "]"});
  const core::Tensor bad_rows = mla_test::i32_tensor({static_cast<int32_t>(T)});
  bad = qa;
  bad.seqs.row_begin = bad_rows.view();
  expect_fail(mla_q_absorb_check(bad), {"seqs.row_begin[0]"});
  EXPECT_THROW(mla_q_absorb_reference(bad), core::Error);

  MlaPartialAttentionArgs pa;
  pa.qc = f32_view(qc_all, {cp, T, Hr, E});
  pa.pages = group.pages[1].view();
  pa.seqs = group.local_seqs();
  pa.o_part = f32_view(o_part, {cp, T, Hr, L});
  pa.lse = f32_view(lse, {cp, T, Hr});
  pa.cp_size = cp, pa.cp_rank = 1, pa.scale = 0.15f;
  EXPECT_TRUE(mla_partial_attention_check(pa).is_ok()) << mla_partial_attention_check(pa).reason();
  auto pb = pa;
  pb.cp_rank = 3;
  expect_fail(mla_partial_attention_check(pb), {"cp_rank", "3", "cp_size 3"});
  pb = pa;
  pb.lse = f32_view(lse, {cp * T, Hr});
  expect_fail(mla_partial_attention_check(pb), {"lse must be", "[3, " + std::to_string(T) + ", 1]"});
  pb = pa;
  pb.o_part = f32_view(o_part, {cp, T, Hr * L});
  expect_fail(mla_partial_attention_check(pb), {"o_part must be"});
  pb = pa;
  pb.pages = p.pages.view();  // global pages: fine by shape; now a wrong width
  pb.pages.shape = {p.pages.dim(0), p.pages.dim(1), E - 1};
  expect_fail(mla_partial_attention_check(pb), {"pages must be", "kv_lora + rope = " + Es});
  pb = pa;
  pb.seqs.max_tokens = 2;  // local bound below what the last row sees on rank 1 (local 0..6)
  expect_fail(mla_partial_attention_check(pb), {"seqs.position[0]", "local position", "max_tokens = 2"});
  const core::Tensor i32_lse = core::Tensor::zeros(core::DType::i32, {cp, T, Hr});
  pb = pa;
  pb.lse = i32_lse.view();
  expect_fail(mla_partial_attention_check(pb), {"lse must be", "I32"});
  pb = pa;
  pb.scale = 0.0f;
  expect_fail(mla_partial_attention_check(pb), {"scale"});

  MlaLseRescaleArgs ra{f32_view(o_part, {cp, T, Hr, L}), f32_view(lse_all, {cp, cp, T, Hr}), batch.seqs(), 2};
  EXPECT_TRUE(mla_lse_rescale_check(ra).is_ok()) << mla_lse_rescale_check(ra).reason();
  auto rb = ra;
  rb.cp_rank = 3;
  expect_fail(mla_lse_rescale_check(rb), {"cp_rank", "cp = 3"});
  rb = ra;
  rb.lse_all = f32_view(lse_all, {cp * cp, T, Hr});
  expect_fail(mla_lse_rescale_check(rb), {"lse_all must be", "[cp, 3, " + std::to_string(T) + ", 1]"});

  core::Tensor o_lat = nan_filled({T * Hr, L});
  MlaWUvArgs wa{
      f32_view(o_lat, {T, Hr, L}), batch.seqs(), &group.kv_b[0], {}, out.view(), s.heads, s.nope, s.v, s.kv_lora};
  EXPECT_TRUE(mla_w_uv_check(wa).is_ok()) << mla_w_uv_check(wa).reason();
  auto wb = wa;
  wb.o_lat = f32_view(o_lat, {T, Hr * L});
  expect_fail(mla_w_uv_check(wb), {"o_lat must be", "[T, num_heads, kv_lora]"});
  wb = wa;
  wb.out = batch.q.view();
  expect_fail(mla_w_uv_check(wb), {"out must be", "[" + std::to_string(T) + ", " + std::to_string(s.v) + "]"});
  wb = wa;
  wb.num_heads = 0;
  expect_fail(mla_w_uv_check(wb), {"num_heads"});
}

}  // namespace
}  // namespace k3::kernels
