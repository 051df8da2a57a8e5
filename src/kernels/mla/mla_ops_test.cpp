// kernels/mla/mla_ops_test.cpp: the MLA ops on every device backend against the CPU reference, batched
// over sequences and paged: mla_cache_write (tokens of several sequences into shuffled pages through
// cache_rows, -1 rows skipped), mla_naive (prefill) and mla_absorbed (decode, with verify rows), one
// call per batch whose sequences have different positions and row counts, over bf16 / f32 / fp8 e4m3
// latent caches in pages of 7, 16 and 64 tokens, at odd dims and at the TP8 shapes (12 heads, nope
// 128, rope 64, v 128, kv_lora 512, 8K context for decode, a batch of 64 decode sequences), and one
// decode step captured as a CUDA graph and replayed for new positions, row counts and block tables; the
// tensor-core prefill strategy (cuda_expand_gemm_flash) at rows 1..512 over prefixes 0..3584, asserting
// which strategy each case selects.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/mla/cases.h"
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

using MlaDims = kernels::MlaShape;  // kernels/mla/cases.h
using SeqShape = kernels::MlaSeq;

Tensor i32_host(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::zeros(DType::i32, shape);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// A random permutation of 0 .. n-1.
std::vector<int32_t> shuffled(int64_t n, core::Rng& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(i);
  for (int64_t i = n - 1; i > 0; --i) std::swap(ids[i], ids[rng.next_u64() % static_cast<uint64_t>(i + 1)]);
  return ids;
}

// Where a batch lives: sequences' pages from a shuffled pool (plus spares), every cache token's
// row, the i32 tables, and the q rows: row 0 belongs to no sequence, then the sequences in
// reverse order (row_begin not monotonic in s).
struct Layout {
  int64_t block_size = 0, num_blocks = 0, rows = 1, tokens = 0, max_blocks = 0;
  int max_rows = 0;
  int64_t max_tokens = 0;
  std::vector<int32_t> begins, counts, positions, table, cache_rows;

  Layout(const std::vector<SeqShape>& seqs, int64_t bs, int row_slack, int64_t token_slack, core::Rng& rng)
      : block_size(bs) {
    const auto n = static_cast<int64_t>(seqs.size());
    int64_t blocks = 0;
    for (const SeqShape& s : seqs) {
      blocks += (s.S + bs - 1) / bs;
      tokens += s.S;
      max_rows = std::max(max_rows, static_cast<int>(s.T) + row_slack);
      max_tokens = std::max(max_tokens, s.S + token_slack);
    }
    max_blocks = (max_tokens + bs - 1) / bs;
    num_blocks = blocks + 2;
    const std::vector<int32_t> pool = shuffled(num_blocks, rng);
    table.assign(static_cast<size_t>(n * max_blocks), -1);
    begins.resize(seqs.size());
    size_t next = 0;
    for (int64_t k = n - 1; k >= 0; --k) {
      begins[k] = static_cast<int32_t>(rows);
      rows += seqs[k].T;
    }
    for (int64_t k = 0; k < n; ++k) {
      const SeqShape& s = seqs[k];
      for (int64_t b = 0; b * bs < s.S; ++b) table[k * max_blocks + b] = pool[next++];
      for (int64_t j = 0; j < s.S; ++j)
        cache_rows.push_back(static_cast<int32_t>(table[k * max_blocks + j / bs] * bs + j % bs));
      counts.push_back(static_cast<int32_t>(s.T));
      positions.push_back(static_cast<int32_t>(s.S - s.T));
    }
  }
  // The tables as tensors (host; upload for a device).
  Tensor row_begin() const { return i32_host(begins, {static_cast<int64_t>(begins.size())}); }
  Tensor num_rows() const { return i32_host(counts, {static_cast<int64_t>(counts.size())}); }
  Tensor position() const { return i32_host(positions, {static_cast<int64_t>(positions.size())}); }
  Tensor block_table() const { return i32_host(table, {static_cast<int64_t>(begins.size()), max_blocks}); }
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

// Rows r0.. of a CPU f32 [R, W] tensor, as a copy.
Tensor rows_from(const Tensor& t, int64_t r0) {
  const int64_t W = t.dim(1);
  return Tensor::copy_of(TensorView::contiguous(t.data<float>() + r0 * W, DType::f32, {t.dim(0) - r0, W}));
}

std::string shape_of(const std::vector<SeqShape>& seqs, int64_t bs) {
  std::string s = "bs" + std::to_string(bs);
  for (const SeqShape& q : seqs) s += " " + std::to_string(q.S) + "/" + std::to_string(q.T);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// cache: "bf16" (CPU: f32 holding bf16 values, device: real bf16), "f32" or "fp8". The device pages
// are written by the device's mla_cache_write into NaN-poisoned pages (spare pages stay NaN); the
// CPU reference reads pages its own mla_cache_write filled.
// want_impl: the exact implementation name the device registry must select (nullptr: any of the device's).
void check_mla(Device* dev, Mode mode, bool absorbed, MlaDims d, const std::vector<SeqShape>& seqs,
               const std::string& cache, float k_scale, int64_t bs, uint64_t seed, const char* want_impl = nullptr) {
  core::Rng rng(seed);
  const Layout lay(seqs, bs, /*row_slack=*/1, /*token_slack=*/3, rng);
  const int64_t H = d.heads, L = d.kv_lora, E = d.kv_lora + d.rope, R = lay.rows;
  const Tensor q = random_act(rng, {R, H * (d.nope + d.rope)}, mode);
  const Tensor c_n = random_act(rng, {lay.tokens, L}, Mode::bf16),
               k_pe = random_act(rng, {lay.tokens, d.rope}, Mode::bf16);
  const Tensor cache_rows = i32_host(lay.cache_rows, {lay.tokens});
  kernels::LinearWeight kv_b;
  kv_b.weight = random_bf16_weight(rng, H * (d.nope + d.v), L);
  const bool fp8 = cache == "fp8";
  Tensor cpu_pages = Tensor::zeros(fp8 ? DType::f8_e4m3 : DType::f32, {lay.num_blocks, bs, E});
  cpu_registry().mla_cache_write.run({c_n.view(), k_pe.view(), cpu_pages.view(), cache_rows.view(), k_scale},
                                     core::Device::cpu);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.nope + d.rope));
  const Precision p = precision(mode);
  auto& cpu_table = absorbed ? cpu_registry().mla_absorbed : cpu_registry().mla_naive;
  const Tensor rb = lay.row_begin(), nr = lay.num_rows(), pos = lay.position(), bt = lay.block_table();
  Tensor want = nan_tensor({R, H * d.v});
  cpu_table.run({q.view(), cpu_pages.view(), lay.seqs(rb, nr, pos, bt), k_scale, &kv_b, want.view(), d.heads, d.nope,
                 d.rope, d.v, d.kv_lora, scale, p},
                core::Device::cpu);

  const DType dev_cache_dtype = fp8 ? DType::f8_e4m3 : cache == "bf16" ? DType::bf16 : DType::f32;
  Tensor dpages = dev->poisoned(dev_cache_dtype, {lay.num_blocks, bs, E});
  const Tensor dc = dev->act(c_n, mode), dpe = dev->act(k_pe, mode), drows = dev->upload(cache_rows);
  dev->registry().mla_cache_write.run({dc.view(), dpe.view(), dpages.view(), drows.view(), k_scale}, dev->kind());
  const Tensor dq = dev->act(q, mode);
  const Tensor drb = dev->upload(rb), dnr = dev->upload(nr), dpos = dev->upload(pos), dbt = dev->upload(bt);
  const kernels::LinearWeight dkv_b = dev->upload(kv_b);
  Tensor out = dev->poisoned(act_dtype(mode), {R, H * d.v});
  const kernels::MlaAttentionArgs args{dq.view(), dpages.view(), lay.seqs(drb, dnr, dpos, dbt),
                                       k_scale,   &dkv_b,        out.view(),
                                       d.heads,   d.nope,        d.rope,
                                       d.v,       d.kv_lora,     scale,
                                       p};
  auto& table = absorbed ? dev->registry().mla_absorbed : dev->registry().mla_naive;
  expect_device_impl(table, args, dev);
  if (want_impl != nullptr) {
    ASSERT_EQ(table.select(args, dev->kind()).name, want_impl) << shape_of(seqs, bs);
  }
  table.run(args, dev->kind());
  const Tensor got = dev->to_host_f32(out.view());
  // Row 0 belongs to no sequence: never written. Rows 1.. are every sequence's rows.
  for (int64_t c = 0; c < H * d.v; ++c) ASSERT_TRUE(std::isnan(got.data<const float>()[c])) << "unowned row written";
  expect_close(absorbed ? "mla_absorbed" : "mla_naive", shape_of(seqs, bs) + " H" + std::to_string(H), mode,
               "cache_" + cache, rows_from(got, 1), rows_from(want, 1), tol_attention(mode));
}

constexpr const MlaDims& kOdd = kernels::kMlaOdd;
constexpr const MlaDims& kTp8 = kernels::kMlaK3Tp8;

TEST(OpsOdd, MlaNaive) {
  K3_REQUIRE_CUDA(dev);
  // Fresh prefills, continuations after a cached prefix, and a one-token chunk, in one call.
  const std::vector<SeqShape> batch = {{17, 17}, {57, 17}, {1, 1}, {97, 40}, {54, 54}};
  uint64_t seed = 8000;
  for (Mode m : kModes)
    for (int64_t bs : {7, 16, 64}) {
      check_mla(dev, m, false, kOdd, batch, m == Mode::bf16 ? "bf16" : "f32", 1.0f, bs, ++seed);
      check_mla(dev, m, false, kOdd, batch, "fp8", 0.5f, bs, ++seed);
    }
}
TEST(OpsTp8, MlaNaive) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes) {
    check_mla(dev, m, false, kTp8, {{256, 256}, {300, 97}}, m == Mode::bf16 ? "bf16" : "f32", 1.0f, 64, 8200);
    check_mla(dev, m, false, kTp8, {{300, 97}, {128, 128}}, "fp8", 1.0f, 16, 8300);
  }
}
// ---------------------------------------------------------------- mla_naive on tensor cores

