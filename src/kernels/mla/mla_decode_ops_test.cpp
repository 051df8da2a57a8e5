// kernels/mla/mla_decode_ops_test.cpp: the fused MLA decode op (kernels/mla_decode, fastpath/) on every
// device backend against the CPU reference: batches of decode and verify sequences with different
// positions, row counts and shuffled block tables, over bf16 / f32 / fp8 e4m3 latent caches in pages of
// 7, 16 and 64 tokens, with and without the output gate, at odd dims and at one TP8 rank's shapes
// (12 heads, nope 128, rope 64, v 128, kv_lora 512) with contexts of 1, 17, 31, 33, 97, 1000+ and up to
// 8192 positions, 64 decode sequences in one call, a caller-provided (NaN-poisoned) workspace, out
// written in place over the gate, and explicit split lengths; the cluster slices of the combine_w_uv_gate
// launch at their edges (kv_lora 8 and 36, v 1, 20, 200 and 256, several slot chunks, 10 and 37 splits) and
// the op's batch invariance (one sequence's out bits alone, in a batch of 8 and in a batch of 64). Each case
// checks that the registry picked exactly the strategy it should: "cuda_decode_splitkv_mma" (tensor cores)
// for bf16 activations whenever its dims fit, "cuda_decode_splitkv" (CUDA cores) for f32 activations and
// for odd dims (both end in the same combine_w_uv_gate cluster kernel: no other combine exists).
//
// Tolerance: the tensor-core path keeps tol_attention (bf16: rel 3e-2, cosine 0.999). Its scores are exact
// products (bf16 Qc x cache codes, which are bf16-exact) summed in fp32, like the CUDA-core path; what it
// adds is rounding P_j = e^{s_j - m} to the P.V operand type: f16 beside an fp8 cache (relative error
// delta_j <= 2^-11) or bf16 beside a bf16 cache (<= 2^-8, about 1.6e-3 rms). l sums the
// same rounded P, so o_lat stays a weighted mean whose weights carry independent relative errors: to first
// order its error is sum_j P_j delta_j (c_j - o_lat) / l, of rms rms(delta) * |c - o_lat| * sqrt(sum P_j^2) / l.
// For flat attention over n positions that is ~1.6e-3 |c| / sqrt(n) against |o_lat| ~ |c| / sqrt(n); for
// peaked attention ~1.6e-3 |c| against |o_lat| ~ |c| (a one-hot P rounds exactly): ~2e-3 relative either
// way, the size of o_lat's own bf16 rounding and ~15x below the bound; W_UV and the gate are linear in it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/mla/cases.h"
#include "kernels/testing/op_harness.h"

