// kernels/mla/mla_absorbed_mma_ops_test.cpp: the standard op mla_absorbed on its tensor-core CUDA strategy
// "cuda_absorbed_splitkv_mma" (kernels/mla/cuda_absorbed_via_decode.cu: mla_decode's tensor-core
// launches without a gate) against the CPU reference mla_absorbed_reference, bf16 activations:
//   - positions 0, 17, 97 and 3001 with 1 and 3 (verify) rows per sequence, pages of 16 and 7 tokens,
//     1, 3 and 12 heads, fp8 (k_scale 0.25 / 0.5) and bf16 caches, odd nope / v at small latent dims and
//     the TP8 head dims (nope 128, rope 64, v 128, kv_lora 512; spec §11);
//   - one TP8 rank at 8K and 32K contexts, batches of 1, 8 and 64 decode sequences;
//   - a decode step captured as a CUDA graph once and replayed for new positions, row counts, block
//     tables and q rows;
//   - what it refuses (f32 activations, an f32 cache, odd latent dims, 17 heads) runs on kernels/mla's
//     "cuda_split_kv" and the refusal names the reason.
// Each case asserts the exact strategy selected, so a refusal cannot pass as a success of the old kernel.
// Sequences draw their pages from one shared pool (prefix sharing: each sequence has its own shuffled
// order of the pool's pages), so a batch of 64 x 32K contexts needs only one 32K cache; the two spare
// pages are never written (NaN on the device) and never referenced. Tolerance: tol_attention, as the
// mla_absorbed and mla_decode GPU tests (mla_decode_ops_test.cpp explains the tensor-core error budget).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/testing/op_harness.h"

#ifdef K3_HAVE_CUDA
#include "backends/cuda/check.h"
#include "backends/cuda/context.h"
#include "backends/cuda/device_tensor.h"
#include "backends/cuda/graph.h"
#include "kernels/registry.h"
#endif