// "cuda_expand_gemm_flash" takes bf16 mode over bf16 / fp8 (power-of-two k_scale) caches with head dims
// that are multiples of 16; everything else stays on "cuda_expand_online_softmax". Each case asserts the
// exact implementation selected, so a refusal cannot pass as a success of the old kernel.
constexpr const char* kFlash = "cuda_expand_gemm_flash";
constexpr const char* kOnline = "cuda_expand_online_softmax";
constexpr const MlaDims& kK3OneHead = kernels::kMlaK3OneHead;
const MlaDims kSixteens{5, 32, 16, 48, 96};  // every dim a multiple of 16, none K3's

// Rows 1, 17, 64 and 130 after prefixes 0, 37 and 1000, six sequences of different lengths in one call
// (64-row tiles: partial row tiles, partial key tiles, the causal diagonal inside a tile and across tiles),
// then batches whose longest sequence has <= 15 rows (16-row tiles) and 17 rows (32-row tiles).
TEST(OpsOdd, MlaNaiveFlash) {
  K3_REQUIRE_CUDA(dev);
  const std::vector<SeqShape> prefill = {{1, 1}, {54, 17}, {1064, 64}, {130, 130}, {1001, 1}, {167, 130}};
  const std::vector<SeqShape> few_rows = {{1, 1}, {38, 1}, {1015, 15}, {40, 3}};
  const std::vector<SeqShape> rows17 = {{54, 17}, {1017, 17}, {17, 17}};
  uint64_t seed = 8900;
  for (const MlaDims& d : {kK3OneHead, kSixteens, kTp8})
    for (int64_t bs : {16, 64}) {
      check_mla(dev, Mode::bf16, false, d, prefill, "bf16", 1.0f, bs, ++seed, kFlash);
      check_mla(dev, Mode::bf16, false, d, prefill, "fp8", 0.5f, bs, ++seed, kFlash);
    }
  for (const MlaDims& d : {kK3OneHead, kSixteens}) {
    check_mla(dev, Mode::bf16, false, d, few_rows, "fp8", 1.0f, 16, ++seed, kFlash);
    check_mla(dev, Mode::bf16, false, d, rows17, "bf16", 1.0f, 64, ++seed, kFlash);
  }
}
// What the tensor-core strategy refuses runs on the old one: fp32 mode, f32 caches, a k_scale that is not
// a power of two (fp8 * k_scale inexact in bf16), head dims that are not multiples of 16.
TEST(OpsOdd, MlaNaiveFlashRefusals) {
  K3_REQUIRE_CUDA(dev);
  const std::vector<SeqShape> batch = {{54, 17}, {40, 3}};
  check_mla(dev, Mode::fp32, false, kK3OneHead, batch, "f32", 1.0f, 16, 8950, kOnline);
  check_mla(dev, Mode::fp32, false, kK3OneHead, batch, "fp8", 1.0f, 16, 8951, kOnline);
  check_mla(dev, Mode::bf16, false, kK3OneHead, batch, "f32", 1.0f, 16, 8952, kOnline);
  check_mla(dev, Mode::bf16, false, kK3OneHead, batch, "fp8", 0.37f, 16, 8953, kOnline);
  check_mla(dev, Mode::bf16, false, kOdd, batch, "bf16", 1.0f, 16, 8954, kOnline);
}
// The TP8 prefill chunk: 12 heads, 512 rows at context 4096 (positions 3584 .. 4095), both caches.
TEST(OpsTp8, MlaNaiveFlashChunk512) {
  K3_REQUIRE_CUDA(dev);
  check_mla(dev, Mode::bf16, false, kTp8, {{4096, 512}}, "bf16", 1.0f, 64, 8960, kFlash);
  check_mla(dev, Mode::bf16, false, kTp8, {{4096, 512}}, "fp8", 1.0f, 16, 8961, kFlash);
}