namespace k3::ops_test {
namespace {

using Dims = kernels::MlaShape;  // kernels/mla/cases.h
using SeqShape = kernels::MlaSeq;
constexpr const Dims& kOdd = kernels::kMlaOdd;
constexpr const Dims& kTp8 = kernels::kMlaK3Tp8;

Tensor i32_host(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::zeros(DType::i32, shape);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// Pages from a shuffled pool (plus 2 never-written spares), every cache token's row, the i32 tables,
// q / gate rows: row 0 belongs to no sequence, then the sequences in reverse order.
struct Layout {
  int64_t num_blocks = 0, rows = 1, tokens = 0, max_blocks = 0, max_tokens = 0;
  int max_rows = 0;
  std::vector<int32_t> begins, counts, positions, table, cache_rows;

  Layout(const std::vector<SeqShape>& seqs, int64_t bs, core::Rng& rng) {
    const auto n = static_cast<int64_t>(seqs.size());
    int64_t blocks = 0;
    for (const SeqShape& s : seqs) {
      blocks += (s.S + bs - 1) / bs;
      tokens += s.S;
      max_rows = std::max(max_rows, static_cast<int>(s.T) + 1);  // slack row slots exit at once
      max_tokens = std::max(max_tokens, s.S + 3);                // slack positions
    }
    max_blocks = (max_tokens + bs - 1) / bs;
    num_blocks = blocks + 2;
    std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
    for (int64_t i = 0; i < num_blocks; ++i) pool[i] = static_cast<int32_t>(i);
    for (int64_t i = num_blocks - 1; i > 0; --i)
      std::swap(pool[i], pool[rng.next_u64() % static_cast<uint64_t>(i + 1)]);
    table.assign(static_cast<size_t>(n * max_blocks), -1);
    begins.resize(seqs.size());
    for (int64_t k = n - 1; k >= 0; --k) {
      begins[k] = static_cast<int32_t>(rows);
      rows += seqs[k].T;
    }
    size_t next = 0;
    for (int64_t k = 0; k < n; ++k) {
      for (int64_t b = 0; b * bs < seqs[k].S; ++b) table[k * max_blocks + b] = pool[next++];
      for (int64_t j = 0; j < seqs[k].S; ++j)
        cache_rows.push_back(static_cast<int32_t>(table[k * max_blocks + j / bs] * bs + j % bs));
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

enum class Out { own, workspace, in_place };  // separate out; + caller workspace; out written over the gate

constexpr const char* kMmaImpl = "cuda_decode_splitkv_mma";
constexpr const char* kCudaCoreImpl = "cuda_decode_splitkv";

// The strategy the registry must pick (cuda_mla_decode_mma.cu's supports()): tensor cores for bf16
// activations over an fp8 / bf16 cache when heads <= 16, kv_lora % 64 == 0 (<= 512) and
// (kv_lora + rope) % 16 == 0 (<= 576); the CUDA-core strategy for everything else.
std::string expected_impl(Mode mode, Dims d, const std::string& cache) {
  const bool dims_fit = d.heads <= 16 && d.kv_lora % 64 == 0 && d.kv_lora <= 512 && (d.kv_lora + d.rope) % 16 == 0 &&
                        d.kv_lora + d.rope <= 576;
  return mode == Mode::bf16 && cache != "f32" && dims_fit ? kMmaImpl : kCudaCoreImpl;
}

// cache: "bf16" (CPU: f32 holding bf16 values; device: real bf16), "f32" or "fp8". Device pages are
// written by the device's mla_cache_write into NaN-poisoned pages (spare pages stay NaN).
void check_decode(Device* dev, Mode mode, Dims d, const std::vector<SeqShape>& seqs, const std::string& cache,
                  float k_scale, int64_t bs, bool gated, Out how, uint64_t seed, int64_t split_len = 0,
                  bool kv_b_f32 = false) {
  core::Rng rng(seed);
  const Layout lay(seqs, bs, rng);
  const int64_t H = d.heads, L = d.kv_lora, E = L + d.rope, R = lay.rows, W = H * d.v;
  const Tensor q = random_act(rng, {R, H * (d.nope + d.rope)}, mode);
  const Tensor gate = random_act(rng, {R, W}, mode, 0.0, 2.0);
  const Tensor c_n = random_act(rng, {lay.tokens, L}, Mode::bf16),
               k_pe = random_act(rng, {lay.tokens, d.rope}, Mode::bf16);
  const Tensor cache_rows = i32_host(lay.cache_rows, {lay.tokens});
  kernels::LinearWeight kv_b;
  kv_b.weight = kv_b_f32 ? random_uniform_f32(rng, {H * (d.nope + d.v), L}, 1.0 / std::sqrt(static_cast<double>(L)))
                         : random_bf16_weight(rng, H * (d.nope + d.v), L);
  const bool fp8 = cache == "fp8";
  Tensor cpu_pages = Tensor::zeros(fp8 ? DType::f8_e4m3 : DType::f32, {lay.num_blocks, bs, E});
  cpu_registry().mla_cache_write.run({c_n.view(), k_pe.view(), cpu_pages.view(), cache_rows.view(), k_scale},
                                     core::Device::cpu);
  const Tensor rb = i32_host(lay.begins, {static_cast<int64_t>(lay.begins.size())});
  const Tensor nr = i32_host(lay.counts, {static_cast<int64_t>(lay.counts.size())});
  const Tensor pos = i32_host(lay.positions, {static_cast<int64_t>(lay.positions.size())});
  const Tensor bt = i32_host(lay.table, {static_cast<int64_t>(lay.begins.size()), lay.max_blocks});
  const auto make_args = [&](const TensorView& qv, const TensorView& pages, const kernels::SeqBatch& sb,
                             const kernels::LinearWeight* w, const TensorView& g, const TensorView& out) {
    kernels::MlaDecodeArgs a;
    a.q = qv;
    a.pages = pages;
    a.seqs = sb;
    a.k_scale = k_scale;
    a.kv_b = w;
    if (gated) a.gate = g;
    a.out = out;
    a.num_heads = d.heads;
    a.qk_nope = d.nope;
    a.qk_rope = d.rope;
    a.v_head_dim = d.v;
    a.kv_lora = d.kv_lora;
    a.scale = 1.0f / std::sqrt(static_cast<float>(d.nope + d.rope));
    a.precision = precision(mode);
    return a;
  };
  Tensor want = nan_tensor({R, W});
  cpu_registry().mla_decode.run(make_args(q.view(), cpu_pages.view(), lay.seqs(rb, nr, pos, bt), &kv_b, gate.view(),
                                          want.view()),
                                core::Device::cpu);

  const DType dev_cache = fp8 ? DType::f8_e4m3 : cache == "bf16" ? DType::bf16 : DType::f32;
  Tensor dpages = dev->poisoned(dev_cache, {lay.num_blocks, bs, E});
  const Tensor dc = dev->act(c_n, mode), dpe = dev->act(k_pe, mode), drows = dev->upload(cache_rows);
  dev->registry().mla_cache_write.run({dc.view(), dpe.view(), dpages.view(), drows.view(), k_scale}, dev->kind());
  const Tensor dq = dev->act(q, mode), dgate = dev->act(gate, mode);
  const Tensor drb = dev->upload(rb), dnr = dev->upload(nr), dpos = dev->upload(pos), dbt = dev->upload(bt);
  const kernels::LinearWeight dkv_b = dev->upload(kv_b);
  // In place: out is the gate itself (row 0 then keeps its gate logits, never NaN).
  Tensor out = how == Out::in_place ? dev->act(gate, mode) : dev->poisoned(act_dtype(mode), {R, W});
  kernels::MlaDecodeArgs args = make_args(dq.view(), dpages.view(), lay.seqs(drb, dnr, dpos, dbt), &dkv_b,
                                          how == Out::in_place ? out.view() : dgate.view(), out.view());
  args.split_len = split_len;  // 0: the op's own choice
  Tensor ws;
  if (how == Out::workspace) {
    ws = dev->poisoned(DType::f32, {kernels::mla_decode_workspace_floats(args)});
    args.workspace = ws.view();
  }
  expect_device_impl(dev->registry().mla_decode, args, dev);
  EXPECT_EQ(dev->registry().mla_decode.select(args, dev->kind()).name, expected_impl(mode, d, cache))
      << "mla_decode picked another strategy for " << mode_name(mode) << " activations, cache " << cache;
  dev->registry().mla_decode.run(args, dev->kind());
  const Tensor got = dev->to_host_f32(out.view());
  if (how != Out::in_place) {
    for (int64_t c = 0; c < W; ++c) {
      ASSERT_TRUE(std::isnan(got.data<const float>()[c])) << "unowned row written";
    }
  }
  const std::string what = "cache_" + cache + (gated ? "_gate" : "_nogate") +
                           (how == Out::workspace  ? "_ws"
                            : how == Out::in_place ? "_inplace"
                                                   : "");
  expect_close("mla_decode", shape_of(seqs, bs, d.heads), mode, what, rows_from(got, 1), rows_from(want, 1),
               tol_attention(mode));
}

std::string act_cache(Mode m) { return m == Mode::bf16 ? "bf16" : "f32"; }

TEST(OpsOdd, MlaDecode) {
  K3_REQUIRE_CUDA(dev);
  const std::vector<SeqShape> batch = std::vector<SeqShape>(std::begin(kernels::kMlaDecodeOddBatch),
                                                            std::end(kernels::kMlaDecodeOddBatch));
  uint64_t seed = 9000;
  for (Mode m : kModes)
    for (int64_t bs : {7, 16, 64}) {
      check_decode(dev, m, kOdd, batch, act_cache(m), 1.0f, bs, true, Out::own, ++seed);
      check_decode(dev, m, kOdd, batch, "fp8", 0.25f, bs, bs != 16, Out::own, ++seed);
    }
  check_decode(dev, Mode::bf16, kOdd, batch, "fp8", 0.5f, 7, true, Out::workspace, ++seed);
  check_decode(dev, Mode::fp32, kOdd, batch, "f32", 1.0f, 16, true, Out::in_place, ++seed);
}

// kv_b stored in f32 (a checkpoint whose kv_b_proj is f32): W_UK and W_UV read as f32.
TEST(OpsOdd, MlaDecodeF32KvB) {
  K3_REQUIRE_CUDA(dev);
  const std::vector<SeqShape> batch = {{1, 1}, {17, 4}, {97, 3}};
  uint64_t seed = 9050;
  for (Mode m : kModes) check_decode(dev, m, kOdd, batch, "fp8", 0.5f, 16, true, Out::own, ++seed, 0, true);
  check_decode(dev, Mode::bf16, kTp8, {{700, 1}}, "bf16", 1.0f, 16, true, Out::own, ++seed, 0, true);
}

TEST(OpsTp8, MlaDecodeContexts) {
  K3_REQUIRE_CUDA(dev);
  const std::vector<SeqShape> batch = std::vector<SeqShape>(std::begin(kernels::kMlaDecodeK3Batch),
                                                            std::end(kernels::kMlaDecodeK3Batch));
  uint64_t seed = 9100;
  for (Mode m : kModes) {
    check_decode(dev, m, kTp8, batch, "fp8", 1.0f, 16, true, Out::own, ++seed);
    check_decode(dev, m, kTp8, batch, act_cache(m), 1.0f, 64, false, Out::own, ++seed);
  }
  check_decode(dev, Mode::bf16, kTp8, batch, "fp8", 1.0f, 16, true, Out::workspace, ++seed);
  check_decode(dev, Mode::bf16, kTp8, batch, "bf16", 1.0f, 16, true, Out::in_place, ++seed);
}

TEST(OpsTp8, MlaDecodeLongContext) {
  K3_REQUIRE_CUDA(dev);
  // A few thousand positions: one sequence alone (many splits per query) and with verify rows.
  uint64_t seed = 9200;
  for (Mode m : kModes) {
    check_decode(dev, m, kTp8, {{4096, 1}}, "fp8", 1.0f, 64, true, Out::own, ++seed);
    check_decode(dev, m, kTp8, {{3001, 1}, {2500, 4}}, act_cache(m), 1.0f, 16, true, Out::own, ++seed);
  }
}

// Explicit split lengths (benchmarks tune them with MlaDecodeArgs::split_len): one long sequence and
// a batch with verify rows, from one tile per split to the whole context in one split.
TEST(OpsTp8, MlaDecodeSplitLengths) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9250;
  for (Mode m : kModes)
    for (int64_t split_len : {32, 96, 512, 4096}) {
      SCOPED_TRACE("split_len " + std::to_string(split_len));
      check_decode(dev, m, kTp8, {{4096, 1}}, "fp8", 1.0f, 16, true, Out::own, ++seed, split_len);
      check_decode(dev, m, kTp8, {{700, 1}, {97, 3}}, "fp8", 1.0f, 16, true, Out::workspace, ++seed, split_len);
    }
}

// 64 decode sequences in one call (the batch-64 decode step), contexts from 1 to 700 tokens.
TEST(OpsTp8, MlaDecodeBatch64) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9300);
  std::vector<SeqShape> batch;
  for (int i = 0; i < 64; ++i) batch.push_back({1 + static_cast<int64_t>(rng.next_u64() % 700), 1});
  for (Mode m : kModes) check_decode(dev, m, kTp8, batch, "fp8", 1.0f, 16, true, Out::own, 9301);
  check_decode(dev, Mode::bf16, kTp8, batch, "bf16", 1.0f, 64, true, Out::workspace, 9302);
}

// Head counts at the kernel's edges: 16 (the most one CTA takes: every 4-head score group live),
// 5 and 9 (a partial last group), at the TP8 head dims; and more query slots than the split
// sizing aims CTAs for (100 sequences x 3 verify rows: one split per query).
TEST(OpsTp8, MlaDecodeHeadCountsAndManyQueries) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9400;
  for (int heads : {16, 5, 9}) {
    const Dims d{heads, 128, 64, 128, 512};
    for (Mode m : kModes) check_decode(dev, m, d, {{1, 1}, {300, 3}, {97, 1}}, "fp8", 1.0f, 16, true, Out::own, ++seed);
  }
  core::Rng rng(9401);
  std::vector<SeqShape> batch;
  for (int i = 0; i < 100; ++i) batch.push_back({3 + static_cast<int64_t>(rng.next_u64() % 200), 3});
  check_decode(dev, Mode::bf16, kTp8, batch, "fp8", 1.0f, 16, true, Out::own, ++seed);
}

// ---------------------------------------------------------------- the tensor-core strategy

// The registry's choice itself: bf16 activations at TP8 dims take the tensor-core split_kv (fp8 and bf16
// caches), f32 activations the CUDA-core one; odd dims stay on CUDA cores in either precision.
TEST(OpsTp8, MlaDecodeStrategyByActivationDtype) {
  K3_REQUIRE_CUDA(dev);
  EXPECT_EQ(expected_impl(Mode::bf16, kTp8, "fp8"), kMmaImpl);
  EXPECT_EQ(expected_impl(Mode::bf16, kTp8, "bf16"), kMmaImpl);
  EXPECT_EQ(expected_impl(Mode::fp32, kTp8, "fp8"), kCudaCoreImpl);
  EXPECT_EQ(expected_impl(Mode::bf16, kOdd, "fp8"), kCudaCoreImpl);
  uint64_t seed = 9500;  // check_decode asserts the selected name for each
  check_decode(dev, Mode::bf16, kTp8, {{33, 1}}, "fp8", 1.0f, 16, true, Out::own, ++seed);
  check_decode(dev, Mode::bf16, kTp8, {{33, 1}}, "bf16", 1.0f, 16, true, Out::own, ++seed);
  check_decode(dev, Mode::fp32, kTp8, {{33, 1}}, "fp8", 1.0f, 16, true, Out::own, ++seed);
  check_decode(dev, Mode::fp32, kTp8, {{33, 1}}, "f32", 1.0f, 16, true, Out::own, ++seed);
}

// Head counts 1, 5, 12, 16 at the TP8 head dims (padded mma rows, every row live at 16) over contexts
// around the 64-position stage and its 16-position k-steps (1, 17, 31, 33, 97, 1000), decode and verify
// rows, fp8 (k_scale 0.5) and bf16 caches, pages of 16 and 64.
TEST(OpsTp8, MlaDecodeMmaHeadCounts) {
  K3_REQUIRE_CUDA(dev);
  const std::vector<SeqShape> batch = {{1, 1}, {17, 1}, {31, 2}, {33, 1}, {97, 4}, {1000, 1}};
  uint64_t seed = 9600;
  for (int heads : {1, 5, 12, 16}) {
    SCOPED_TRACE("heads " + std::to_string(heads));
    const Dims d{heads, 128, 64, 128, 512};
    ASSERT_EQ(expected_impl(Mode::bf16, d, "fp8"), kMmaImpl);
    check_decode(dev, Mode::bf16, d, batch, "fp8", 0.5f, 16, true, Out::own, ++seed);
    check_decode(dev, Mode::bf16, d, batch, "bf16", 1.0f, 64, heads % 2 == 0, Out::own, ++seed);
  }
}

// Small dims the tensor-core kernel takes: kv_lora 64 (one P.V warp), 128, 256, 448 (7 of 8 P.V warps);
// entries of 8, 9, 18 and 31 k-steps (uneven K quarters); odd nope and v (q_absorb, w_uv_gate edges);
// pages of 7, 16 and 64; a caller workspace and out in place over the gate.
TEST(OpsOdd, MlaDecodeMmaSmallDims) {
  K3_REQUIRE_CUDA(dev);
  const std::vector<SeqShape> batch = {{1, 1}, {17, 4}, {31, 1}, {33, 2}, {97, 3}, {130, 1}};
  const Dims dims[] = {{3, 17, 64, 13, 64}, {5, 32, 16, 24, 128}, {16, 64, 32, 40, 256}, {1, 16, 48, 16, 448}};
  uint64_t seed = 9700;
  for (const Dims& d : dims) {
    SCOPED_TRACE("kv_lora " + std::to_string(d.kv_lora) + " rope " + std::to_string(d.rope));
    ASSERT_EQ(expected_impl(Mode::bf16, d, "fp8"), kMmaImpl);
    check_decode(dev, Mode::bf16, d, batch, "fp8", 0.25f, 7, true, Out::own, ++seed);
    check_decode(dev, Mode::bf16, d, batch, "bf16", 1.0f, 16, false, Out::workspace, ++seed);
    check_decode(dev, Mode::bf16, d, batch, "fp8", 1.0f, 64, true, Out::in_place, ++seed);
  }
}

// An 8K context (the benchmark's) alone and beside shorter sequences with verify rows, at the automatic
// split and at split_len 32 (half-empty 64-position stages), 64 and 2048 (32 stages per CTA).
TEST(OpsTp8, MlaDecodeMmaLongContextSplits) {
  K3_REQUIRE_CUDA(dev);
  uint64_t seed = 9800;
  for (int64_t split_len : {0, 32, 64, 2048}) {
    SCOPED_TRACE("split_len " + std::to_string(split_len));
    check_decode(dev, Mode::bf16, kTp8, {{8192, 1}}, "fp8", 1.0f, 16, true, Out::own, ++seed, split_len);
    check_decode(dev, Mode::bf16, kTp8, {{8192, 1}, {5000, 3}, {33, 1}}, split_len == 64 ? "bf16" : "fp8", 1.0f, 64,
                 true, Out::workspace, ++seed, split_len);
  }
}

// ---------------------------------------------------------------- combine_w_uv_gate's clusters

// The cluster slices at their edges (8 CTAs per head and chunk of 8 query slots): kv_lora 36 (a multiple of 4,
// not 8: float4 combine, scalar W_UV; ranks 5-7 own no columns), kv_lora 8 (ranks 0-1 own columns) with v 1
// (one W_UV row in the whole cluster), v 200 and 256 (two register passes of W_UV rows per warp; 200: a short
// last rank). 25 query slots (5 sequences x max_rows 5): 4 slot chunks, the last with one slot. Automatic
// splits (10 of 128 positions: 10 split groups) and split_len 32 (37 splits: 16 groups of 2-3).
TEST(OpsOdd, MlaDecodeClusterSlices) {
  K3_REQUIRE_CUDA(dev);
  const std::vector<SeqShape> batch = {{1, 1}, {17, 4}, {97, 3}, {1180, 1}, {40, 2}};
  uint64_t seed = 9900;
  for (Mode m : kModes) {
    check_decode(dev, m, {2, 16, 8, 20, 36}, batch, act_cache(m), 1.0f, 16, true, Out::own, ++seed);
    check_decode(dev, m, {1, 8, 8, 1, 8}, batch, "fp8", 0.5f, 7, true, Out::in_place, ++seed);
  }
  for (int64_t split_len : {0, 32}) {
    SCOPED_TRACE("split_len " + std::to_string(split_len));
    check_decode(dev, Mode::bf16, {4, 32, 16, 200, 128}, batch, "fp8", 0.5f, 16, true, Out::own, ++seed, split_len);
    check_decode(dev, Mode::bf16, {2, 64, 64, 256, 512}, batch, "bf16", 1.0f, 64, false, Out::workspace, ++seed,
                 split_len);
  }
}

// One sequence's inputs (bf16 values in f32), so the same bytes can sit in different batches.
struct SeqInputs {
  SeqShape shape;
  Tensor q, gate, c_n, k_pe;  // [T, H (nope + rope)], [T, H v], [S, kv_lora], [S, rope]
};
SeqInputs random_seq(core::Rng& rng, Dims d, SeqShape s) {
  return {s, random_act(rng, {s.T, int64_t{d.heads} * (d.nope + d.rope)}, Mode::bf16),
          random_act(rng, {s.T, int64_t{d.heads} * d.v}, Mode::bf16, 0.0, 2.0),
          random_act(rng, {s.S, d.kv_lora}, Mode::bf16), random_act(rng, {s.S, d.rope}, Mode::bf16)};
}

// Copies src's rows into dst's rows r0 .. (f32, same width).
void put_rows(const Tensor& src, Tensor& dst, int64_t r0) {
  std::memcpy(dst.data<float>() + r0 * dst.dim(1), src.data<const float>(), static_cast<size_t>(src.nbytes()));
}

// mla_decode on the device (bf16, fp8 cache in pages of 16, gated, split_len fixed) over `seqs` in this
// order; the out rows of each sequence, as host f32 [T, H v].
std::vector<Tensor> decode_batch_rows(Device* dev, Dims d, const std::vector<const SeqInputs*>& seqs,
                                      const kernels::LinearWeight& dkv_b, int64_t split_len, uint64_t seed) {
  std::vector<SeqShape> shapes;
  for (const SeqInputs* s : seqs) shapes.push_back(s->shape);
  core::Rng rng(seed);
  const Layout lay(shapes, 16, rng);
  const int64_t E = d.kv_lora + d.rope, W = int64_t{d.heads} * d.v;
  Tensor q = Tensor::zeros(DType::f32, {lay.rows, int64_t{d.heads} * (d.nope + d.rope)});
  Tensor gate = Tensor::zeros(DType::f32, {lay.rows, W});
  Tensor c_n = Tensor::zeros(DType::f32, {lay.tokens, d.kv_lora});
  Tensor k_pe = Tensor::zeros(DType::f32, {lay.tokens, d.rope});
  int64_t token = 0;
  for (size_t k = 0; k < seqs.size(); ++k) {
    put_rows(seqs[k]->q, q, lay.begins[k]);
    put_rows(seqs[k]->gate, gate, lay.begins[k]);
    put_rows(seqs[k]->c_n, c_n, token);
    put_rows(seqs[k]->k_pe, k_pe, token);
    token += seqs[k]->shape.S;
  }
  const auto n = static_cast<int64_t>(seqs.size());
  Tensor pages = dev->poisoned(DType::f8_e4m3, {lay.num_blocks, 16, E});
  const Tensor dc = dev->act(c_n, Mode::bf16), dpe = dev->act(k_pe, Mode::bf16);
  const Tensor drows = dev->upload(i32_host(lay.cache_rows, {lay.tokens}));
  dev->registry().mla_cache_write.run({dc.view(), dpe.view(), pages.view(), drows.view(), 1.0f}, dev->kind());
  const Tensor dq = dev->act(q, Mode::bf16), dgate = dev->act(gate, Mode::bf16);
  const Tensor rb = dev->upload(i32_host(lay.begins, {n})), nr = dev->upload(i32_host(lay.counts, {n}));
  const Tensor pos = dev->upload(i32_host(lay.positions, {n}));
  const Tensor bt = dev->upload(i32_host(lay.table, {n, lay.max_blocks}));
  Tensor out = dev->poisoned(DType::bf16, {lay.rows, W});
  kernels::MlaDecodeArgs a;
  a.q = dq.view();
  a.pages = pages.view();
  a.seqs = lay.seqs(rb, nr, pos, bt);
  a.kv_b = &dkv_b;
  a.gate = dgate.view();
  a.out = out.view();
  a.num_heads = d.heads, a.qk_nope = d.nope, a.qk_rope = d.rope, a.v_head_dim = d.v, a.kv_lora = d.kv_lora;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d.nope + d.rope));
  a.split_len = split_len;
  EXPECT_EQ(dev->registry().mla_decode.select(a, dev->kind()).name, kMmaImpl);
  dev->registry().mla_decode.run(a, dev->kind());
  const Tensor got = dev->to_host_f32(out.view());
  std::vector<Tensor> rows;
  for (size_t k = 0; k < seqs.size(); ++k)
    rows.push_back(Tensor::copy_of(
        TensorView::contiguous(got.data<float>() + lay.begins[k] * W, DType::f32, {seqs[k]->shape.T, W})));
  return rows;
}