namespace k3::ops_test {
namespace {

struct Dims {
  int heads, nope, rope, v, kv_lora;
};
struct SeqShape {
  int64_t S, T;  // cache tokens after the step, rows this step (at positions S-T .. S-1)
};

constexpr const char* kMma = "cuda_absorbed_splitkv_mma";
constexpr const char* kCudaCore = "cuda_split_kv";

Dims tp8_heads(int heads) { return {heads, 128, 64, 128, 512}; }  // one TP8 rank's head dims, `heads` heads

Tensor i32_host(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::zeros(DType::i32, shape);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

std::vector<int32_t> shuffled(int64_t n, core::Rng& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(i);
  for (int64_t i = n - 1; i > 0; --i) std::swap(ids[i], ids[rng.next_u64() % static_cast<uint64_t>(i + 1)]);
  return ids;
}

// Uniform values (std 1) rounded to bf16 as a bf16 cache stores them; fast for the 32K-token pools.
Tensor bf16_values(core::Rng& rng, Shape shape) {
  Tensor t = random_uniform_f32(rng, shape, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = kernels::round_act(t.data<float>()[i], Precision::bf16);
  return t;
}

// The page pool [num_blocks, bs, E]: pool pages 0 .. pool_blocks-1 of a shuffled id order hold
// pool_blocks * bs cache entries (cache_rows, in pool order), the last 2 ids are spares.
struct Pool {
  int64_t bs = 0, pool_blocks = 0, num_blocks = 0;
  std::vector<int32_t> ids, cache_rows;
  Pool(int64_t longest, int64_t block_size, core::Rng& rng) : bs(block_size) {
    pool_blocks = std::max<int64_t>(1, (longest + bs - 1) / bs);
    num_blocks = pool_blocks + 2;
    ids = shuffled(num_blocks, rng);
    for (int64_t k = 0; k < pool_blocks; ++k)
      for (int64_t o = 0; o < bs; ++o) cache_rows.push_back(static_cast<int32_t>(ids[k] * bs + o));
  }
  int64_t tokens() const { return pool_blocks * bs; }
  // A sequence's block table row: the pool's pages in a fresh shuffled order, -1 past its blocks.
  void table_row(int64_t S, int64_t max_blocks, core::Rng& rng, int32_t* row) const {
    const std::vector<int32_t> order = shuffled(pool_blocks, rng);
    for (int64_t b = 0; b < max_blocks; ++b) row[b] = b * bs < S ? ids[order[b]] : -1;
  }
};

// q rows: row 0 belongs to no sequence, then the sequences in reverse order (row_begin not monotonic);
// one slack row slot and 3 slack positions (slots and splits that must exit at once).
struct Batch {
  int64_t rows = 1, max_blocks = 0, max_tokens = 0;
  int max_rows = 0;
  std::vector<int32_t> begins, counts, positions, table;
  Batch(const std::vector<SeqShape>& seqs, const Pool& pool, core::Rng& rng) {
    const auto n = static_cast<int64_t>(seqs.size());
    for (const SeqShape& s : seqs) {
      max_rows = std::max(max_rows, static_cast<int>(s.T) + 1);
      max_tokens = std::max(max_tokens, s.S + 3);
    }
    max_blocks = (max_tokens + pool.bs - 1) / pool.bs;
    table.assign(static_cast<size_t>(n * max_blocks), -1);
    begins.resize(seqs.size());
    for (int64_t k = n - 1; k >= 0; --k) {
      begins[k] = static_cast<int32_t>(rows);
      rows += seqs[k].T;
    }
    for (int64_t k = 0; k < n; ++k) {
      pool.table_row(seqs[k].S, max_blocks, rng, table.data() + k * max_blocks);
      counts.push_back(static_cast<int32_t>(seqs[k].T));
      positions.push_back(static_cast<int32_t>(seqs[k].S - seqs[k].T));
    }
  }
  kernels::SeqBatch seqs(const Tensor& rb, const Tensor& nr, const Tensor& pos, const Tensor& bt) const {
    kernels::SeqBatch b;
    b.row_begin = rb.view();
    b.num_rows = nr.view();
    b.position = pos.view();
    b.block_table = bt.view();
    b.num_seqs = static_cast<int>(begins.size());
    b.max_rows = max_rows;
    b.max_tokens = max_tokens;
    return b;
  }
};

Tensor rows_from(const Tensor& t, int64_t r0) {
  const int64_t W = t.dim(1);
  return Tensor::copy_of(TensorView::contiguous(t.data<float>() + r0 * W, DType::f32, {t.dim(0) - r0, W}));
}

std::string shape_of(const std::vector<SeqShape>& seqs, int64_t bs, int heads) {
  std::string s = "bs";  // appended piece by piece (GCC 12 warns falsely on chained operator+)
  s += std::to_string(bs);
  s += " H";
  s += std::to_string(heads);
  for (const SeqShape& q : seqs) {
    s += ' ';
    s += std::to_string(q.S);
    s += '/';
    s += std::to_string(q.T);
  }
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// One mla_absorbed call on the device against the CPU reference. cache: "fp8", "bf16" (CPU: f32 holding
// bf16 values) or "f32". want_impl: the strategy the registry must select; refusal: when set, a phrase the
// tensor-core strategy's refusal must contain (the call then runs on want_impl).
void check_absorbed(Device* dev, Mode mode, Dims d, const std::vector<SeqShape>& seqs, const std::string& cache,
                    float k_scale, int64_t bs, uint64_t seed, const char* want_impl, const char* refusal = nullptr) {
  SCOPED_TRACE(shape_of(seqs, bs, d.heads) + " cache " + cache + " " + mode_name(mode));
  core::Rng rng(seed);
  int64_t longest = 1;
  for (const SeqShape& s : seqs) longest = std::max(longest, s.S);
  const Pool pool(longest, bs, rng);
  const Batch batch(seqs, pool, rng);
  const int64_t H = d.heads, L = d.kv_lora, E = L + d.rope, R = batch.rows, W = H * d.v;
  const Tensor q = random_act(rng, {R, H * (d.nope + d.rope)}, mode);
  const Tensor c_n = bf16_values(rng, {pool.tokens(), L}), k_pe = bf16_values(rng, {pool.tokens(), d.rope});
  const Tensor cache_rows = i32_host(pool.cache_rows, {pool.tokens()});
  kernels::LinearWeight kv_b;
  kv_b.weight = random_bf16_weight(rng, H * (d.nope + d.v), L);
  const bool fp8 = cache == "fp8";
  Tensor cpu_pages = Tensor::zeros(fp8 ? DType::f8_e4m3 : DType::f32, {pool.num_blocks, bs, E});
  cpu_registry().mla_cache_write.run({c_n.view(), k_pe.view(), cpu_pages.view(), cache_rows.view(), k_scale},
                                     core::Device::cpu);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.nope + d.rope));
  const Precision p = precision(mode);
  const auto n = static_cast<int64_t>(seqs.size());
  const Tensor rb = i32_host(batch.begins, {n}), nr = i32_host(batch.counts, {n}), pos = i32_host(batch.positions, {n});
  const Tensor bt = i32_host(batch.table, {n, batch.max_blocks});
  Tensor want = nan_tensor({R, W});
  cpu_registry().mla_absorbed.run({q.view(), cpu_pages.view(), batch.seqs(rb, nr, pos, bt), k_scale, &kv_b, want.view(),
                                   d.heads, d.nope, d.rope, d.v, d.kv_lora, scale, p},
                                  core::Device::cpu);

  const DType dev_cache = fp8 ? DType::f8_e4m3 : cache == "bf16" ? DType::bf16 : DType::f32;
  Tensor dpages = dev->poisoned(dev_cache, {pool.num_blocks, bs, E});
  const Tensor dc = dev->act(c_n, mode), dpe = dev->act(k_pe, mode), drows = dev->upload(cache_rows);
  dev->registry().mla_cache_write.run({dc.view(), dpe.view(), dpages.view(), drows.view(), k_scale}, dev->kind());
  const Tensor dq = dev->act(q, mode);
  const Tensor drb = dev->upload(rb), dnr = dev->upload(nr), dpos = dev->upload(pos), dbt = dev->upload(bt);
  const kernels::LinearWeight dkv_b = dev->upload(kv_b);
  Tensor out = dev->poisoned(act_dtype(mode), {R, W});
  const kernels::MlaAttentionArgs args{dq.view(), dpages.view(), batch.seqs(drb, dnr, dpos, dbt),
                                       k_scale,   &dkv_b,        out.view(),
                                       d.heads,   d.nope,        d.rope,
                                       d.v,       d.kv_lora,     scale,
                                       p};
  auto& table = dev->registry().mla_absorbed;
  expect_device_impl(table, args, dev);
  ASSERT_EQ(table.select(args, dev->kind()).name, want_impl);
  if (refusal != nullptr) {
    const auto& impls = table.impls();
    const auto mma = std::find_if(impls.begin(), impls.end(), [](const auto& i) { return i.name == kMma; });
    ASSERT_NE(mma, impls.end()) << kMma << " is not registered";
    const core::Status s = mma->supports(args);
    ASSERT_FALSE(s.is_ok()) << kMma << " accepted what it should refuse";
    EXPECT_NE(s.reason().find(refusal), std::string::npos) << "reason: " << s.reason();
  }
  table.run(args, dev->kind());
  const Tensor got = dev->to_host_f32(out.view());
  for (int64_t c = 0; c < W; ++c) ASSERT_TRUE(std::isnan(got.data<const float>()[c])) << "unowned row written";
  expect_close("mla_absorbed", shape_of(seqs, bs, d.heads), mode, "cache_" + cache + "_" + want_impl, rows_from(got, 1),
               rows_from(want, 1), tol_attention(mode));
}

// Positions 0, 17, 97 and 3001, each with 1 row and with 3 verify rows.
const std::vector<SeqShape> kPositions = {{1, 1}, {3, 3}, {18, 1}, {20, 3}, {98, 1}, {100, 3}, {3002, 1}, {3004, 3}};

// Sequences of contexts in [lo, hi] with one row each; the first has hi positions (and 4 verify rows
// when `verify`).
std::vector<SeqShape> decode_batch(int n, int64_t lo, int64_t hi, bool verify, uint64_t seed) {
  core::Rng rng(seed);
  std::vector<SeqShape> b = {{hi, verify ? 4 : 1}};
  const auto range = static_cast<uint64_t>(hi - lo + 1);
  for (int i = 1; i < n; ++i) b.push_back({lo + static_cast<int64_t>(rng.next_u64() % range), 1});
  return b;
}

// Small latent dims the tensor-core kernel takes (kv_lora 64: one P.V warp; entries of 5 and 15
// k-steps) with odd nope and v (q_absorb and w_uv edges).
TEST(OpsOdd, MlaAbsorbedMma) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 12000;
  for (int heads : {1, 3, 12})
    for (int64_t bs : {16, 7}) {
      const Dims d{heads, 17, 16, 13, 64};
      check_absorbed(dev, Mode::bf16, d, kPositions, "fp8", 0.25f, bs, ++seed, kMma);
      check_absorbed(dev, Mode::bf16, d, kPositions, "bf16", 1.0f, bs, ++seed, kMma);
    }
  check_absorbed(dev, Mode::bf16, {3, 33, 48, 24, 192}, kPositions, "fp8", 0.5f, 7, ++seed, kMma);
}

// The TP8 head dims with 1, 3 and 12 heads over the same positions.
TEST(OpsTp8, MlaAbsorbedMmaPositions) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 12100;
  for (int heads : {1, 3, 12}) {
    check_absorbed(dev, Mode::bf16, tp8_heads(heads), kPositions, "fp8", 0.5f, 16, ++seed, kMma);
    check_absorbed(dev, Mode::bf16, tp8_heads(heads), kPositions, "bf16", 1.0f, 7, ++seed, kMma);
  }
}

// One TP8 rank at 8K: batch 1, 8 (one sequence with 4 verify rows) and 64. With the slack row slot the
// query slots are 2, 40 and 128: 129 splits of 64 positions, 6 of 1408 and 2 of 4160.
TEST(OpsTp8, MlaAbsorbedMma8kContext) {
  K3_REQUIRE_CUDA(dev);
  const Dims d = tp8_heads(12);
  uint64_t seed = 12200;
  const std::pair<int, bool> batches[] = {{1, false}, {8, true}, {64, false}};  // (sequences, verify rows)
  for (const auto& [batch, verify] : batches) {
    const std::vector<SeqShape> seqs = decode_batch(batch, 6000, 8192, verify, ++seed);
    check_absorbed(dev, Mode::bf16, d, seqs, "fp8", 1.0f, 16, ++seed, kMma);
    check_absorbed(dev, Mode::bf16, d, seqs, "bf16", 1.0f, 64, ++seed, kMma);
  }
}

// One TP8 rank at 32K (the agentic workload's long contexts): batch 1, 8 and 64 (fp8 only at 64).
TEST(OpsTp8, MlaAbsorbedMma32kContext) {
  K3_REQUIRE_CUDA(dev);
  const Dims d = tp8_heads(12);
  uint64_t seed = 12300;
  const std::pair<int, bool> batches[] = {{1, false}, {8, true}, {64, false}};  // (sequences, verify rows)
  for (const auto& [batch, verify] : batches) {
    const std::vector<SeqShape> seqs = decode_batch(batch, 24576, 32768, verify, ++seed);
    check_absorbed(dev, Mode::bf16, d, seqs, "fp8", 1.0f, 16, ++seed, kMma);
    if (batch < 64) check_absorbed(dev, Mode::bf16, d, seqs, "bf16", 1.0f, 16, ++seed, kMma);
  }
}

// What the tensor-core strategy refuses runs on cuda_split_kv, and the refusal says why.
TEST(OpsTp8, MlaAbsorbedMmaRefusalsFallBack) {
  K3_REQUIRE_CUDA(dev);
  const std::vector<SeqShape> seqs = {{1, 1}, {98, 3}, {700, 1}};
  uint64_t seed = 12400;
  check_absorbed(dev, Mode::fp32, tp8_heads(12), seqs, "fp8", 1.0f, 16, ++seed, kCudaCore, "needs bf16 activations");
  check_absorbed(dev, Mode::fp32, tp8_heads(12), seqs, "f32", 1.0f, 16, ++seed, kCudaCore, "needs bf16 activations");
  check_absorbed(dev, Mode::bf16, tp8_heads(12), seqs, "f32", 1.0f, 16, ++seed, kCudaCore, "f8_e4m3 or bf16 cache");
  check_absorbed(dev, Mode::bf16, {3, 17, 9, 13, 54}, seqs, "fp8", 0.25f, 7, ++seed, kCudaCore,
                 "kv_lora must be a multiple of 64");
  check_absorbed(dev, Mode::bf16, tp8_heads(17), seqs, "bf16", 1.0f, 16, ++seed, kCudaCore, "num_heads 17");
}

// ---------------------------------------------------------------- CUDA-graph replay

#ifdef K3_HAVE_CUDA
// One mla_absorbed call captured once with fixed host integers (5 sequences, max_rows 3, max_tokens 400)
// and replayed 3 times after writing new q rows and new tables into the same device buffers: new
// positions, row counts, page orders, and row_begin orders. Every replay matches the CPU reference and
// leaves the rows of no sequence NaN. The cache (one pool of pages) is written before the capture.
TEST(OpsGraph, MlaAbsorbedMmaReplaysForNewPositionsAndTables) {
  K3_REQUIRE_CUDA(dev);
  (void)dev;
  const auto ctx = backends::cuda::Context::create(0);
  kernels::Registry reg;
  kernels::register_reference_ops(reg);
  kernels::register_cuda_ops(reg, ctx);
  const cudaStream_t stream = ctx->stream();
  auto& mem = ctx->pool();
  const Dims d = tp8_heads(12);
  const int nseq = 5, max_rows = 3;
  const int64_t bs = 16, max_tokens = 400, max_blocks = (max_tokens + bs - 1) / bs;
  const int64_t R = nseq * max_rows + 2, H = d.heads, L = d.kv_lora, E = L + d.rope, qw = H * (d.nope + d.rope);
  const float k_scale = 0.5f, scale = 1.0f / std::sqrt(static_cast<float>(d.nope + d.rope));
  core::Rng rng(12500);
  const Pool pool(max_tokens, bs, rng);
  kernels::LinearWeight kv_b;
  kv_b.weight = random_bf16_weight(rng, H * (d.nope + d.v), L);
  kernels::LinearWeight dkv_b;
  dkv_b.weight = backends::cuda::upload(kv_b.weight.view(), mem, stream);
  // The cache: the whole pool on both sides (fp8 bytes are the same on the CPU and the GPU).
  Tensor cpu_pages = Tensor::zeros(DType::f8_e4m3, {pool.num_blocks, bs, E});
  {
    const Tensor c = bf16_values(rng, {pool.tokens(), L}), pe = bf16_values(rng, {pool.tokens(), d.rope});
    const Tensor rows = i32_host(pool.cache_rows, {pool.tokens()});
    cpu_registry().mla_cache_write.run({c.view(), pe.view(), cpu_pages.view(), rows.view(), k_scale},
                                       core::Device::cpu);
  }
  const Tensor dpages = backends::cuda::upload(cpu_pages.view(), mem, stream);
  const Tensor dq = backends::cuda::empty(mem, DType::bf16, {R, qw});
  const Tensor dtables = backends::cuda::empty(mem, DType::i32, {3 * nseq + nseq * max_blocks});
  const Tensor dout = backends::cuda::empty(mem, DType::bf16, {R, H * d.v});
  const auto table_view = [](const Tensor& t, int64_t off, Shape shape) {
    return TensorView::contiguous(t.data<int32_t>() + off, DType::i32, shape, t.view().device);
  };
  const auto seqs_of = [&](const Tensor& tables) {
    kernels::SeqBatch b;
    b.row_begin = table_view(tables, 0, {nseq});
    b.num_rows = table_view(tables, nseq, {nseq});
    b.position = table_view(tables, 2 * nseq, {nseq});
    b.block_table = table_view(tables, 3 * nseq, {nseq, max_blocks});
    b.num_seqs = nseq;
    b.max_rows = max_rows;
    b.max_tokens = max_tokens;
    return b;
  };
  const auto args_of = [&](const TensorView& q, const TensorView& pages, const kernels::SeqBatch& seqs,
                           const kernels::LinearWeight* w, const TensorView& out) {
    return kernels::MlaAttentionArgs{q,   pages,     seqs,  k_scale,        w, out, d.heads, d.nope, d.rope,
                                     d.v, d.kv_lora, scale, Precision::bf16};
  };
  const kernels::MlaAttentionArgs step = args_of(dq.view(), dpages.view(), seqs_of(dtables), &dkv_b, dout.view());
  ASSERT_EQ(reg.mla_absorbed.select(step, core::Device::cuda).name, kMma);
  backends::cuda::Graph graph = backends::cuda::Graph::capture(*ctx,
                                                               [&] { reg.mla_absorbed.run(step, core::Device::cuda); });

  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    // Table row k: 1..3 rows at a random position (0 for the first replay's first row) and a fresh page
    // order. Rows are taken from the end backwards (row_begin falling in k), on the last replay from the
    // start forwards (rising); the rows left over belong to no sequence.
    const bool forwards = replay == 2;
    std::vector<int32_t> begins(nseq), counts(nseq), positions(nseq), table(nseq * max_blocks, -1);
    std::vector<bool> owned(static_cast<size_t>(R), false);
    int64_t next_row = forwards ? 0 : R;
    for (int k = 0; k < nseq; ++k) {
      counts[k] = 1 + static_cast<int>(rng.next_u64() % max_rows);
      if (!forwards) next_row -= counts[k];
      begins[k] = static_cast<int32_t>(next_row);
      for (int i = 0; i < counts[k]; ++i) owned[next_row + i] = true;
      if (forwards) next_row += counts[k];
      const auto span = static_cast<uint64_t>(max_tokens - counts[k] + 1);
      positions[k] = replay == 0 && k == 0 ? 0 : static_cast<int32_t>(rng.next_u64() % span);
      pool.table_row(positions[k] + counts[k], max_blocks, rng, table.data() + k * max_blocks);
    }
    std::vector<int32_t> tables = begins;
    tables.insert(tables.end(), counts.begin(), counts.end());
    tables.insert(tables.end(), positions.begin(), positions.end());
    tables.insert(tables.end(), table.begin(), table.end());
    const Tensor q = random_act(rng, {R, qw}, Mode::bf16);
    const Tensor h_tables = i32_host(tables, {static_cast<int64_t>(tables.size())});
    const Tensor q_bf16 = backends::cuda::upload(q.view(), DType::bf16, mem, stream);
    K3_CUDA_CHECK(cudaMemcpyAsync(dq.view().data, q_bf16.view().data, static_cast<size_t>(q_bf16.nbytes()),
                                  cudaMemcpyDeviceToDevice, stream));
    backends::cuda::copy_to_device(h_tables.view(), dtables.view(), stream);
    backends::cuda::poison_nan(dout.view(), stream);
    graph.replay();
    const Tensor got = backends::cuda::download_f32(dout.view(), stream);

    Tensor want = nan_tensor({R, H * d.v});
    cpu_registry().mla_absorbed.run(args_of(q.view(), cpu_pages.view(), seqs_of(h_tables), &kv_b, want.view()),
                                    core::Device::cpu);
    // The sequences' rows against the reference; every other row stays NaN.
    const int64_t W = H * d.v;
    std::vector<float> got_rows, want_rows;
    for (int64_t r = 0; r < R; ++r) {
      const float* g = got.data<const float>() + r * W;
      const float* w = want.data<const float>() + r * W;
      if (!owned[r]) {
        for (int64_t c = 0; c < W; ++c) ASSERT_TRUE(std::isnan(g[c])) << "row " << r << " of no sequence written";
        continue;
      }
      got_rows.insert(got_rows.end(), g, g + W);
      want_rows.insert(want_rows.end(), w, w + W);
    }
    const auto owned_rows = static_cast<int64_t>(got_rows.size()) / W;
    expect_close("mla_absorbed", "graph replay " + std::to_string(replay), Mode::bf16, "cache_fp8_mma",
                 Tensor::copy_of(TensorView::contiguous(got_rows.data(), DType::f32, {owned_rows, W})),
                 Tensor::copy_of(TensorView::contiguous(want_rows.data(), DType::f32, {owned_rows, W})),
                 tol_attention(Mode::bf16));
  }
}
#endif

}  // namespace
}  // namespace k3::ops_test