TEST(OpsOdd, MlaAbsorbed) {
  K3_REQUIRE_CUDA(dev);
  // Plain decode and verify rows (3 and 4) at different positions, in one call.
  const std::vector<SeqShape> batch = std::vector<SeqShape>(std::begin(kernels::kMlaDecodeOddBatch),
                                                            std::end(kernels::kMlaDecodeOddBatch));
  uint64_t seed = 8400;
  for (Mode m : kModes)
    for (int64_t bs : {7, 16, 64}) {
      check_mla(dev, m, true, kOdd, batch, m == Mode::bf16 ? "bf16" : "f32", 1.0f, bs, ++seed);
      check_mla(dev, m, true, kOdd, batch, "fp8", 0.25f, bs, ++seed);
    }
}
TEST(OpsTp8, MlaAbsorbed8kContext) {
  K3_REQUIRE_CUDA(dev);
  const std::vector<SeqShape> batch = {{8192, 1}, {8192, 4}, {3001, 1}, {6000, 2}};
  for (Mode m : kModes) {
    check_mla(dev, m, true, kTp8, batch, "fp8", 1.0f, 64, 8600);
    check_mla(dev, m, true, kTp8, batch, m == Mode::bf16 ? "bf16" : "f32", 1.0f, 16, 8700);
  }
}
// 64 decode sequences in one call (the batch-64 decode step), contexts from 1 to 700 tokens.
TEST(OpsTp8, MlaAbsorbedBatch64) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(8800);
  std::vector<SeqShape> batch;
  for (int i = 0; i < 64; ++i) batch.push_back({1 + static_cast<int64_t>(rng.next_u64() % 700), 1});
  for (Mode m : kModes) {
    check_mla(dev, m, true, kTp8, batch, "fp8", 1.0f, 16, 8801);
    check_mla(dev, m, true, kTp8, batch, m == Mode::bf16 ? "bf16" : "f32", 1.0f, 64, 8802);
  }
}