// Batch invariance (every sum of the op runs in an order fixed by the dims and the split count): an 8K-context
// sequence at TP8 (split_len 256: 33 splits, the same in every batch since it is the longest) gives the same
// out bits alone (batch 1: slot 0 of chunk 0), at slot 25 of a batch of 8 with verify rows (max_rows 5) and at
// slot 185 of a batch of 64 (chunk 23), beside shorter sequences in the same clusters.
TEST(OpsTp8, MlaDecodeBatchInvariant) {
  K3_REQUIRE_CUDA(dev);
  core::Rng rng(9950);
  kernels::LinearWeight kv_b;
  kv_b.weight = random_bf16_weight(rng, int64_t{kTp8.heads} * (kTp8.nope + kTp8.v), kTp8.kv_lora);
  const kernels::LinearWeight dkv_b = dev->upload(kv_b);
  const SeqInputs target = random_seq(rng, kTp8, {8192, 1});
  std::vector<SeqInputs> others;
  for (int i = 0; i < 63; ++i)
    others.push_back(random_seq(rng, kTp8, {4 + static_cast<int64_t>(rng.next_u64() % 700), i % 7 == 3 ? 4 : 1}));
  std::vector<const SeqInputs*> batch8, batch64;
  for (int i = 0; i < 63; ++i) (i < 7 ? batch8 : batch64).push_back(&others[i]);
  batch64.insert(batch64.begin(), batch8.begin(), batch8.end());
  batch8.insert(batch8.begin() + 5, &target);
  batch64.insert(batch64.begin() + 37, &target);
  const Tensor alone = decode_batch_rows(dev, kTp8, {&target}, dkv_b, 256, 1)[0];
  for (float x : alone.span<const float>()) ASSERT_TRUE(std::isfinite(x)) << "batch 1: an unwritten or NaN out";
  const std::pair<const std::vector<const SeqInputs*>*, size_t> cases[] = {{&batch8, 5}, {&batch64, 37}};
  for (const auto& [batch, at] : cases) {
    const Tensor got = decode_batch_rows(dev, kTp8, *batch, dkv_b, 256, 2)[at];
    EXPECT_EQ(std::memcmp(got.data<const float>(), alone.data<const float>(), static_cast<size_t>(alone.nbytes())), 0)
        << "the 8K sequence's out differs in a batch of " << batch->size() << " from batch 1";
  }
}

}  // namespace
}  // namespace k3::ops_test