// ---------------------------------------------------------------- mla_cache_write

// T tokens of several sequences into shuffled pages (one row in 9 a -1 padding row): the rows the
// CPU writes match exactly, and every other row of the NaN-poisoned device pages stays NaN.
void check_cache_write(Device* dev, Mode mode, int64_t T, int64_t L, int64_t rope, int64_t bs, DType cache,
                       float k_scale, uint64_t seed) {
  core::Rng rng(seed);
  const Tensor c_n = random_act(rng, {T, L}, mode), k_pe = random_act(rng, {T, rope}, mode, 0, 30);
  const int64_t num_blocks = (T + bs - 1) / bs + 2, capacity = num_blocks * bs, E = L + rope;
  const std::vector<int32_t> order = shuffled(capacity, rng);
  std::vector<int32_t> rows(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) rows[t] = t % 9 == 4 ? -1 : order[t];
  const Tensor cache_rows = i32_host(rows, {T});
  // The CPU stores a "bf16 cache" as f32 holding bf16 values; CUDA stores real bf16.
  const DType cpu_cache = cache == DType::f8_e4m3 ? DType::f8_e4m3 : DType::f32;
  Tensor want = Tensor::zeros(cpu_cache, {num_blocks, bs, E});
  cpu_registry().mla_cache_write.run({c_n.view(), k_pe.view(), want.view(), cache_rows.view(), k_scale},
                                     core::Device::cpu);
  Tensor d_c = dev->act(c_n, mode), d_pe = dev->act(k_pe, mode), d_rows = dev->upload(cache_rows);
  Tensor dst = dev->poisoned(cache, {num_blocks, bs, E});
  const kernels::MlaCacheWriteArgs args{d_c.view(), d_pe.view(), dst.view(), d_rows.view(), k_scale};
  expect_device_impl(dev->registry().mla_cache_write, args, dev);
  dev->registry().mla_cache_write.run(args, dev->kind());
  const Tensor got = dev->to_host_f32(TensorView::contiguous(dst.view().data, cache, {capacity, E}, dst.view().device));
  const Tensor want_f32 = to_f32(want);
  // Gather the written rows; check the others stayed poisoned.
  std::vector<bool> written(static_cast<size_t>(capacity), false);
  for (int32_t r : rows)
    if (r >= 0) written[r] = true;
  std::vector<int64_t> kept;
  for (int64_t r = 0; r < capacity; ++r) {
    if (written[r]) {
      kept.push_back(r);
      continue;
    }
    for (int64_t i = 0; i < E; ++i) ASSERT_TRUE(std::isnan(got.data<const float>()[r * E + i])) << "cache row " << r;
  }
  Tensor got_rows = f32_tensor({static_cast<int64_t>(kept.size()), E}), want_rows = f32_tensor(got_rows.shape());
  for (size_t k = 0; k < kept.size(); ++k)
    for (int64_t i = 0; i < E; ++i) {
      got_rows.data<float>()[k * E + i] = got.data<const float>()[kept[k] * E + i];
      want_rows.data<float>()[k * E + i] = want_f32.data<const float>()[kept[k] * E + i];
    }
  expect_close("mla_cache_write", shape_str({T, L, rope, bs}), mode,
               std::string(core::dtype_name(cache)) + "_kscale" + std::to_string(k_scale).substr(0, 4), got_rows,
               want_rows, Tol{0.0, 1.0 - 1e-12});  // same rounding: exact
}

TEST(OpsOdd, MlaCacheWrite) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 17, 54, 97}) {
      check_cache_write(dev, m, T, 54, 9, 7, m == Mode::bf16 ? DType::bf16 : DType::f32, 1.0f, 1400 + T);
      check_cache_write(dev, m, T, 54, 9, 16, DType::f8_e4m3, 1.0f, 1500 + T);
      check_cache_write(dev, m, T, 54, 9, 5, DType::f8_e4m3, 0.37f, 1600 + T);
    }
}
TEST(OpsTp8, MlaCacheWrite) {
  K3_REQUIRE_CUDA(dev);
  for (Mode m : kModes)
    for (int64_t T : {1, 64, 256}) {
      check_cache_write(dev, m, T, 512, 64, 64, m == Mode::bf16 ? DType::bf16 : DType::f32, 1.0f, 1700 + T);
      check_cache_write(dev, m, T, 512, 64, 16, DType::f8_e4m3, 1.0f, 1800 + T);
    }
}

// ---------------------------------------------------------------- CUDA-graph replay

#ifdef K3_HAVE_CUDA
// One decode step (mla_cache_write of every row, then mla_absorbed over 5 sequences of 1 or 2 rows)
// captured once with fixed host integers (num_seqs 5, max_rows 2, max_tokens 120) and replayed 3
// times after writing new inputs and new tables into the same device buffers: the positions advance,
// the row counts change, sequences get new pages, and on the last step the sequences swap table
// rows and q rows. Every replay matches the CPU reference on the same cache state.
TEST(OpsGraph, MlaDecodeStepReplaysForNewPositionsAndTables) {
  K3_REQUIRE_CUDA(dev);
  (void)dev;
  const auto ctx = backends::cuda::Context::create(0);
  kernels::Registry reg;
  kernels::register_reference_ops(reg);
  kernels::register_cuda_ops(reg, ctx);
  const cudaStream_t stream = ctx->stream();
  auto& pool = ctx->pool();
  const MlaDims d = kOdd;
  const int nseq = 5, max_rows = 2;
  const int64_t bs = 7, max_tokens = 120, max_blocks = (max_tokens + bs - 1) / bs, num_blocks = nseq * max_blocks + 3;
  const int64_t R = nseq * max_rows, H = d.heads, L = d.kv_lora, E = L + d.rope, qw = H * (d.nope + d.rope);
  const float k_scale = 0.5f, scale = 1.0f / std::sqrt(static_cast<float>(d.nope + d.rope));
  core::Rng rng(9000);
  kernels::LinearWeight kv_b;
  kv_b.weight = random_bf16_weight(rng, H * (d.nope + d.v), L);
  const kernels::LinearWeight dkv_b = [&] {
    kernels::LinearWeight w;
    w.weight = backends::cuda::upload(kv_b.weight.view(), pool, stream);
    return w;
  }();
  Tensor cpu_pages = Tensor::zeros(DType::f8_e4m3, {num_blocks, bs, E});
  const Tensor dpages = backends::cuda::empty_poisoned(pool, DType::f8_e4m3, {num_blocks, bs, E}, stream);
  // Fixed device buffers the graph reads: inputs, cache rows and tables (row_begin, num_rows,
  // position, block_table in one i32 buffer), and the output.
  const Tensor dq = backends::cuda::empty(pool, DType::bf16, {R, qw});
  const Tensor dc = backends::cuda::empty(pool, DType::bf16, {R, L}),
               dpe = backends::cuda::empty(pool, DType::bf16, {R, d.rope});
  const Tensor drows = backends::cuda::empty(pool, DType::i32, {R});
  const Tensor dtables = backends::cuda::empty(pool, DType::i32, {3 * nseq + nseq * max_blocks});
  const Tensor dout = backends::cuda::empty(pool, DType::bf16, {R, H * d.v});
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
  const auto attention_args = [&](const TensorView& q, const TensorView& pages, const kernels::SeqBatch& seqs,
                                  const kernels::LinearWeight* w, const TensorView& out) {
    return kernels::MlaAttentionArgs{q,   pages,     seqs,  k_scale,        w, out, d.heads, d.nope, d.rope,
                                     d.v, d.kv_lora, scale, Precision::bf16};
  };

  // Sequences: their pages (from a shuffled pool) and lengths; a prefix written before the capture.
  std::vector<int32_t> free_pages = shuffled(num_blocks, rng);
  std::vector<std::vector<int32_t>> pages(nseq);
  std::vector<int64_t> length(nseq);
  const auto cache_row = [&](int s, int64_t pos) {
    while (static_cast<int64_t>(pages[s].size()) * bs <= pos) {
      pages[s].push_back(free_pages.back());
      free_pages.pop_back();
    }
    return static_cast<int32_t>(pages[s][pos / bs] * bs + pos % bs);
  };
  const auto write_both = [&](const Tensor& c, const Tensor& pe, const std::vector<int32_t>& rows) {
    const Tensor h_rows = i32_host(rows, {static_cast<int64_t>(rows.size())});
    cpu_registry().mla_cache_write.run({c.view(), pe.view(), cpu_pages.view(), h_rows.view(), k_scale},
                                       core::Device::cpu);
    const Tensor d_c = backends::cuda::upload(c.view(), DType::bf16, pool, stream);
    const Tensor d_pe = backends::cuda::upload(pe.view(), DType::bf16, pool, stream);
    const Tensor d_rows = backends::cuda::upload(h_rows.view(), pool, stream);
    reg.mla_cache_write.run({d_c.view(), d_pe.view(), dpages.view(), d_rows.view(), k_scale}, core::Device::cuda);
    K3_CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  {
    std::vector<int32_t> rows;
    for (int s = 0; s < nseq; ++s) {
      length[s] = 1 + static_cast<int64_t>(rng.next_u64() % 60);
      for (int64_t j = 0; j < length[s]; ++j) rows.push_back(cache_row(s, j));
    }
    const auto n = static_cast<int64_t>(rows.size());
    write_both(random_act(rng, {n, L}, Mode::bf16), random_act(rng, {n, d.rope}, Mode::bf16), rows);
  }

  const kernels::MlaCacheWriteArgs write_args{dc.view(), dpe.view(), dpages.view(), drows.view(), k_scale};
  const kernels::MlaAttentionArgs step_args = attention_args(dq.view(), dpages.view(), seqs_of(dtables), &dkv_b,
                                                             dout.view());
  backends::cuda::Graph graph = backends::cuda::Graph::capture(*ctx, [&] {
    reg.mla_cache_write.run(write_args, core::Device::cuda);
    reg.mla_absorbed.run(step_args, core::Device::cuda);
  });

  for (int step = 0; step < 3; ++step) {
    // This step: sequence s (order[k] sits at table row k) gets 1 or 2 rows at its next positions.
    std::vector<int> order = {0, 1, 2, 3, 4};
    if (step == 2) order = {3, 0, 4, 2, 1};
    std::vector<int32_t> begins(nseq), counts(nseq), positions(nseq), table(nseq * max_blocks, -1), rows(R, -1);
    int64_t next_row = R;
    for (int k = 0; k < nseq; ++k) {
      const int s = order[k];
      counts[k] = 1 + static_cast<int>(rng.next_u64() % max_rows);
      next_row -= counts[k];  // rows from the end backwards: row_begin not monotonic in k
      begins[k] = static_cast<int32_t>(next_row);
      positions[k] = static_cast<int32_t>(length[s]);
      for (int i = 0; i < counts[k]; ++i) rows[next_row + i] = cache_row(s, length[s] + i);
      length[s] += counts[k];
      std::copy(pages[s].begin(), pages[s].end(), table.begin() + k * max_blocks);
    }
    std::vector<int32_t> tables = begins;
    tables.insert(tables.end(), counts.begin(), counts.end());
    tables.insert(tables.end(), positions.begin(), positions.end());
    tables.insert(tables.end(), table.begin(), table.end());
    const Tensor q = random_act(rng, {R, qw}, Mode::bf16), c = random_act(rng, {R, L}, Mode::bf16);
    const Tensor pe = random_act(rng, {R, d.rope}, Mode::bf16);
    const Tensor h_rows = i32_host(rows, {R}), h_tables = i32_host(tables, {static_cast<int64_t>(tables.size())});
    // New contents, same addresses; then one replay.
    for (const auto& [host, device] : {std::pair{&q, &dq}, {&c, &dc}, {&pe, &dpe}}) {
      const Tensor as_bf16 = backends::cuda::upload(host->view(), DType::bf16, pool, stream);
      K3_CUDA_CHECK(cudaMemcpyAsync(device->view().data, as_bf16.view().data, static_cast<size_t>(as_bf16.nbytes()),
                                    cudaMemcpyDeviceToDevice, stream));
      K3_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    backends::cuda::copy_to_device(h_rows.view(), drows.view(), stream);
    backends::cuda::copy_to_device(h_tables.view(), dtables.view(), stream);
    backends::cuda::poison_nan(dout.view(), stream);
    graph.replay();
    const Tensor got = backends::cuda::download_f32(dout.view(), stream);

    // The CPU reference on the same state.
    cpu_registry().mla_cache_write.run({c.view(), pe.view(), cpu_pages.view(), h_rows.view(), k_scale},
                                       core::Device::cpu);
    Tensor want = nan_tensor({R, H * d.v});
    cpu_registry().mla_absorbed.run(attention_args(q.view(), cpu_pages.view(), seqs_of(h_tables), &kv_b, want.view()),
                                    core::Device::cpu);
    // Rows [next_row, R) are the step's; rows before it belong to no sequence and stay NaN.
    for (int64_t i = 0; i < next_row * H * d.v; ++i)
      ASSERT_TRUE(std::isnan(got.data<const float>()[i])) << "step " << step;
    expect_close("mla_absorbed", "graph step " + std::to_string(step), Mode::bf16, "cache_fp8",
                 rows_from(got, next_row), rows_from(want, next_row), tol_attention(Mode::bf16));
  }
}
#endif

}  // namespace
}  // namespace k3::ops_test
